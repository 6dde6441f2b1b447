// What the rANS encoder and decoder share: the contexts' histograms and entropy, and the switch
// that keeps both on their scalar loops for tests. The coder itself: rans_encode.cc,
// rans_decode.cc, its tables: rans_tables.cc.
#include "codec/rans.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "codec/internal/rans_simd.h"

namespace strata::codec::rans {

bool g_force_scalar = false;
bool g_force_avx2 = false;

void ForceScalarForTesting(bool on) { g_force_scalar = on; }
void ForceAvx2ForTesting(bool on) { g_force_avx2 = on; }

namespace {

// Context c's whole runs (c, c + num_ctx, ...) counted into h, one symbol at a time, in four
// sub-histograms (lane & 3) so that runs of one symbol do not serialise on one counter's
// store-to-load latency (`scratch`: their storage, shared by a histogram's contexts).
template <typename Sym>
void CountContext(const Sym* syms, size_t full, uint32_t c, uint32_t num_ctx, uint32_t alphabet,
                  uint32_t* h, std::vector<uint32_t>* scratch) {
  scratch->assign(4 * size_t{alphabet}, 0);
  uint32_t* sub = scratch->data();
  for (size_t g = c; g < full; g += num_ctx) {
    const Sym* s = syms + g * kCtxRun;
    for (int l = 0; l < kCtxRun; l += 4) {
      ++sub[s[l]];
      ++sub[alphabet + s[l + 1]];
      ++sub[2 * alphabet + s[l + 2]];
      ++sub[3 * alphabet + s[l + 3]];
    }
  }
  for (uint32_t a = 0; a < alphabet; ++a)
    h[a] += sub[a] + sub[alphabet + a] + sub[2 * alphabet + a] + sub[3 * alphabet + a];
}

#if STRATA_RANS_AVX512
// The same by byte compares, four runs per vector: each of the (at most) seven symbols around
// `center` counted by a compare and a population count, the others one at a time. Most of a
// pca section's contexts hold coordinates of a bit or less, nearly all of whose symbols lie
// there; one at a time their increments were a sixth of the encoder's time. False, with nothing
// counted, where the first vector has more than a quarter of its symbols outside: such a
// context counts faster one at a time.
__attribute__((target("avx512f,avx512bw,popcnt"))) bool CountContextAround(
    const uint8_t* syms, size_t full, uint32_t c, uint32_t num_ctx, uint32_t alphabet,
    uint32_t center, uint32_t* h) {
  const uint32_t lo = center >= 3 ? center - 3 : 0, hi = std::min(alphabet - 1, center + 3);
  const __m512i base = _mm512_set1_epi8(static_cast<char>(lo));
  const __m512i span = _mm512_set1_epi8(static_cast<char>(hi - lo));
  __m512i value[7];
  for (uint32_t w = 0; w <= hi - lo; ++w) value[w] = _mm512_set1_epi8(static_cast<char>(lo + w));
  uint64_t in[7] = {};
  alignas(64) uint8_t bytes[64];
  bool first = true;
  for (size_t g = c; g < full; g += 4 * size_t{num_ctx}) {
    // Runs g, g + num_ctx, g + 2 num_ctx, g + 3 num_ctx; those past the end count as nothing.
    __m512i v = _mm512_setzero_si512();
    uint64_t live = 0;
    for (int r = 0; r < 4; ++r) {
      const size_t run = g + r * size_t{num_ctx};
      if (run >= full) break;
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(syms + run * kCtxRun));
      v = _mm512_mask_broadcast_i32x4(v, static_cast<__mmask16>(0xF << (4 * r)), x);
      live |= uint64_t{0xFFFF} << (16 * r);
    }
    const uint64_t outside =
        _cvtmask64_u64(_mm512_cmpgt_epu8_mask(_mm512_sub_epi8(v, base), span)) & live;
    if (first && _mm_popcnt_u64(outside) > 16) return false;  // before anything is counted
    first = false;
    for (uint32_t w = 0; w <= hi - lo; ++w)
      in[w] += _mm_popcnt_u64(_cvtmask64_u64(_mm512_cmpeq_epi8_mask(v, value[w])) & live);
    if (outside != 0) {
      _mm512_store_si512(bytes, v);
      for (uint64_t m = outside; m != 0; m &= m - 1) ++h[bytes[__builtin_ctzll(m)]];
    }
  }
  for (uint32_t w = 0; w <= hi - lo; ++w) h[lo + w] += static_cast<uint32_t>(in[w]);
  return true;
}

// CountContextAround for AVX2 cores: two runs per vector, the masks 32 bits wide, the range
// check by an unsigned max (AVX2 has no unsigned byte compare).
__attribute__((target("avx2,popcnt"))) bool CountContextAroundAvx2(
    const uint8_t* syms, size_t full, uint32_t c, uint32_t num_ctx, uint32_t alphabet,
    uint32_t center, uint32_t* h) {
  const uint32_t lo = center >= 3 ? center - 3 : 0, hi = std::min(alphabet - 1, center + 3);
  const __m256i base = _mm256_set1_epi8(static_cast<char>(lo));
  const __m256i span = _mm256_set1_epi8(static_cast<char>(hi - lo));
  __m256i value[7];
  for (uint32_t w = 0; w <= hi - lo; ++w) value[w] = _mm256_set1_epi8(static_cast<char>(lo + w));
  uint64_t in[7] = {};
  alignas(32) uint8_t bytes[32];
  bool first = true;
  for (size_t g = c; g < full; g += 2 * size_t{num_ctx}) {
    // Runs g and g + num_ctx; one past the end counts as nothing.
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(syms + g * kCtxRun));
    const size_t next = g + num_ctx;
    const bool both = next < full;
    const __m128i b =
        both ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(syms + next * kCtxRun))
             : _mm_setzero_si128();
    const __m256i v = _mm256_set_m128i(b, a);
    const uint32_t live = both ? 0xFFFFFFFFu : 0xFFFFu;
    const __m256i off = _mm256_sub_epi8(v, base);
    const uint32_t inside = static_cast<uint32_t>(
        _mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_max_epu8(off, span), span)));
    const uint32_t outside = ~inside & live;
    if (first && _mm_popcnt_u32(outside) > static_cast<int>(std::popcount(live)) / 4)
      return false;  // before anything is counted
    first = false;
    for (uint32_t w = 0; w <= hi - lo; ++w)
      in[w] += static_cast<uint32_t>(_mm_popcnt_u32(
          static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(v, value[w]))) & live));
    if (outside != 0) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(bytes), v);
      for (uint32_t m = outside; m != 0; m &= m - 1) ++h[bytes[__builtin_ctz(m)]];
    }
  }
  for (uint32_t w = 0; w <= hi - lo; ++w) h[lo + w] += static_cast<uint32_t>(in[w]);
  return true;
}
#endif

}  // namespace

