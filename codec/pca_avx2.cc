// The pca decoder's int16 sums and store pass on AVX2 cores (codec/internal/pca_avx2.h).
#include "codec/internal/pca_avx2.h"

#include <algorithm>
#include <atomic>
#include <cmath>
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
    // Saturated as FloatToHalf does (codec/half.h): infinities too; NaN passes.
    v = _mm256_max_ps(_mm256_set1_ps(-65504.0f), _mm256_min_ps(_mm256_set1_ps(65504.0f), v));
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
  WithRowsKind(out.type, stream, [&](auto type, auto streaming) {
    StoreRows<decltype(type)::value, decltype(streaming)::value>(sums, dim, scale, mean, rows,
                                                                  rope, first_token, out);
  });
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

// The encoder's projection (PcaEncodeHeadAvx2): PcaEncodeHeadVnni's operands and sums, with
// vpmaddwd for vpdpwssd and 8-lane vectors.

// Both int16 vectors have a length of at most kUnits (+ half a unit per element): no int32 sum
// overflows at dim <= 256 (PcaVnniEncodesDim), as in the VNNI encoder.
constexpr float kUnits = 32767.0f;
constexpr size_t kEncodeGroups = 4;  // token groups of 16 per pass over the basis

// Token t's head vector as floats in xrow, RoPE undone (RopeRows's inverse, the same float
// operations).
STRATA_AVX2_TARGET void LoadRow(const PcaInput& in, size_t t, size_t dim, const PcaRope* rope,
                                float* xrow) {
  const size_t at = t * in.stride;
  const uint16_t* h = static_cast<const uint16_t*>(in.data) + at;
  switch (in.type) {
    case PcaRows::Type::kFloat32:
      std::memcpy(xrow, static_cast<const float*>(in.data) + at, dim * sizeof(float));
      break;
    case PcaRows::Type::kFloat16:
      for (size_t d = 0; d < dim; d += 8)
        _mm256_storeu_ps(xrow + d, _mm256_cvtph_ps(_mm_loadu_si128(
                                       reinterpret_cast<const __m128i*>(h + d))));
      break;
    case PcaRows::Type::kBFloat16:
      for (size_t d = 0; d < dim; d += 8) {
        const __m256i w =
            _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + d)));
        _mm256_storeu_ps(xrow + d, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
      }
      break;
  }
  if (!rope) return;
  const size_t half = dim / 2;
  const float* cos = rope->cos + t * half;
  const float* sin = rope->sin + t * half;
  for (size_t j = 0; j < half; j += 8) {
    const __m256 a = _mm256_loadu_ps(xrow + j), b = _mm256_loadu_ps(xrow + j + half);
    const __m256 c = _mm256_loadu_ps(cos + j), s = _mm256_loadu_ps(sin + j);
    _mm256_storeu_ps(xrow + j, _mm256_add_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
    _mm256_storeu_ps(xrow + j + half, _mm256_sub_ps(_mm256_mul_ps(b, c), _mm256_mul_ps(a, s)));
  }
}

