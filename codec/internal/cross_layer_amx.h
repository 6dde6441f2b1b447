// The cross-layer coder's bf16 products: C (+)= A B with A bf16 token rows and B in the AMX
// tiles' pair rows, fp32 sums. They run on AMX tiles (codec/cross_layer_amx.cc) where the CPU has
// them (PcaAmxAvailable), else as `vdpbf16ps` on AVX512-BF16 or as FMAs on AVX2
// (codec/cross_layer_bf16.cc): the same operands and sums up to float rounding. Operands are
// rounded to bf16 once (nearest even), each product off by up to 2^-9 of itself; the kernels' sums
// differ among themselves by float rounding. The encoder
// runs the same products in the same order as the decoder, so where both take the same kernel
// the prediction's rounding is the decoder's and the closed loop absorbs it; the projection's
// only moves the quantiser's choice; the reconstruction's (q x step x axis) is kept under 1/16 of
// a step by taking the products there only for |q| <= 32 (cross_layer.cc). A decoder on the
// float kernels differs by the prediction's rounding, ~2^-9 of the prediction (~0.002 of a
// head's rms), which does not grow through the layers (docs/codec.md); the products are used
// only where every step is at least 2^-3 of a head's rms, where that is under 2 % of a step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "codec/internal/aligned.h"

namespace strata::codec {
struct CrossLayerCalibration;  // codec/cross_layer.h
}

namespace strata::codec::internal {

// A B operand: rows x cols of a matrix (row-major floats) in the tiles' pair rows
// [rows_pad / 2][cols_pad][2], rows padded to 32 and cols to 32 with zeros.
struct XlPairs {
  CacheAlignedVector<uint16_t> words;
  size_t rows_pad = 0, cols_pad = 0;
};
void BuildXlPairs(const float* m, size_t rows, size_t cols, const float* row_scale, XlPairs* out);

// A calibration's operands on the tiles: per layer the predictor ([below][this]), the axes
// transposed ([c][k], the encoder's projection) and the axes times their steps ([k][c]).
struct CrossLayerTiles {
  std::vector<XlPairs> predictor, axes_t, scaled_axes;
};
// Sets cal->tiles where the CPU runs one of the product kernels, the width is a multiple of 32
// and every step at least 2^-3 of a head's rms; resets it elsewhere (CalibrateCrossLayer and
// Parse call it).
void BuildCrossLayerTiles(CrossLayerCalibration* cal);

// The kernels, in the order of preference.
enum class XlKernel { kFloat, kFma, kAvx512Bf16, kAmx };
// The best kernel this CPU runs, within STRATA_CODEC_XL_KERNEL's cap and the tests': kFloat
// where none. AMX only where PcaAmxAvailable (so STRATA_CODEC_AMX=0 leaves AVX512-BF16 or FMAs).
XlKernel XlKernelInUse();
// Tests: the best kernel XlKernelInUse may return (kAmx, the default, allows every one).
void SetXlKernelCapForTest(XlKernel cap);
// Whether XlProduct runs here (XlKernelInUse() != kFloat).
bool XlProductsAvailable();
bool XlBf16ProductsSupported();       // AVX512-BF16
bool XlFmaProductsSupported();        // AVX2 and FMA

// c[t][j] (+)= sum over i < b.rows_pad of a[t][i] b[i][j], t < tokens (a multiple of 32), j <
// b.cols_pad; a is bf16 token rows of b.rows_pad words, `lda` words apart, c fp32 rows `ldc`
// floats apart. accumulate: start from c, else from zero.
void XlProduct(const uint16_t* a, size_t lda, const XlPairs& b, size_t tokens, bool accumulate,
               float* c, size_t ldc);
// The same products by one kernel each (cross_layer_bf16.cc), for a CPU that supports it.
void XlProductBf16(const uint16_t* a, size_t lda, const XlPairs& b, size_t tokens,
                   bool accumulate, float* c, size_t ldc);
void XlProductFma(const uint16_t* a, size_t lda, const XlPairs& b, size_t tokens,
                  bool accumulate, float* c, size_t ldc);

// Products this process has run by XlProduct, on any kernel (tests: the path was taken).
uint64_t XlTileProducts();

// n floats to bf16 (nearest even) at dst; dst[n .. n_pad) zero. XlToBf16Vector: the CPU's
// widest conversion (`vcvtneps2bf16`, which reads denormals as zero, else AVX2 or scalar
// FloatToBF16); one machine always converts alike.
void XlToBf16(const float* src, size_t n, size_t n_pad, uint16_t* dst);
void XlToBf16Vector(const float* src, size_t n, size_t n_pad, uint16_t* dst);
void XlToBf16Avx2(const float* src, size_t n, size_t n_pad, uint16_t* dst);  // where FMA runs

}  // namespace strata::codec::internal
