// The pca decoder's sums on x86 cores with AVX2 but without AVX-512 (codec/pca_avx2.cc): AMD's
// before Zen 4 and Intel's client cores, where the decoder otherwise ran the float kernels one
// row at a time and two passes after them (RoPE, then the conversion to the block's type).
#ifndef STRATA_CODEC_INTERNAL_PCA_AVX2_H_
#define STRATA_CODEC_INTERNAL_PCA_AVX2_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "codec/internal/pca_amx.h"

namespace strata::codec::internal {

struct PcaVnniAxes;  // internal/pca_avx512.h

// The VNNI decoder's int16 sums with AVX2's vpmaddwd (two products per 32-bit lane, exact int32
// sums, then a multiply add per lane: twice the multiply-adds per instruction of the float
// kernels' FMAs): per head the axes times their steps as int16 with one unit per column
// (BuildPcaVnniAxes without variances: int16 only), each row the exact integer sum of (symbol -
// maxq) times them, times the column's unit, then the mean, RoPE and the block's type in one
// pass, with the columns in the vector lanes. The rows are PcaReconstructVnni's with the same
// axes, value for value: each term off by at most 2^-16 of its column's largest per unit of
// |symbol - maxq| against the float sum. Byte symbols only (no int32 sum overflows at dim <=
// 256).
//
// Supported: the CPU has AVX2, FMA and F16C, and STRATA_CODEC_AVX2 is not 0 (checked once).
// Available: supported, and no test switched the integer sums off (SetPcaVnniEnabledForTest:
// the float-reference tests pin both).
bool PcaAvx2Supported();
bool PcaAvx2Available();
// False, writing nothing, where the head does not qualify (wide symbols, int8 terms, no
// coordinates, dim not a multiple of 32 or above 256) or AVX2 is not supported. `scratch`: the
// group's rows and symbol pairs.
bool PcaReconstructAvx2(const PcaSymbols& s, const uint32_t* slot, size_t n,
                        const PcaVnniAxes& axes, size_t dim, float scale, const float* mean,
                        const PcaRope* rope, const PcaRows& out, std::vector<float>* scratch);
// Heads this process has summed with AVX2 (tests: the path was taken).
uint64_t PcaAvx2HeadsDecoded();

// The encoder's projection likewise: PcaEncodeHeadVnni's int16 operands and exact int32 sums
// (internal/pca_avx512.h, PcaVnniBasis; same contract, same bound), with vpmaddwd. False where
// a value (after the rotation) is not finite, the head half done; or, writing nothing, where
// the shape does not fit (PcaVnniEncodesDim) or AVX2 is not supported.
struct PcaVnniBasis;
bool PcaEncodeHeadAvx2(const PcaInput& in, const PcaRope* rope, size_t tokens, size_t dim,
                       const float* mean, const PcaVnniBasis& basis, size_t tp, double* norm2,
                       double* err2, float* y, std::vector<uint32_t>* scratch);
// Heads this process has projected with AVX2 (tests: the path was taken).
uint64_t PcaAvx2HeadsProjected();

}  // namespace strata::codec::internal

#endif  // STRATA_CODEC_INTERNAL_PCA_AVX2_H_
