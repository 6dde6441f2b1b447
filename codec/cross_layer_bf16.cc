// The cross-layer coder's bf16 products without AMX tiles (internal/cross_layer_amx.h):
// `vdpbf16ps` where the core has AVX512-BF16 (AMD Zen 4, Intel Cooper Lake and later), else the
// same pairs as two FMAs on AVX2. The operands are the tiles' (bf16 token rows, pair rows of B):
// the kernels' sums differ by float rounding alone. A bf16 times a bf16 is exact in float, so an
// FMA adds it with one rounding: the FMA kernel's sums are std::fma's in pair order.
#include <algorithm>
#include <cstring>

#include "codec/half.h"
#include "codec/internal/cross_layer_amx.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define STRATA_XL_X86 1
#define STRATA_XL_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define STRATA_XL_FMA_TARGET __attribute__((target("avx2,fma")))
#endif

namespace strata::codec::internal {

#ifdef STRATA_XL_X86
namespace {

// A token's coordinates 2p and 2p + 1 as one word (the row's words are uint16_t).
inline int PairAt(const uint16_t* row, size_t p) {
  int w;
  std::memcpy(&w, row + 2 * p, sizeof(w));
  return w;
}

// Four tokens from t by NJ column vectors of 16 from j, over every pair row of b: acc (+)= a b.
template <int NJ>
STRATA_XL_BF16_TARGET inline void Bf16Tile(const uint16_t* a, size_t lda, const XlPairs& b,
                                           size_t t, size_t j, bool accumulate, float* c,
                                           size_t ldc) {
  __m512 acc[4][NJ];
  for (int tt = 0; tt < 4; ++tt)
    for (int jj = 0; jj < NJ; ++jj)
      acc[tt][jj] = accumulate ? _mm512_loadu_ps(c + (t + tt) * ldc + j + 16 * jj)
                               : _mm512_setzero_ps();
  const uint32_t* bw = reinterpret_cast<const uint32_t*>(b.words.data()) + j;
  const uint16_t* ar[4];
  for (int tt = 0; tt < 4; ++tt) ar[tt] = a + (t + tt) * lda;
  const size_t pairs = b.rows_pad / 2;
  for (size_t p = 0; p < pairs; ++p) {
    __m512bh bv[NJ];
    for (int jj = 0; jj < NJ; ++jj)
      bv[jj] = (__m512bh)_mm512_loadu_si512(bw + p * b.cols_pad + 16 * jj);
    for (int tt = 0; tt < 4; ++tt) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(PairAt(ar[tt], p));
      for (int jj = 0; jj < NJ; ++jj) acc[tt][jj] = _mm512_dpbf16_ps(acc[tt][jj], av, bv[jj]);
    }
  }
  for (int tt = 0; tt < 4; ++tt)
    for (int jj = 0; jj < NJ; ++jj) _mm512_storeu_ps(c + (t + tt) * ldc + j + 16 * jj, acc[tt][jj]);
}

STRATA_XL_BF16_TARGET void ProductBf16(const uint16_t* a, size_t lda, const XlPairs& b,
                                       size_t tokens, bool accumulate, float* c, size_t ldc) {
  // Columns outside, tokens inside: 64 columns of b's pair rows (64 KiB at 512 rows) stay in
  // the L2 while the token rows stream past them.
  size_t j = 0;
  for (; j + 64 <= b.cols_pad; j += 64)
    for (size_t t = 0; t < tokens; t += 4) Bf16Tile<4>(a, lda, b, t, j, accumulate, c, ldc);
  for (; j < b.cols_pad; j += 32)
    for (size_t t = 0; t < tokens; t += 4) Bf16Tile<2>(a, lda, b, t, j, accumulate, c, ldc);
}

STRATA_XL_BF16_TARGET void ToBf16Avx512(const float* src, size_t n, size_t n_pad,
                                        uint16_t* dst) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i))));
  for (; i < n; ++i) dst[i] = FloatToBF16(src[i]);
  std::fill(dst + n, dst + n_pad, uint16_t{0});
}

// A pair word's two bf16 as floats: the low (even row) and the high (odd row) half.
STRATA_XL_FMA_TARGET inline __m256 EvenHalf(__m256i w) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
STRATA_XL_FMA_TARGET inline __m256 OddHalf(__m256i w) {
  return _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(static_cast<int>(0xFFFF0000))));
}

