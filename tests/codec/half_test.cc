#include "codec/half.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "codec/internal/kernels.h"
#include "gtest/gtest.h"
#include "hwy/targets.h"

namespace strata::codec {
namespace {

// Runs `check` once per compiled SIMD target this machine supports (AVX-512, AVX2, SSE4,
// scalar), each with the kernels dispatched to that target.
template <typename F>
void OnEveryTarget(F&& check) {
  for (int64_t t = hwy::SupportedTargets() & HWY_TARGETS; t != 0; t &= t - 1) {
    const int64_t target = t & -t;
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    check();
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Every finite fp16 and NaN; infinities come back as the largest finite value (FloatToHalf
// saturates).
TEST(Half, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << h;
      continue;
    }
    if (std::isinf(f)) {
      EXPECT_EQ(FloatToHalf(f), (h & 0x8000) | 0x7BFF) << h;
      continue;
    }
    EXPECT_EQ(FloatToHalf(f), h) << h;
  }
}

TEST(Half, KnownValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7BFF);            // past the largest: saturates
  EXPECT_EQ(FloatToHalf(-1e30f), 0xFBFF);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xFBFF);  // saturates too
  EXPECT_EQ(FloatToHalf(std::nanf("")) & 0x7E00, 0x7E00);                    // a quiet NaN
  EXPECT_EQ(FloatToHalf(5.9604645e-08f), 0x0001);      // smallest subnormal
  EXPECT_EQ(FloatToHalf(2.9802322e-08f), 0x0000);      // half of it: ties to even (0)
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 2048), 0x3C00);  // tie, even mantissa kept
  EXPECT_EQ(FloatToHalf(1.0f + 3.0f / 2048), 0x3C02);  // tie, rounds up to even
  EXPECT_FLOAT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(FloatToBF16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBF16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie to even
  EXPECT_EQ(FloatToBF16(std::bit_cast<float>(0x3F818000u)), 0x3F82);
}

void CheckSimdRowsMatchScalar() {
  std::mt19937 rng(7);
  std::vector<float> f(10007);
  for (size_t i = 0; i < f.size(); ++i) {
    const uint32_t bits = rng();
    float v = std::bit_cast<float>(bits);
    if (!std::isfinite(v)) v = 1.0f;
    // Spread over the fp16 range, subnormals included.
    f[i] = i % 3 == 0 ? v
                      : std::ldexp(static_cast<float>(rng() % 100000) / 1000.0f - 50.0f,
                                   static_cast<int>(rng() % 40) - 30);
  }
  // Infinities saturate as finite values past 65504 do; NaNs stay NaNs.
  f[7] = std::numeric_limits<float>::infinity();
  f[8] = -f[7];
  f[10] = std::nanf("");
  f[11] = -f[10];
  std::vector<uint16_t> h(f.size()), b(f.size());
  internal::FloatToHalfRow(f.data(), h.data(), f.size());
  internal::FloatToBF16Row(f.data(), b.data(), f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    if (std::isnan(f[i])) {
      ASSERT_TRUE(std::isnan(HalfToFloat(h[i])) && std::isnan(HalfToFloat(FloatToHalf(f[i])))) << i;
      ASSERT_TRUE(std::isnan(BF16ToFloat(b[i]))) << i;
      continue;
    }
    ASSERT_EQ(h[i], FloatToHalf(f[i])) << i << " " << f[i];
    ASSERT_EQ(b[i], FloatToBF16(f[i])) << i << " " << f[i];
  }
  std::vector<float> back(f.size()), back_b(f.size());
  internal::HalfToFloatRow(h.data(), back.data(), h.size());
  internal::BF16ToFloatRow(b.data(), back_b.data(), b.size());
  for (size_t i = 0; i < f.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(HalfToFloat(h[i])));
    ASSERT_EQ(std::bit_cast<uint32_t>(back_b[i]), std::bit_cast<uint32_t>(BF16ToFloat(b[i])));
  }
}

