#include "codec/rans.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"

#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
// GCC's AVX-512 headers start some conversions from _mm*_undefined_*(), which -Wall flags.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define STRATA_RANS_AVX512 1
#endif

namespace strata::codec::rans {
namespace {

bool g_force_scalar = false;

constexpr uint32_t kL = 1u << 16;  // states live in [kL, 2^32); words are 16 bits
constexpr int kMinProbBits = 11;
constexpr int kMaxProbBits = 15;

struct EncSym {
  uint64_t rcp;  // floor((2^64 - 1) / freq): quotient estimate, corrected by one step
  uint32_t freq;
  uint32_t start;
  uint32_t x_max;  // renormalise (emit a word) while x >= x_max
  uint32_t shift;  // prob_bits of the context
};

int ChooseProbBits(uint32_t used) {
  int b = 0;
  while ((1u << b) < used) ++b;
  return std::clamp(b + 6, kMinProbBits, kMaxProbBits);
}

// Scales counts (summing to total) to frequencies summing to 2^prob_bits, every used symbol
// keeping at least 1. Deterministic.
void Normalize(const uint32_t* c, uint32_t count, uint64_t total, int prob_bits, uint32_t* f) {
  const uint64_t m = uint64_t{1} << prob_bits;
  int64_t sum = 0;
  uint32_t best = 0;
  for (uint32_t s = 0; s < count; ++s) {
    if (c[s] == 0) {
      f[s] = 0;
      continue;
    }
    uint64_t v = (uint64_t{c[s]} * m * 2 + total) / (2 * total);  // round to nearest
    f[s] = static_cast<uint32_t>(std::max<uint64_t>(1, v));
    sum += f[s];
    if (c[s] > c[best]) best = s;
  }
  int64_t diff = static_cast<int64_t>(m) - sum;
  if (diff > 0 || static_cast<int64_t>(f[best]) + diff >= 1) {
    f[best] = static_cast<uint32_t>(f[best] + diff);
    return;
  }
  // Many symbols were forced up to 1: take the excess from the largest frequencies.
  int64_t excess = -diff;
  while (excess > 0) {
    for (uint32_t s = 0; s < count && excess > 0; ++s) {
      if (f[s] > 1) {
        int64_t take = std::min<int64_t>({excess, f[s] - 1, std::max<int64_t>(1, f[s] / 16)});
        f[s] -= static_cast<uint32_t>(take);
        excess -= take;
      }
    }
  }
}

// The decoder reads words in place from the blob, where they may sit at an odd address.
inline uint32_t LoadWord(const uint16_t* p) {
  uint16_t w;
  std::memcpy(&w, p, 2);
  return w;
}

inline uint64_t MulHi64(uint64_t a, uint64_t b) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
}

template <typename Sym>
void HistogramImpl(const Sym* syms, size_t n, uint32_t alphabet, uint32_t num_ctx,
                   uint32_t* counts) {
  const size_t full = n / kCtxRun;
  uint32_t ctx = 0;
  if (alphabet <= 1024) {
    // Four sub-histograms per context (lane & 3), so runs of one symbol do not serialise on
    // one counter's store-to-load latency.
    std::vector<uint32_t> sub(size_t{num_ctx} * 4 * alphabet, 0);
    for (size_t g = 0; g < full; ++g) {
      uint32_t* h = sub.data() + size_t{ctx} * 4 * alphabet;
      const Sym* s = syms + g * kCtxRun;
      for (int l = 0; l < kCtxRun; l += 4) {
        ++h[s[l]];
        ++h[alphabet + s[l + 1]];
        ++h[2 * alphabet + s[l + 2]];
        ++h[3 * alphabet + s[l + 3]];
      }
      if (++ctx == num_ctx) ctx = 0;
    }
    for (uint32_t c = 0; c < num_ctx; ++c) {
      const uint32_t* h = sub.data() + size_t{c} * 4 * alphabet;
      uint32_t* o = counts + size_t{c} * alphabet;
      for (uint32_t a = 0; a < alphabet; ++a)
        o[a] += h[a] + h[alphabet + a] + h[2 * alphabet + a] + h[3 * alphabet + a];
    }
  } else {
    for (size_t g = 0; g < full; ++g) {
      uint32_t* h = counts + size_t{ctx} * alphabet;
      for (int l = 0; l < kCtxRun; ++l) ++h[syms[g * kCtxRun + l]];
      if (++ctx == num_ctx) ctx = 0;
    }
  }
  for (size_t i = full * kCtxRun; i < n; ++i) ++counts[size_t{ctx} * alphabet + syms[i]];
}

#if STRATA_RANS_AVX512
// The SIMD paths are templates on the number of 16-lane state vectors (8, 4 or 2 for 128, 64
// or 32 states) and on the span of a section's symbol table (16, 32, 64, or a general one):
// these call f with each as a compile-time constant.
template <typename F>
decltype(auto) WithChains(int chains, F&& f) {
  switch (chains) {
    case 8:
      return f(std::integral_constant<int, 8>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    default:
      return f(std::integral_constant<int, 2>{});
  }
}
template <int kGeneral, typename F>
decltype(auto) WithTableSpan(uint32_t span, F&& f) {
  switch (span) {
    case 16:
      return f(std::integral_constant<int, 16>{});
    case 32:
      return f(std::integral_constant<int, 32>{});
    case 64:
      return f(std::integral_constant<int, 64>{});
    default:
      return f(std::integral_constant<int, kGeneral>{});
  }
}

bool CpuHasAvx512() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return ok;
}

#define STRATA_AVX512_FN __attribute__((target("avx512f,avx512bw"))) inline

// One rANS decode step of 16 lanes sharing context tables (ent, sym) and precision p.
STRATA_AVX512_FN __m512i DecStep(__m512i x, const uint32_t* ent, const uint16_t* sym, uint32_t p,
                                 __m512i* sv) {
  const __m512i low16 = _mm512_set1_epi32(0xFFFF);
  const __m512i slot = _mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>((1u << p) - 1)));
  const __m512i e = _mm512_i32gather_epi32(slot, ent, 4);
  *sv = _mm512_and_si512(_mm512_i32gather_epi32(slot, sym, 2), low16);  // tables padded
  const __m512i xs = _mm512_srl_epi32(x, _mm_cvtsi32_si128(static_cast<int>(p)));
  return _mm512_add_epi32(_mm512_mullo_epi32(_mm512_srli_epi32(e, 16), xs),
                          _mm512_and_si512(e, low16));
}

