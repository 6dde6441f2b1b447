#include "codec/rans.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

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

constexpr uint32_t kL = 1u << 16;  // states live in [kL, 2^32); words are 16 bits
constexpr int kMinProbBits = 11;
constexpr int kMaxProbBits = 15;

struct EncSym {
  uint64_t rcp;    // floor((2^64 - 1) / freq): quotient estimate, corrected by one step
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

inline uint64_t MulHi64(uint64_t a, uint64_t b) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
}

template <typename Sym>
void Histogram(const Sym* syms, size_t n, uint32_t alphabet, uint32_t num_ctx, uint32_t* counts) {
  size_t groups = (n + kCtxRun - 1) / kCtxRun;
  uint32_t ctx = 0;
  for (size_t g = 0; g < groups; ++g) {
    uint32_t* h = counts + size_t{ctx} * alphabet;
    size_t base = g * kCtxRun;
    size_t cnt = std::min<size_t>(kCtxRun, n - base);
    for (size_t l = 0; l < cnt; ++l) ++h[syms[base + l]];
    if (++ctx == num_ctx) ctx = 0;
  }
}

#if STRATA_RANS_AVX512
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
  const __m512i w =
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp)));
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

// Decodes pairs of full 16-symbol runs (states 0-15, then 16-31) while at least kLanes words
// remain, so both 16-word loads are in bounds. The two state vectors are independent, so their
// gathers overlap. Returns the number of runs decoded (even).
template <typename Sym>
__attribute__((target("avx512f,avx512bw"))) size_t DecodeRunsAvx512(
    uint32_t* states, const uint16_t*& wp, const uint16_t* wend, size_t runs, uint32_t num_ctx,
    const uint32_t* const* ent, const uint16_t* const* sym, const uint32_t* prob_bits, Sym* out) {
  __m512i x0 = _mm512_loadu_si512(states);
  __m512i x1 = _mm512_loadu_si512(states + 16);
  size_t g = 0;
  uint32_t c0 = 0;
  for (; g + 2 <= runs; g += 2) {
    if (wend - wp < kLanes) break;
    const uint32_t c1 = c0 + 1 == num_ctx ? 0 : c0 + 1;
    __m512i s0, s1;
    x0 = DecStep(x0, ent[c0], sym[c0], prob_bits[c0], &s0);
    x1 = DecStep(x1, ent[c1], sym[c1], prob_bits[c1], &s1);
    x0 = DecRenorm(x0, wp);
    x1 = DecRenorm(x1, wp);
    DecStore(s0, out + g * kCtxRun);
    DecStore(s1, out + (g + 1) * kCtxRun);
    c0 = c1 + 1 == num_ctx ? 0 : c1 + 1;
  }
  _mm512_storeu_si512(states, x0);
  _mm512_storeu_si512(states + 16, x1);
  return g;
}
#endif

}  // namespace

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
  Histogram(syms, n, alphabet, num_ctx, counts.data());
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
            std::vector<uint8_t>* out, CoderStats* stats) {
  internal::ByteWriter w(out);
  const size_t table_start = out->size();
  std::vector<uint32_t>& counts = scratch->counts;
  counts.assign(size_t{alphabet} * num_ctx, 0);
  Histogram(syms, n, alphabet, num_ctx, counts.data());

  scratch->enc_syms.resize(size_t{alphabet} * num_ctx * sizeof(EncSym));
  EncSym* enc = reinterpret_cast<EncSym*>(scratch->enc_syms.data());
  std::vector<uint32_t> freqs(alphabet);
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
    if (total == 0) {
      w.U8(0);
      continue;
    }
    for (uint32_t s = lo; s <= hi; ++s)
      if (h[s]) entropy += h[s] * std::log2(static_cast<double>(total) / h[s]);
    const int p = ChooseProbBits(used);
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

  // Encode backwards; words are written from the end of the scratch buffer towards its front.
  std::vector<uint16_t>& words = scratch->words;
  words.resize(n + kLanes + 1);  // +1: the unconditional store at wp[-1]
  uint16_t* const wend = words.data() + words.size();
  uint16_t* wp = wend;
  uint32_t x[kLanes];
  for (int l = 0; l < kLanes; ++l) x[l] = kL;
  const size_t runs = (n + kCtxRun - 1) / kCtxRun;
  for (size_t g = runs; g-- > 0;) {
    const EncSym* tab = enc + size_t(g % num_ctx) * alphabet;
    const size_t base = g * kCtxRun;
    const int cnt = static_cast<int>(std::min<size_t>(kCtxRun, n - base));
    uint32_t* xl = x + (base % kLanes);
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
  }
  const size_t nwords = static_cast<size_t>(wend - wp);
  const size_t stream_bytes = kLanes * 4 + nwords * 2;
  w.Varint(static_cast<uint32_t>(stream_bytes));
  w.Raw(x, sizeof(x));
  w.Raw(wp, nwords * 2);
  if (stats) {
    stats->entropy_bits += entropy;
    stats->stream_bits += stream_bytes * 8;
    stats->table_bits += table_bytes * 8;
    stats->symbols += n;
  }
}