TEST(Half, SimdRowsMatchScalar) { CheckSimdRowsMatchScalar(); }

// Every compiled target rounds fp16 like FloatToHalf: Highway 1.0.3's emulated f32->f16
// demotion on SSE4 and scalar truncates (half of these values were 1 ulp off there), so the
// kernels convert lane by lane on those targets.
TEST(Half, SimdRowsMatchScalarOnEveryTarget) { OnEveryTarget(CheckSimdRowsMatchScalar); }

TEST(Kernels, SplitMergeBytes) {
  std::vector<uint16_t> w(1000);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint16_t>(i * 2654435761u >> 7);
  std::vector<uint8_t> lo(w.size()), hi(w.size());
  internal::SplitBytes(w.data(), lo.data(), hi.data(), w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_EQ(lo[i], w[i] & 0xFF);
    ASSERT_EQ(hi[i], w[i] >> 8);
  }
  std::vector<uint16_t> back(w.size());
  internal::MergeBytes(lo.data(), hi.data(), back.data(), w.size());
  EXPECT_EQ(back, w);
}

TEST(Kernels, QuantRowAndDequantRowAgree) {
  const size_t n = 77;  // not a multiple of any vector width: exercises the scalar tail
  std::mt19937 rng(3);
  std::normal_distribution<float> g;
  std::vector<float> x(n), mu(n), a(n), st(n), inv(n), xh(n), xh2(n);
  std::vector<uint16_t> sym(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = g(rng);
    mu[i] = 0.1f * g(rng);
    a[i] = static_cast<float>(rng() % 17) / 16.0f;
    st[i] = 0.05f + 0.01f * static_cast<float>(i % 5);
    inv[i] = 1.0f / st[i];
    xh[i] = xh2[i] = g(rng);
  }
  internal::QuantRow(x.data(), mu.data(), a.data(), st.data(), inv.data(), xh.data(), sym.data(), n,
                     64, 255);
  internal::DequantRow(sym.data(), mu.data(), a.data(), st.data(), xh2.data(), n, 64);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(xh[i]), std::bit_cast<uint32_t>(xh2[i])) << i;
    if (sym[i] > 0 && sym[i] < 255) {
      EXPECT_LE(std::fabs(xh[i] - x[i]), st[i] * 0.5001f) << i;
    }
  }
}

// The SIMD Walsh-Hadamard (in place and fused with the fp16 conversion) gives exactly the scalar
// butterflies' bits, so blobs and decoded blocks do not depend on the SIMD target.
void CheckHadamardMatchesScalar() {
  std::mt19937 rng(5);
  std::normal_distribution<float> g;
  for (size_t n : {1u, 2u, 8u, 32u, 64u, 128u, 256u}) {
    const size_t rows = 5;
    std::vector<float> x(rows * n), ref(rows * n), tmp(n);
    for (auto& v : x) v = g(rng) * 10.0f;
    // Signed zeros (the in-vector butterflies compute a - b as a + b * -1) and a wide range.
    for (size_t i = 0; i < x.size(); ++i) {
      if (i % 7 == 3) x[i] = 0.0f;
      if (i % 11 == 5) x[i] = -0.0f;
      if (i % 13 == 1) x[i] *= 1e30f;
      if (i % 17 == 2) x[i] *= 1e-30f;
    }
    if (n >= 4) std::fill(x.begin() + 2 * n, x.begin() + 3 * n, -0.0f);  // one all -0 row
    ref = x;
    const float scale = 1.0f / std::sqrt(static_cast<float>(n));
    for (size_t r = 0; r < rows; ++r) {
      float* v = ref.data() + r * n;
      for (size_t h = 1; h < n; h <<= 1)
        for (size_t i = 0; i < n; i += 2 * h)
          for (size_t j = i; j < i + h; ++j) {
            const float a = v[j], b = v[j + h];
            v[j] = a + b;
            v[j + h] = a - b;
          }
      for (size_t i = 0; i < n; ++i) v[i] *= scale;
    }
    std::vector<uint16_t> h16(rows * n), ref16(rows * n);
    internal::HadamardRowsToHalf(x.data(), tmp.data(), h16.data(), rows, n);
    internal::HadamardRowsSimd(x.data(), rows, n);
    for (size_t i = 0; i < rows * n; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(x[i]), std::bit_cast<uint32_t>(ref[i])) << n << " " << i;
      ref16[i] = FloatToHalf(ref[i]);
    }
    EXPECT_EQ(h16, ref16) << n;
  }
}

