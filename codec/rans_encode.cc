// The rANS encoder: the scalar loop, the AVX-512 loop (bit-identical streams), and the stream
// shared by the sections of a blob.
#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "codec/internal/rans_simd.h"
#include "codec/internal/rans_tables.h"
#include "codec/rans.h"

namespace strata::codec::rans {
namespace {

// Words a buffer keeps in front of the lowest word an encoding can reach: the scalar loop
// stores at wp[-1] and the AVX2 loop 8 words below wp before either knows how many it keeps.
constexpr size_t kWordSlack = 8;

inline uint64_t MulHi64(uint64_t a, uint64_t b) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
}

#if STRATA_RANS_AVX512
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
    const __m512i lov, const int* shifts, uint32_t& ctx, uint32_t num_ctx, uint16_t*& wp,
    __m512i& xr) {
  const __m512i low16 = _mm512_set1_epi32(0xFFFF);
  const __m512i one = _mm512_set1_epi32(1);
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
      _mm512_sub_epi32(_mm512_sllv_epi32(freq, _mm512_set1_epi32(shifts[2 * ctx + 1])), one);
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
  __m512i q = _mm512_cvttps_epu32(qf);  // the quotient or one less (QuotientReciprocal)
  __m512i r = _mm512_sub_epi32(x, _mm512_mullo_epi32(q, freq));
  const __mmask16 over = _mm512_cmpge_epu32_mask(r, freq);
  q = _mm512_mask_add_epi32(q, over, q, one);
  r = _mm512_mask_sub_epi32(r, over, r, freq);
  xr = _mm512_add_epi32(_mm512_sllv_epi32(q, _mm512_set1_epi32(shifts[2 * ctx])),
                        _mm512_add_epi32(r, start));
  ctx = ctx == 0 ? num_ctx - 1 : ctx - 1;
}

// Runs b * V + V - 1 .. b * V, one per state vector.
template <typename Sym, int kTab, int V, size_t... I>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"), always_inline)) inline void EncBlock(
    const Sym* syms, size_t b, const uint32_t* tables, const float* rcps, size_t stride,
    const __m512i lov, const int* shifts, uint32_t& ctx, uint32_t num_ctx, uint16_t*& wp,
    __m512i* xv, std::index_sequence<I...>) {
  ((EncStep<Sym, kTab>(syms, b * V + (V - 1 - I), tables, rcps, stride, lov, shifts, ctx,
                       num_ctx, wp, xv[V - 1 - I])),
   ...);
}

// Encodes full 16-symbol runs g = runs-1 .. 0 (backwards, as the scalar loop), run g on the
// state vector g % V (lanes 16 * (g % V) ..). Per-context tables hold freq | start << 16 per
// symbol, `stride` entries per context starting at symbol `lo`. kTab selects the lookup:
// 0 = gather, 16/32/64 = in-register permutes of a table of that many entries.
// q = x / freq comes from x times a float reciprocal of freq biased low (QuotientReciprocal:
// q < 2^(32-p) <= 2^21, and the estimate is the quotient or one less; a multiply has a shorter
// latency than a division) corrected by one step up: the result is exact, so the stream is
// identical to the scalar encoder's bit for bit.
template <typename Sym, int kTab, int V>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) void EncodeRunsAvx512(
    const Sym* syms, size_t runs, uint32_t num_ctx, const uint32_t* tables, const float* rcps,
    size_t stride, uint32_t lo, const uint32_t* prob_bits, uint32_t* states, uint16_t*& wp_ref) {
  // runs is a multiple of V: run b * V + v uses state vector v.
  __m512i xv[V];
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v) xv[v] = _mm512_loadu_si512(states + 16 * v);
  const __m512i lov = _mm512_set1_epi32(static_cast<int>(lo));
  // Per context p and 32 - p, read as broadcast operands: a shift by a count in a register takes
  // a vector-port uop to move the count and another in the shift (four per step).
  int shifts[2 * kMaxContexts];
  for (uint32_t c = 0; c < num_ctx; ++c) {
    shifts[2 * c] = static_cast<int>(prob_bits[c]);
    shifts[2 * c + 1] = 32 - static_cast<int>(prob_bits[c]);
  }
  uint16_t* wp = wp_ref;
  uint32_t ctx = static_cast<uint32_t>((runs - 1) % num_ctx);
  for (size_t b = runs / V; b-- > 0;) {
    // Unrolled by a fold over the chains, so the states stay in registers (GCC did not unroll
    // the loop and kept them on the stack).
    EncBlock<Sym, kTab, V>(syms, b, tables, rcps, stride, lov, shifts, ctx, num_ctx, wp, xv,
                           std::make_index_sequence<V>{});
  }
  wp_ref = wp;
#pragma GCC unroll 8
  for (int v = 0; v < V; ++v) _mm512_storeu_si512(states + 16 * v, xv[v]);
}