// Refills the lanes that fell below kL with the next words, in lane order.
STRATA_AVX512_FN __m512i DecRenorm(__m512i x, const uint16_t*& wp) {
  const __mmask16 need = _mm512_cmplt_epu32_mask(x, _mm512_set1_epi32(static_cast<int>(kL)));
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp)));
  wp += std::popcount(static_cast<unsigned>(need));
  return _mm512_mask_or_epi32(x, need, _mm512_slli_epi32(x, 16),
                              _mm512_maskz_expand_epi32(need, w));
}

template <typename Sym>
STRATA_AVX512_FN void DecStore(__m512i sv, Sym* dst) {
  if constexpr (sizeof(Sym) == 1) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtepi32_epi8(sv));
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(sv));
  }
}

// Decodes blocks of V full 16-symbol runs (run g on state vector g % V) while at least 16 * V
// words remain, so every 16-word load is in bounds. The V state vectors are independent, so
// their gathers overlap. Returns the number of runs decoded (a multiple of V).
template <typename Sym, int V>
__attribute__((target("avx512f,avx512bw"))) size_t DecodeRunsAvx512(
    uint32_t* states, const uint16_t*& wp, const uint16_t* wend, size_t runs, uint32_t num_ctx,
    const uint32_t* const* ent, const uint16_t* const* sym, const uint32_t* prob_bits, Sym* out) {
  __m512i xv[V];
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v) xv[v] = _mm512_loadu_si512(states + 16 * v);
  const uint16_t* wq = wp;  // local: the stores to out must not force reloads
  size_t g = 0;
  uint32_t c0 = 0;
  for (; g + V <= runs; g += V) {
    if (wend - wq < 16 * V) break;
    __m512i sv[V];
    uint32_t c = c0;
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      xv[v] = DecStep(xv[v], ent[c], sym[c], prob_bits[c], &sv[v]);
      c = c + 1 == num_ctx ? 0 : c + 1;
    }
    c0 = c;
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) xv[v] = DecRenorm(xv[v], wq);
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) DecStore(sv[v], out + (g + v) * kCtxRun);
  }
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v) _mm512_storeu_si512(states + 16 * v, xv[v]);
  wp = wq;
  return g;
}

// Decode step with one byte gather: `pack` holds, per slot, the symbol's index in the context's
// symbols lo..lo+kTab-1 (one byte, so a context's table is 2^p bytes and stays in L1), and the
// symbol's freq | start << 16 comes from an in-register table (kTab 16, 32 or 64 entries).
template <int kTab>
__attribute__((target("avx512f,avx512bw"), always_inline)) inline __m512i DecStepPacked(
    __m512i x, const uint8_t* pack, const uint32_t* ftab, __m512i lov, uint32_t p, __m512i* sv) {
  const __m512i low16 = _mm512_set1_epi32(0xFFFF);
  const __m512i slot = _mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>((1u << p) - 1)));
  const __m512i idx =
      _mm512_and_si512(_mm512_i32gather_epi32(slot, pack, 1), _mm512_set1_epi32(0xFF));
  __m512i f;
  if constexpr (kTab == 16) {
    f = _mm512_permutexvar_epi32(idx, _mm512_loadu_si512(ftab));
  } else if constexpr (kTab == 32) {
    f = _mm512_permutex2var_epi32(_mm512_loadu_si512(ftab), idx, _mm512_loadu_si512(ftab + 16));
  } else if constexpr (kTab == 64) {
    const __m512i f0 =
        _mm512_permutex2var_epi32(_mm512_loadu_si512(ftab), idx, _mm512_loadu_si512(ftab + 16));
    const __m512i f1 = _mm512_permutex2var_epi32(_mm512_loadu_si512(ftab + 32), idx,
                                                 _mm512_loadu_si512(ftab + 48));
    f = _mm512_mask_blend_epi32(_mm512_test_epi32_mask(idx, _mm512_set1_epi32(32)), f0, f1);
  } else {
    static_assert(kTab == 256);  // 1 KiB per context: a second gather, from L1
    f = _mm512_i32gather_epi32(idx, ftab, 4);
  }
  *sv = _mm512_add_epi32(idx, lov);
  const __m512i xs = _mm512_srl_epi32(x, _mm_cvtsi32_si128(static_cast<int>(p)));
  const __m512i bias = _mm512_sub_epi32(slot, _mm512_srli_epi32(f, 16));
  return _mm512_add_epi32(_mm512_mullo_epi32(_mm512_and_si512(f, low16), xs), bias);
}