TEST(Kernels, HadamardMatchesScalarBitForBit) { CheckHadamardMatchesScalar(); }

// The same floats and fp16 output on every compiled SIMD target this machine runs (AVX-512,
// AVX2, SSE4, scalar).
TEST(Kernels, HadamardMatchesScalarOnEveryTarget) { OnEveryTarget(CheckHadamardMatchesScalar); }

// The :had decoder row (DequantRowF16 with had_dim: dequantise, rotate each head vector and
// convert in one pass) writes what DequantRowF16 + HadamardRowsToHalf write, and the same xh,
// for 8-bit, 16-bit and split symbols, per-channel steps and channel groups (one group per
// vector, groups straddling vectors and heads), head vectors in registers (1..8 vectors) or not.
void CheckDequantHadamardMatchesTwoPasses() {
  std::mt19937 rng(13);
  std::normal_distribution<float> g;
  for (size_t dim : {1u, 4u, 8u, 16u, 32u, 64u, 128u, 256u}) {
    for (size_t group : {0u, 16u, 40u, 64u}) {
      const size_t heads = 3, n = heads * dim;
      if (group > n) continue;
      const size_t ngroups = group ? (n + group - 1) / group : n;
      std::vector<float> mu(n), a(n), st(ngroups), xh(n), xh2(n), tmp(dim);
      std::vector<uint8_t> s8(n), lo(n);
      std::vector<uint16_t> s16(n), out(n), ref(n);
      for (size_t i = 0; i < n; ++i) {
        mu[i] = g(rng);
        a[i] = static_cast<float>(rng() % 17) / 16.0f;
        xh[i] = g(rng);
        s8[i] = static_cast<uint8_t>(rng() % 64);
        lo[i] = static_cast<uint8_t>(rng() % 4);
        s16[i] = static_cast<uint16_t>(rng() % 4096);
      }
      for (auto& v : st) v = 0.01f + 0.001f * static_cast<float>(rng() % 100);
      for (int variant = 0; variant < 3; ++variant) {
        SCOPED_TRACE(::testing::Message()
                     << "dim " << dim << " group " << group << " variant " << variant);
        xh2 = xh;
        std::vector<float> xr = xh;
        auto run = [&](float* x, uint16_t* o, size_t had) {
          if (variant == 0)
            internal::DequantRowF16(s8.data(), mu.data(), a.data(), st.data(), group, x, o, n, 32,
                                    had);
          else if (variant == 1)
            internal::DequantRowF16(s16.data(), mu.data(), a.data(), st.data(), group, x, o, n,
                                    2048, had);
          else
            internal::DequantRowSplitF16(s8.data(), lo.data(), 2, mu.data(), a.data(), st.data(),
                                         group, x, o, n, 100, had);
        };
        for (int row = 0; row < 2; ++row) {  // two rows: the second predicts from the first
          run(xr.data(), nullptr, 0);
          internal::HadamardRowsToHalf(xr.data(), tmp.data(), ref.data(), heads, dim);
          run(xh2.data(), out.data(), dim);
          for (size_t i = 0; i < n; ++i)
            ASSERT_EQ(std::bit_cast<uint32_t>(xr[i]), std::bit_cast<uint32_t>(xh2[i])) << i;
          ASSERT_EQ(out, ref) << row;
        }
      }
    }
  }
}

TEST(Kernels, DequantHadamardMatchesTwoPasses) { CheckDequantHadamardMatchesTwoPasses(); }

