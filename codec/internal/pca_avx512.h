// The pca decoder's sums on AVX-512 cores without AMX (codec/pca_avx512.cc), written through
// the tiles' store pass (mean, RoPE and the block's type in one pass; internal/pca_amx.h has the
// shared PcaSymbols, PcaRope and PcaRows), and the encoder's projection with VNNI
// (codec/pca_encode_avx512.cc).
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
// their steps are stored as integers with one scale per column, and each sum is the exact
// integer sum of (symbol - maxq) times them, times the column's scale; no dequantised
// coordinates are made. Only for byte symbols (|symbol - maxq| <= 127, so no sum overflows at
// dim <= 256). Two widths, one kernel:
//  - int16 (vpdpwssd, two coordinates per product; the column's unit its largest |term| /
//    32767): each term off by at most 2^-16 of the column's largest per unit of |symbol - maxq|;
//    on real KV 10^-7 to 10^-6 of the codec's own error energy.
//  - int8 (vpdpbusd on the raw symbols, four per product, twice int16's rate; maxq times the
//    column's sum of terms taken off after): a unit of 2^-7 of the largest |term| leaves an
//    error that grows with the symbols, not with the step, so the coordinates whose symbols
//    carry the most energy (variance / step^2) stay int16 and only the rest go int8, as many as
//    keep the expected added error under kMaxAddedError of the head's quantisation noise.
// The columns are the vector lanes (each token's sums come out as its row: no transposes before
// the store pass). The axes: the head's coordinates in `order`; int16 pairs (2p, 2p + 1) per
// column, [c / 16][p][16] 32-bit words; then int8 quads per column, [c / 16][q][16] words, q <
// quad_pitch (quads rounded up to 16, the rows past quads zero: whole AMX-INT8 tiles, each
// column block's on a cache line, internal/pca_amx.h).
struct PcaVnniAxes {
  std::vector<uint32_t> order;  // the coordinates k the kernel takes, in its order
  size_t pairs = 0;             // int16: order[0, 2 pairs) (the last may pad); 0 and no quads:
                                // not built (the float kernels decode)
  CacheAlignedVector<uint32_t> words;
  std::vector<float> scale;     // per column
  size_t quads = 0;             // int8: order[2 pairs, n), padded to 4
  size_t quad_pitch = 0;
  CacheAlignedVector<uint32_t> bytes;
  std::vector<float> byte_scale;       // per column
  std::vector<int32_t> byte_sum;       // per column: the sum of its int8 terms
  // Expected squared error per token the int8 terms add (E[symbol^2] from the calibration's
  // variances): independent of the block's step code, unlike the quantisation noise.
  double added_error = 0;
};
// The share of a head's quantisation noise the int8 terms may add (expected; the decoder
// checks it again at the block's own steps, PcaVnniBytesFit).
inline constexpr double kMaxAddedError = 1e-3;
bool PcaVnniSupported();  // the CPU (and STRATA_CODEC_VNNI)
bool PcaVnniAvailable();  // and no test switched it off
// Tests: the float kernels instead of the integer sums (VNNI's, and AVX2's where VNNI is not
// there: internal/pca_avx2.h), or the integer sums again.
void SetPcaVnniEnabledForTest(bool enabled);
bool PcaIntegerSumsEnabledForTest();  // what the tests last set (true at start)
// Int8 terms (STRATA_CODEC_VNNI=16 and tests turn them off: int16 only).
bool PcaVnniBytesAvailable();
void SetPcaVnniBytesEnabledForTest(bool enabled);
// All int16 where `variances` is null; else int8 beyond the coordinates that must stay int16
// (none built where every one must: axes->quads == 0).
void BuildPcaVnniAxes(const float* basis, const uint32_t* coords, const float* steps,
                      const float* variances, size_t n, size_t dim, PcaVnniAxes* axes);
// Whether axes with int8 terms keep within kMaxAddedError of the quantisation noise at steps
// times `step_scale` (a step code finer than calibrated shrinks the noise, not the int8 error).
bool PcaVnniBytesFit(const PcaVnniAxes& axes, const float* steps, const float* variances,
                     size_t n, float step_scale);