template <typename Sym, int kTab, int V>
__attribute__((target("avx512f,avx512bw"))) size_t DecodeRunsPackedAvx512(
    uint32_t* states, const uint16_t*& wp, const uint16_t* wend, size_t runs, uint32_t num_ctx,
    const uint8_t* const* pack, const uint32_t* ftabs, uint32_t lo, const uint32_t* prob_bits,
    Sym* out) {
  __m512i xv[V];
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v) xv[v] = _mm512_loadu_si512(states + 16 * v);
  const __m512i lov = _mm512_set1_epi32(static_cast<int>(lo));
  const uint16_t* wq = wp;  // local: the stores to out must not force reloads
  size_t g = 0;
  uint32_t c0 = 0;
  for (; g + V <= runs; g += V) {
    if (wend - wq < 16 * V) break;
    __m512i sv[V];
    uint32_t c = c0;
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      xv[v] =
          DecStepPacked<kTab>(xv[v], pack[c], ftabs + size_t{c} * kTab, lov, prob_bits[c], &sv[v]);
      c = c + 1 == num_ctx ? 0 : c + 1;
    }
    c0 = c;
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) xv[v] = DecRenorm(xv[v], wq);
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) DecStore(sv[v], out + (g + v) * kCtxRun);
  }
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v) _mm512_storeu_si512(states + 16 * v, xv[v]);
  wp = wq;
  return g;
}

// Looks up 16 table entries by index: a gather (kTab 0) or in-register permutes of a table of
// kTab entries.
template <int kTab>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), always_inline)) inline __m512i
TableLookup(const uint32_t* tab, __m512i idx) {
  if constexpr (kTab == 0) {
    return _mm512_i32gather_epi32(idx, tab, 4);
  } else if constexpr (kTab == 16) {
    return _mm512_permutexvar_epi32(idx, _mm512_loadu_si512(tab));
  } else if constexpr (kTab == 32) {
    return _mm512_permutex2var_epi32(_mm512_loadu_si512(tab), idx, _mm512_loadu_si512(tab + 16));
  } else {
    static_assert(kTab == 64);
    const __m512i e0 =
        _mm512_permutex2var_epi32(_mm512_loadu_si512(tab), idx, _mm512_loadu_si512(tab + 16));
    const __m512i e1 =
        _mm512_permutex2var_epi32(_mm512_loadu_si512(tab + 32), idx, _mm512_loadu_si512(tab + 48));
    return _mm512_mask_blend_epi32(_mm512_test_epi32_mask(idx, _mm512_set1_epi32(32)), e0, e1);
  }
}

template <typename Sym, int kTab>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), always_inline)) inline void EncStep(
    const Sym* syms, size_t g, const uint32_t* tables, const float* rcps, size_t stride,
    const __m512i lov, const uint32_t* prob_bits, uint32_t& ctx, uint32_t num_ctx, uint16_t*& wp,
    __m512i& xr) {
  const __m512i low16 = _mm512_set1_epi32(0xFFFF);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i zero = _mm512_setzero_si512();
  const uint32_t p = prob_bits[ctx];
  const uint32_t* tab = tables + size_t{ctx} * stride;
  const uint32_t* rtab = reinterpret_cast<const uint32_t*>(rcps + size_t{ctx} * stride);
  __m512i idx;
  if constexpr (sizeof(Sym) == 1) {
    idx =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(syms + g * kCtxRun)));
  } else {
    idx = _mm512_cvtepu16_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(syms + g * kCtxRun)));
  }
  idx = _mm512_sub_epi32(idx, lov);
  const __m512i e = TableLookup<kTab>(tab, idx);
  const __m512 rcp = _mm512_castsi512_ps(TableLookup<kTab>(rtab, idx));
  const __m512i freq = _mm512_and_si512(e, low16);
  const __m512i start = _mm512_srli_epi32(e, 16);
  // freq << (32 - p), minus one: emit while x > that (x >= freq << (32 - p)); a symbol with
  // freq = 2^p wraps to 0xFFFFFFFF and never emits.
  const __m512i xmax1 =
      _mm512_sub_epi32(_mm512_sll_epi32(freq, _mm_cvtsi32_si128(static_cast<int>(32 - p))), one);
  __m512i x = xr;
  const __mmask16 emit = _mm512_cmpgt_epu32_mask(x, xmax1);
  const unsigned k = static_cast<unsigned>(std::popcount(static_cast<unsigned>(emit)));
  __m256i w = _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(emit, x));
  // Keeps the narrowing in a register: GCC would fuse it with the masked store into a
  // narrowing store (vpmovdw to memory), which is slow on Zen 4.
  asm("" : "+v"(w));
  wp -= k;
  _mm256_mask_storeu_epi16(wp, static_cast<__mmask16>((1u << k) - 1), w);
  x = _mm512_mask_srli_epi32(x, emit, x, 16);
  const __m512 qf = _mm512_mul_ps(_mm512_cvtepu32_ps(x), rcp);
  __m512i q = _mm512_cvttps_epu32(qf);
  __m512i r = _mm512_sub_epi32(x, _mm512_mullo_epi32(q, freq));
  const __mmask16 neg = _mm512_cmplt_epi32_mask(r, zero);
  q = _mm512_mask_sub_epi32(q, neg, q, one);
  r = _mm512_mask_add_epi32(r, neg, r, freq);
  const __mmask16 over = _mm512_cmpge_epu32_mask(r, freq);
  q = _mm512_mask_add_epi32(q, over, q, one);
  r = _mm512_mask_sub_epi32(r, over, r, freq);
  xr = _mm512_add_epi32(_mm512_sll_epi32(q, _mm_cvtsi32_si128(static_cast<int>(p))),
                        _mm512_add_epi32(r, start));
  ctx = ctx == 0 ? num_ctx - 1 : ctx - 1;
}