template <typename Sym>
absl::Status Decode(internal::ByteReader& in, size_t n, uint32_t alphabet, uint32_t num_ctx,
                    Scratch* scratch, Sym* out) {
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

  // Pass 2: build the decode tables (validated above, so plain reads are safe).
  scratch->dec_entry.resize(total_entries);
  scratch->dec_sym.resize(total_entries + 2);  // +2: the SIMD gather reads 4 bytes
  internal::ByteReader t(tables_begin, static_cast<size_t>(in.pos() - tables_begin), "rans");
  const uint32_t* ent[kMaxContexts];
  const uint16_t* sym[kMaxContexts];
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

  uint32_t stream_bytes = 0;
  if (auto s = in.Varint(&stream_bytes); !s.ok()) return s;
  if (stream_bytes < kLanes * 4 || (stream_bytes - kLanes * 4) % 2 != 0)
    return absl::DataLossError("rans: bad stream length");
  const uint8_t* sp;
  if (auto s = in.Take(stream_bytes, &sp); !s.ok()) return s;
  uint32_t x[kLanes];
  std::memcpy(x, sp, sizeof(x));
  for (int l = 0; l < kLanes; ++l)
    if (x[l] < kL) return absl::DataLossError("rans: bad initial state");
  // The word area may be unaligned; copy it so u16 loads are well defined.
  const size_t nwords = (stream_bytes - kLanes * 4) / 2;
  std::vector<uint16_t>& words = scratch->words;
  words.resize(nwords + kLanes);
  std::memcpy(words.data(), sp + kLanes * 4, nwords * 2);
  const uint16_t* wp = words.data();
  const uint16_t* const wend = words.data() + nwords;

  const size_t full_runs = n / kCtxRun;
  size_t g = 0;
#if STRATA_RANS_AVX512
  if (CpuHasAvx512() && full_runs >= 2)
    g = DecodeRunsAvx512<Sym>(x, wp, wend, full_runs, num_ctx, ent, sym, prob_bits, out);
#endif
  uint32_t ctx = static_cast<uint32_t>(g % num_ctx);
  for (; g < runs; ++g) {
    const uint32_t p = prob_bits[ctx];
    const uint32_t mask = (1u << p) - 1;
    const uint32_t* e = ent[ctx];
    const uint16_t* sy = sym[ctx];
    const size_t base = g * kCtxRun;
    uint32_t* xl = x + (base % kLanes);
    const int cnt = static_cast<int>(std::min<size_t>(kCtxRun, n - base));
    if (cnt == kCtxRun && wend - wp >= kCtxRun) {
      for (int l = 0; l < kCtxRun; ++l) {
        uint32_t xs = xl[l];
        const uint32_t slot = xs & mask;
        const uint32_t en = e[slot];
        out[base + l] = static_cast<Sym>(sy[slot]);
        xs = (en >> 16) * (xs >> p) + (en & 0xFFFF);
        const bool need = xs < kL;
        const uint32_t word = *wp;
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
          xs = (xs << 16) | *wp++;
        }
        xl[l] = xs;
      }
    }
    if (++ctx == num_ctx) ctx = 0;
  }
  if (wp != wend) return absl::DataLossError("rans: stream has trailing words");
  for (int l = 0; l < kLanes; ++l)
    if (x[l] != kL) return absl::DataLossError("rans: final state mismatch (corrupt stream)");
  return absl::OkStatus();
}

template void Encode<uint8_t>(const uint8_t*, size_t, uint32_t, uint32_t, Scratch*,
                              std::vector<uint8_t>*, CoderStats*);
template void Encode<uint16_t>(const uint16_t*, size_t, uint32_t, uint32_t, Scratch*,
                               std::vector<uint8_t>*, CoderStats*);
template absl::Status Decode<uint8_t>(internal::ByteReader&, size_t, uint32_t, uint32_t, Scratch*,
                                      uint8_t*);
template absl::Status Decode<uint16_t>(internal::ByteReader&, size_t, uint32_t, uint32_t,
                                       Scratch*, uint16_t*);
template double EmpiricalEntropyBits<uint8_t>(const uint8_t*, size_t, uint32_t, uint32_t);
template double EmpiricalEntropyBits<uint16_t>(const uint16_t*, size_t, uint32_t, uint32_t);

}  // namespace strata::codec::rans
