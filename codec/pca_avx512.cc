// The pca decoder's sums on AVX-512 cores without AMX (codec/internal/pca_avx512.h): in float
// token lanes, or as integer dot products on the symbols where the core has VNNI. Both leave
// the sums in the tiles' [c][16] layout for their store pass (internal/pca_store_avx512.h).
// Functions carry their own target attributes: nothing here runs unless PcaLanesSupported().
#include "codec/internal/pca_avx512.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "codec/internal/pca_store_avx512.h"

namespace strata::codec::internal {

namespace {

std::atomic<bool> g_vnni_enabled_for_test{true};
std::atomic<uint64_t> g_heads_decoded_in_lanes{0};
std::atomic<uint64_t> g_heads_decoded_vnni{0};

#ifdef STRATA_PCA_AVX512

using avx512::PairIndex;
using avx512::StoreGroup;

// The float decoder's sum with the tokens in the vector lanes, for AVX-512 cores without AMX:
// sums[c][t] = sum over k of yt[k][t] * axes(k, c), fused multiply-adds in k order, for
// two groups of 16 tokens by 8 columns at a time (16 sums; per coordinate two token loads and 8
// broadcasts of its axis). The sums are already the store pass's [c][16] layout, so the mean,
// RoPE and the conversion to the block's type happen in the same pass as for the tiles.
STRATA_AVX512_TARGET void ReconstructLanes(const float* yt, size_t tp, size_t tokens, size_t n,
                                           const float* axes, size_t dim, const float* mean,
                                           const PcaRope* rope, const PcaRows& out,
                                           std::vector<float>* scratch) {
  const size_t groups = (tokens + 15) / 16;
  scratch->resize(2 * dim * 16 + n * 32);
  float* s0 = scratch->data();
  float* s1 = s0 + dim * 16;
  // The pair's coordinates, [k][32]: yt's rows lie tp floats apart, at a stride that maps them
  // to a few L1 sets, and every column block reads them all again.
  float* y = s1 + dim * 16;
  for (size_t g = 0; g < groups; g += 2) {
    const bool two = g + 1 < groups;
    for (size_t k = 0; k < n; ++k) {
      const float* from = yt + k * tp + g * 16;
      _mm512_storeu_ps(y + k * 32, _mm512_loadu_ps(from));
      // No second group: its sums are not stored.
      _mm512_storeu_ps(y + k * 32 + 16, two ? _mm512_loadu_ps(from + 16) : _mm512_setzero_ps());
    }
    for (size_t c0 = 0; c0 < dim; c0 += 8) {
      __m512 a[8], b[8];
      for (int j = 0; j < 8; ++j) a[j] = b[j] = _mm512_setzero_ps();
      const float* block = axes + c0 * n;  // [k][8]: coordinate k's axis at columns c0 ..
      for (size_t k = 0; k < n; ++k) {
        const __m512 v0 = _mm512_loadu_ps(y + k * 32), v1 = _mm512_loadu_ps(y + k * 32 + 16);
        const float* row = block + k * 8;
        for (int j = 0; j < 8; ++j) {
          const __m512 w = _mm512_set1_ps(row[j]);
          a[j] = _mm512_fmadd_ps(v0, w, a[j]);
          b[j] = _mm512_fmadd_ps(v1, w, b[j]);
        }
      }
      for (int j = 0; j < 8; ++j) {
        _mm512_storeu_ps(s0 + (c0 + j) * 16, a[j]);
        _mm512_storeu_ps(s1 + (c0 + j) * 16, b[j]);
      }
    }
    StoreGroup(s0, dim, 1.0f, mean, tokens, rope, g, out);
    if (two) StoreGroup(s1, dim, 1.0f, mean, tokens, rope, g + 1, out);
  }
}

#define STRATA_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

// Slot j's coordinates (symbol - maxq) for the 16 tokens of group g, as int16; zero for tokens
// past the end.
STRATA_VNNI_TARGET inline __m256i SlotWords(const uint8_t* sym, const PcaSymbols& s, size_t g,
                                            uint32_t j, __m256i maxq) {
  const size_t full = s.tokens / 16, rest = s.tokens % 16;
  if (g < full) {
    const __m128i v =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(sym + (g * s.nslots + j) * 16));
    return _mm256_sub_epi16(_mm256_cvtepu8_epi16(v), maxq);
  }
  const __mmask16 live = static_cast<__mmask16>((1u << rest) - 1);
  const __m128i v = _mm_maskz_loadu_epi8(live, sym + full * 16 * s.nslots + size_t{j} * rest);
  return _mm256_maskz_sub_epi16(live, _mm256_cvtepu8_epi16(v), maxq);
}

// sums[c][t] = scale[c] * sum over pairs p of the int16 dot product of (q[2p][t], q[2p + 1][t])
// with the axes' pair at column c: two groups of 16 tokens by 8 columns at a time, as
// ReconstructLanes, 2 coordinates per product.
STRATA_VNNI_TARGET void ReconstructVnni(const PcaSymbols& s, const uint32_t* slot, size_t n,
                                        const PcaVnniAxes& axes, size_t dim, float scale,
                                        const float* mean, const PcaRope* rope,
                                        const PcaRows& out, std::vector<float>* scratch) {
  const size_t groups = (s.tokens + 15) / 16, pairs = axes.pairs;
  // Two groups' sums, then their coordinate pairs, [p][group][32 words].
  scratch->resize(2 * dim * 16 + pairs * 32);
  float* s0 = scratch->data();
  float* s1 = s0 + dim * 16;
  int16_t* y = reinterpret_cast<int16_t*>(s1 + dim * 16);
  const uint8_t* sym = static_cast<const uint8_t*>(s.sym);
  const __m256i maxq = _mm256_set1_epi16(static_cast<int16_t>(s.maxq));
  const __m512i idx = PairIndex();
  for (size_t g = 0; g < groups; g += 2) {
    for (size_t p = 0; p < pairs; ++p)
      for (size_t h = 0; h < 2; ++h) {
        __m512i v = _mm512_setzero_si512();
        if (g + h < groups) {
          const __m256i a = SlotWords(sym, s, g + h, slot[2 * p], maxq);
          const __m256i b = 2 * p + 1 < n ? SlotWords(sym, s, g + h, slot[2 * p + 1], maxq)
                                          : _mm256_setzero_si256();
          v = _mm512_permutexvar_epi16(idx, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
        }
        _mm512_storeu_si512(y + (2 * p + h) * 32, v);
      }
    for (size_t c0 = 0; c0 < dim; c0 += 8) {
      __m512i a[8], b[8];
      for (int j = 0; j < 8; ++j) a[j] = b[j] = _mm512_setzero_si512();
      const uint32_t* block = axes.words.data() + c0 * pairs;  // [p][8]
      for (size_t p = 0; p < pairs; ++p) {
        const __m512i v0 = _mm512_loadu_si512(y + 2 * p * 32);
        const __m512i v1 = _mm512_loadu_si512(y + (2 * p + 1) * 32);
        for (int j = 0; j < 8; ++j) {
          const __m512i w = _mm512_set1_epi32(static_cast<int>(block[p * 8 + j]));
          a[j] = _mm512_dpwssd_epi32(a[j], v0, w);
          b[j] = _mm512_dpwssd_epi32(b[j], v1, w);
        }
      }
      for (int j = 0; j < 8; ++j) {
        const __m512 sc = _mm512_set1_ps(axes.scale[c0 + j]);
        _mm512_storeu_ps(s0 + (c0 + j) * 16, _mm512_mul_ps(_mm512_cvtepi32_ps(a[j]), sc));
        _mm512_storeu_ps(s1 + (c0 + j) * 16, _mm512_mul_ps(_mm512_cvtepi32_ps(b[j]), sc));
      }
    }
    StoreGroup(s0, dim, scale, mean, s.tokens, rope, g, out);
    if (g + 1 < groups) StoreGroup(s1, dim, scale, mean, s.tokens, rope, g + 1, out);
  }
}

bool DetectVnni() {
  if (const char* env = std::getenv("STRATA_CODEC_VNNI"); env && std::strcmp(env, "0") == 0)
    return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni");
}

#endif  // STRATA_PCA_AVX512

}  // namespace

bool PcaLanesSupported() {
#ifdef STRATA_PCA_AVX512
  static const bool detected = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }();
  return detected;
#else
  return false;
#endif
}