// Runs b * V + V - 1 .. b * V, one per state vector.
template <typename Sym, int kTab, int V, size_t... I>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), always_inline)) inline void EncBlock(
    const Sym* syms, size_t b, const uint32_t* tables, const float* rcps, size_t stride,
    const __m512i lov, const uint32_t* prob_bits, uint32_t& ctx, uint32_t num_ctx, uint16_t*& wp,
    __m512i* xv, std::index_sequence<I...>) {
  ((EncStep<Sym, kTab>(syms, b * V + (V - 1 - I), tables, rcps, stride, lov, prob_bits, ctx,
                       num_ctx, wp, xv[V - 1 - I])),
   ...);
}

// Encodes full 16-symbol runs g = runs-1 .. 0 (backwards, as the scalar loop), run g on the
// state vector g % V (lanes 16 * (g % V) ..). Per-context tables hold freq | start << 16 per
// symbol, `stride` entries per context starting at symbol `lo`. kTab selects the lookup:
// 0 = gather, 16/32/64 = in-register permutes of a table of that many entries.
// q = x / freq comes from x times the float reciprocal of freq (three roundings of 2^-24 each:
// relative error < 2^-22, and q < 2^(32-p) <= 2^21, so the estimate is within 1 of the
// quotient; a multiply has a shorter latency than a division) corrected by one step each way:
// the result is exact, so the stream is identical to the scalar encoder's bit for bit.
template <typename Sym, int kTab, int V>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) void EncodeRunsAvx512(
    const Sym* syms, size_t runs, uint32_t num_ctx, const uint32_t* tables, const float* rcps,
    size_t stride, uint32_t lo, const uint32_t* prob_bits, uint32_t* states, uint16_t*& wp_ref) {
  // runs is a multiple of V: run b * V + v uses state vector v.
  __m512i xv[V];
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v) xv[v] = _mm512_loadu_si512(states + 16 * v);
  const __m512i lov = _mm512_set1_epi32(static_cast<int>(lo));
  uint16_t* wp = wp_ref;
  uint32_t ctx = static_cast<uint32_t>((runs - 1) % num_ctx);
  for (size_t b = runs / V; b-- > 0;) {
    // Unrolled by a fold over the chains, so the states stay in registers (GCC did not unroll
    // the loop and kept them on the stack).
    EncBlock<Sym, kTab, V>(syms, b, tables, rcps, stride, lov, prob_bits, ctx, num_ctx, wp, xv,
                           std::make_index_sequence<V>{});
  }
  wp_ref = wp;
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v) _mm512_storeu_si512(states + 16 * v, xv[v]);
}
#endif

}  // namespace

void ForceScalarForTesting(bool on) { g_force_scalar = on; }

bool SimdDecodeAvailable() {
#if STRATA_RANS_AVX512
  return CpuHasAvx512();
#else
  return false;
#endif
}

template <typename Sym>
double EmpiricalEntropyBits(const Sym* syms, size_t n, uint32_t alphabet, uint32_t num_ctx) {
  std::vector<uint32_t> counts(size_t{alphabet} * num_ctx, 0);
  HistogramImpl(syms, n, alphabet, num_ctx, counts.data());
  double bits = 0;
  for (uint32_t c = 0; c < num_ctx; ++c) {
    const uint32_t* h = counts.data() + size_t{c} * alphabet;
    uint64_t total = 0;
    for (uint32_t s = 0; s < alphabet; ++s) total += h[s];
    for (uint32_t s = 0; s < alphabet; ++s)
      if (h[s]) bits += h[s] * std::log2(static_cast<double>(total) / h[s]);
  }
  return bits;
}