template <typename Sym>
void Histogram(const Sym* syms, size_t n, uint32_t alphabet, uint32_t num_ctx, uint32_t* counts) {
  const size_t full = n / kCtxRun;
  if (alphabet <= 1024) {
    std::vector<uint32_t> scratch;
    for (uint32_t c = 0; c < num_ctx; ++c) {
      uint32_t* h = counts + size_t{c} * alphabet;
#if STRATA_RANS_AVX512
      // Symbols are q + maxq with alphabet 2 maxq + 1 for the quantised modes: the centre is
      // q = 0.
      if constexpr (sizeof(Sym) == 1)
        if (UseAvx512() ? CountContextAround(syms, full, c, num_ctx, alphabet, alphabet / 2, h)
                        : UseAvx2() &&
                              CountContextAroundAvx2(syms, full, c, num_ctx, alphabet,
                                                     alphabet / 2, h))
          continue;
#endif
      CountContext(syms, full, c, num_ctx, alphabet, h, &scratch);
    }
  } else {
    uint32_t ctx = 0;
    for (size_t g = 0; g < full; ++g) {
      uint32_t* h = counts + size_t{ctx} * alphabet;
      for (int l = 0; l < kCtxRun; ++l) ++h[syms[g * kCtxRun + l]];
      if (++ctx == num_ctx) ctx = 0;
    }
  }
  const size_t ctx = num_ctx == 0 ? 0 : full % num_ctx;
  for (size_t i = full * kCtxRun; i < n; ++i) ++counts[ctx * alphabet + syms[i]];
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

template void Histogram<uint8_t>(const uint8_t*, size_t, uint32_t, uint32_t, uint32_t*);
template void Histogram<uint16_t>(const uint16_t*, size_t, uint32_t, uint32_t, uint32_t*);
template double EmpiricalEntropyBits<uint8_t>(const uint8_t*, size_t, uint32_t, uint32_t);
template double EmpiricalEntropyBits<uint16_t>(const uint16_t*, size_t, uint32_t, uint32_t);

}  // namespace strata::codec::rans