uint64_t PcaLanesHeadsDecoded() {
  return g_heads_decoded_in_lanes.load(std::memory_order_relaxed);
}

void BuildPcaLanesAxes(const float* basis, const uint32_t* coords, size_t n, size_t dim,
                       std::vector<float>* axes) {
  axes->assign(dim * n, 0.0f);
  if (dim % 32 != 0) return;
  for (size_t c0 = 0; c0 < dim; c0 += 8)
    for (size_t k = 0; k < n; ++k)
      for (size_t j = 0; j < 8; ++j)
        (*axes)[c0 * n + k * 8 + j] = basis[size_t{coords[k]} * dim + c0 + j];
}

void PcaReconstructLanes(const float* yt, size_t tp, size_t tokens, size_t n,
                         const std::vector<float>& axes, size_t dim, const float* mean,
                         const PcaRope* rope, const PcaRows& out, std::vector<float>* scratch) {
#ifdef STRATA_PCA_AVX512
  ReconstructLanes(yt, tp, tokens, n, axes.data(), dim, mean, rope, out, scratch);
  g_heads_decoded_in_lanes.fetch_add(1, std::memory_order_relaxed);
#else
  (void)yt, (void)tp, (void)tokens, (void)n, (void)axes, (void)dim, (void)mean, (void)rope,
      (void)out, (void)scratch;
#endif
}

