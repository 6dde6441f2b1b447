// The pca encoder's projection as int16 dot products on AVX512-VNNI cores without AMX
// (internal/pca_avx512.h, PcaEncodeHeadVnni): vpdpwssd takes 32 products per instruction where
// a float multiply-add takes 16, and this core issues either at two per cycle, so the sums that
// were most of an encode take half the cycles. And its quantisation on AVX-512 cores
// (PcaQuantizeHead*Avx512). Functions carry their own target attributes: nothing here runs
// unless PcaVnniSupported() (the projection) or PcaLanesSupported() (the quantisation).
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
// (kUnits + 8)^2 < 2^31 for dim <= 256 (Cauchy-Schwarz; PcaVnniEncodesDim): no int32 sum
// overflows.
constexpr float kUnits = 32767.0f;

#ifdef STRATA_PCA_AVX512

using avx512::LoadRow;

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

// Lane i: the sum of v[i]'s lanes.
STRATA_AVX512_TARGET inline __m512 LaneSums(__m512 v[16]) {
  avx512::Transpose16(v);
  for (int w = 8; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) v[i] = _mm512_add_ps(v[i], v[i + w]);
  return v[0];
}

// One group's 16 tokens from t0 (live of them; the rest zero): per token the squared norm and
// centred energy added to norm2[i] and err2[i], its centred vector as int16 at kUnits over its
// length (unit[i]: the length / kUnits), then transposed into pairs: xp[j][i] = token i's
// elements 2j and 2j + 1 (the low word first), j < dim / 2. False at a value that is not finite.
// The tokens' sums and scales are taken together, 16 lanes at a time: one token at a time, a
// reduction, a square root and a division stood between its two passes.
STRATA_VNNI_ENCODE_TARGET bool PrepareGroup(const PcaInput& in, const PcaRope* rope, size_t t0,
                                            size_t live, size_t tokens, size_t dim,
                                            const float* mean, double* norm2, double* err2,
                                            float* unit, float* centred, int16_t* rows,
                                            uint32_t* xp) {
  const size_t es = in.type == PcaRows::Type::kFloat32 ? sizeof(float) : sizeof(uint16_t);
  __m512 nx[16], nc[16];
  for (size_t i = 0; i < 16; ++i) {
    nx[i] = nc[i] = _mm512_setzero_ps();
    if (i >= live) continue;
    float* row = centred + i * dim;
    if (t0 + 16 + i < tokens) {  // the next group's row (from L3 or memory, not the L2)
      const char* next = static_cast<const char*>(in.data) + (t0 + 16 + i) * in.stride * es;
      for (size_t b = 0; b < dim * es; b += 64) _mm_prefetch(next + b, _MM_HINT_T0);
    }
    LoadRow(in, t0 + i, dim, rope, row);
    for (size_t d = 0; d < dim; d += 16) {
      const __m512 v = _mm512_loadu_ps(row + d);
      const __m512 c = _mm512_sub_ps(v, _mm512_loadu_ps(mean + d));
      nx[i] = _mm512_fmadd_ps(v, v, nx[i]);
      nc[i] = _mm512_fmadd_ps(c, c, nc[i]);
      _mm512_storeu_ps(row + d, c);
    }
  }
  alignas(64) float sx[16], sc[16], scale[16];
  _mm512_store_ps(sx, LaneSums(nx));
  _mm512_store_ps(sc, LaneSums(nc));
  const __m512 sums = _mm512_add_ps(_mm512_load_ps(sx), _mm512_load_ps(sc));
  if (_mm512_cmp_ps_mask(_mm512_abs_ps(sums), _mm512_set1_ps(INFINITY), _CMP_LT_OQ) != 0xFFFF) {
    // Squares past float's range (or values that are not finite): those tokens in double.
    for (size_t i = 0; i < live; ++i) {
      if (std::isfinite(sx[i]) && std::isfinite(sc[i])) continue;
      LoadRow(in, t0 + i, dim, rope, centred + i * dim);
      double dx = 0, dc = 0;
      for (size_t d = 0; d < dim; ++d) {
        const float v = centred[i * dim + d], cf = v - mean[d];
        if (!std::isfinite(cf)) return false;  // v, or its distance to the mean in float
        const double c = double{v} - mean[d];
        dx += double{v} * v;
        dc += c * c;
        centred[i * dim + d] = cf;
      }
      norm2[i] += dx;
      err2[i] += dc;
      const double length = std::sqrt(dc);
      unit[i] = static_cast<float>(length / kUnits);
      scale[i] = length > 0 ? static_cast<float>(kUnits / length) : 0.0f;
      sx[i] = sc[i] = NAN;  // taken
    }
  }
  // The others' sums added in double, their lengths and scales 16 at a time.
  const __m512 length = _mm512_sqrt_ps(_mm512_load_ps(sc));
  const __mmask16 taken = _mm512_cmp_ps_mask(length, length, _CMP_UNORD_Q);
  const __mmask16 some = _mm512_cmp_ps_mask(length, _mm512_setzero_ps(), _CMP_GT_OQ) & ~taken;
  _mm512_mask_storeu_ps(unit, ~taken, _mm512_mul_ps(length, _mm512_set1_ps(1.0f / kUnits)));
  _mm512_mask_storeu_ps(scale, ~taken,
                        _mm512_maskz_div_ps(some, _mm512_set1_ps(kUnits), length));
  for (size_t i = 0; i < 16; ++i) {
    if (taken >> i & 1) continue;
    norm2[i] += sx[i];
    err2[i] += sc[i];
  }
  for (size_t i = 0; i < 16; ++i) {
    int16_t* r = rows + i * dim;
    if (i >= live) {
      std::memset(r, 0, dim * sizeof(int16_t));
      continue;
    }
    const __m512 s = _mm512_set1_ps(scale[i]);
    const float* c = centred + i * dim;
    for (size_t d = 0; d < dim; d += 16) {
      const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(c + d), s);
      const __m256i w = _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(v));
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
  return true;
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

STRATA_VNNI_ENCODE_TARGET bool EncodeHead(const PcaInput& in, const PcaRope* rope,
                                          size_t tokens, size_t dim, const float* mean,
                                          const PcaVnniBasis& basis, size_t tp, double* norm2,
                                          double* err2, float* y,
                                          std::vector<uint32_t>* scratch) {
  const size_t half = dim / 2, groups = tp / 16;
  const size_t pairs = kGroups * half * 16;
  scratch->resize(pairs + 24 * dim + kGroups * 16);
  uint32_t* xp = scratch->data();
  int16_t* rows = reinterpret_cast<int16_t*>(xp + pairs);           // [16][dim]
  float* centred = reinterpret_cast<float*>(xp + pairs + 8 * dim);   // [16][dim]
  float* unit = reinterpret_cast<float*>(xp + pairs + 24 * dim);     // [g][16]
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
      if (!PrepareGroup(in, rope, t0, live, tokens, dim, mean, norm2 + t0, err2 + t0,
                        unit + g * 16, centred, rows, to))
        return false;
    }
    ProjectGroups(xp, dim, basis, unit, tp, g0, take, y);
  }
  return true;
}