template <typename Sym>
void Encode(const Sym* syms, size_t n, uint32_t alphabet, uint32_t num_ctx, Scratch* scratch,
            std::vector<uint8_t>* out, CoderStats* stats, int lanes, const uint32_t* given,
            SharedEncoder* shared) {
  const int L = shared || lanes == 128 ? 128 : lanes == 64 ? 64 : 32;
  internal::ByteWriter w(out);
  const size_t table_start = out->size();
  std::vector<uint32_t>& counts = scratch->counts;
  if (given) {
    counts.assign(given, given + size_t{alphabet} * num_ctx);
  } else {
    counts.assign(size_t{alphabet} * num_ctx, 0);
    HistogramImpl(syms, n, alphabet, num_ctx, counts.data());
  }

  scratch->enc_syms.resize(size_t{alphabet} * num_ctx * sizeof(EncSym));
  EncSym* enc = reinterpret_cast<EncSym*>(scratch->enc_syms.data());
  for (size_t i = 0; i < size_t{alphabet} * num_ctx; ++i) enc[i].freq = 0;
  std::vector<uint32_t> freqs(alphabet);
  uint32_t ctx_bits[kMaxContexts] = {};
  uint32_t ctx_lo[kMaxContexts], ctx_hi[kMaxContexts];
  double entropy = 0;
  for (uint32_t c = 0; c < num_ctx; ++c) {
    const uint32_t* h = counts.data() + size_t{c} * alphabet;
    uint32_t lo = alphabet, hi = 0, used = 0;
    uint64_t total = 0;
    for (uint32_t s = 0; s < alphabet; ++s) {
      if (!h[s]) continue;
      lo = std::min(lo, s);
      hi = s;
      ++used;
      total += h[s];
    }
    ctx_lo[c] = lo;
    ctx_hi[c] = hi;
    if (total == 0) {
      w.U8(0);
      continue;
    }
    for (uint32_t s = lo; s <= hi; ++s)
      if (h[s]) entropy += h[s] * std::log2(static_cast<double>(total) / h[s]);
    const int p = ChooseProbBits(used);
    ctx_bits[c] = static_cast<uint32_t>(p);
    const uint32_t count = hi - lo + 1;
    Normalize(h + lo, count, total, p, freqs.data());
    w.U8(static_cast<uint8_t>(p));
    w.Varint(lo);
    w.Varint(count);
    uint32_t start = 0;
    EncSym* e = enc + size_t{c} * alphabet;
    for (uint32_t i = 0; i < count; ++i) {
      const uint32_t f = freqs[i];
      w.Varint(f);
      EncSym& es = e[lo + i];
      es.freq = f;
      es.start = start;
      es.shift = static_cast<uint32_t>(p);
      if (f) {
        es.rcp = ~uint64_t{0} / f;
        es.x_max = static_cast<uint32_t>(std::min<uint64_t>(uint64_t{f} << (32 - p), 0xFFFFFFFFu));
      }
      start += f;
    }
  }
  const size_t table_bytes = out->size() - table_start;
  if (stats && given) {
    // Statistics are of the symbols themselves, whatever the tables were built from.
    std::vector<uint32_t> exact(size_t{alphabet} * num_ctx, 0);
    HistogramImpl(syms, n, alphabet, num_ctx, exact.data());
    entropy = 0;
    for (uint32_t c = 0; c < num_ctx; ++c) {
      const uint32_t* h = exact.data() + size_t{c} * alphabet;
      uint64_t total = 0;
      for (uint32_t s = 0; s < alphabet; ++s) total += h[s];
      for (uint32_t s = 0; s < alphabet; ++s)
        if (h[s]) entropy += h[s] * std::log2(static_cast<double>(total) / h[s]);
    }
  }

  // Encode backwards; words are written from the end of the buffer towards its front (at most
  // one word per symbol, +1: the unconditional store at wp[-1]; + L for the final states).
  uint16_t* wend;
  uint32_t own_states[kMaxLanes];
  uint32_t* x = own_states;
  if (shared) {
    wend = shared->Chunk(shared->used, n + 1) + n + 1;
    x = shared->x;
  } else {
    std::vector<uint16_t>& words = scratch->words;
    words.resize(n + L + 1);
    wend = words.data() + words.size();
    for (int l = 0; l < L; ++l) x[l] = kL;
  }
  uint16_t* wp = wend;
  const size_t runs = (n + kCtxRun - 1) / kCtxRun;
  auto scalar_run = [&](size_t g) {
    const EncSym* tab = enc + size_t(g % num_ctx) * alphabet;
    const size_t base = g * kCtxRun;
    const int cnt = static_cast<int>(std::min<size_t>(kCtxRun, n - base));
    uint32_t* xl = x + (base % L);
    for (int l = cnt - 1; l >= 0; --l) {
      const EncSym& s = tab[syms[base + l]];
      uint32_t xs = xl[l];
      // Branchless renormalisation: the word is always written, the pointer moves only when
      // it is needed (an unpredictable branch here costs more than the coding itself).
      const bool emit = xs >= s.x_max;
      wp[-1] = static_cast<uint16_t>(xs);
      wp -= emit;
      xs = emit ? xs >> 16 : xs;
      uint64_t q = MulHi64(xs, s.rcp);
      uint32_t r = xs - static_cast<uint32_t>(q) * s.freq;
      if (r >= s.freq) {
        ++q;
        r -= s.freq;
      }
      xl[l] = (static_cast<uint32_t>(q) << s.shift) + r + s.start;
    }
  };
  size_t g = runs;
  if (n % kCtxRun != 0) scalar_run(--g);  // the partial run is the last one
#if STRATA_RANS_AVX512
  const size_t V = static_cast<size_t>(L / 16);
  if (g >= V && CpuHasAvx512() && !g_force_scalar) {
    while (g % V != 0) scalar_run(--g);  // the vector loop takes whole blocks of V runs
    // Packed per-context tables for the vector loop: freq | start << 16, symbols lo..hi.
    uint32_t lo = alphabet, hi = 0;
    for (uint32_t c = 0; c < num_ctx; ++c) {
      lo = std::min(lo, ctx_lo[c]);
      hi = std::max(hi, ctx_hi[c]);
    }
    const uint32_t span = hi - lo + 1;
    const size_t stride = span <= 16 ? 16 : span <= 32 ? 32 : span <= 64 ? 64 : alphabet;
    if (stride == alphabet) lo = 0;
    scratch->enc_ent.assign(stride * num_ctx, 0);
    scratch->enc_rcp.assign(stride * num_ctx, 0.0f);
    for (uint32_t c = 0; c < num_ctx; ++c)
      for (uint32_t sy = ctx_lo[c]; sy <= ctx_hi[c] && sy < alphabet; ++sy) {
        const EncSym& es = enc[size_t{c} * alphabet + sy];
        if (es.freq) {
          scratch->enc_ent[c * stride + (sy - lo)] = es.freq | es.start << 16;
          scratch->enc_rcp[c * stride + (sy - lo)] = 1.0f / static_cast<float>(es.freq);
        }
      }
    const uint32_t* tabs = scratch->enc_ent.data();
    const float* rcps = scratch->enc_rcp.data();
    WithChains(V, [&](auto v) {
      WithTableSpan<0>(stride, [&](auto span) {
        EncodeRunsAvx512<Sym, decltype(span)::value, decltype(v)::value>(
            syms, g, num_ctx, tabs, rcps, stride, lo, ctx_bits, x, wp);
      });
    });
    g = 0;
  }
#endif
  while (g-- > 0) scalar_run(g);
  const size_t nwords = static_cast<size_t>(wend - wp);
  size_t stream_bytes = nwords * 2;
  if (shared) {
    const size_t k = shared->used++;
    shared->end[k] = n + 1;
    shared->begin[k] = n + 1 - nwords;
  } else {
    stream_bytes += size_t(L) * 4;
    w.Varint(static_cast<uint32_t>(stream_bytes));
    w.Raw(x, size_t(L) * 4);
    w.Raw(wp, nwords * 2);
  }
  if (stats) {
    stats->entropy_bits += entropy;
    stats->stream_bits += stream_bytes * 8;
    stats->table_bits += table_bytes * 8;
    stats->symbols += n;
  }
}