// r[i] <- column i of the 8 x 8 block of 32-bit words r.
STRATA_AVX2_TARGET inline void Transpose8(__m256i r[8]) {
  __m256i a[8], b[8];
  for (int i = 0; i < 8; i += 2) {
    a[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    a[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    b[i] = _mm256_unpacklo_epi64(a[i], a[i + 2]);
    b[i + 1] = _mm256_unpackhi_epi64(a[i], a[i + 2]);
    b[i + 2] = _mm256_unpacklo_epi64(a[i + 1], a[i + 3]);
    b[i + 3] = _mm256_unpackhi_epi64(a[i + 1], a[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2x128_si256(b[i], b[i + 4], 0x20);
    r[i + 4] = _mm256_permute2x128_si256(b[i], b[i + 4], 0x31);
  }
}

STRATA_AVX2_TARGET inline float Sum8(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

// One group's 16 tokens from t0 (live of them; the rest zero), as the VNNI encoder's
// PrepareGroup: norms and centred energies added to norm2[i] and err2[i] (in float, or in double
// where the squares pass float's range), the centred vector as int16 at kUnits over its length
// (unit[i]), then as pairs per token, xp[j][i] (j < dim / 2). False at a value that is not
// finite.
STRATA_AVX2_TARGET bool PrepareGroup(const PcaInput& in, const PcaRope* rope, size_t t0,
                                     size_t live, size_t tokens, size_t dim, const float* mean,
                                     double* norm2, double* err2, float* unit, float* centred,
                                     int16_t* rows, uint32_t* xp) {
  const size_t es = in.type == PcaRows::Type::kFloat32 ? sizeof(float) : sizeof(uint16_t);
  for (size_t i = 0; i < 16; ++i) {
    int16_t* r = rows + i * dim;
    if (i >= live) {
      std::memset(r, 0, dim * sizeof(int16_t));
      unit[i] = 0;
      continue;
    }
    float* row = centred + i * dim;
    if (t0 + 16 + i < tokens) {  // the next group's row
      const char* next = static_cast<const char*>(in.data) + (t0 + 16 + i) * in.stride * es;
      for (size_t b = 0; b < dim * es; b += 64) _mm_prefetch(next + b, _MM_HINT_T0);
    }
    LoadRow(in, t0 + i, dim, rope, row);
    __m256 nx = _mm256_setzero_ps(), nc = nx;
    for (size_t d = 0; d < dim; d += 8) {
      const __m256 v = _mm256_loadu_ps(row + d);
      const __m256 c = _mm256_sub_ps(v, _mm256_loadu_ps(mean + d));
      nx = _mm256_fmadd_ps(v, v, nx);
      nc = _mm256_fmadd_ps(c, c, nc);
      _mm256_storeu_ps(row + d, c);
    }
    float sx = Sum8(nx), sc = Sum8(nc);
    double length;
    if (std::isfinite(sx) && std::isfinite(sc)) {
      norm2[i] += sx;
      err2[i] += sc;
      length = std::sqrt(sc);
    } else {  // squares past float's range, or values that are not finite: in double
      LoadRow(in, t0 + i, dim, rope, row);
      double dx = 0, dc = 0;
      for (size_t d = 0; d < dim; ++d) {
        const float v = row[d], cf = v - mean[d];
        if (!std::isfinite(cf)) return false;  // v, or its distance to the mean in float
        const double c = double{v} - mean[d];
        dx += double{v} * v;
        dc += c * c;
        row[d] = cf;
      }
      norm2[i] += dx;
      err2[i] += dc;
      length = std::sqrt(dc);
    }
    unit[i] = static_cast<float>(length / kUnits);
    const __m256 s = _mm256_set1_ps(length > 0 ? static_cast<float>(kUnits / length) : 0.0f);
    for (size_t d = 0; d < dim; d += 16) {
      const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + d), s));
      const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(row + d + 8), s));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(r + d),
                          _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8));
    }
  }
  // A row of int16 is a row of pairs: 8 x 8 transposes of 32-bit words put a pair of 8 tokens
  // in each vector.
  for (size_t j0 = 0; j0 < dim / 2; j0 += 8)
    for (size_t i0 = 0; i0 < 16; i0 += 8) {
      __m256i b[8];
      for (size_t i = 0; i < 8; ++i)
        b[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows + (i0 + i) * dim + 2 * j0));
      Transpose8(b);
      for (size_t j = 0; j < 8; ++j)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(xp + (j0 + j) * 16 + i0), b[j]);
    }
  return true;
}