// PcaQuantizeT's arithmetic on a vector of 16 tokens for every coordinate in turn, with the
// tokens' float gains and largest |q| held in registers across the coordinates (the kernel's
// memory round trip per coordinate was most of its time), the gains added to the double errors
// once: the same operations in the same order, so the same bits. (Summed in double per
// coordinate, the conversions were a fifth of the loop: encode 5 % slower.) kRuns: each coordinate's 16 symbols as int8 (saturated) into
// its slot's run of the token group, runs[(t / 16 * nslots + slot[k]) * 16 ..], else as int32
// into q[k * tp + t].
template <bool kRuns>
STRATA_AVX512_TARGET void QuantizeHead(const float* y, size_t n, size_t tp, const float* steps,
                                       const float* inv, float limit, int32_t* q,
                                       const uint32_t* slot, size_t nslots, int8_t* runs,
                                       double* err2, int32_t* tok_max) {
  const __m512 lo = _mm512_set1_ps(-limit), hi = _mm512_set1_ps(limit);
  for (size_t t = 0; t < tp; t += 16) {
    __m512 gains = _mm512_setzero_ps();
    __m512i most = _mm512_loadu_si512(tok_max + t);
    int8_t* group = kRuns ? runs + (t / 16) * nslots * 16 : nullptr;
    for (size_t k = 0; k < n; ++k) {
      // Two groups ahead on this coordinate's row: the rows lie tp floats apart, a stride the
      // prefetchers miss, and a bit budget's kept rows come from L3 (this loop took twice its
      // time there: with the size model's cheaper spreads, the budget's encode 2-8 % faster).
      if (t + 32 < tp)
        _mm_prefetch(reinterpret_cast<const char*>(y + k * tp + t + 32), _MM_HINT_T0);
      const __m512 v = _mm512_loadu_ps(y + k * tp + t);
      const __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(inv[k])),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512 qv = _mm512_min_ps(hi, _mm512_max_ps(lo, r));
      const __m512 e = _mm512_sub_ps(v, _mm512_mul_ps(qv, _mm512_set1_ps(steps[k])));
      gains = _mm512_add_ps(gains, _mm512_sub_ps(_mm512_mul_ps(e, e), _mm512_mul_ps(v, v)));
      const __m512i qi = _mm512_cvtps_epi32(qv);
      if constexpr (kRuns) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(group + size_t{slot[k]} * 16),
                         _mm512_cvtsepi32_epi8(qi));
      } else {
        _mm512_storeu_si512(q + k * tp + t, qi);
      }
      most = _mm512_max_epi32(most, _mm512_abs_epi32(qi));
    }
    const __m256 upper = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(gains), 1));
    _mm512_storeu_pd(err2 + t, _mm512_add_pd(_mm512_loadu_pd(err2 + t),
                                             _mm512_cvtps_pd(_mm512_castps512_ps256(gains))));
    _mm512_storeu_pd(err2 + t + 8,
                     _mm512_add_pd(_mm512_loadu_pd(err2 + t + 8), _mm512_cvtps_pd(upper)));
    _mm512_storeu_si512(tok_max + t, most);
  }
}