void SharedEncoder::Reset() {
  for (uint32_t& v : x) v = kL;
  used = 0;
}

uint16_t* SharedEncoder::Chunk(size_t k, size_t size) {
  if (chunks.size() <= k) {
    chunks.resize(k + 1);
    capacity.resize(k + 1, 0);
    begin.resize(k + 1, 0);
    end.resize(k + 1, 0);
  }
  if (capacity[k] < size) {
    chunks[k].reset(new uint16_t[size]);  // default-initialised: not zero-filled
    capacity[k] = size;
  }
  return chunks[k].get();
}

void FinishShared(SharedEncoder* enc, std::vector<uint8_t>* out, CoderStats* stats) {
  size_t words = 0;
  for (size_t k = 0; k < enc->used; ++k) words += enc->end[k] - enc->begin[k];
  const size_t at = out->size();
  out->resize(at + sizeof(enc->x) + words * 2);
  uint8_t* p = out->data() + at;
  std::memcpy(p, enc->x, sizeof(enc->x));
  p += sizeof(enc->x);
  // The last section's words are read first.
  for (size_t k = enc->used; k-- > 0;) {
    const size_t len = (enc->end[k] - enc->begin[k]) * 2;
    std::memcpy(p, enc->chunks[k].get() + enc->begin[k], len);
    p += len;
  }
  if (stats) stats->stream_bits += sizeof(enc->x) * 8;
  enc->Reset();
}

absl::Status StartShared(std::span<const uint8_t> payload, SharedDecoder* dec) {
  if (payload.size() < sizeof(dec->x) || (payload.size() - sizeof(dec->x)) % 2 != 0)
    return absl::DataLossError("rans: bad shared stream length");
  std::memcpy(dec->x, payload.data(), sizeof(dec->x));
  for (uint32_t v : dec->x)
    if (v < kL) return absl::DataLossError("rans: bad initial state in the shared stream");
  // Words are read in place (LoadWord, unaligned vector loads), never past wend.
  const size_t nwords = (payload.size() - sizeof(dec->x)) / 2;
  dec->wp = reinterpret_cast<const uint16_t*>(payload.data() + sizeof(dec->x));
  dec->wend = dec->wp + nwords;
  return absl::OkStatus();
}

absl::Status FinishShared(const SharedDecoder& dec) {
  if (dec.wp != dec.wend) return absl::DataLossError("rans: shared stream has trailing words");
  for (uint32_t v : dec.x)
    if (v != kL) return absl::DataLossError("rans: shared stream's final states mismatch");
  return absl::OkStatus();
}