// The AVX2 loop (x86 cores without AVX-512): each run as two 8-lane halves, the high lanes
// first, otherwise EncodeRunsAvx512's arithmetic, so the same stream. AVX2 has neither a
// compress nor unsigned conversions and compares: a half's words are permuted to the top of a
// vector by its emit mask (kCompress) and stored as 8 words ending at wp (the words below are
// written over by the next ones: the buffers keep kWordSlack words in front); float(x) is its
// two 16-bit halves' sum, rounded once; the compares go through the sign bit.
#define STRATA_AVX2_ENC __attribute__((target("avx2,bmi,bmi2,popcnt,fma"), always_inline)) inline

struct CompressTable {
  uint8_t lane[256][8];  // mask m: lanes 8 - popcount(m) .. 7 take m's set lanes, in order
};
constexpr CompressTable MakeCompressTable() {
  CompressTable t{};
  for (int m = 0; m < 256; ++m) {
    int j = 8 - std::popcount(static_cast<unsigned>(m));
    for (int i = 0; i < 8; ++i)
      if ((m >> i) & 1) t.lane[m][j++] = static_cast<uint8_t>(i);
  }
  return t;
}
alignas(64) constexpr CompressTable kCompress = MakeCompressTable();

// 8 entries of a context's table by index: in-register permutes (kTab 16 or 32), else a gather.
template <int kTab>
STRATA_AVX2_ENC __m256i Lookup8(const uint32_t* tab, __m256i idx) {
  if constexpr (kTab == 16 || kTab == 32) {
    auto part = [&](int j) __attribute__((target("avx2"), always_inline)) {
      return _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tab + 8 * j)), idx));
    };
    auto pick = [&](__m256 a, __m256 b, int bit) __attribute__((target("avx2"), always_inline)) {
      return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 31 - bit)));
    };
    if constexpr (kTab == 16) return _mm256_castps_si256(pick(part(0), part(1), 3));
    return _mm256_castps_si256(pick(pick(part(0), part(1), 3), pick(part(2), part(3), 3), 4));
  } else {
    return _mm256_i32gather_epi32(reinterpret_cast<const int*>(tab), idx, 4);
  }
}

template <int kTab>
STRATA_AVX2_ENC __m256i EncHalfAvx2(__m256i x, __m256i idx, const uint32_t* tab,
                                    const uint32_t* rtab, __m128i p, __m128i pinv, uint16_t*& wp) {
  const __m256i low16 = _mm256_set1_epi32(0xFFFF);
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i e = Lookup8<kTab>(tab, idx);
  const __m256 rcp = _mm256_castsi256_ps(Lookup8<kTab>(rtab, idx));
  const __m256i freq = _mm256_and_si256(e, low16);
  const __m256i start = _mm256_srli_epi32(e, 16);
  const __m256i xmax1 = _mm256_sub_epi32(_mm256_sll_epi32(freq, pinv), _mm256_set1_epi32(1));
  const __m256i emit =
      _mm256_cmpgt_epi32(_mm256_xor_si256(x, sign), _mm256_xor_si256(xmax1, sign));
  const unsigned m = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(emit)));
  const __m256i at = _mm256_cvtepu8_epi32(
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(kCompress.lane[m])));
  const __m256i words =
      _mm256_permutevar8x32_epi32(_mm256_and_si256(x, low16), at);  // emitted words on top
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(words, words), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(wp - 8), _mm256_castsi256_si128(packed));
  wp -= std::popcount(m);
  x = _mm256_blendv_epi8(x, _mm256_srli_epi32(x, 16), emit);
  const __m256 xf = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(x, 16)),
                                    _mm256_set1_ps(65536.0f),
                                    _mm256_cvtepi32_ps(_mm256_and_si256(x, low16)));
  __m256i q = _mm256_cvttps_epi32(_mm256_mul_ps(xf, rcp));  // the quotient or one less
  __m256i r = _mm256_sub_epi32(x, _mm256_mullo_epi32(q, freq));
  const __m256i over = _mm256_cmpgt_epi32(r, _mm256_sub_epi32(freq, _mm256_set1_epi32(1)));
  q = _mm256_sub_epi32(q, over);
  r = _mm256_sub_epi32(r, _mm256_and_si256(over, freq));
  return _mm256_add_epi32(_mm256_sll_epi32(q, p), _mm256_add_epi32(r, start));
}

template <typename Sym>
STRATA_AVX2_ENC __m256i Indexes8(const Sym* s, __m256i lov) {
  __m256i v;
  if constexpr (sizeof(Sym) == 1) {
    v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s)));
  } else {
    v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
  }
  return _mm256_sub_epi32(v, lov);
}

