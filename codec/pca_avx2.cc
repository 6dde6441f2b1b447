// The pca decoder's int16 sums and store pass on AVX2 cores (codec/internal/pca_avx2.h).
#include "codec/internal/pca_avx2.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "codec/internal/aligned.h"
#include "codec/internal/pca_avx512.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define STRATA_PCA_AVX2 1
#endif

namespace strata::codec::internal {
namespace {

std::atomic<uint64_t> g_heads_decoded{0};

#ifdef STRATA_PCA_AVX2

#define STRATA_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

bool DetectAvx2() {
  if (const char* env = std::getenv("STRATA_CODEC_AVX2"); env && std::strcmp(env, "0") == 0)
    return false;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return false;
  unsigned a, b, c, d;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
  return (c >> 29) & 1;  // F16C
}

// Slot j's coordinates (symbol - maxq) for the 16 tokens of group g, as int16; zero for tokens
// past the end.
STRATA_AVX2_TARGET inline __m256i SlotWords(const uint8_t* sym, const PcaSymbols& s, size_t g,
                                            uint32_t j, __m256i maxq) {
  const size_t full = s.tokens / 16, rest = s.tokens % 16;
  if (g < full) {
    const __m128i v =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(sym + (g * s.nslots + j) * 16));
    return _mm256_sub_epi16(_mm256_cvtepu8_epi16(v), maxq);
  }
  alignas(16) uint8_t run[16] = {};
  std::memcpy(run, sym + full * 16 * s.nslots + size_t{j} * rest, rest);
  const __m256i lane = _mm256_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m256i live = _mm256_cmpgt_epi16(_mm256_set1_epi16(static_cast<int16_t>(rest)), lane);
  const __m256i v = _mm256_cvtepu8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(run)));
  return _mm256_and_si256(_mm256_sub_epi16(v, maxq), live);
}

// Group g's symbols as pairs of coordinates per token: y[p * 16 + t] holds coordinates 2p
// (low word) and 2p + 1 of token t (zero past n), the operand vpmaddwd broadcasts.
STRATA_AVX2_TARGET void PairWords(const uint8_t* sym, const PcaSymbols& s, size_t g,
                                  const uint32_t* ordered, size_t n, size_t pairs, uint32_t* y) {
  const __m256i maxq = _mm256_set1_epi16(static_cast<int16_t>(s.maxq));
  for (size_t p = 0; p < pairs; ++p) {
    const __m256i a = SlotWords(sym, s, g, ordered[2 * p], maxq);
    const __m256i b = 2 * p + 1 < n ? SlotWords(sym, s, g, ordered[2 * p + 1], maxq)
                                    : _mm256_setzero_si256();
    const __m256i lo = _mm256_unpacklo_epi16(a, b);  // tokens 0-3 | 8-11
    const __m256i hi = _mm256_unpackhi_epi16(a, b);  // tokens 4-7 | 12-15
    __m256i* at = reinterpret_cast<__m256i*>(y + p * 16);
    _mm256_store_si256(at, _mm256_permute2x128_si256(lo, hi, 0x20));
    _mm256_store_si256(at + 1, _mm256_permute2x128_si256(lo, hi, 0x31));
  }
}

// acc += the products of u's and w's word pairs, summed per 32-bit lane.
STRATA_AVX2_TARGET inline void MulAdd(__m256i& acc, __m256i u, __m256i w) {
  acc = _mm256_add_epi32(acc, _mm256_madd_epi16(u, w));
}