#endif  // STRATA_PCA_AVX512

}  // namespace

void BuildPcaVnniBasis(const float* basis, const uint32_t* coords, size_t n, size_t dim,
                       PcaVnniBasis* out) {
  *out = PcaVnniBasis{};
  if (n == 0 || !PcaVnniEncodesDim(dim)) return;
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

bool PcaEncodeHeadVnni(const PcaInput& in, const PcaRope* rope, size_t tokens, size_t dim,
                       const float* mean, const PcaVnniBasis& basis, size_t tp, double* norm2,
                       double* err2, float* y, std::vector<uint32_t>* scratch) {
#ifdef STRATA_PCA_AVX512
  if (!EncodeHead(in, rope, tokens, dim, mean, basis, tp, norm2, err2, y, scratch)) return false;
  g_heads_projected_vnni.fetch_add(1, std::memory_order_relaxed);
  return true;
#else
  (void)in, (void)rope, (void)tokens, (void)dim, (void)mean, (void)basis, (void)tp, (void)norm2,
      (void)err2, (void)y, (void)scratch;
  return false;
#endif
}

void PcaQuantizeHeadAvx512(const float* y, size_t n, size_t tp, const float* steps,
                           const float* inv, float limit, int32_t* q, double* err2,
                           int32_t* tok_max) {
#ifdef STRATA_PCA_AVX512
  QuantizeHead<false>(y, n, tp, steps, inv, limit, q, nullptr, 0, nullptr, err2, tok_max);
#else
  (void)y, (void)n, (void)tp, (void)steps, (void)inv, (void)limit, (void)q, (void)err2,
      (void)tok_max;
#endif
}

void PcaQuantizeHeadRunsAvx512(const float* y, size_t n, size_t tp, const float* steps,
                               const float* inv, float limit, const uint32_t* slot,
                               size_t nslots, int8_t* runs, double* err2, int32_t* tok_max) {
#ifdef STRATA_PCA_AVX512
  QuantizeHead<true>(y, n, tp, steps, inv, limit, nullptr, slot, nslots, runs, err2, tok_max);
#else
  (void)y, (void)n, (void)tp, (void)steps, (void)inv, (void)limit, (void)slot, (void)nslots,
      (void)runs, (void)err2, (void)tok_max;
#endif
}

uint64_t PcaVnniHeadsProjected() {
  return g_heads_projected_vnni.load(std::memory_order_relaxed);
}

}  // namespace strata::codec::internal