// y[k][t] for the coordinates of `basis` and the kEncodeGroups groups of xp ([g][dim / 2][16])
// from group g0, the first `groups` of them stored: four coordinates by one group (two vectors
// of 8 tokens) at a time, eight accumulators; the four basis rows stay in L1 across the groups.
STRATA_AVX2_TARGET void ProjectGroups(const uint32_t* xp, size_t dim, const PcaVnniBasis& basis,
                                      const float* unit, size_t tp, size_t g0, size_t groups,
                                      float* y) {
  const size_t half = dim / 2, n = basis.n;
  for (size_t k0 = 0; k0 < n; k0 += 4) {
    const uint32_t* b0 = basis.pairs.data() + k0 * half;
    const uint32_t* b1 = b0 + half;
    const uint32_t* b2 = b1 + half;
    const uint32_t* b3 = b2 + half;
    for (size_t g = 0; g < groups; ++g) {
      const uint32_t* x = xp + g * half * 16;
      __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, c0 = a0, c1 = a0, c2 = a0,
              c3 = a0;
      for (size_t j = 0; j < half; ++j) {
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j * 16));
        const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + j * 16 + 8));
        __m256i u = _mm256_set1_epi32(static_cast<int>(b0[j]));
        MulAdd(a0, u, lo), MulAdd(c0, u, hi);
        u = _mm256_set1_epi32(static_cast<int>(b1[j]));
        MulAdd(a1, u, lo), MulAdd(c1, u, hi);
        u = _mm256_set1_epi32(static_cast<int>(b2[j]));
        MulAdd(a2, u, lo), MulAdd(c2, u, hi);
        u = _mm256_set1_epi32(static_cast<int>(b3[j]));
        MulAdd(a3, u, lo), MulAdd(c3, u, hi);
      }
      auto put = [&](size_t k, __m256i lo, __m256i hi) STRATA_AVX2_TARGET {
        if (k0 + k >= n) return;
        const __m256 bu = _mm256_set1_ps(basis.unit[k0 + k]);
        float* out = y + (k0 + k) * tp + (g0 + g) * 16;
        _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_cvtepi32_ps(lo),
                                            _mm256_mul_ps(_mm256_loadu_ps(unit + g * 16), bu)));
        _mm256_storeu_ps(out + 8,
                         _mm256_mul_ps(_mm256_cvtepi32_ps(hi),
                                       _mm256_mul_ps(_mm256_loadu_ps(unit + g * 16 + 8), bu)));
      };
      put(0, a0, c0), put(1, a1, c1), put(2, a2, c2), put(3, a3, c3);
    }
  }
}

STRATA_AVX2_TARGET bool EncodeHead(const PcaInput& in, const PcaRope* rope, size_t tokens,
                                   size_t dim, const float* mean, const PcaVnniBasis& basis,
                                   size_t tp, double* norm2, double* err2, float* y,
                                   std::vector<uint32_t>* scratch) {
  const size_t half = dim / 2, groups = tp / 16;
  const size_t pairs = kEncodeGroups * half * 16;
  scratch->resize(pairs + 24 * dim + kEncodeGroups * 16);
  uint32_t* xp = scratch->data();
  int16_t* rows = reinterpret_cast<int16_t*>(xp + pairs);          // [16][dim]
  float* centred = reinterpret_cast<float*>(xp + pairs + 8 * dim);  // [16][dim]
  float* unit = reinterpret_cast<float*>(xp + pairs + 24 * dim);    // [g][16]
  for (size_t g0 = 0; g0 < groups; g0 += kEncodeGroups) {
    const size_t take = std::min(kEncodeGroups, groups - g0);
    for (size_t g = 0; g < take; ++g) {
      const size_t t0 = (g0 + g) * 16;
      const size_t live = t0 < tokens ? std::min<size_t>(16, tokens - t0) : 0;
      if (!PrepareGroup(in, rope, t0, live, tokens, dim, mean, norm2 + t0, err2 + t0,
                        unit + g * 16, centred, rows, xp + g * half * 16))
        return false;
    }
    ProjectGroups(xp, dim, basis, unit, tp, g0, take, y);
  }
  return true;
}

#endif  // STRATA_PCA_AVX2

std::atomic<uint64_t> g_heads_projected{0};

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

bool PcaEncodeHeadAvx2(const PcaInput& in, const PcaRope* rope, size_t tokens, size_t dim,
                       const float* mean, const PcaVnniBasis& basis, size_t tp, double* norm2,
                       double* err2, float* y, std::vector<uint32_t>* scratch) {
#ifdef STRATA_PCA_AVX2
  if (!PcaAvx2Supported() || !PcaVnniEncodesDim(dim) || tp % 16 != 0 || tp < tokens)
    return false;
  if (!EncodeHead(in, rope, tokens, dim, mean, basis, tp, norm2, err2, y, scratch)) return false;
  g_heads_projected.fetch_add(1, std::memory_order_relaxed);
  return true;
#else
  (void)in, (void)rope, (void)tokens, (void)dim, (void)mean, (void)basis, (void)tp, (void)norm2,
      (void)err2, (void)y, (void)scratch;
  return false;
#endif
}

uint64_t PcaAvx2HeadsProjected() { return g_heads_projected.load(std::memory_order_relaxed); }

}  // namespace strata::codec::internal