// The group's token rows sums[t][c] (t < rows) = the integer sums of its pairs times the
// columns' int16 terms, times the columns' units: 16 columns (two vectors) by 4 tokens at a
// time, eight accumulators, each term vector loaded once per 4 tokens.
STRATA_AVX2_TARGET void SumRows(const uint32_t* y, const PcaVnniAxes& axes, size_t rows,
                                size_t dim, float* sums) {
  const size_t pairs = axes.pairs;
  for (size_t c0 = 0; c0 < dim; c0 += 16) {
    const uint32_t* terms = axes.words.data() + c0 * pairs;  // [p][16 columns]
    const __m256 sc0 = _mm256_loadu_ps(axes.scale.data() + c0);
    const __m256 sc1 = _mm256_loadu_ps(axes.scale.data() + c0 + 8);
    for (size_t t0 = 0; t0 < rows; t0 += 4) {
      __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0,
              b3 = a0;
      for (size_t p = 0; p < pairs; ++p) {
        const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(terms + p * 16));
        const __m256i w1 =
            _mm256_load_si256(reinterpret_cast<const __m256i*>(terms + p * 16 + 8));
        const int* at = reinterpret_cast<const int*>(y + p * 16 + t0);
        __m256i u = _mm256_set1_epi32(at[0]);
        MulAdd(a0, u, w0), MulAdd(b0, u, w1);
        u = _mm256_set1_epi32(at[1]);
        MulAdd(a1, u, w0), MulAdd(b1, u, w1);
        u = _mm256_set1_epi32(at[2]);
        MulAdd(a2, u, w0), MulAdd(b2, u, w1);
        u = _mm256_set1_epi32(at[3]);
        MulAdd(a3, u, w0), MulAdd(b3, u, w1);
      }
      auto put = [&](size_t t, __m256i lo, __m256i hi) STRATA_AVX2_TARGET {
        if (t0 + t >= rows) return;
        float* r = sums + (t0 + t) * dim + c0;
        _mm256_storeu_ps(r, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), sc0));
        _mm256_storeu_ps(r + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), sc1));
      };
      put(0, a0, b0), put(1, a1, b1), put(2, a2, b2), put(3, a3, b3);
    }
  }
}

// 8 values at element `at` of out's data, converted as the AVX-512 store pass converts them
// (round to nearest even); kStream: past the caches (the address aligned to the store).
template <PcaRows::Type kType, bool kStream>
STRATA_AVX2_TARGET inline void PutAt(void* data, size_t at, __m256 v) {
  if constexpr (kType == PcaRows::Type::kFloat32) {
    float* p = static_cast<float*>(data) + at;
    if constexpr (kStream) {
      _mm256_stream_ps(p, v);
    } else {
      _mm256_storeu_ps(p, v);
    }
    return;
  }
  __m128i half;
  if constexpr (kType == PcaRows::Type::kFloat16) {
    half = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {  // FloatToBF16's rounding of finite values
    const __m256i u = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd)), 16);
    half = _mm256_castsi256_si128(
        _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));  // words 0-7
  }
  __m128i* p = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(data) + at);
  if constexpr (kStream) {
    _mm_stream_si128(p, half);
  } else {
    _mm_storeu_si128(p, half);
  }
}

