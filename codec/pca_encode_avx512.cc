// The pca encoder's projection as int16 dot products on AVX512-VNNI cores without AMX
// (internal/pca_avx512.h, PcaEncodeHeadVnni): vpdpwssd takes 32 products per instruction where
// a float multiply-add takes 16, and this core issues either at two per cycle, so the sums that
// were most of an encode take half the cycles.
// Functions carry their own target attributes: nothing here runs unless PcaVnniSupported().
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "codec/internal/pca_avx512.h"
#include "codec/internal/pca_store_avx512.h"

namespace strata::codec::internal {

namespace {

std::atomic<uint64_t> g_heads_projected_vnni{0};

// Both operands' int16 vectors have a length of at most kUnits (+ half a unit of rounding per
// element), so every sum of products, and so every partial sum, is at most
// (kUnits + 8)^2 < 2^31 for dim <= 256 (Cauchy-Schwarz): no int32 sum overflows.
constexpr float kUnits = 32767.0f;
constexpr size_t kMaxDim = 256;

#ifdef STRATA_PCA_AVX512

#define STRATA_VNNI_ENCODE_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

constexpr size_t kGroups = 4;  // token groups of 16 per pass over the basis

// acc += the pairwise products of two int16 vectors. An asm of its own: with the intrinsic GCC
// 12 copies each accumulator through another register around every product.
STRATA_VNNI_ENCODE_TARGET __attribute__((always_inline)) inline void WordDotAdd(__m512i& acc,
                                                                               __m512i u,
                                                                               __m512i s) {
  asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
}

// One group's 16 tokens from `x` (live of them; the rest zero): per token the squared norm and
// centred energy added to norm2[i] and err2[i], its centred vector as int16 at kUnits over its
// length (unit[i]: the length / kUnits), then transposed into pairs: xp[j][i] = token i's
// elements 2j and 2j + 1 (the low word first), j < dim / 2.
STRATA_VNNI_ENCODE_TARGET void PrepareGroup(const float* x, size_t stride, size_t live,
                                            size_t dim, const float* mean, double* norm2,
                                            double* err2, float* unit, int16_t* rows,
                                            uint32_t* xp) {
  for (size_t i = 0; i < 16; ++i) {
    int16_t* r = rows + i * dim;
    if (i >= live) {
      std::memset(r, 0, dim * sizeof(int16_t));
      unit[i] = 0;
      continue;
    }
    const float* row = x + i * stride;
    __m512 nx = _mm512_setzero_ps(), nc = nx;
    for (size_t d = 0; d < dim; d += 16) {
      const __m512 v = _mm512_loadu_ps(row + d);
      const __m512 c = _mm512_sub_ps(v, _mm512_loadu_ps(mean + d));
      nx = _mm512_fmadd_ps(v, v, nx);
      nc = _mm512_fmadd_ps(c, c, nc);
    }
    double sx = _mm512_reduce_add_ps(nx), sc = _mm512_reduce_add_ps(nc);
    if (!std::isfinite(sx) || !std::isfinite(sc)) {  // squares past float's range: in double
      sx = sc = 0;
      for (size_t d = 0; d < dim; ++d) {
        const double c = double{row[d]} - mean[d];
        sx += double{row[d]} * row[d];
        sc += c * c;
      }
    }
    norm2[i] += sx;
    err2[i] += sc;
    const double length = std::sqrt(sc);
    unit[i] = static_cast<float>(length / kUnits);
    const __m512 s = _mm512_set1_ps(length > 0 ? static_cast<float>(kUnits / length) : 0.0f);
    for (size_t d = 0; d < dim; d += 16) {
      const __m512 c = _mm512_sub_ps(_mm512_loadu_ps(row + d), _mm512_loadu_ps(mean + d));
      const __m256i w = _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(c, s)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(r + d), w);
    }
  }
  // A row of int16 is a row of pairs: transposing 16 x 16 blocks of 32-bit words puts a pair
  // of every token in each vector.
  for (size_t j0 = 0; j0 < dim / 2; j0 += 16) {
    __m512 b[16];
    for (size_t i = 0; i < 16; ++i)
      b[i] = _mm512_loadu_ps(reinterpret_cast<const float*>(rows + i * dim + 2 * j0));
    avx512::Transpose16(b);
    for (size_t j = 0; j < 16; ++j)
      _mm512_storeu_ps(reinterpret_cast<float*>(xp + (j0 + j) * 16), b[j]);
  }
}

// y[k][t] for the coordinates of `basis` and the kGroups groups of xp ([g][dim / 2][16]) from
// group g0, the first `groups` of them stored: four coordinates by four groups at a time,
// sixteen named accumulators (two products per cycle, five cycles apart), eight loads per
// sixteen products.
STRATA_VNNI_ENCODE_TARGET void ProjectGroups(const uint32_t* xp, size_t dim,
                                             const PcaVnniBasis& basis, const float* unit,
                                             size_t tp, size_t g0, size_t groups, float* y) {
  const size_t half = dim / 2, n = basis.n;
  const uint32_t* x1p = xp + half * 16;
  const uint32_t* x2p = x1p + half * 16;
  const uint32_t* x3p = x2p + half * 16;
  for (size_t k0 = 0; k0 < n; k0 += 4) {
    const uint32_t* b0 = basis.pairs.data() + k0 * half;
    const uint32_t* b1 = b0 + half;
    const uint32_t* b2 = b1 + half;
    const uint32_t* b3 = b2 + half;
    __m512i a00 = _mm512_setzero_si512(), a01 = a00, a02 = a00, a03 = a00;
    __m512i a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    __m512i a20 = a00, a21 = a00, a22 = a00, a23 = a00;
    __m512i a30 = a00, a31 = a00, a32 = a00, a33 = a00;
    for (size_t j = 0; j < half; ++j) {
      const __m512i x0 = _mm512_loadu_si512(xp + j * 16), x1 = _mm512_loadu_si512(x1p + j * 16);
      const __m512i x2 = _mm512_loadu_si512(x2p + j * 16), x3 = _mm512_loadu_si512(x3p + j * 16);
      __m512i u = _mm512_set1_epi32(static_cast<int>(b0[j]));
      WordDotAdd(a00, u, x0), WordDotAdd(a01, u, x1), WordDotAdd(a02, u, x2);
      WordDotAdd(a03, u, x3);
      u = _mm512_set1_epi32(static_cast<int>(b1[j]));
      WordDotAdd(a10, u, x0), WordDotAdd(a11, u, x1), WordDotAdd(a12, u, x2);
      WordDotAdd(a13, u, x3);
      u = _mm512_set1_epi32(static_cast<int>(b2[j]));
      WordDotAdd(a20, u, x0), WordDotAdd(a21, u, x1), WordDotAdd(a22, u, x2);
      WordDotAdd(a23, u, x3);
      u = _mm512_set1_epi32(static_cast<int>(b3[j]));
      WordDotAdd(a30, u, x0), WordDotAdd(a31, u, x1), WordDotAdd(a32, u, x2);
      WordDotAdd(a33, u, x3);
    }
    // Each accumulator by name (an array of them would be stored and loaded back).
    auto put = [&](size_t k, size_t g, __m512i acc) STRATA_VNNI_ENCODE_TARGET {
      if (k0 + k >= n || g >= groups) return;
      const __m512 scale =
          _mm512_mul_ps(_mm512_loadu_ps(unit + g * 16), _mm512_set1_ps(basis.unit[k0 + k]));
      _mm512_storeu_ps(y + (k0 + k) * tp + (g0 + g) * 16,
                       _mm512_mul_ps(_mm512_cvtepi32_ps(acc), scale));
    };
    put(0, 0, a00), put(0, 1, a01), put(0, 2, a02), put(0, 3, a03);
    put(1, 0, a10), put(1, 1, a11), put(1, 2, a12), put(1, 3, a13);
    put(2, 0, a20), put(2, 1, a21), put(2, 2, a22), put(2, 3, a23);
    put(3, 0, a30), put(3, 1, a31), put(3, 2, a32), put(3, 3, a33);
  }
}

STRATA_VNNI_ENCODE_TARGET void EncodeHead(const float* x, size_t stride, size_t tokens,
                                          size_t dim, const float* mean,
                                          const PcaVnniBasis& basis, size_t tp, double* norm2,
                                          double* err2, float* y,
                                          std::vector<uint32_t>* scratch) {
  const size_t half = dim / 2, groups = tp / 16;
  scratch->resize(kGroups * half * 16 + 8 * dim + kGroups * 16);
  uint32_t* xp = scratch->data();
  int16_t* rows = reinterpret_cast<int16_t*>(xp + kGroups * half * 16);  // [16][dim]
  float* unit = reinterpret_cast<float*>(xp + kGroups * half * 16 + 8 * dim);  // [g][16]
  for (size_t g0 = 0; g0 < groups; g0 += kGroups) {
    const size_t take = std::min(kGroups, groups - g0);
    for (size_t g = 0; g < kGroups; ++g) {
      uint32_t* to = xp + g * half * 16;
      if (g >= take) {  // summed, not stored
        std::memset(to, 0, half * 16 * sizeof(uint32_t));
        continue;
      }
      const size_t t0 = (g0 + g) * 16;
      const size_t live = t0 < tokens ? std::min<size_t>(16, tokens - t0) : 0;
      PrepareGroup(x + t0 * stride, stride, live, dim, mean, norm2 + t0, err2 + t0,
                   unit + g * 16, rows, to);
    }
    ProjectGroups(xp, dim, basis, unit, tp, g0, take, y);
  }
}

#endif  // STRATA_PCA_AVX512

}  // namespace

