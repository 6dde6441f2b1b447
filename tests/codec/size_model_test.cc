// A bit budget's size model (codec/internal/size_model.h): where a coordinate's spread lands,
// and what the model charges for it, against the definitions computed the slow way.
#include "codec/internal/size_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace strata::codec::internal {
namespace {

// The one bin AddSpread put `symbols` into (-1 if not exactly one bin holds them all).
int BinOf(double mean_square, double step, double symbols = 1) {
  std::vector<double> spreads;
  AddSpread(mean_square, step, symbols, &spreads);
  int bin = -1;
  for (size_t b = 0; b < spreads.size(); ++b) {
    if (spreads[b] == 0) continue;
    if (bin >= 0 || spreads[b] != symbols) return -1;
    bin = static_cast<int>(b);
  }
  return spreads.size() == static_cast<size_t>(kSpreadBins) ? bin : -1;
}

TEST(SizeModel, ASpreadLandsOnThirtyTwoLogsOfItsRatioToTheStep) {
  // Ratios of rms to step across the bins' whole range, not on a grid of them.
  for (int k = -1000; k <= 1000; ++k) {
    const double ratio = std::exp2(k / 63.0);
    const double exact = kSpreadZero + 32 * std::log2(ratio);
    if (exact < 0.5 || exact > kSpreadBins - 1.5) continue;
    for (double step : {1.0, 0.375, 1e-3, 7e4}) {
      const int bin = BinOf(ratio * ratio * step * step, step);
      ASSERT_GE(bin, 0) << "ratio " << ratio << " step " << step;
      // The log's quadratic is within 0.08 of a bin; rounding adds half a bin.
      EXPECT_LE(std::abs(bin - exact), 0.58) << "ratio " << ratio << " step " << step;
    }
  }
}

// The bins as first defined: 16 log2 by frexp's exponent and mantissa, rounded by lround.
int ReferenceBin(double mean_square, double step) {
  double at = -1e9;
  if (step > 0 && mean_square > 0) {
    const double ratio = mean_square / (step * step);
    if (std::isinf(ratio)) {
      at = 1e9;
    } else if (ratio > 0) {
      int e = 0;
      const double m = 2 * std::frexp(ratio, &e);
      at = 16.0 * ((e - 1) + (-0.34484843 * m + 2.02466578) * m - 1.67487759);
    }
  }
  return static_cast<int>(std::lround(std::clamp(at + kSpreadZero, 0.0, kSpreadBins - 1.0)));
}

TEST(SizeModel, SpreadBinsAreTheFirstDefinitionsBinForBin) {
  // Dense mantissas at every exponent that reaches the bins (and past them both ways).
  for (int e = -40; e <= 40; ++e)
    for (int i = 0; i < 1024; ++i) {
      const double ratio = std::ldexp(1.0 + i / 1024.0 + 1e-7 * (i % 7), e);
      for (double step : {1.0, 3.0, 0.01}) {
        const double mean_square = ratio * step * step;
        ASSERT_EQ(BinOf(mean_square, step), ReferenceBin(mean_square, step))
            << "ratio " << ratio << " step " << step;
      }
    }
  for (double mean_square : {0.0, 1e-310, 1e300, std::numeric_limits<double>::infinity()})
    for (double step : {1.0, 1e-300, 0.0, std::numeric_limits<double>::infinity()})
      EXPECT_EQ(BinOf(mean_square, step), ReferenceBin(mean_square, step))
          << mean_square << " " << step;
}

TEST(SizeModel, SpreadsOutOfRangeTakeTheEndBins) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(BinOf(1e300, 1e-300), kSpreadBins - 1);  // step^2 underflows: the ratio is inf
  EXPECT_EQ(BinOf(inf, 1.0), kSpreadBins - 1);
  EXPECT_EQ(BinOf(1e200, 1.0), kSpreadBins - 1);  // finite, past the top bin
  EXPECT_EQ(BinOf(0.0, 1.0), 0);
  EXPECT_EQ(BinOf(1e-310, 1.0), 0);  // a subnormal ratio
  EXPECT_EQ(BinOf(1e-200, 1.0), 0);
  EXPECT_EQ(BinOf(nan, 1.0), 0);
  EXPECT_EQ(BinOf(1.0, 0.0), 0);
  EXPECT_EQ(BinOf(1.0, -2.0), 0);
  EXPECT_EQ(BinOf(1.0, nan), 0);
  EXPECT_EQ(BinOf(-1.0, 1.0), 0);
  // Symbols add up in their bin.
  std::vector<double> spreads;
  AddSpread(4.0, 1.0, 3, &spreads);
  AddSpread(4.0, 1.0, 5, &spreads);
  EXPECT_EQ(spreads[kSpreadZero + 32], 8);
}

// Bits per symbol of a Laplacian of rms sigma rounded to integer multiples of delta: the
// probabilities of each integer summed one by one.
double RoundedLaplaceBits(double sigma, double delta) {
  const double lambda = std::sqrt(2.0) / sigma;  // density lambda / 2 exp(-lambda |x|)
  auto tail = [&](double x) { return 0.5 * std::exp(-lambda * x); };  // P(X > x), x >= 0
  double bits = 0;
  const double p0 = 1 - 2 * tail(0.5 * delta);
  if (p0 > 0) bits -= p0 * std::log2(p0);
  for (int n = 1; n < 100000; ++n) {
    const double p = tail((n - 0.5) * delta) - tail((n + 0.5) * delta);  // each side
    if (p < 1e-300) break;
    bits -= 2 * p * std::log2(p);
  }
  return bits;
}

TEST(SizeModel, ABinCostsARoundedLaplacianOfItsSpread) {
  constexpr double kSymbols = 1000;
  // Bin centres (32 log2(sigma / delta) whole), from mostly zeros to ~12 bits a symbol.
  for (int offset : {-96, -40, -1, 0, 17, 64, 150, 288}) {
    const double ratio = std::exp2(offset / 32.0);
    std::vector<double> spreads;
    AddSpread(ratio * ratio, 1.0, kSymbols, &spreads);
    ASSERT_EQ(spreads[kSpreadZero + offset], kSymbols) << offset;
    // Code 128 is the calibrated step; 32 codes coarser doubles it.
    for (int code : {128, 96, 160, 200}) {
      const double step = std::exp2((code - 128) / 32.0);
      const double want = kSymbols * RoundedLaplaceBits(ratio, step) / 8;
      EXPECT_NEAR(ModelBytes(spreads, code), want, 1e-6 * want + 1e-9)
          << "offset " << offset << " code " << code;
    }
  }
}

TEST(SizeModel, CoarserCodesNeverCostMore) {
  std::vector<double> spreads;
  for (int k = 0; k < 200; ++k) {
    const double ratio = std::exp2((k % 37) / 5.0 - 3);
    AddSpread(ratio * ratio, 0.5 + k % 3, 256, &spreads);
  }
  double last = ModelBytes(spreads, 1);
  EXPECT_GT(last, 0);
  for (int code = 2; code <= 255; ++code) {
    const double bytes = ModelBytes(spreads, code);
    EXPECT_LE(bytes, last * (1 + 1e-12)) << "code " << code;
    last = bytes;
  }
  EXPECT_LT(ModelBytes(spreads, 255), ModelBytes(spreads, 128));
  EXPECT_LT(ModelBytes(spreads, 128), ModelBytes(spreads, 1));
}

}  // namespace
}  // namespace strata::codec::internal
