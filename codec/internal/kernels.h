// Row kernels for the codec's hot loops, dispatched at run time to the best SIMD target
// Highway finds (AVX-512, AVX2, SSE4, or portable scalar). All float arithmetic is separate
// multiplies and adds (no fused multiply-add), so every target produces the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::codec::internal {

void HalfToFloatRow(const uint16_t* in, float* out, size_t n);
void FloatToHalfRow(const float* in, uint16_t* out, size_t n);
void BF16ToFloatRow(const uint16_t* in, float* out, size_t n);
void FloatToBF16Row(const float* in, uint16_t* out, size_t n);

// sum += x and, when mn is set, mn = min(mn, x), mx = max(mx, x), element-wise. Returns false if
// any x is NaN or infinite.
bool AccumRow(const float* x, float* sum, float* mn, float* mx, size_t n);
// range[g] = max - min of x over channels [g * group, min(n, (g + 1) * group)).
void GroupRangesRow(const float* x, size_t n, size_t group, float* range);
// worst[g] = max over channel group g of |x - (mu + a * (xh - mu))| (the quantiser's residual
// against its prediction, the same float operations as QuantRow).
void MaxResidualGroups(const float* x, const float* mu, const float* a, const float* xh, size_t n,
                       size_t group, float* worst);
// num += (prev - mu) * (cur - mu), den += (prev - mu)^2, element-wise.
void ArStatsRow(const float* prev, const float* cur, const float* mu, float* num, float* den,
                size_t n);

// AccumRow and ArStatsRow over all T rows of a [T][C] tensor (rows t-1, t for t = 1..T-1), in
// one call, channel blocks in registers; the same bits as the row-by-row loops.
bool AccumRows(const float* x, size_t T, size_t C, float* sum, float* mn, float* mx);
void ArStatsRows(const float* x, size_t T, size_t C, const float* mu, float* num, float* den);

// acc += x * x, element-wise.
void SumSquaresRow(const float* x, float* acc, size_t n);

// Closed-loop predictive quantisation of one token row (n channels):
//   p   = mu + a * (xh - mu)             prediction from the previous reconstruction
//   q   = clamp(round((x - p) * inv_step), -offset, max_sym - offset)
//   xh  = p + q * step                   new reconstruction (the decoder computes the same)
//   sym = q + offset
// With a == 0 this is plain uniform quantisation around mu.
void QuantRow(const float* x, const float* mu, const float* a, const float* step,
              const float* inv_step, float* xh, uint16_t* sym, size_t n, int32_t offset,
              int32_t max_sym);
// QuantRow with one step (and inv_step) per channel group: step[c / step_group].
void QuantRowGrouped(const float* x, const float* mu, const float* a, const float* step,
                     const float* inv_step, size_t step_group, float* xh, uint16_t* sym, size_t n,
                     int32_t offset, int32_t max_sym);
// The decoder half: xh = mu + a * (xh - mu) + (sym - offset) * step.
void DequantRow(const uint16_t* sym, const float* mu, const float* a, const float* step, float* xh,
                size_t n, int32_t offset);

// DequantRow on 8- or 16-bit symbols, fused with the fp16 conversion of the new xh (out16, when
// not null, receives fp16(xh) as FloatToHalfRow would write it). step_group 0: step[c] per
// channel; else step[c / step_group] (one step per channel group; fastest when step_group is a
// multiple of the vector length). had_dim != 0 (a power of two dividing n; out16 set): out16
// receives instead what HadamardRowsToHalf(xh, .., n / had_dim, had_dim) would write (the
// :had decoder row; xh itself stays unrotated), each head vector rotated in registers as it is
// dequantised when had_dim is 1, 2, 4 or 8 vectors.
void DequantRowF16(const uint8_t* sym, const float* mu, const float* a, const float* step,
                   size_t step_group, float* xh, uint16_t* out16, size_t n, int32_t offset,
                   size_t had_dim = 0);
void DequantRowF16(const uint16_t* sym, const float* mu, const float* a, const float* step,
                   size_t step_group, float* xh, uint16_t* out16, size_t n, int32_t offset,
                   size_t had_dim = 0);
// DequantRowF16 on split symbols (the split quant coder): sym = (hi << r) + lo, and `offset`
// is the quantiser's offset minus base << r (base: what the encoder subtracted from sym >> r).
void DequantRowSplitF16(const uint8_t* hi, const uint8_t* lo, int r, const float* mu,
                        const float* a, const float* step, size_t step_group, float* xh,
                        uint16_t* out16, size_t n, int32_t offset, size_t had_dim = 0);
// `rows` consecutive rows of DequantRowF16 on 8-bit symbols (lo null) or DequantRowSplitF16
// (lo set), in one call: row t reads sym + t * n (lo + t * n) and writes out16 + t * n. With
// step_group == 0 every row uses `step` (per channel); else row t first converts its
// ceil(n / step_group) fp16 steps at steps16 + t * ngroups into `step`.
void DequantRowsF16(const uint8_t* sym, const uint8_t* lo, int r, const float* mu, const float* a,
                    float* step, const uint16_t* steps16, size_t step_group, float* xh,
                    uint16_t* out16, size_t rows, size_t n, int32_t offset, size_t had_dim);
