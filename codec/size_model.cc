// A bit budget's size model (internal/size_model.h).
#include "codec/internal/size_model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "codec/internal/kernels.h"

namespace strata::codec::internal {
namespace {

constexpr int kCodes = 255;

// 16 partial sums per pass, so vectors on every target (AVX-512 where the CPU has it).
using Floats16 = float __attribute__((vector_size(64)));
using Doubles8 = double __attribute__((vector_size(64)));
inline float SumSquares16(const float* y, size_t n) {
  Floats16 acc = {};
  for (size_t t = 0; t < n; t += 16) {
    Floats16 v;
    std::memcpy(&v, y + t, sizeof(v));
    acc += v * v;
  }
  float sum = 0;
  for (int j = 0; j < 16; ++j) sum += acc[j];
  return sum;
}
// x[0..n) . y[0..n) in 8 partial sums.
inline double Dot8(const double* x, const double* y, size_t n) {
  Doubles8 acc = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Doubles8 a, b;
    std::memcpy(&a, x + i, sizeof(a));
    std::memcpy(&b, y + i, sizeof(b));
    acc += a * b;
  }
  double sum = 0;
  for (int j = 0; j < 8; ++j) sum += acc[j];
  for (; i < n; ++i) sum += x[i] * y[i];
  return sum;
}
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx512f"))) float SumSquaresAvx512(const float* y, size_t n) {
  return SumSquares16(y, n);
}
__attribute__((target("avx512f"))) double Dot8Avx512(const double* x, const double* y, size_t n) {
  return Dot8(x, y, n);
}
#endif

double Dot(const double* x, const double* y, size_t n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512) return Dot8Avx512(x, y, n);
#endif
  return Dot8(x, y, n);
}

// 16 log2(v) for v > 0, to within 0.08 (a spread bin is 1): the exponent, and the mantissa's
// log by a quadratic, both read from the bits (no libm call per coordinate: frexp was most of a
// budget's spreads). Subnormals read as exponent -1023, far below the lowest bin.
inline double SixteenLog2(double v) {
  const auto bits = std::bit_cast<uint64_t>(v);
  const int e = static_cast<int>((bits >> 52) & 0x7FF) - 1023;
  const auto m =  // [1, 2)
      std::bit_cast<double>((bits & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);
  return 16.0 * (e + (-0.34484843 * m + 2.02466578) * m - 1.67487759);
}

// Bits of one symbol of a Laplacian coordinate of rms sigma rounded to steps of delta, at
// x = log2(sigma / delta) (closed form: the symbols past zero are geometric).
double LaplaceSymbolBits(double x) {
  const double lambda_delta = std::sqrt(2.0) * std::exp2(-x);  // delta over the scale b
  const double p0 = -std::expm1(-0.5 * lambda_delta);
  if (p0 >= 1.0 - 1e-15) return 0.0;
  const double a = std::exp(-lambda_delta);
  const double c = 0.5 * std::exp(-0.5 * lambda_delta) * (1.0 - a);
  const double tail = c / (1.0 - a);  // P(q = n) summed over n >= 1
  const double bits = -p0 * std::log2(p0) -
                      2.0 * (tail * std::log2(c) + c * std::log2(a) * a / ((1.0 - a) * (1.0 - a)));
  return std::max(bits, 0.0);
}

}  // namespace

float SumSquares(const float* y, size_t n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512) return SumSquaresAvx512(y, n);
#endif
  return SumSquares16(y, n);
}

void AddSpread(double mean_square, double step, double symbols, std::vector<double>* spreads) {
  if (spreads->size() < kSpreadBins) spreads->resize(kSpreadBins, 0.0);
  // 32 log2(rms / step) = 16 log2(mean square / step^2).
  double at = -1e9;
  if (step > 0 && mean_square > 0) {
    const double ratio = mean_square / (step * step);
    if (std::isinf(ratio))
      at = 1e9;
    else if (ratio > 0)
      at = SixteenLog2(ratio);
  }
  // To the nearest bin, halves up (no libm call).
  const auto bin = static_cast<long>(std::clamp(at + kSpreadZero, 0.0, kSpreadBins - 1.0) + 0.5);
  (*spreads)[static_cast<size_t>(bin)] += symbols;
}

void AddColumnSpreads(const float* y, size_t tokens, size_t stride, size_t n, const float* steps,
                      std::vector<float>* squares, std::vector<double>* spreads) {
  if (tokens == 0) return;
  squares->assign(n, 0.0f);
  float* sq = squares->data();
  for (size_t t = 0; t < tokens; ++t) SumSquaresRow(y + t * stride, sq, n);
  const auto count = static_cast<double>(tokens);
  for (size_t j = 0; j < n; ++j) AddSpread(sq[j] / count, steps[j], count, spreads);
}

double ModelBytes(std::span<const double> spreads, int code, size_t first_bin) {
  static const std::vector<double> table = [] {
    std::vector<double> t(2 * kSpreadBins + 2 * kCodes);
    for (size_t i = 0; i < t.size(); ++i)
      t[i] = LaplaceSymbolBits((static_cast<double>(i) - kSpreadBins - kCodes) / 32.0);
    return t;
  }();
  constexpr auto kBins = static_cast<size_t>(kSpreadBins);
  if (first_bin >= kBins) return 0.0;
  // Bin b's bits per symbol are table[b + offset]: one dot product (a budget's one-pass coding
  // asks for a dozen of these per section).
  const auto offset = static_cast<size_t>(kSpreadBins + kCodes - kSpreadZero - (code - 128));
  const size_t n = std::min(spreads.size(), kBins - first_bin);
  return Dot(spreads.data(), table.data() + offset + first_bin, n) / 8.0;
}

}  // namespace strata::codec::internal
