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
std::atomic<bool> g_vnni_bytes_enabled_for_test{true};
std::atomic<uint64_t> g_heads_decoded_in_lanes{0};
std::atomic<uint64_t> g_heads_decoded_vnni{0};
std::atomic<uint64_t> g_heads_decoded_bytes{0};

struct ByteColumn {
  float unit = 0;
  double error = 0;
};

// Nearest, halves away from zero; inline (lrint is a library call, and this runs per term of
// every head of a plan).
inline int32_t Nearest(float x) { return static_cast<int32_t>(x + (x < 0 ? -0.5f : 0.5f)); }

// One column's int8 terms of the ordered coordinates [from, n): their unit (the largest |term| /
// 127) and the expected squared error they leave, each rounding weighted by its symbols' energy.
ByteColumn ByteColumnOf(const float* column, const double* energy, size_t from, size_t n) {
  ByteColumn b;
  float largest = 0;
  for (size_t i = from; i < n; ++i) largest = std::max(largest, std::abs(column[i]));
  b.unit = largest / 127.0f;
  if (b.unit == 0) return b;
  for (size_t i = from; i < n; ++i) {
    const double d = column[i] - static_cast<double>(Nearest(column[i] / b.unit)) * b.unit;
    b.error += energy[i] * d * d;
  }
  return b;
}

// Expected quantisation noise per token of the head's coded coordinates at these steps.
double QuantisationNoise(const float* steps, const float* variances, size_t n, float scale) {
  double noise = 0;
  for (size_t k = 0; k < n; ++k) {
    const double step = double{steps[k]} * scale;
    noise += std::min(double{variances[k]}, step * step / 12);
  }
  return noise;
}

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