// The group's rows from its sums [t][dim]: mean + scale * sum, rotated as RopeRows rotates (the
// AVX-512 store pass's operations: the same values), converted.
template <PcaRows::Type kType, bool kStream>
STRATA_AVX2_TARGET void StoreRows(const float* sums, size_t dim, float scale, const float* mean,
                                  size_t rows, const PcaRope* rope, size_t first_token,
                                  const PcaRows& out) {
  const __m256 sc = _mm256_set1_ps(scale);
  const size_t half = dim / 2, stride = out.stride;
  void* const data = out.data;
  for (size_t t = 0; t < rows; ++t) {
    const float* r = sums + t * dim;
    const size_t token = first_token + t, row = token * stride;
    if (!rope) {
      for (size_t c0 = 0; c0 < dim; c0 += 8)
        PutAt<kType, kStream>(
            data, row + c0,
            _mm256_fmadd_ps(_mm256_loadu_ps(r + c0), sc, _mm256_loadu_ps(mean + c0)));
      continue;
    }
    const float* const tc = rope->cos + token * half;
    const float* const ts = rope->sin + token * half;
    for (size_t c0 = 0; c0 < half; c0 += 8) {
      const __m256 a = _mm256_fmadd_ps(_mm256_loadu_ps(r + c0), sc, _mm256_loadu_ps(mean + c0));
      const __m256 b = _mm256_fmadd_ps(_mm256_loadu_ps(r + c0 + half), sc,
                                       _mm256_loadu_ps(mean + c0 + half));
      const __m256 c = _mm256_loadu_ps(tc + c0), s = _mm256_loadu_ps(ts + c0);
      PutAt<kType, kStream>(data, row + c0,
                            _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
      PutAt<kType, kStream>(data, row + c0 + half,
                            _mm256_add_ps(_mm256_mul_ps(b, c), _mm256_mul_ps(a, s)));
    }
  }
}

// Whether the rows may be streamed: every 8 values of every row aligned to the store's width.
bool StreamsRows(const PcaRows& out) {
  const size_t elem = out.type == PcaRows::Type::kFloat32 ? 4 : 2;
  return reinterpret_cast<uintptr_t>(out.data) % (8 * elem) == 0 && out.stride % 8 == 0;
}

STRATA_AVX2_TARGET void StoreGroup(const float* sums, size_t dim, float scale, const float* mean,
                                   size_t rows, const PcaRope* rope, size_t first_token,
                                   const PcaRows& out, bool stream) {
  using T = PcaRows::Type;
  auto store = [&](auto type, auto streaming) {
    StoreRows<decltype(type)::value, decltype(streaming)::value>(sums, dim, scale, mean, rows,
                                                                  rope, first_token, out);
  };
  using Stream = std::true_type;
  using Plain = std::false_type;
  switch (out.type) {
    case T::kFloat32:
      return stream ? store(std::integral_constant<T, T::kFloat32>{}, Stream{})
                    : store(std::integral_constant<T, T::kFloat32>{}, Plain{});
    case T::kFloat16:
      return stream ? store(std::integral_constant<T, T::kFloat16>{}, Stream{})
                    : store(std::integral_constant<T, T::kFloat16>{}, Plain{});
    case T::kBFloat16:
      return stream ? store(std::integral_constant<T, T::kBFloat16>{}, Stream{})
                    : store(std::integral_constant<T, T::kBFloat16>{}, Plain{});
  }
}

STRATA_AVX2_TARGET void ReconstructAvx2(const PcaSymbols& s, const uint32_t* slot, size_t n,
                                        const PcaVnniAxes& axes, size_t dim, float scale,
                                        const float* mean, const PcaRope* rope,
                                        const PcaRows& out, std::vector<float>* scratch) {
  const size_t groups = (s.tokens + 15) / 16, pairs = axes.pairs;
  // The group's token rows; its pairs; the slots in the axes' order (each on a cache line).
  const size_t lines = kCacheLine / sizeof(float);
  scratch->resize(16 * dim + pairs * 16 + n + 2 * lines);
  float* const sums = AlignToCacheLine(scratch->data());
  uint32_t* const y = reinterpret_cast<uint32_t*>(AlignToCacheLine(sums + 16 * dim));
  uint32_t* const ordered = y + pairs * 16;
  for (size_t i = 0; i < n; ++i) ordered[i] = axes.order.empty() ? slot[i] : slot[axes.order[i]];
  const uint8_t* sym = static_cast<const uint8_t*>(s.sym);
  const bool stream = StreamsRows(out);
  for (size_t g = 0; g < groups; ++g) {
    const size_t rows = std::min<size_t>(16, s.tokens - g * 16);
    PairWords(sym, s, g, ordered, n, pairs, y);
    SumRows(y, axes, rows, dim, sums);
    StoreGroup(sums, dim, scale, mean, rows, rope, g * 16, out, stream);
  }
  if (stream) _mm_sfence();  // the streamed rows visible before whoever the caller tells
}

#endif  // STRATA_PCA_AVX2

}  // namespace

bool PcaAvx2Supported() {
#ifdef STRATA_PCA_AVX2
  static const bool detected = DetectAvx2();
  return detected;
#else
  return false;
#endif
}

bool PcaAvx2Available() { return PcaAvx2Supported() && PcaIntegerSumsEnabledForTest(); }

bool PcaReconstructAvx2(const PcaSymbols& s, const uint32_t* slot, size_t n,
                        const PcaVnniAxes& axes, size_t dim, float scale, const float* mean,
                        const PcaRope* rope, const PcaRows& out, std::vector<float>* scratch) {
#ifdef STRATA_PCA_AVX2
  if (!PcaAvx2Supported() || s.wide || s.maxq > 127 || axes.pairs == 0 || axes.quads != 0 ||
      dim % 32 != 0 || dim > 256 || s.tokens == 0 ||
      (!axes.order.empty() && axes.order.size() != n))
    return false;
  ReconstructAvx2(s, slot, n, axes, dim, scale, mean, rope, out, scratch);
  g_heads_decoded.fetch_add(1, std::memory_order_relaxed);
  return true;
#else
  (void)s, (void)slot, (void)n, (void)axes, (void)dim, (void)scale, (void)mean, (void)rope,
      (void)out, (void)scratch;
  return false;
#endif
}

uint64_t PcaAvx2HeadsDecoded() { return g_heads_decoded.load(std::memory_order_relaxed); }

}  // namespace strata::codec::internal
