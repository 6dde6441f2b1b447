// The pca decoder's sums on AVX-512 cores without AMX (codec/internal/pca_avx512.h): in float
// token lanes (leaving the sums in the tiles' [c][16] layout), or as integer dot products on the
// symbols in column lanes where the core has VNNI (token rows); both go through the store pass
// of internal/pca_store_avx512.h.
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

// Nearest, halves away from zero; inline (lrint is a library call, and this runs per term of
// every head of a plan).
inline int32_t Nearest(float x) { return static_cast<int32_t>(x + (x < 0 ? -0.5f : 0.5f)); }

// The unit of one column's int8 terms of the ordered coordinates [from, n): the largest |term| /
// 127.
float ByteUnit(const float* column, size_t from, size_t n) {
  float largest = 0;
  for (size_t i = from; i < n; ++i) largest = std::max(largest, std::abs(column[i]));
  return largest / 127.0f;
}

// The expected squared error per token that int8 terms of the ordered coordinates [from, n)
// leave, over the dim columns ([c][n]): each term's rounding at its column's ByteUnit, weighted
// by its symbols' energy. BuildPcaVnniAxes's search evaluates it a few times per head: in scalar
// code, with a division per term, that made the first decode after a calibration arrives ~100 ms
// slower (Qwen2.5-1.5B). The vector one rounds halves to even, not away from zero as the axes
// do: a tie's error differs, which a bound does not mind.
double AddedErrorScalar(const float* columns, const float* energy, size_t from, size_t n,
                        size_t dim) {
  double total = 0;
  for (size_t c = 0; c < dim; ++c) {
    const float* col = columns + c * n;
    const float unit = ByteUnit(col, from, n);
    for (size_t i = from; i < n && unit > 0; ++i) {
      const double d = col[i] - static_cast<double>(std::nearbyint(col[i] / unit)) * unit;
      total += double{energy[i]} * d * d;
    }
  }
  return total;
}
#ifdef STRATA_PCA_AVX512
__attribute__((target("avx512f"))) double AddedErrorAvx512(const float* columns,
                                                           const float* energy, size_t from,
                                                           size_t n, size_t dim) {
  double total = 0;
  for (size_t c = 0; c < dim; ++c) {
    const float* col = columns + c * n;
    auto live = [&](size_t i) __attribute__((target("avx512f"))) {
      return static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
    };
    __m512 big = _mm512_setzero_ps();
    for (size_t i = from; i < n; i += 16)
      big = _mm512_max_ps(big, _mm512_abs_ps(_mm512_maskz_loadu_ps(live(i), col + i)));
    const float unit = _mm512_reduce_max_ps(big) / 127.0f;
    if (unit == 0) continue;
    const __m512 u = _mm512_set1_ps(unit), inv = _mm512_set1_ps(1.0f / unit);
    __m512 err = _mm512_setzero_ps();
    for (size_t i = from; i < n; i += 16) {
      const __m512 x = _mm512_maskz_loadu_ps(live(i), col + i);
      const __m512 q = _mm512_roundscale_ps(_mm512_mul_ps(x, inv), _MM_FROUND_TO_NEAREST_INT);
      const __m512 d = _mm512_fnmadd_ps(q, u, x);
      err = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(live(i), energy + i), d), d, err);
    }
    total += _mm512_reduce_add_ps(err);
  }
  return total;
}
#endif
// The vector sum where the CPU has AVX-512 (the decoders that read int8 terms run there), the
// scalar one elsewhere (tests build such axes on any CPU).
double AddedError(const float* columns, const float* energy, size_t from, size_t n,
                  size_t dim) {
#ifdef STRATA_PCA_AVX512
  static const bool avx512 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  if (avx512) return AddedErrorAvx512(columns, energy, from, n, dim);
#endif
  return AddedErrorScalar(columns, energy, from, n, dim);
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
using avx512::StoreTokenGroup;

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
  const bool stream = avx512::StreamsRows(out);
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
    StoreGroup(s0, dim, 1.0f, mean, tokens, rope, g, out, stream);
    if (two) StoreGroup(s1, dim, 1.0f, mean, tokens, rope, g + 1, out, stream);
  }
  if (stream) _mm_sfence();  // the streamed rows visible before whoever the caller tells
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

// acc += the dot products of u (unsigned bytes, or words) and s (signed bytes, or words), in
// place: with the intrinsics GCC 12 copies every accumulator through another register in
// SumTokenRows's loop, and it keeps an array of accumulators in memory.
template <bool kBytes>
STRATA_VNNI_TARGET __attribute__((always_inline)) inline void DotAdd(__m512i& acc, __m512i u,
                                                                    __m512i s) {
  if constexpr (kBytes) {
    asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  } else {
    asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  }
}