template <typename Sym>
absl::Status Decode(internal::ByteReader& in, size_t n, uint32_t alphabet, uint32_t num_ctx,
                    Scratch* scratch, Sym* out, int lanes, SharedDecoder* shared) {
  if (shared) lanes = 128;
  if (lanes != 32 && lanes != 64 && lanes != 128)
    return absl::InternalError("rans: lanes must be 32, 64 or 128");
  const int L = lanes;
  if (alphabet == 0 || alphabet > kMaxAlphabet || num_ctx == 0 || num_ctx > kMaxContexts)
    return absl::DataLossError("rans: bad alphabet or context count");
  if constexpr (sizeof(Sym) == 1) {
    if (alphabet > 256) return absl::InternalError("rans: alphabet too large for 8-bit symbols");
  }
  uint32_t prob_bits[kMaxContexts];
  size_t offsets[kMaxContexts];
  size_t total_entries = 0;
  // Pass 1: validate tables and size the decode tables.
  const uint8_t* tables_begin = in.pos();
  for (uint32_t c = 0; c < num_ctx; ++c) {
    uint8_t p = 0;
    if (auto s = in.Read(&p); !s.ok()) return s;
    prob_bits[c] = p;
    offsets[c] = total_entries;
    if (p == 0) continue;
    if (p > kMaxProbBits) return absl::DataLossError("rans: probability precision out of range");
    uint32_t lo = 0, count = 0;
    if (auto s = in.Varint(&lo); !s.ok()) return s;
    if (auto s = in.Varint(&count); !s.ok()) return s;
    if (count == 0 || lo >= alphabet || count > alphabet - lo)
      return absl::DataLossError("rans: table symbol range outside the alphabet");
    uint64_t sum = 0;
    for (uint32_t i = 0; i < count; ++i) {
      uint32_t f = 0;
      if (auto s = in.Varint(&f); !s.ok()) return s;
      sum += f;
      if (sum > (uint64_t{1} << p)) return absl::DataLossError("rans: frequencies overflow");
    }
    if (sum != (uint64_t{1} << p)) return absl::DataLossError("rans: frequencies do not sum up");
    total_entries += size_t{1} << p;
  }
  const size_t runs = (n + kCtxRun - 1) / kCtxRun;
  for (uint32_t c = 0; c < num_ctx && c < runs; ++c)
    if (prob_bits[c] == 0) return absl::DataLossError("rans: symbols in an empty context");

  // Pass 2: the symbol range over all contexts (tables validated above: plain reads are safe).
  const size_t table_len = static_cast<size_t>(in.pos() - tables_begin);
  uint32_t sym_lo = alphabet, sym_hi = 0;
  {
    internal::ByteReader t(tables_begin, table_len, "rans");
    for (uint32_t c = 0; c < num_ctx; ++c) {
      uint8_t p = 0;
      (void)t.Read(&p);
      if (p == 0) continue;
      uint32_t lo = 0, count = 0, f = 0;
      (void)t.Varint(&lo);
      (void)t.Varint(&count);
      sym_lo = std::min(sym_lo, lo);
      sym_hi = std::max(sym_hi, lo + count - 1);
      for (uint32_t i = 0; i < count; ++i) (void)t.Varint(&f);
    }
  }
  const uint32_t span = sym_hi >= sym_lo ? sym_hi - sym_lo + 1 : 0;
  const size_t full_runs = n / kCtxRun;
  // Packed tables (the AVX-512 byte-gather decoder, and the scalar finish after it): per slot
  // the symbol's index (symbol - sym_lo, one byte), per index freq | start << 16. Built straight
  // from the frequencies (a memset per symbol), without the per-slot entry tables.
  bool packed = false;
  uint32_t tab = 0;
#if STRATA_RANS_AVX512
  packed =
      CpuHasAvx512() && !g_force_scalar && full_runs >= size_t(L / 16) && span > 0 && span <= 256;
  tab = span <= 16 ? 16 : span <= 32 ? 32 : span <= 64 ? 64 : 256;
#endif
  const uint32_t* ent[kMaxContexts];
  const uint16_t* sym[kMaxContexts];
  const uint8_t* pack[kMaxContexts];
  internal::ByteReader t(tables_begin, table_len, "rans");
  if (packed) {
    scratch->dec_pack8.resize(total_entries + 4);  // +4: the gather reads 4 bytes per slot
    scratch->dec_ftab.assign(size_t{tab} * num_ctx, 0);
    for (uint32_t c = 0; c < num_ctx; ++c) {
      uint8_t p = 0;
      (void)t.Read(&p);
      pack[c] = scratch->dec_pack8.data() + offsets[c];
      if (p == 0) continue;
      uint32_t lo = 0, count = 0;
      (void)t.Varint(&lo);
      (void)t.Varint(&count);
      uint8_t* pk = scratch->dec_pack8.data() + offsets[c];
      uint32_t* ft = scratch->dec_ftab.data() + size_t{c} * tab;
      uint32_t start = 0;
      for (uint32_t i = 0; i < count; ++i) {
        uint32_t f = 0;
        (void)t.Varint(&f);
        if (f == 0) continue;
        const uint32_t k = lo + i - sym_lo;
        std::memset(pk + start, static_cast<int>(k), f);
        ft[k] = f | start << 16;
        start += f;
      }
    }
  } else {
    scratch->dec_entry.resize(total_entries);
    scratch->dec_sym.resize(total_entries + 2);  // +2: the SIMD gather reads 4 bytes
    for (uint32_t c = 0; c < num_ctx; ++c) {
      uint8_t p = 0;
      (void)t.Read(&p);
      ent[c] = scratch->dec_entry.data() + offsets[c];
      sym[c] = scratch->dec_sym.data() + offsets[c];
      if (p == 0) continue;
      uint32_t lo = 0, count = 0;
      (void)t.Varint(&lo);
      (void)t.Varint(&count);
      uint32_t* e = scratch->dec_entry.data() + offsets[c];
      uint16_t* sy = scratch->dec_sym.data() + offsets[c];
      uint32_t start = 0;
      for (uint32_t i = 0; i < count; ++i) {
        uint32_t f = 0;
        (void)t.Varint(&f);
        for (uint32_t j = 0; j < f; ++j) {
          e[start + j] = (f << 16) | j;
          sy[start + j] = static_cast<uint16_t>(lo + i);
        }
        start += f;
      }
    }
  }

  uint32_t own_states[kMaxLanes];
  uint32_t* x = own_states;
  const uint16_t* wp;
  const uint16_t* wend;
  if (shared) {
    x = shared->x;
    wp = shared->wp;
    wend = shared->wend;
  } else {
    uint32_t stream_bytes = 0;
    if (auto s = in.Varint(&stream_bytes); !s.ok()) return s;
    if (stream_bytes < size_t(L) * 4 || (stream_bytes - size_t(L) * 4) % 2 != 0)
      return absl::DataLossError("rans: bad stream length");
    const uint8_t* sp;
    if (auto s = in.Take(stream_bytes, &sp); !s.ok()) return s;
    std::memcpy(x, sp, size_t(L) * 4);
    for (int l = 0; l < L; ++l)
      if (x[l] < kL) return absl::DataLossError("rans: bad initial state");
    // Words are read in place (LoadWord, unaligned vector loads), never past wend: copying
    // them out of the blob was ~9% of an 8-bit section's decoding.
    const size_t nwords = (stream_bytes - size_t(L) * 4) / 2;
    wp = reinterpret_cast<const uint16_t*>(sp + size_t(L) * 4);
    wend = wp + nwords;
  }

  size_t g = 0;
#if STRATA_RANS_AVX512
  const int V = L / 16;
  if (CpuHasAvx512() && !g_force_scalar && full_runs >= size_t(V)) {
    if (packed) {
      // One byte gather per step: slot -> symbol index; freq | start by symbol index from
      // registers (span <= 64) or from a small L1-resident table (span <= 256).
      const uint32_t* ft = scratch->dec_ftab.data();
      g = WithChains(V, [&](auto v) {
        return WithTableSpan<256>(tab, [&](auto span) {
          return DecodeRunsPackedAvx512<Sym, decltype(span)::value, decltype(v)::value>(
              x, wp, wend, full_runs, num_ctx, pack, ft, sym_lo, prob_bits, out);
        });
      });
    } else {
      g = WithChains(V, [&](auto v) {
        return DecodeRunsAvx512<Sym, decltype(v)::value>(x, wp, wend, full_runs, num_ctx, ent, sym,
                                                         prob_bits, out);
      });
    }
  }
#endif
  uint32_t ctx = static_cast<uint32_t>(g % num_ctx);
  if (packed) {
    // Scalar finish on the packed tables.
    for (; g < runs; ++g) {
      const uint32_t p = prob_bits[ctx];
      const uint32_t mask = (1u << p) - 1;
      const uint8_t* pk = pack[ctx];
      const uint32_t* ft = scratch->dec_ftab.data() + size_t{ctx} * tab;
      const size_t base = g * kCtxRun;
      uint32_t* xl = x + (base % L);
      const int cnt = static_cast<int>(std::min<size_t>(kCtxRun, n - base));
      for (int l = 0; l < cnt; ++l) {
        uint32_t xs = xl[l];
        const uint32_t slot = xs & mask;
        const uint32_t k = pk[slot];
        const uint32_t fe = ft[k];
        out[base + l] = static_cast<Sym>(k + sym_lo);
        xs = (fe & 0xFFFF) * (xs >> p) + slot - (fe >> 16);
        if (xs < kL) {
          if (wp == wend) return absl::DataLossError("rans: stream exhausted");
          xs = (xs << 16) | LoadWord(wp++);
        }
        xl[l] = xs;
      }
      if (++ctx == num_ctx) ctx = 0;
    }
  }
  for (; g < runs; ++g) {
    const uint32_t p = prob_bits[ctx];
    const uint32_t mask = (1u << p) - 1;
    const uint32_t* e = ent[ctx];
    const uint16_t* sy = sym[ctx];
    const size_t base = g * kCtxRun;
    uint32_t* xl = x + (base % L);
    const int cnt = static_cast<int>(std::min<size_t>(kCtxRun, n - base));
    if (cnt == kCtxRun && wend - wp >= kCtxRun) {
      for (int l = 0; l < kCtxRun; ++l) {
        uint32_t xs = xl[l];
        const uint32_t slot = xs & mask;
        const uint32_t en = e[slot];
        out[base + l] = static_cast<Sym>(sy[slot]);
        xs = (en >> 16) * (xs >> p) + (en & 0xFFFF);
        const bool need = xs < kL;
        const uint32_t word = LoadWord(wp);
        xs = need ? (xs << 16) | word : xs;
        wp += need;
        xl[l] = xs;
      }
    } else {
      for (int l = 0; l < cnt; ++l) {
        uint32_t xs = xl[l];
        const uint32_t slot = xs & mask;
        const uint32_t en = e[slot];
        out[base + l] = static_cast<Sym>(sy[slot]);
        xs = (en >> 16) * (xs >> p) + (en & 0xFFFF);
        if (xs < kL) {
          if (wp == wend) return absl::DataLossError("rans: stream exhausted");
          xs = (xs << 16) | LoadWord(wp++);
        }
        xl[l] = xs;
      }
    }
    if (++ctx == num_ctx) ctx = 0;
  }
  if (shared) {
    shared->wp = wp;  // the states were updated in place; the stream's end is checked once
    return absl::OkStatus();
  }
  if (wp != wend) return absl::DataLossError("rans: stream has trailing words");
  for (int l = 0; l < L; ++l)
    if (x[l] != kL) return absl::DataLossError("rans: final state mismatch (corrupt stream)");
  return absl::OkStatus();
}

