// The pca decoder's sums on AVX-512 cores without AMX (codec/pca_avx512.cc), written through
// the tiles' store pass (mean, RoPE and the block's type in one pass; internal/pca_amx.h has the
// shared PcaSymbols, PcaRope and PcaRows).
#ifndef STRATA_CODEC_INTERNAL_PCA_AVX512_H_
#define STRATA_CODEC_INTERNAL_PCA_AVX512_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "codec/internal/pca_amx.h"

namespace strata::codec::internal {

// Without AMX, on AVX-512 cores (PcaLanesSupported), the float decoder's sum with the tokens in
// the vector lanes, written through the same store pass as the tiles': row t = mean[c] + sum over
// k < n of yt[k][t] * basis[coords[k]][c] (yt: [k][tp] coordinates times their steps, tp tokens
// rounded up to 16; fused multiply-adds in k order, the mean added last), rotated with `rope`
// and converted as PcaReconstructAmx's rows. dim a multiple of 32. The axes are the basis rows
// coords[k] by blocks of 8 columns, [c / 8][k][8] (BuildPcaLanesAxes, once per plan): read in
// order (the basis rows' stride maps a column block of every row to a few L1 sets).
// `scratch`: two groups' sums and coordinates.
bool PcaLanesSupported();
void BuildPcaLanesAxes(const float* basis, const uint32_t* coords, size_t n, size_t dim,
                       std::vector<float>* axes);
void PcaReconstructLanes(const float* yt, size_t tp, size_t tokens, size_t n,
                         const std::vector<float>& axes, size_t dim, const float* mean,
                         const PcaRope* rope, const PcaRows& out, std::vector<float>* scratch);
// Heads this process has reconstructed in token lanes (tests: the path was taken).
uint64_t PcaLanesHeadsDecoded();


// With AVX512-VNNI as well (PcaVnniAvailable: the CPU has it, STRATA_CODEC_VNNI is not 0 and no
// test switched it off), integer dot products on the symbols instead: per head, the axes times
// their steps are stored as int16 with one scale per column (the column's largest |value| /
// 32767), and each sum is the exact integer sum of (symbol - maxq) times them (vpdpwssd, two
// coordinates per product), times the column's scale; no dequantised coordinates are made. Each
// term is then off by at most half a scale unit, 2^-16 of the column's largest term per unit of
// |symbol - maxq|: on real KV 10^-7 to 10^-6 of the codec's own error energy (tested below 1 %),
// 8-10 % of fp16 values differing from the float kernels' in their last bit. Only for
// byte symbols (|symbol - maxq| <= 127, so no sum overflows at dim <= 256). The axes: int16
// pairs (coordinates 2p, 2p + 1) per column, [c / 8][p][8], as 32-bit words.
struct PcaVnniAxes {
  std::vector<uint32_t> words;
  std::vector<float> scale;  // per column
  size_t pairs = 0;          // (n + 1) / 2; 0: not built (the float kernels decode)
};
bool PcaVnniSupported();  // the CPU (and STRATA_CODEC_VNNI)
bool PcaVnniAvailable();  // and no test switched it off
void SetPcaVnniEnabledForTest(bool enabled);
void BuildPcaVnniAxes(const float* basis, const uint32_t* coords, const float* steps, size_t n,
                      size_t dim, PcaVnniAxes* axes);
// Rows as PcaReconstructAmx's (scale: the section's step scale) from byte symbols.
void PcaReconstructVnni(const PcaSymbols& s, const uint32_t* slot, size_t n,
                        const PcaVnniAxes& axes, size_t dim, float scale, const float* mean,
                        const PcaRope* rope, const PcaRows& out, std::vector<float>* scratch);
// Heads this process has reconstructed with VNNI (tests: the path was taken).
uint64_t PcaVnniHeadsDecoded();

}  // namespace strata::codec::internal

#endif  // STRATA_CODEC_INTERNAL_PCA_AVX512_H_