TEST(Kernels, DequantHadamardMatchesTwoPassesOnEveryTarget) {
  OnEveryTarget(CheckDequantHadamardMatchesTwoPasses);
}

TEST(Kernels, FusedDequantMatchesDequantThenConvert) {
  const size_t n = 200, group = 40;  // 40: groups straddle vectors on every target
  std::mt19937 rng(9);
  std::normal_distribution<float> g;
  std::vector<float> mu(n), a(n), st(n), gst(n / group), xh(n), xh2(n), xh3(n);
  std::vector<uint8_t> s8(n);
  std::vector<uint16_t> s16(n), out(n), out2(n);
  for (size_t i = 0; i < n; ++i) {
    mu[i] = g(rng);
    a[i] = static_cast<float>(rng() % 17) / 16.0f;
    xh[i] = xh2[i] = xh3[i] = g(rng);
    s8[i] = static_cast<uint8_t>(rng() % 64);
    s16[i] = s8[i];
  }
  for (size_t k = 0; k < n / group; ++k) gst[k] = 0.01f * static_cast<float>(k + 1);
  for (size_t i = 0; i < n; ++i) st[i] = gst[i / group];
  internal::DequantRow(s16.data(), mu.data(), a.data(), st.data(), xh.data(), n, 32);
  internal::DequantRowF16(s8.data(), mu.data(), a.data(), gst.data(), group, xh2.data(), out.data(),
                          n, 32);
  internal::DequantRowF16(s16.data(), mu.data(), a.data(), st.data(), 0, xh3.data(), nullptr, n,
                          32);
  internal::FloatToHalfRow(xh.data(), out2.data(), n);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(xh[i]), std::bit_cast<uint32_t>(xh2[i])) << i;
    ASSERT_EQ(std::bit_cast<uint32_t>(xh[i]), std::bit_cast<uint32_t>(xh3[i])) << i;
  }
  EXPECT_EQ(out, out2);
}

// The column-blocked passes over a tensor give the row-by-row kernels' bits (each channel summed
// in row order), for widths with and without a channel tail, on every compiled target; a
// non-finite value anywhere is reported.
void CheckRowsMatchRowByRow() {
  std::mt19937 rng(21);
  std::normal_distribution<float> g(0.0f, 3.0f);
  for (size_t C : {1u, 7u, 16u, 64u, 100u, 192u, 1024u}) {
    for (size_t T : {1u, 2u, 37u}) {
      std::vector<float> x(T * C), mu(C);
      for (auto& v : x) v = g(rng);
      for (auto& v : mu) v = g(rng);
      std::vector<float> s1(C, 0.5f), s2 = s1, lo1(x.begin(), x.begin() + C), lo2 = lo1, hi1 = lo1,
                                      hi2 = lo1;
      bool f1 = true;
      for (size_t t = 0; t < T; ++t)
        f1 &= internal::AccumRow(x.data() + t * C, s1.data(), lo1.data(), hi1.data(), C);
      const bool f2 = internal::AccumRows(x.data(), T, C, s2.data(), lo2.data(), hi2.data());
      EXPECT_TRUE(f1 && f2);
      std::vector<float> n1(C, 0.25f), d1(C, 1.0f), n2 = n1, d2 = d1;
      for (size_t t = 1; t < T; ++t)
        internal::ArStatsRow(x.data() + (t - 1) * C, x.data() + t * C, mu.data(), n1.data(),
                             d1.data(), C);
      internal::ArStatsRows(x.data(), T, C, mu.data(), n2.data(), d2.data());
      for (size_t c = 0; c < C; ++c) {
        ASSERT_EQ(std::bit_cast<uint32_t>(s1[c]), std::bit_cast<uint32_t>(s2[c])) << C << " " << c;
        ASSERT_EQ(lo1[c], lo2[c]);
        ASSERT_EQ(hi1[c], hi2[c]);
        ASSERT_EQ(std::bit_cast<uint32_t>(n1[c]), std::bit_cast<uint32_t>(n2[c])) << C << " " << c;
        ASSERT_EQ(std::bit_cast<uint32_t>(d1[c]), std::bit_cast<uint32_t>(d2[c])) << C << " " << c;
      }
      for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
        std::vector<float> y = x, s(C, 0.0f);
        y[rng() % y.size()] = bad;
        EXPECT_FALSE(internal::AccumRows(y.data(), T, C, s.data(), nullptr, nullptr)) << C;
      }
    }
  }
}