void BuildPcaVnniBasis(const float* basis, const uint32_t* coords, size_t n, size_t dim,
                       PcaVnniBasis* out) {
  *out = PcaVnniBasis{};
  if (n == 0 || dim % 32 != 0 || dim > kMaxDim) return;
  const size_t half = dim / 2, kpad = (n + 3) / 4 * 4;
  out->n = n;
  out->pairs.assign(kpad * half, 0);
  out->unit.assign(kpad, 0.0f);
  for (size_t k = 0; k < n; ++k) {
    const float* row = basis + size_t{coords[k]} * dim;
    double length2 = 0;
    for (size_t d = 0; d < dim; ++d) length2 += double{row[d]} * row[d];
    const double unit = std::sqrt(length2) / kUnits;
    out->unit[k] = static_cast<float>(unit);
    for (size_t d = 0; d < dim && unit > 0; ++d) {
      const long v = std::clamp(std::lrint(row[d] / unit), -32767L, 32767L);
      const uint32_t word = static_cast<uint16_t>(static_cast<int16_t>(v));
      out->pairs[k * half + d / 2] |= d % 2 == 0 ? word : word << 16;
    }
  }
}

void PcaEncodeHeadVnni(const float* x, size_t stride, size_t tokens, size_t dim,
                       const float* mean, const PcaVnniBasis& basis, size_t tp, double* norm2,
                       double* err2, float* y, std::vector<uint32_t>* scratch) {
#ifdef STRATA_PCA_AVX512
  EncodeHead(x, stride, tokens, dim, mean, basis, tp, norm2, err2, y, scratch);
  g_heads_projected_vnni.fetch_add(1, std::memory_order_relaxed);
#else
  (void)x, (void)stride, (void)tokens, (void)dim, (void)mean, (void)basis, (void)tp,
      (void)norm2, (void)err2, (void)y, (void)scratch;
#endif
}

uint64_t PcaVnniHeadsProjected() {
  return g_heads_projected_vnni.load(std::memory_order_relaxed);
}

}  // namespace strata::codec::internal