template <typename Sym>
void Histogram(const Sym* syms, size_t n, uint32_t alphabet, uint32_t num_ctx, uint32_t* counts) {
  HistogramImpl(syms, n, alphabet, num_ctx, counts);
}

template void Encode<uint8_t>(const uint8_t*, size_t, uint32_t, uint32_t, Scratch*,
                              std::vector<uint8_t>*, CoderStats*, int, const uint32_t*,
                              SharedEncoder*);
template void Encode<uint16_t>(const uint16_t*, size_t, uint32_t, uint32_t, Scratch*,
                               std::vector<uint8_t>*, CoderStats*, int, const uint32_t*,
                               SharedEncoder*);
template void Histogram<uint8_t>(const uint8_t*, size_t, uint32_t, uint32_t, uint32_t*);
template void Histogram<uint16_t>(const uint16_t*, size_t, uint32_t, uint32_t, uint32_t*);
template absl::Status Decode<uint8_t>(internal::ByteReader&, size_t, uint32_t, uint32_t, Scratch*,
                                      uint8_t*, int, SharedDecoder*);
template absl::Status Decode<uint16_t>(internal::ByteReader&, size_t, uint32_t, uint32_t, Scratch*,
                                       uint16_t*, int, SharedDecoder*);
template double EmpiricalEntropyBits<uint8_t>(const uint8_t*, size_t, uint32_t, uint32_t);
template double EmpiricalEntropyBits<uint16_t>(const uint16_t*, size_t, uint32_t, uint32_t);

}  // namespace strata::codec::rans