TEST(Kernels, RowsMatchRowByRowOnEveryTarget) { OnEveryTarget(CheckRowsMatchRowByRow); }

// The pca mode's kernels give the scalar loops' bits on every target (odd sizes: tails too).
void CheckPcaKernelsMatchScalar() {
  std::mt19937 rng(17);
  std::normal_distribution<float> g;
  auto same = [](float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); };
  for (size_t tp : {16u, 48u, 256u})
    for (size_t dim : {1u, 5u, 40u, 64u, 128u})
      for (size_t n : {0u, 1u, 6u, 17u}) {
        std::vector<float> xt(dim * tp), basis(dim * dim), mean(dim);
        for (float& v : xt) v = g(rng);
        for (float& v : basis) v = g(rng);
        for (float& v : mean) v = g(rng);
        std::vector<uint32_t> coords(n);
        for (size_t k = 0; k < n; ++k) coords[k] = static_cast<uint32_t>((k * 7 + 3) % dim);
        // Centring and the per-token sums.
        std::vector<double> norm2(tp, 1.0), err2(tp, 2.0);
        std::vector<float> xc = xt;
        internal::PcaCenterT(xc.data(), tp, dim, mean.data(), norm2.data(), err2.data());
        for (size_t t = 0; t < tp; ++t) {
          double nw = 1.0, ew = 2.0;
          for (size_t d = 0; d < dim; ++d) {
            const float x = xt[d * tp + t], c = x - mean[d];
            nw += double{x} * x;
            ew += double{c} * c;
            ASSERT_TRUE(same(xc[d * tp + t], c));
          }
          ASSERT_EQ(norm2[t], nw);
          ASSERT_EQ(err2[t], ew);
        }
        // Projection on the coded rows.
        std::vector<float> y(std::max<size_t>(1, n * tp));
        internal::PcaProjectT(xc.data(), tp, dim, basis.data(), coords.data(), n, y.data());
        for (size_t k = 0; k < n; ++k)
          for (size_t t = 0; t < tp; ++t) {
            float want = 0;
            for (size_t d = 0; d < dim; ++d) {
              const float a = xc[d * tp + t], b = basis[coords[k] * dim + d];
              want = internal::FusesMultiplyAdds() ? std::fma(a, b, want) : want + a * b;
            }
            ASSERT_TRUE(same(y[k * tp + t], want)) << tp << " " << dim << " " << n;
          }
        // Reconstruction from [k][t] coordinates, rows < tp.
        const size_t rows = tp - 3, stride = dim + 3;
        std::vector<float> out(rows * stride, -1.0f);
        internal::PcaReconstruct(y.data(), tp, rows, n, basis.data(), coords.data(), dim,
                                 mean.data(), out.data(), stride);
        for (size_t t = 0; t < rows; ++t)
          for (size_t c = 0; c < dim; ++c) {
            float want = mean[c];
            for (size_t k = 0; k < n; ++k) {
              const float a = y[k * tp + t], b = basis[coords[k] * dim + c];
              want = internal::FusesMultiplyAdds() ? std::fma(a, b, want) : want + a * b;
            }
            ASSERT_TRUE(same(out[t * stride + c], want)) << tp << " " << dim << " " << n;
          }
      }
  // Rounding to steps: ties to even, clamping, the gains added to the errors.
  const size_t tp = 48;
  const float step = 0.3f, inv = 1.0f / step;
  std::vector<float> y(tp);
  for (size_t i = 0; i < tp; ++i)
    y[i] = i < 4 ? (static_cast<float>(i) + 0.5f) * step : 40.0f * g(rng);
  std::vector<int32_t> q(tp), max_abs(tp, 7);
  std::vector<float> gain(tp, 0.5f);
  internal::PcaQuantizeT(y.data(), tp, inv, step, 100.0f, q.data(), gain.data(), max_abs.data());
  for (size_t i = 0; i < tp; ++i) {
    const float want = std::min(100.0f, std::max(-100.0f, std::nearbyint(y[i] * inv)));
    const float e = y[i] - want * step;
    EXPECT_EQ(q[i], static_cast<int32_t>(want)) << i;
    EXPECT_EQ(max_abs[i], std::max(7, std::abs(q[i]))) << i;
    EXPECT_EQ(gain[i], 0.5f + (e * e - y[i] * y[i])) << i;
  }
  // Symbol runs out and back: 3 runs of 16 at a stride of 48.
  {
    std::vector<int32_t> qs(48);
    for (size_t i = 0; i < qs.size(); ++i) qs[i] = static_cast<int32_t>(i % 23) - 11;
    std::vector<uint8_t> s8(3 * 48, 0);
    std::vector<uint16_t> s16(3 * 48, 0);
    internal::EmitRuns(qs.data(), 3, 16, 48, 11, s8.data() + 16);
    internal::EmitRuns(qs.data(), 3, 16, 48, 1000, s16.data() + 16);
    std::vector<float> back8(48), back16(48);
    internal::DequantRuns(s8.data() + 16, 3, 16, 48, 11, 0.3f, back8.data());
    internal::DequantRuns(s16.data() + 16, 3, 16, 48, 1000, 0.3f, back16.data());
    for (size_t r = 0; r < 3; ++r)
      for (size_t i = 0; i < 16; ++i) {
        const int32_t v = qs[r * 16 + i];
        EXPECT_EQ(s8[16 + r * 48 + i], v + 11);
        EXPECT_EQ(s16[16 + r * 48 + i], v + 1000);
        EXPECT_TRUE(same(back8[r * 16 + i], static_cast<float>(v) * 0.3f));
        EXPECT_TRUE(same(back16[r * 16 + i], static_cast<float>(v) * 0.3f));
        EXPECT_EQ(s8[r * 48 + i], 0);  // between the runs: untouched
      }
  }
  // RoPE rows (half = 21: vector and scalar parts) and the finiteness check.
  const size_t T = 3, H = 2, D = 42, half = D / 2;
  std::vector<float> x(T * H * D), cs(T * half), sn(T * half);
  for (float& v : x) v = g(rng);
  for (size_t i = 0; i < cs.size(); ++i) {
    cs[i] = std::cos(0.1f * static_cast<float>(i));
    sn[i] = std::sin(0.1f * static_cast<float>(i));
  }
  for (bool inverse : {false, true}) {
    std::vector<float> r = x;
    internal::RopeRows(r.data(), T, H, D, cs.data(), sn.data(), inverse);
    for (size_t t = 0; t < T; ++t)
      for (size_t h = 0; h < H; ++h)
        for (size_t j = 0; j < half; ++j) {
          const float* v = &x[(t * H + h) * D];
          const float a = v[j], b = v[j + half], c = cs[t * half + j];
          const float s = (inverse ? -1.0f : 1.0f) * sn[t * half + j];
          EXPECT_TRUE(same(r[(t * H + h) * D + j], a * c - b * s));
          EXPECT_TRUE(same(r[(t * H + h) * D + j + half], b * c + a * s));
        }
  }
  EXPECT_TRUE(internal::AllFinite(x.data(), x.size()));
  for (size_t at : {0u, 17u, 251u}) {
    x[at] = at == 17 ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
    EXPECT_FALSE(internal::AllFinite(x.data(), x.size())) << at;
    x[at] = 0;
  }
}

TEST(Kernels, PcaKernelsMatchScalarOnEveryTarget) { OnEveryTarget(CheckPcaKernelsMatchScalar); }

}  // namespace
}  // namespace strata::codec