bool PcaVnniSupported() {
#ifdef STRATA_PCA_AVX512
  static const bool detected = PcaLanesSupported() && DetectVnni();
  return detected;
#else
  return false;
#endif
}

bool PcaVnniAvailable() {
  return PcaVnniSupported() && g_vnni_enabled_for_test.load(std::memory_order_relaxed);
}

void SetPcaVnniEnabledForTest(bool enabled) { g_vnni_enabled_for_test.store(enabled); }

void BuildPcaVnniAxes(const float* basis, const uint32_t* coords, const float* steps, size_t n,
                      size_t dim, PcaVnniAxes* axes) {
  axes->words.clear();
  axes->scale.clear();
  axes->pairs = 0;
  if (dim % 32 != 0 || dim > 256 || n == 0) return;
  const size_t pairs = (n + 1) / 2;
  axes->pairs = pairs;
  axes->scale.assign(dim, 0.0f);
  axes->words.assign(dim * pairs, 0);
  std::vector<float> column(n);
  for (size_t c = 0; c < dim; ++c) {
    float largest = 0;
    for (size_t k = 0; k < n; ++k) {
      column[k] = steps[k] * basis[size_t{coords[k]} * dim + c];
      largest = std::max(largest, std::abs(column[k]));
    }
    const float unit = largest / 32767.0f;
    axes->scale[c] = unit;
    if (unit == 0) continue;
    for (size_t k = 0; k < n; ++k) {
      const long v = std::clamp(std::lrint(column[k] / unit), -32767L, 32767L);
      const uint32_t half = static_cast<uint16_t>(static_cast<int16_t>(v));
      uint32_t& word = axes->words[(c / 8) * pairs * 8 + (k / 2) * 8 + c % 8];
      word |= k % 2 == 0 ? half : half << 16;
    }
  }
}

void PcaReconstructVnni(const PcaSymbols& s, const uint32_t* slot, size_t n,
                        const PcaVnniAxes& axes, size_t dim, float scale, const float* mean,
                        const PcaRope* rope, const PcaRows& out, std::vector<float>* scratch) {
#ifdef STRATA_PCA_AVX512
  ReconstructVnni(s, slot, n, axes, dim, scale, mean, rope, out, scratch);
  g_heads_decoded_vnni.fetch_add(1, std::memory_order_relaxed);
#else
  (void)s, (void)slot, (void)n, (void)axes, (void)dim, (void)scale, (void)mean, (void)rope,
      (void)out, (void)scratch;
#endif
}

uint64_t PcaVnniHeadsDecoded() { return g_heads_decoded_vnni.load(std::memory_order_relaxed); }

}  // namespace strata::codec::internal