template <typename Sym, int kTab, int V>
__attribute__((target("avx2,bmi,bmi2,popcnt,fma"))) void EncodeRunsAvx2(
    const Sym* syms, size_t runs, uint32_t num_ctx, const uint32_t* tables, const float* rcps,
    size_t stride, uint32_t lo, const uint32_t* prob_bits, uint32_t* states, uint16_t*& wp_ref) {
  alignas(32) uint32_t x[16 * V];
  std::memcpy(x, states, sizeof(x));
  const __m256i lov = _mm256_set1_epi32(static_cast<int>(lo));
  uint16_t* wp = wp_ref;
  uint32_t ctx = static_cast<uint32_t>((runs - 1) % num_ctx);
  for (size_t g = runs; g-- > 0;) {
    const uint32_t* tab = tables + size_t{ctx} * stride;
    const uint32_t* rtab = reinterpret_cast<const uint32_t*>(rcps + size_t{ctx} * stride);
    const __m128i p = _mm_cvtsi32_si128(static_cast<int>(prob_bits[ctx]));
    const __m128i pinv = _mm_cvtsi32_si128(32 - static_cast<int>(prob_bits[ctx]));
    __m256i* xv = reinterpret_cast<__m256i*>(x + 16 * (g % V));
    const Sym* s = syms + g * kCtxRun;
    _mm256_store_si256(xv + 1, EncHalfAvx2<kTab>(_mm256_load_si256(xv + 1), Indexes8(s + 8, lov),
                                                 tab, rtab, p, pinv, wp));
    _mm256_store_si256(xv, EncHalfAvx2<kTab>(_mm256_load_si256(xv), Indexes8(s, lov), tab, rtab,
                                             p, pinv, wp));
    ctx = ctx == 0 ? num_ctx - 1 : ctx - 1;
  }
  wp_ref = wp;
  std::memcpy(states, x, sizeof(x));
}

// Encodes runs g-1 .. 0 (g a multiple of L / 16) with the vector loop, from the tables' packed
// form.
template <typename Sym>
void EncodeRunsSimd(const Sym* syms, size_t g, uint32_t alphabet, uint32_t num_ctx, int L,
                    const EncodeTables& t, Scratch* scratch, uint32_t* x, uint16_t*& wp) {
  uint32_t lo = 0;
  const size_t stride = BuildSimdEncodeTables(t, alphabet, num_ctx, scratch, &lo);
  const uint32_t* tabs = scratch->enc_ent.data();
  const float* rcps = scratch->enc_rcp.data();
  const bool avx512 = UseAvx512();
  WithChains(L / 16, [&](auto v) {
    WithTableSpan<0>(stride, [&](auto span) {
      constexpr int kTab = decltype(span)::value, kV = decltype(v)::value;
      if (avx512) {
        EncodeRunsAvx512<Sym, kTab, kV>(syms, g, num_ctx, tabs, rcps, stride, lo, t.prob_bits,
                                        x, wp);
      } else {
        EncodeRunsAvx2<Sym, kTab, kV>(syms, g, num_ctx, tabs, rcps, stride, lo, t.prob_bits, x,
                                      wp);
      }
    });
  });
}
#endif

}  // namespace

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
    Histogram(syms, n, alphabet, num_ctx, counts.data());
  }
  EncodeTables t;
  BuildEncodeTables(counts.data(), alphabet, num_ctx, scratch, w, &t, stats && !given);
  const EncSym* enc = t.syms;
  const size_t table_bytes = out->size() - table_start;
  // Statistics are of the symbols themselves, whatever the tables were built from.
  const double entropy =
      stats && given ? EmpiricalEntropyBits(syms, n, alphabet, num_ctx) : t.entropy_bits;

  // Encode backwards; words are written from the end of the buffer towards its front (at most
  // one word per symbol, + kWordSlack: the unconditional stores below wp; + L for the final
  // states).
  uint16_t* wend;
  uint32_t own_states[kMaxLanes];
  uint32_t* x = own_states;
  if (shared) {
    wend = shared->Chunk(shared->used, n + kWordSlack) + n + kWordSlack;
    x = shared->x;
  } else {
    std::vector<uint16_t>& words = scratch->words;
    words.resize(n + L + kWordSlack);
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
  if (g >= V && (UseAvx512() || UseAvx2())) {
    while (g % V != 0) scalar_run(--g);  // the vector loop takes whole blocks of V runs
    EncodeRunsSimd(syms, g, alphabet, num_ctx, L, t, scratch, x, wp);
    g = 0;
  }
#endif
  while (g-- > 0) scalar_run(g);

  const size_t nwords = static_cast<size_t>(wend - wp);
  size_t stream_bytes = nwords * 2;
  if (shared) {
    const size_t k = shared->used++;
    shared->end[k] = n + kWordSlack;
    shared->begin[k] = n + kWordSlack - nwords;
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

template void Encode<uint8_t>(const uint8_t*, size_t, uint32_t, uint32_t, Scratch*,
                              std::vector<uint8_t>*, CoderStats*, int, const uint32_t*,
                              SharedEncoder*);
template void Encode<uint16_t>(const uint16_t*, size_t, uint32_t, uint32_t, Scratch*,
                               std::vector<uint8_t>*, CoderStats*, int, const uint32_t*,
                               SharedEncoder*);

}  // namespace strata::codec::rans
