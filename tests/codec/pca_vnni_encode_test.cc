// The pca encoder's projection as int16 dot products (internal/pca_avx512.h, PcaEncodeHeadVnni):
// its coordinates against a double reference, and its blobs against the float kernels'.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "codec/calibration.h"
#include "codec/codec.h"
#include "codec/half.h"
#include "codec/internal/pca_amx.h"
#include "codec/internal/pca_avx512.h"
#include "codec/synthetic_kv.h"
#include "tests/codec/test_layout.h"

namespace strata::codec {
namespace {

using test::Layout;

bool Runs() { return internal::PcaVnniSupported() && !internal::PcaAmxSupported(); }

// Random rows (not orthogonal: the kernel does not rely on it) of random lengths, one token equal
// to the mean, one far past float's squares (fp32 KV) and a key-like outlier channel 300x the
// others; tokens 1 .. 256 (tails of a group and of a pass of four groups), two heads per row.
TEST(PcaVnniEncode, CoordinatesMatchADoubleReference) {
  if (!Runs()) GTEST_SKIP() << "this CPU offers no AVX512-VNNI (or has AMX tiles)";
  std::mt19937 rng(41);
  std::normal_distribution<float> g;
  for (const size_t dim : {64u, 96u, 128u, 256u})
    for (const size_t tokens : {1u, 16u, 40u, 72u, 256u})
      for (const size_t n : {size_t{1}, size_t{3}, dim - 5, dim}) {
        SCOPED_TRACE(::testing::Message() << "dim " << dim << " tokens " << tokens << " n " << n);
        const size_t heads = 2, stride = heads * dim, tp = (tokens + 15) / 16 * 16;
        std::vector<float> basis(dim * dim), mean(dim), x(tokens * stride);
        for (size_t k = 0; k < dim; ++k) {
          const float length = 0.1f + 3.0f * std::abs(g(rng));
          for (size_t d = 0; d < dim; ++d) basis[k * dim + d] = length * g(rng);
        }
        for (float& m : mean) m = g(rng);
        for (size_t t = 0; t < tokens; ++t)
          for (size_t d = 0; d < stride; ++d)
            x[t * stride + d] = (d % dim == 5 ? 300.0f : 1.0f) * g(rng);
        const size_t h = 1;  // the second head of each row
        std::memcpy(&x[(tokens / 2) * stride + h * dim], mean.data(), dim * sizeof(float));
        if (tokens > 2)
          for (size_t d = 0; d < dim; ++d) x[(tokens - 1) * stride + h * dim + d] = 3e25f * g(rng);
        std::vector<uint32_t> coords(n);
        for (size_t k = 0; k < n; ++k) coords[k] = static_cast<uint32_t>((k * 7 + 3) % dim);
        internal::PcaVnniBasis b;
        internal::BuildPcaVnniBasis(basis.data(), coords.data(), n, dim, &b);
        ASSERT_EQ(b.n, n);
        // One row past the coordinates: left as it was.
        std::vector<float> y((n + 1) * tp, -7.0f);
        std::vector<double> norm2(tp, 1.0), err2(tp, 2.0);
        std::vector<uint32_t> scratch;
        internal::PcaEncodeHeadVnni(x.data() + h * dim, stride, tokens, dim, mean.data(), b, tp,
                                    norm2.data(), err2.data(), y.data(), &scratch);
        for (size_t t = 0; t < tp; ++t) {
          double nx = 0, nc = 0;
          for (size_t d = 0; d < dim && t < tokens; ++d) {
            const double v = x[t * stride + h * dim + d], c = v - mean[d];
            nx += v * v;
            nc += c * c;
          }
          ASSERT_NEAR(norm2[t], 1.0 + nx, 1e-5 * (1.0 + nx)) << t;
          ASSERT_NEAR(err2[t], 2.0 + nc, 1e-5 * (2.0 + nc)) << t;
          for (size_t k = 0; k < n; ++k) {
            const float* row = &basis[size_t{coords[k]} * dim];
            double want = 0, row2 = 0;
            for (size_t d = 0; d < dim; ++d) {
              const double c = t < tokens ? double{x[t * stride + h * dim + d]} - mean[d] : 0.0;
              want += c * row[d];
              row2 += double{row[d]} * row[d];
            }
            // At most half a unit (a 32767th of each length) per element of each operand.
            const double bound = std::sqrt(double(dim)) / 32767 * std::sqrt(nc * row2);
            ASSERT_NEAR(y[k * tp + t], want, bound) << "token " << t << " coordinate " << k;
          }
        }
        for (size_t t = 0; t < tp; ++t) ASSERT_EQ(y[n * tp + t], -7.0f);
      }
}

// Synthetic KV (2 layers, 2 heads of 128, 64 tokens per block) calibrated at 1.5 and at 4
// bits/value from other blocks: with VNNI the encoder projects every head as int16 products, and
// its blobs decode (by the same float decoder) to the float kernels' values in nearly every
// head vector (at 1.5 bits; 80 % at 4), as far from the input to within 0.1 % of the error energy, at nearly their size.
TEST(PcaVnniEncode, BlobsMatchTheFloatKernels) {
  if (!Runs()) GTEST_SKIP() << "this CPU offers no AVX512-VNNI (or has AMX tiles)";
  const KvLayout layout = Layout(2, 2, 128, 64);
  const size_t bb = layout.BlockBytes();
  const std::vector<uint8_t> kv = GenerateSyntheticKv(layout, 6, SyntheticKvParams{});
  auto block = [&](size_t i) { return std::span(kv).subspan(i * bb, bb); };
  for (const double bits : {1.5, 4.0}) {
    SCOPED_TRACE(::testing::Message() << bits << " bits/value");
    std::vector<std::span<const uint8_t>> samples;
    for (size_t i = 0; i < 4; ++i) samples.push_back(block(i));
    CalibrateOptions o;
    o.bits_per_value = bits;
    auto cal = Calibrate(layout, samples, o);
    ASSERT_TRUE(cal.ok()) << cal.status();
    CalibrationSet set;
    CodecParams p;
    p.mode = Mode::kPca;
    p.calibration_id = set.Add(std::make_shared<const Calibration>(*std::move(cal)));
    p.first_position = 4 * 64;
    Encoder enc;
    Decoder dec;
    enc.set_calibrations(&set);
    dec.set_calibrations(&set);
    for (size_t i = 4; i < 6; ++i, p.first_position += 64) {
      const std::span<const uint8_t> in = block(i);
      std::vector<uint8_t> vnni_blob, float_blob, vnni(bb), floats(bb);
      const uint64_t before = internal::PcaVnniHeadsProjected();
      ASSERT_TRUE(enc.Encode(layout, p, in, &vnni_blob).ok());
      EXPECT_EQ(internal::PcaVnniHeadsProjected() - before, 2u * 2 * 2);  // every head
      internal::SetPcaVnniEnabledForTest(false);
      ASSERT_TRUE(enc.Encode(layout, p, in, &float_blob).ok());
      EXPECT_EQ(internal::PcaVnniHeadsProjected() - before, 2u * 2 * 2);
      ASSERT_TRUE(dec.Decode(vnni_blob, vnni).ok());
      ASSERT_TRUE(dec.Decode(float_blob, floats).ok());
      internal::SetPcaVnniEnabledForTest(true);
      size_t equal = 0;
      double err_vnni = 0, err_floats = 0;
      const size_t values = bb / 2, rows = values / 128;
      for (size_t row = 0; row < values; row += 128) {
        bool same = true;
        for (size_t v = row; v < row + 128; ++v) {
          const double x = HalfToFloat(in[2 * v] | in[2 * v + 1] << 8);
          const double a = HalfToFloat(vnni[2 * v] | vnni[2 * v + 1] << 8);
          const double f = HalfToFloat(floats[2 * v] | floats[2 * v + 1] << 8);
          same = same && a == f;
          err_vnni += (a - x) * (a - x);
          err_floats += (f - x) * (f - x);
        }
        equal += same;
      }
      // A flipped rounding changes a whole head vector: more of them at finer steps.
      EXPECT_GT(equal, rows * (bits < 2 ? 98 : 80) / 100);
      EXPECT_NEAR(err_vnni, err_floats, 1e-3 * err_floats);
      EXPECT_NEAR(static_cast<double>(vnni_blob.size()), float_blob.size(),
                  0.002 * float_blob.size());
    }
  }
}

}  // namespace
}  // namespace strata::codec