// hi[i] = (sym[i] >> r) - base, lo[i] = sym[i] & (2^r - 1); both must fit a byte.
void SplitSymbols(const uint16_t* sym, size_t n, int r, uint16_t base, uint8_t* hi, uint8_t* lo);
// Smallest and largest of n > 0 values.
void MinMaxU16(const uint16_t* x, size_t n, uint16_t* mn, uint16_t* mx);
// Orthonormal fast Walsh-Hadamard transform of each n-vector (n a power of two), in place;
// bit-identical to the scalar butterflies on every target.
void HadamardRowsSimd(float* x, size_t rows, size_t n);
// out16 = fp16(Hadamard(in)) per n-vector, the same bits as HadamardRowsSimd + FloatToHalfRow;
// tmp holds n floats of scratch.
void HadamardRowsToHalf(const float* in, float* tmp, uint16_t* out16, size_t rows, size_t n);

// Byte planes of 16-bit words: lo[i] = w[i] & 0xFF, hi[i] = w[i] >> 8, and back.
void SplitBytes(const uint16_t* w, uint8_t* lo, uint8_t* hi, size_t n);
void MergeBytes(const uint8_t* lo, const uint8_t* hi, uint16_t* w, size_t n);

// The calibrated transform's section kernels (pca.cc). Token-major data have rows of `stride`
// floats; "transposed" data [i][t] have tp floats per row i, tp a multiple of 16 (the tokens
// padded). Same bits on every target as the scalar loops they replace (products added in order).
//
// xt[d][t] -= mean[d] in place; per token t < tp, in d order: norm2[t] += x^2, err2[t] += xc^2
// (in double).
void PcaCenterT(float* xt, size_t tp, size_t dim, const float* mean, double* norm2,
                double* err2);
// y[k][t] = 0 + sum over d < dim of basis[coords[k]][d] * xt[d][t], the products added in d
// order, each with one rounding (fused multiply-add) on targets that have it (FusesMultiplyAdds),
// with two on those that do not; k < n, t < tp; basis rows are dim floats.
void PcaProjectT(const float* xt, size_t tp, size_t dim, const float* basis,
                 const uint32_t* coords, size_t n, float* y);
// Per token t < tp: q = clamp(round(y * inv_step)) (half to even), gain[t] += (y - q step)^2 -
// y^2 (in float: a head's gains are summed over its coordinates in float and then added to the
// token's double error once), max_abs[t] = max(max_abs[t], |q|).
void PcaQuantizeT(const float* y, size_t tp, float inv_step, float step, float limit, int32_t* q,
                  float* gain, int32_t* max_abs);
// out[t][c] = mean[c] + sum over k < n of yt[k][t] * basis[coords[k]][c], the products added in
// k order; t < rows, c < dim, out rows out_stride floats apart; fused as PcaProjectT. So a
// coordinate within float rounding of a rounding boundary may quantise to another step, and a
// decoded value differ in its last bits, between targets with and without FMA: blobs and decoded
// bytes are compared with nothing across machines (the AMX kernels differ likewise).
void PcaReconstruct(const float* yt, size_t tp, size_t rows, size_t n, const float* basis,
                    const uint32_t* coords, size_t dim, const float* mean, float* out,
                    size_t out_stride);
// RoPE (rotate-half) of rows x[t][h][0..dim), the angles' cosines and sines [t][dim / 2]:
// a' = a c - b s, b' = b c + a s with s negated when `inverse`.
void RopeRows(float* x, size_t tokens, size_t heads, size_t dim, const float* cos,
              const float* sin, bool inverse);
// A slot's symbol runs: run r (run values, a multiple of 16) sits at out + r * stride and takes
// q[r * run + i] + offset (which must fit the symbol type).
void EmitRuns(const int32_t* q, size_t runs, size_t run, size_t stride, int32_t offset,
              uint8_t* out);
void EmitRuns(const int32_t* q, size_t runs, size_t run, size_t stride, int32_t offset,
              uint16_t* out);
// The inverse, dequantised: out[r * run + i] = float(sym[r * stride + i] - offset) * step.
void DequantRuns(const uint8_t* sym, size_t runs, size_t run, size_t stride, int32_t offset,
                 float step, float* out);
void DequantRuns(const uint16_t* sym, size_t runs, size_t run, size_t stride, int32_t offset,
                 float step, float* out);
// Whether every value is finite.
bool AllFinite(const float* x, size_t n);
// Whether the kernels above run their AVX-512 versions (the target Highway dispatches to; tests
// pin others): cheap, unlike asking Highway, which detects the CPU again on every call.
bool DispatchesToAvx512();
bool DispatchesToAvx2();  // likewise, AVX2
// Whether the dispatched target fuses PcaProjectT's and PcaReconstruct's multiply-adds.
bool FusesMultiplyAdds();

// Name of the SIMD target in use (for benchmark reports).
const char* SimdTargetName();

}  // namespace strata::codec::internal
