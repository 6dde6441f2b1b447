// A bit budget's size model (pca and xl; its search is codec/rate_control.cc): how many bytes
// a block's coded coordinates take at each step code, from each coordinate's spread over the
// block. A coordinate of RMS sigma against its calibrated step delta goes to bin
// kSpreadZero + round(32 log2(sigma / delta)) (clamped to the bins); one step code
// (PcaStepScale, 2^(1/32) apart) is one bin: at code c a coordinate stands c - 128 bins lower.
// Each bin's symbols cost what a Laplacian of that spread rounded to the step costs.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace strata::codec::internal {

inline constexpr int kSpreadZero = 512, kSpreadBins = 1024;

// Adds `symbols` symbols of a coordinate of mean square `mean_square` and calibrated step
// `step` to `spreads` (grown to kSpreadBins). A ratio that overflows takes the top bin, one
// that is not a number (or a step that is not positive) the bottom one.
void AddSpread(double mean_square, double step, double symbols, std::vector<double>* spreads);

// Sum of y[t]^2 over n floats (n a multiple of 16, y 64-byte aligned).
float SumSquares(const float* y, size_t n);

// Columns j < n of `tokens` rows (row t at y + t * stride), column j's step steps[j]: each
// column's mean square as `tokens` symbols. `squares` is scratch.
void AddColumnSpreads(const float* y, size_t tokens, size_t stride, size_t n, const float* steps,
                      std::vector<float>* squares, std::vector<double>* spreads);

// The model's bytes for `spreads` at step code `code` (1..255); spreads[i] is bin
// first_bin + i (a caller that knows where the nonzero bins lie passes only those).
double ModelBytes(std::span<const double> spreads, int code, size_t first_bin = 0);

}  // namespace strata::codec::internal