// Slots 4q .. 4q + 3's raw symbols for the 16 tokens of group g, interleaved per token (token t's
// four bytes in dword t: vpdpbusd's unsigned operand); zero past n and past the last token.
STRATA_VNNI_TARGET inline __m512i QuadBytes(const uint8_t* sym, const PcaSymbols& s, size_t g,
                                            const uint32_t* slot, size_t n, size_t q) {
  const size_t full = s.tokens / 16, rest = s.tokens % 16;
  __m128i v[4];
  for (size_t i = 0; i < 4; ++i) {
    const size_t k = 4 * q + i;
    if (k >= n) {
      v[i] = _mm_setzero_si128();
    } else if (g < full) {
      v[i] = _mm_loadu_si128(
          reinterpret_cast<const __m128i*>(sym + (g * s.nslots + slot[k]) * 16));
    } else {
      const __mmask16 live = static_cast<__mmask16>((1u << rest) - 1);
      v[i] = _mm_maskz_loadu_epi8(live, sym + full * 16 * s.nslots + size_t{slot[k]} * rest);
    }
  }
  const __m128i ab_lo = _mm_unpacklo_epi8(v[0], v[1]), ab_hi = _mm_unpackhi_epi8(v[0], v[1]);
  const __m128i cd_lo = _mm_unpacklo_epi8(v[2], v[3]), cd_hi = _mm_unpackhi_epi8(v[2], v[3]);
  const __m256i lo =
      _mm256_set_m128i(_mm_unpackhi_epi16(ab_lo, cd_lo), _mm_unpacklo_epi16(ab_lo, cd_lo));
  const __m256i hi =
      _mm256_set_m128i(_mm_unpackhi_epi16(ab_hi, cd_hi), _mm_unpacklo_epi16(ab_hi, cd_hi));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// 8 columns from c0 of both token groups, one width: the integer sums of the symbols (int16:
// minus maxq already; int8: raw, maxq times the columns' sums of terms taken off) times the
// columns' scales, stored, or added to what the other width stored.
template <bool kBytes>
STRATA_VNNI_TARGET __attribute__((always_inline)) inline void SumColumns(
    const uint32_t* block, size_t count, const __m512i* y, const float* scale,
    const int32_t* sum_of_terms, int32_t maxq, bool add, float* s0, float* s1) {
  __m512i a[8], b[8];
  for (int j = 0; j < 8; ++j) a[j] = b[j] = _mm512_setzero_si512();
  for (size_t i = 0; i < count; ++i) {  // pairs [p][8] or quads [q][8]
    const __m512i v0 = _mm512_loadu_si512(y + 2 * i), v1 = _mm512_loadu_si512(y + 2 * i + 1);
    for (int j = 0; j < 8; ++j) {
      const __m512i w = _mm512_set1_epi32(static_cast<int>(block[i * 8 + j]));
      if constexpr (kBytes) {
        a[j] = _mm512_dpbusd_epi32(a[j], v0, w);
        b[j] = _mm512_dpbusd_epi32(b[j], v1, w);
      } else {
        a[j] = _mm512_dpwssd_epi32(a[j], v0, w);
        b[j] = _mm512_dpwssd_epi32(b[j], v1, w);
      }
    }
  }
  for (int j = 0; j < 8; ++j) {
    if constexpr (kBytes) {
      const __m512i off = _mm512_set1_epi32(maxq * sum_of_terms[j]);
      a[j] = _mm512_sub_epi32(a[j], off);
      b[j] = _mm512_sub_epi32(b[j], off);
    }
    const __m512 sc = _mm512_set1_ps(scale[j]);
    const __m512 x0 = _mm512_cvtepi32_ps(a[j]), x1 = _mm512_cvtepi32_ps(b[j]);
    float* r0 = s0 + j * 16;
    float* r1 = s1 + j * 16;
    if (add) {
      _mm512_storeu_ps(r0, _mm512_fmadd_ps(x0, sc, _mm512_loadu_ps(r0)));
      _mm512_storeu_ps(r1, _mm512_fmadd_ps(x1, sc, _mm512_loadu_ps(r1)));
    } else {
      _mm512_storeu_ps(r0, _mm512_mul_ps(x0, sc));
      _mm512_storeu_ps(r1, _mm512_mul_ps(x1, sc));
    }
  }
}

// sums[c][t] = the integer sums of (symbol - maxq) times the axes' terms at column c, times the
// columns' scales: two groups of 16 tokens by 8 columns at a time, as ReconstructLanes.
STRATA_VNNI_TARGET void ReconstructVnni(const PcaSymbols& s, const uint32_t* slot, size_t n,
                                        const PcaVnniAxes& axes, size_t dim, float scale,
                                        const float* mean, const PcaRope* rope,
                                        const PcaRows& out, std::vector<float>* scratch) {
  const size_t groups = (s.tokens + 15) / 16, pairs = axes.pairs, quads = axes.quads;
  // Two groups' sums; their coordinate pairs, [p][group][32 words]; their quads,
  // [q][group][64 bytes]; the slots in the axes' order.
  scratch->resize(2 * dim * 16 + pairs * 32 + quads * 32 + n);
  float* s0 = scratch->data();
  float* s1 = s0 + dim * 16;
  int16_t* y16 = reinterpret_cast<int16_t*>(s1 + dim * 16);
  __m512i* y8 = reinterpret_cast<__m512i*>(s1 + dim * 16 + pairs * 32);
  uint32_t* ordered = reinterpret_cast<uint32_t*>(s1 + dim * 16 + pairs * 32 + quads * 32);
  for (size_t i = 0; i < n; ++i) ordered[i] = axes.order.empty() ? slot[i] : slot[axes.order[i]];
  const size_t wide = std::min(n, 2 * pairs);  // int16 coordinates; the rest int8
  const uint8_t* sym = static_cast<const uint8_t*>(s.sym);
  const __m256i maxq = _mm256_set1_epi16(static_cast<int16_t>(s.maxq));
  const __m512i idx = PairIndex();
  for (size_t g = 0; g < groups; g += 2) {
    for (size_t p = 0; p < pairs; ++p)
      for (size_t h = 0; h < 2; ++h) {
        __m512i v = _mm512_setzero_si512();
        if (g + h < groups) {
          const __m256i a = SlotWords(sym, s, g + h, ordered[2 * p], maxq);
          const __m256i b = 2 * p + 1 < wide ? SlotWords(sym, s, g + h, ordered[2 * p + 1], maxq)
                                             : _mm256_setzero_si256();
          v = _mm512_permutexvar_epi16(idx, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
        }
        _mm512_storeu_si512(y16 + (2 * p + h) * 32, v);
      }
    for (size_t q = 0; q < quads; ++q)
      for (size_t h = 0; h < 2; ++h)
        _mm512_storeu_si512(y8 + 2 * q + h,
                            g + h < groups ? QuadBytes(sym, s, g + h, ordered + wide, n - wide, q)
                                           : _mm512_setzero_si512());
    for (size_t c0 = 0; c0 < dim; c0 += 8) {
      float* r0 = s0 + c0 * 16;
      float* r1 = s1 + c0 * 16;
      if (pairs > 0)
        SumColumns<false>(axes.words.data() + c0 * pairs, pairs,
                          reinterpret_cast<const __m512i*>(y16), axes.scale.data() + c0, nullptr,
                          0, false, r0, r1);
      if (quads > 0)
        SumColumns<true>(axes.bytes.data() + c0 * quads, quads, y8, axes.byte_scale.data() + c0,
                         axes.byte_sum.data() + c0, s.maxq, pairs > 0, r0, r1);
    }
    StoreGroup(s0, dim, scale, mean, s.tokens, rope, g, out);
    if (g + 1 < groups) StoreGroup(s1, dim, scale, mean, s.tokens, rope, g + 1, out);
  }
}

// STRATA_CODEC_VNNI: "0" no VNNI, "16" int16 terms only (A/B runs of the int8 terms).
bool VnniSetTo(const char* value) {
  const char* env = std::getenv("STRATA_CODEC_VNNI");
  return env != nullptr && std::strcmp(env, value) == 0;
}

bool DetectVnni() {
  if (VnniSetTo("0")) return false;
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

bool PcaVnniBytesAvailable() {
#ifdef STRATA_PCA_AVX512
  static const bool allowed = !VnniSetTo("16");
  return allowed && g_vnni_bytes_enabled_for_test.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void SetPcaVnniBytesEnabledForTest(bool enabled) { g_vnni_bytes_enabled_for_test.store(enabled); }

void BuildPcaVnniAxes(const float* basis, const uint32_t* coords, const float* steps,
                      const float* variances, size_t n, size_t dim, PcaVnniAxes* axes) {
  *axes = PcaVnniAxes{};
  if (dim % 32 != 0 || dim > 256 || n == 0) return;
  axes->order.resize(n);
  for (size_t k = 0; k < n; ++k) axes->order[k] = static_cast<uint32_t>(k);
  // energy[i]: the expected squared symbol of the i-th coordinate in order; column[c][i]: its
  // term at column c.
  std::vector<double> energy(n, 0.0);
  if (variances != nullptr) {
    std::vector<double> of(n);
    for (size_t k = 0; k < n; ++k) of[k] = double{variances[k]} / (double{steps[k]} * steps[k]);
    std::stable_sort(axes->order.begin(), axes->order.end(),
                     [&](uint32_t a, uint32_t b) { return of[a] > of[b]; });
    for (size_t i = 0; i < n; ++i) energy[i] = of[axes->order[i]];
  }
  std::vector<float> column(dim * n);
  for (size_t c = 0; c < dim; ++c)
    for (size_t i = 0; i < n; ++i) {
      const uint32_t k = axes->order[i];
      column[c * n + i] = steps[k] * basis[size_t{coords[k]} * dim + c];
    }
  // The fewest int16 coordinates (a multiple of 4) that keep the int8 rest's expected error
  // within bounds; the error falls as more stay int16, so a bisection finds it.
  size_t wide = n;
  if (variances != nullptr) {
    const double allowed = kMaxAddedError * QuantisationNoise(steps, variances, n, 1.0f);
    auto added = [&](size_t from) {
      double e = 0;
      for (size_t c = 0; c < dim; ++c)
        e += ByteColumnOf(&column[c * n], energy.data(), from, n).error;
      return e;
    };
    size_t lo = 0, hi = (n + 3) / 4;  // in quads; hi: all int16
    while (lo < hi) {
      const size_t mid = (lo + hi) / 2;
      if (added(mid * 4) <= allowed) hi = mid; else lo = mid + 1;
    }
    wide = std::min(n, lo * 4);
    // A handful of int8 coordinates is not worth a second pass over the columns.
    if (n - wide < 16) wide = n;
    if (wide < n) axes->added_error = added(wide);
  }
  const size_t pairs = (wide + 1) / 2, quads = (n - wide + 3) / 4;
  axes->pairs = pairs;
  axes->quads = quads;
  axes->scale.assign(dim, 0.0f);
  axes->words.assign(dim * pairs, 0);
  axes->byte_scale.assign(dim, 0.0f);
  axes->byte_sum.assign(dim, 0);
  axes->bytes.assign(dim * quads, 0);
  for (size_t c = 0; c < dim; ++c) {
    const float* col = &column[c * n];
    float largest = 0;
    for (size_t i = 0; i < wide; ++i) largest = std::max(largest, std::abs(col[i]));
    const float unit = largest / 32767.0f;
    axes->scale[c] = unit;
    for (size_t i = 0; i < wide && unit > 0; ++i) {
      const long v = std::clamp(std::lrint(col[i] / unit), -32767L, 32767L);
      const uint32_t half = static_cast<uint16_t>(static_cast<int16_t>(v));
      uint32_t& word = axes->words[(c / 8) * pairs * 8 + (i / 2) * 8 + c % 8];
      word |= i % 2 == 0 ? half : half << 16;
    }
    const ByteColumn b = ByteColumnOf(col, energy.data(), wide, n);
    axes->byte_scale[c] = b.unit;
    for (size_t i = wide; i < n && b.unit > 0; ++i) {
      const int32_t v = std::clamp(Nearest(col[i] / b.unit), -127, 127);
      axes->byte_sum[c] += static_cast<int32_t>(v);
      const size_t j = i - wide;
      const uint32_t byte = static_cast<uint8_t>(static_cast<int8_t>(v));
      axes->bytes[(c / 8) * quads * 8 + (j / 4) * 8 + c % 8] |= byte << (8 * (j % 4));
    }
  }
}

bool PcaVnniBytesFit(const PcaVnniAxes& axes, const float* steps, const float* variances,
                     size_t n, float step_scale) {
  if (axes.quads == 0) return true;
  return axes.added_error <= kMaxAddedError * QuantisationNoise(steps, variances, n, step_scale);
}

void PcaReconstructVnni(const PcaSymbols& s, const uint32_t* slot, size_t n,
                        const PcaVnniAxes& axes, size_t dim, float scale, const float* mean,
                        const PcaRope* rope, const PcaRows& out, std::vector<float>* scratch) {
#ifdef STRATA_PCA_AVX512
  ReconstructVnni(s, slot, n, axes, dim, scale, mean, rope, out, scratch);
  g_heads_decoded_vnni.fetch_add(1, std::memory_order_relaxed);
  if (axes.quads > 0) g_heads_decoded_bytes.fetch_add(1, std::memory_order_relaxed);
#else
  (void)s, (void)slot, (void)n, (void)axes, (void)dim, (void)scale, (void)mean, (void)rope,
      (void)out, (void)scratch;
#endif
}

uint64_t PcaVnniHeadsDecoded() { return g_heads_decoded_vnni.load(std::memory_order_relaxed); }

uint64_t PcaVnniBytesHeadsDecoded() {
  return g_heads_decoded_bytes.load(std::memory_order_relaxed);
}

}  // namespace strata::codec::internal