// Rows as PcaReconstructAmx's (scale: the section's step scale) from byte symbols.
void PcaReconstructVnni(const PcaSymbols& s, const uint32_t* slot, size_t n,
                        const PcaVnniAxes& axes, size_t dim, float scale, const float* mean,
                        const PcaRope* rope, const PcaRows& out, std::vector<float>* scratch);
// Heads this process has reconstructed with VNNI (tests: the path was taken).
uint64_t PcaVnniHeadsDecoded();
// Of those, heads with int8 terms.
uint64_t PcaVnniBytesHeadsDecoded();

// The encoder's projection with VNNI (codec/pca_encode_avx512.cc), where the decoder would sum
// in lanes and PcaVnniAvailable: as PcaEncodeHeadAmx's, from int16 operands. Each token's
// centred vector is scaled to a length of 32767 units and rounded, each basis row likewise, and
// their exact integer dot product times both units is the coordinate: off by ~1.3e-5 of the
// token's length (two roundings of 0.29 units rms), which against a step of 2^-10 of the head's
// spread adds ~0.2 % to a typical token's quantisation noise (VnniProjectionFits).
struct PcaVnniBasis {
  size_t n = 0;                  // coordinates; 0: not built (the float kernels project)
  std::vector<uint32_t> pairs;   // [kpad][dim / 2] int16 pairs (element 2j in the low word);
                                 // kpad: n rounded up to 4, rows n .. kpad - 1 zero
  std::vector<float> unit;       // per row: its length / 32767
};
// The head sizes the VNNI encoder takes: whole 16 x 16 blocks of pairs, and sums that cannot
// overflow (dim <= 256).
inline bool PcaVnniEncodesDim(size_t dim) { return dim % 32 == 0 && dim <= 256; }
// Rows coords[k] of `basis` (k < n); not built unless PcaVnniEncodesDim(dim).
void BuildPcaVnniBasis(const float* basis, const uint32_t* coords, size_t n, size_t dim,
                       PcaVnniBasis* out);
// Whether int16 operands are fine enough for a head whose finest step is this share of its
// spread (FinestStepToSpread in pca.cc).
inline bool VnniProjectionFits(double finest_step_to_spread) {
  return finest_step_to_spread >= 0x1p-10;
}
// norm2, err2 and y as PcaEncodeHeadAmx's (y[k * tp + t] for k < basis.n; tokens past the end
// zero), from the rows as they are in the block: converted to float and, with `rope` (else
// null), rotated back as RopeRows(..., inverse) rotates them, in the same pass. False, with the
// head half done, where a value (after the rotation) is not finite. PcaVnniEncodesDim(dim), any
// basis.n (0: only norm2 and err2).
bool PcaEncodeHeadVnni(const PcaInput& in, const PcaRope* rope, size_t tokens, size_t dim,
                       const float* mean, const PcaVnniBasis& basis, size_t tp, double* norm2,
                       double* err2, float* y, std::vector<uint32_t>* scratch);
// The encoder's quantisation of one head on AVX-512 cores (PcaLanesSupported): PcaQuantizeT
// for each coordinate k < n in turn (y and q [k][tp], steps[k] and inv[k]) into float gains
// starting at 0, then each token's gain added to err2[t]: the same bits.
void PcaQuantizeHeadAvx512(const float* y, size_t n, size_t tp, const float* steps,
                           const float* inv, float limit, int32_t* q, double* err2,
                           int32_t* tok_max);
// The same, each coordinate's symbols of a group of 16 tokens as int8 (saturated: exact only
// where |q| <= 127) into its slot's run, runs[(t / 16 * nslots + slot[k]) * 16 + t % 16], in
// place of q (tp: the tokens, a multiple of 16).
void PcaQuantizeHeadRunsAvx512(const float* y, size_t n, size_t tp, const float* steps,
                               const float* inv, float limit, const uint32_t* slot,
                               size_t nslots, int8_t* runs, double* err2, int32_t* tok_max);
// Heads this process has projected with VNNI (tests: the path was taken).
uint64_t PcaVnniHeadsProjected();

}  // namespace strata::codec::internal

#endif  // STRATA_CODEC_INTERNAL_PCA_AVX512_H_