// Four tokens from t by two column vectors of 8 from j: acc = fma(a_even, b_even, acc), then the
// odd row's, per pair row in order.
STRATA_XL_FMA_TARGET inline void FmaTile(const uint16_t* a, size_t lda, const XlPairs& b,
                                         size_t t, size_t j, bool accumulate, float* c,
                                         size_t ldc) {
  __m256 acc[4][2];
  for (int tt = 0; tt < 4; ++tt)
    for (int jj = 0; jj < 2; ++jj)
      acc[tt][jj] = accumulate ? _mm256_loadu_ps(c + (t + tt) * ldc + j + 8 * jj)
                               : _mm256_setzero_ps();
  const uint32_t* bw = reinterpret_cast<const uint32_t*>(b.words.data()) + j;
  const uint16_t* ar[4];
  for (int tt = 0; tt < 4; ++tt) ar[tt] = a + (t + tt) * lda;
  const size_t pairs = b.rows_pad / 2;
  for (size_t p = 0; p < pairs; ++p) {
    const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bw + p * b.cols_pad));
    const __m256i w1 =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bw + p * b.cols_pad + 8));
    const __m256 be0 = EvenHalf(w0), bo0 = OddHalf(w0), be1 = EvenHalf(w1), bo1 = OddHalf(w1);
    for (int tt = 0; tt < 4; ++tt) {
      const __m256i aw = _mm256_set1_epi32(PairAt(ar[tt], p));
      const __m256 ae = EvenHalf(aw), ao = OddHalf(aw);
      acc[tt][0] = _mm256_fmadd_ps(ae, be0, acc[tt][0]);
      acc[tt][1] = _mm256_fmadd_ps(ae, be1, acc[tt][1]);
      acc[tt][0] = _mm256_fmadd_ps(ao, bo0, acc[tt][0]);
      acc[tt][1] = _mm256_fmadd_ps(ao, bo1, acc[tt][1]);
    }
  }
  for (int tt = 0; tt < 4; ++tt)
    for (int jj = 0; jj < 2; ++jj) _mm256_storeu_ps(c + (t + tt) * ldc + j + 8 * jj, acc[tt][jj]);
}

STRATA_XL_FMA_TARGET void ProductFma(const uint16_t* a, size_t lda, const XlPairs& b,
                                     size_t tokens, bool accumulate, float* c, size_t ldc) {
  for (size_t j = 0; j < b.cols_pad; j += 16)
    for (size_t t = 0; t < tokens; t += 4) FmaTile(a, lda, b, t, j, accumulate, c, ldc);
}

// FloatToBF16 eight at a time (nearest even; NaNs quiet).
STRATA_XL_FMA_TARGET void ToBf16Avx2(const float* src, size_t n, size_t n_pad, uint16_t* dst) {
  size_t i = 0;
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i up = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), odd);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    const __m256i r = _mm256_blendv_epi8(_mm256_srli_epi32(up, 16), quiet, nan);
    // Every r fits 16 bits, so the saturating pack is exact; it packs per 128-bit half.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
  for (; i < n; ++i) dst[i] = FloatToBF16(src[i]);
  std::fill(dst + n, dst + n_pad, uint16_t{0});
}

}  // namespace
#endif  // STRATA_XL_X86

bool XlBf16ProductsSupported() {
#ifdef STRATA_XL_X86
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bf16");
  return yes;
#else
  return false;
#endif
}

bool XlFmaProductsSupported() {
#ifdef STRATA_XL_X86
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}

void XlProductBf16(const uint16_t* a, size_t lda, const XlPairs& b, size_t tokens,
                   bool accumulate, float* c, size_t ldc) {
#ifdef STRATA_XL_X86
  ProductBf16(a, lda, b, tokens, accumulate, c, ldc);
#else
  (void)a, (void)lda, (void)b, (void)tokens, (void)accumulate, (void)c, (void)ldc;
#endif
}

void XlProductFma(const uint16_t* a, size_t lda, const XlPairs& b, size_t tokens,
                  bool accumulate, float* c, size_t ldc) {
#ifdef STRATA_XL_X86
  ProductFma(a, lda, b, tokens, accumulate, c, ldc);
#else
  (void)a, (void)lda, (void)b, (void)tokens, (void)accumulate, (void)c, (void)ldc;
#endif
}

void XlToBf16Avx2(const float* src, size_t n, size_t n_pad, uint16_t* dst) {
#ifdef STRATA_XL_X86
  ToBf16Avx2(src, n, n_pad, dst);
#else
  (void)src, (void)n, (void)n_pad, (void)dst;
#endif
}

void XlToBf16Vector(const float* src, size_t n, size_t n_pad, uint16_t* dst) {
#ifdef STRATA_XL_X86
  if (XlBf16ProductsSupported()) return ToBf16Avx512(src, n, n_pad, dst);
  if (XlFmaProductsSupported()) return ToBf16Avx2(src, n, n_pad, dst);
#endif
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToBF16(src[i]);
  std::fill(dst + n, dst + n_pad, uint16_t{0});
}

}  // namespace strata::codec::internal