// One group's sums at the 32 columns from c0, one width, with the columns in the vector lanes:
// for every pair or quad i, token t's symbols (a pair of words or a quad of bytes) broadcast
// times the terms of the columns; then the exact integer sums (int8: maxq times the columns'
// sums of terms taken off) times the columns' units, stored as token rows sums[t][c] or added
// to what the other width stored. Eight tokens by two blocks of 16 columns at a time, in named
// accumulators: sixteen independent products in flight (VNNI issues two per cycle, five
// cycles apart), ten loads per sixteen products.
template <bool kBytes>
STRATA_VNNI_TARGET __attribute__((always_inline)) inline void SumTokenRows(
    const uint32_t* lo_terms, const uint32_t* hi_terms, size_t count, const uint32_t* y,
    const float* scale, const int32_t* sum_of_terms, int32_t maxq, bool add, size_t rows,
    size_t dim, float* sums) {
  for (size_t t0 = 0; t0 < rows; t0 += 8) {
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
            a7 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0, b6 = a0, b7 = a0;
    for (size_t i = 0; i < count; ++i) {  // terms [i][16 columns], y [i][16 tokens]
      const __m512i w = _mm512_loadu_si512(lo_terms + i * 16);
      const __m512i v = _mm512_loadu_si512(hi_terms + i * 16);
      const int* at = reinterpret_cast<const int*>(y + i * 16 + t0);
      __m512i u = _mm512_set1_epi32(at[0]);
      DotAdd<kBytes>(a0, u, w), DotAdd<kBytes>(b0, u, v);
      u = _mm512_set1_epi32(at[1]);
      DotAdd<kBytes>(a1, u, w), DotAdd<kBytes>(b1, u, v);
      u = _mm512_set1_epi32(at[2]);
      DotAdd<kBytes>(a2, u, w), DotAdd<kBytes>(b2, u, v);
      u = _mm512_set1_epi32(at[3]);
      DotAdd<kBytes>(a3, u, w), DotAdd<kBytes>(b3, u, v);
      u = _mm512_set1_epi32(at[4]);
      DotAdd<kBytes>(a4, u, w), DotAdd<kBytes>(b4, u, v);
      u = _mm512_set1_epi32(at[5]);
      DotAdd<kBytes>(a5, u, w), DotAdd<kBytes>(b5, u, v);
      u = _mm512_set1_epi32(at[6]);
      DotAdd<kBytes>(a6, u, w), DotAdd<kBytes>(b6, u, v);
      u = _mm512_set1_epi32(at[7]);
      DotAdd<kBytes>(a7, u, w), DotAdd<kBytes>(b7, u, v);
    }
    // Loaded here, not held through the products: every register is taken there.
    __m512i off0 = _mm512_setzero_si512(), off1 = off0;
    if constexpr (kBytes) {
      const __m512i m = _mm512_set1_epi32(maxq);
      off0 = _mm512_mullo_epi32(m, _mm512_loadu_si512(sum_of_terms));
      off1 = _mm512_mullo_epi32(m, _mm512_loadu_si512(sum_of_terms + 16));
    }
    const __m512 sc0 = _mm512_loadu_ps(scale), sc1 = _mm512_loadu_ps(scale + 16);
    // Token t0 + t's row at the columns: each accumulator by name (an array of them would be
    // stored and loaded back).
    auto put = [&](size_t t, __m512i lo, __m512i hi) STRATA_VNNI_TARGET {
      if (t0 + t >= rows) return;
      float* r = sums + (t0 + t) * dim;
      const __m512 x = _mm512_cvtepi32_ps(_mm512_sub_epi32(lo, off0));
      const __m512 z = _mm512_cvtepi32_ps(_mm512_sub_epi32(hi, off1));
      _mm512_storeu_ps(r, add ? _mm512_fmadd_ps(x, sc0, _mm512_loadu_ps(r))
                              : _mm512_mul_ps(x, sc0));
      _mm512_storeu_ps(r + 16, add ? _mm512_fmadd_ps(z, sc1, _mm512_loadu_ps(r + 16))
                                   : _mm512_mul_ps(z, sc1));
    };
    put(0, a0, b0), put(1, a1, b1), put(2, a2, b2), put(3, a3, b3);
    put(4, a4, b4), put(5, a5, b5), put(6, a6, b6), put(7, a7, b7);
  }
}

// Token rows = the integer sums of (symbol - maxq) times the axes' terms, times the columns'
// units; per group of 16 tokens, its symbols interleaved per token once ([pair][16 tokens]
// dwords of two words, [quad][16 tokens] dwords of four bytes), then 32 columns at a time.
STRATA_VNNI_TARGET void ReconstructVnni(const PcaSymbols& s, const uint32_t* slot, size_t n,
                                        const PcaVnniAxes& axes, size_t dim, float scale,
                                        const float* mean, const PcaRope* rope,
                                        const PcaRows& out, std::vector<float>* scratch) {
  const size_t groups = (s.tokens + 15) / 16, pairs = axes.pairs, quads = axes.quads;
  // The group's token rows; its pairs; its quads; the slots in the axes' order.
  scratch->resize(16 * dim + pairs * 16 + quads * 16 + n);
  float* sums = scratch->data();
  uint32_t* y16 = reinterpret_cast<uint32_t*>(sums + 16 * dim);
  uint32_t* y8 = y16 + pairs * 16;
  uint32_t* ordered = y8 + quads * 16;
  for (size_t i = 0; i < n; ++i) ordered[i] = axes.order.empty() ? slot[i] : slot[axes.order[i]];
  const size_t wide = std::min(n, 2 * pairs);  // int16 coordinates; the rest int8
  const uint8_t* sym = static_cast<const uint8_t*>(s.sym);
  const __m256i maxq = _mm256_set1_epi16(static_cast<int16_t>(s.maxq));
  const __m512i idx = PairIndex();
  const bool stream = avx512::StreamsRows(out);
  for (size_t g = 0; g < groups; ++g) {
    const size_t rows = std::min<size_t>(16, s.tokens - g * 16);
    for (size_t p = 0; p < pairs; ++p) {
      const __m256i a = SlotWords(sym, s, g, ordered[2 * p], maxq);
      const __m256i b = 2 * p + 1 < wide ? SlotWords(sym, s, g, ordered[2 * p + 1], maxq)
                                         : _mm256_setzero_si256();
      const __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
      _mm512_storeu_si512(y16 + p * 16, _mm512_permutexvar_epi16(idx, ab));
    }
    for (size_t q = 0; q < quads; ++q)
      _mm512_storeu_si512(y8 + q * 16, QuadBytes(sym, s, g, ordered + wide, n - wide, q));
    for (size_t c0 = 0; c0 < dim; c0 += 32) {
      if (pairs > 0) {
        const uint32_t* terms = axes.words.data() + c0 * pairs;
        SumTokenRows<false>(terms, terms + 16 * pairs, pairs, y16, axes.scale.data() + c0,
                            nullptr, 0, false, rows, dim, sums + c0);
      }
      if (quads > 0) {
        const uint32_t* terms = axes.bytes.data() + c0 * axes.quad_pitch;
        SumTokenRows<true>(terms, terms + 16 * axes.quad_pitch, quads, y8,
                           axes.byte_scale.data() + c0,
                           axes.byte_sum.data() + c0, s.maxq, pairs > 0, rows, dim, sums + c0);
      }
    }
    StoreTokenGroup(sums, dim, scale, mean, rows, rope, g * 16, out, stream);
  }
  if (stream) _mm_sfence();  // the streamed rows visible before whoever the caller tells
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

bool PcaIntegerSumsEnabledForTest() {
  return g_vnni_enabled_for_test.load(std::memory_order_relaxed);
}

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
  std::vector<float> energy(n, 0.0f);
  if (variances != nullptr) {
    std::vector<double> of(n);
    for (size_t k = 0; k < n; ++k) of[k] = double{variances[k]} / (double{steps[k]} * steps[k]);
    std::stable_sort(axes->order.begin(), axes->order.end(),
                     [&](uint32_t a, uint32_t b) { return of[a] > of[b]; });
    for (size_t i = 0; i < n; ++i) energy[i] = static_cast<float>(of[axes->order[i]]);
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
      return AddedError(column.data(), energy.data(), from, n, dim);
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
  axes->quad_pitch = (quads + 15) / 16 * 16;
  axes->scale.assign(dim, 0.0f);
  axes->words.assign(dim * pairs, 0);
  axes->byte_scale.assign(dim, 0.0f);
  axes->byte_sum.assign(dim, 0);
  axes->bytes.assign(dim * axes->quad_pitch, 0);
  for (size_t c = 0; c < dim; ++c) {
    const float* col = &column[c * n];
    float largest = 0;
    for (size_t i = 0; i < wide; ++i) largest = std::max(largest, std::abs(col[i]));
    const float unit = largest / 32767.0f;
    axes->scale[c] = unit;
    for (size_t i = 0; i < wide && unit > 0; ++i) {
      const long v = std::clamp(std::lrint(col[i] / unit), -32767L, 32767L);
      const uint32_t half = static_cast<uint16_t>(static_cast<int16_t>(v));
      uint32_t& word = axes->words[(c / 16) * pairs * 16 + (i / 2) * 16 + c % 16];
      word |= i % 2 == 0 ? half : half << 16;
    }
    const float unit8 = ByteUnit(col, wide, n);
    axes->byte_scale[c] = unit8;
    for (size_t i = wide; i < n && unit8 > 0; ++i) {
      const int32_t v = std::clamp(Nearest(col[i] / unit8), -127, 127);
      axes->byte_sum[c] += static_cast<int32_t>(v);
      const size_t j = i - wide;
      const uint32_t byte = static_cast<uint8_t>(static_cast<int8_t>(v));
      const size_t word = ((c / 16) * axes->quad_pitch + j / 4) * 16 + c % 16;
      axes->bytes[word] |= byte << (8 * (j % 4));
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
