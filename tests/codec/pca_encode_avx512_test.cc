// The pca encoder's AVX-512 kernels (internal/pca_avx512.h, codec/pca_encode_avx512.cc): the
// projection as int16 dot products against a double reference, its blobs against the float
// kernels', and the quantisation against the Highway kernel's bits; the same projection on AVX2
// cores (internal/pca_avx2.h); and the AMX tiles' encoder reading the block's rows itself
// (internal/pca_amx.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "codec/calibration.h"
#include "codec/codec.h"
#include "codec/half.h"
#include "codec/internal/kernels.h"
#include "codec/internal/pca_amx.h"
#include "codec/internal/pca_avx2.h"
#include "codec/internal/pca_avx512.h"
#include "hwy/targets.h"
#include "tests/codec/calibrated_synthetic.h"
#include "tests/codec/test_layout.h"

namespace strata::codec {
namespace {

using test::Layout;

bool Runs() { return internal::PcaVnniSupported() && !internal::PcaAmxSupported(); }

// The two int16 projections (VNNI's and AVX2's): the same contract, the same tests.
using ProjectFn = bool (*)(const internal::PcaInput&, const internal::PcaRope*, size_t, size_t,
                           const float*, const internal::PcaVnniBasis&, size_t, double*, double*,
                           float*, std::vector<uint32_t>*);
struct Projection {
  bool (*runs)();
  ProjectFn project;
  uint64_t (*projected)();
};
const Projection kVnni{Runs, internal::PcaEncodeHeadVnni, internal::PcaVnniHeadsProjected};
const Projection kAvx2{internal::PcaAvx2Supported, internal::PcaEncodeHeadAvx2,
                       internal::PcaAvx2HeadsProjected};

float Rounded(float v, internal::PcaRows::Type type) {
  return type == internal::PcaRows::Type::kFloat16    ? HalfToFloat(FloatToHalf(v))
         : type == internal::PcaRows::Type::kBFloat16 ? BF16ToFloat(FloatToBF16(v))
                                                      : v;
}

// The row as the kernel should see it: `type`'s value of x, rotated back with `rope`.
std::vector<double> Expected(const std::vector<float>& x, size_t at, size_t dim,
                             internal::PcaRows::Type type, const std::vector<float>* cos,
                             const std::vector<float>* sin, size_t t) {
  std::vector<double> r(dim);
  for (size_t d = 0; d < dim; ++d) r[d] = Rounded(x[at + d], type);
  if (!cos) return r;
  const size_t half = dim / 2;
  std::vector<double> o(r);
  for (size_t j = 0; j < half; ++j) {
    const double c = (*cos)[t * half + j], s = (*sin)[t * half + j];
    o[j] = r[j] * c + r[j + half] * s;
    o[j + half] = r[j + half] * c - r[j] * s;
  }
  return o;
}

// The block's values in `type`, `stride` apart (infinities as fp16 infinities, which
// FloatToHalf, the codec's rounding, never writes).
std::vector<uint16_t> Narrow(const std::vector<float>& x, internal::PcaRows::Type type) {
  std::vector<uint16_t> w(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if (type != internal::PcaRows::Type::kFloat16) {
      w[i] = FloatToBF16(x[i]);
    } else if (std::isinf(x[i])) {
      w[i] = std::signbit(x[i]) ? 0xFC00 : 0x7C00;
    } else {
      w[i] = FloatToHalf(x[i]);
    }
  }
  return w;
}

// Random rows (not orthogonal: the kernel does not rely on them being so) of random lengths,
// one token equal to the mean, a key-like outlier channel 300x the others, and in fp32 one token
// far past float's squares; tokens 1 .. 256 (tails of a group and of a pass of four groups), two
// heads per row; fp32, fp16 and bf16 rows, with and without RoPE (random angles).
void CoordinatesMatchADoubleReference(const Projection& projection) {
  using Type = internal::PcaRows::Type;
  std::mt19937 rng(41);
  std::normal_distribution<float> g;
  std::uniform_real_distribution<float> angle(0.0f, 6.2831853f);
  for (const Type type : {Type::kFloat32, Type::kFloat16, Type::kBFloat16})
  for (const bool rope : {false, true})
  for (const size_t dim : {64u, 96u, 128u, 256u})
    for (const size_t tokens : {1u, 16u, 40u, 72u, 256u})
      for (const size_t n : {size_t{0}, size_t{1}, size_t{3}, dim - 5, dim}) {
        SCOPED_TRACE(::testing::Message() << "type " << static_cast<int>(type) << " rope "
                                          << rope << " dim " << dim << " tokens " << tokens
                                          << " n " << n);
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
        if (!rope)  // one token equal to the mean (the mean exact in the block's type)
          for (size_t d = 0; d < dim; ++d) {
            mean[d] = Rounded(mean[d], type);
            x[(tokens / 2) * stride + h * dim + d] = mean[d];
          }
        if (tokens > 2 && type == Type::kFloat32)
          for (size_t d = 0; d < dim; ++d) x[(tokens - 1) * stride + h * dim + d] = 3e25f * g(rng);
        std::vector<float> cos(tokens * dim / 2), sin(tokens * dim / 2);
        for (size_t i = 0; i < cos.size(); ++i) {
          const float a = angle(rng);
          cos[i] = std::cos(a);
          sin[i] = std::sin(a);
        }
        const internal::PcaRope angles{cos.data(), sin.data()};
        const std::vector<uint16_t> narrow = Narrow(x, type);
        const internal::PcaInput in{
            type == Type::kFloat32 ? static_cast<const void*>(x.data() + h * dim)
                                   : static_cast<const void*>(narrow.data() + h * dim),
            type, stride};
        std::vector<uint32_t> coords(n);
        for (size_t k = 0; k < n; ++k) coords[k] = static_cast<uint32_t>((k * 7 + 3) % dim);
        internal::PcaVnniBasis b;
        internal::BuildPcaVnniBasis(basis.data(), coords.data(), n, dim, &b);
        ASSERT_EQ(b.n, n);
        // One row past the coordinates: left as it was.
        std::vector<float> y((n + 1) * tp, -7.0f);
        std::vector<double> norm2(tp, 1.0), err2(tp, 2.0);
        std::vector<uint32_t> scratch;
        ASSERT_TRUE(projection.project(in, rope ? &angles : nullptr, tokens, dim, mean.data(), b,
                                       tp, norm2.data(), err2.data(), y.data(), &scratch));
        for (size_t t = 0; t < tp; ++t) {
          std::vector<double> c(dim, 0.0);
          double nx = 0, nc = 0;
          if (t < tokens) {
            const std::vector<double> r = Expected(x, t * stride + h * dim, dim, type,
                                                   rope ? &cos : nullptr, &sin, t);
            for (size_t d = 0; d < dim; ++d) {
              c[d] = r[d] - mean[d];
              nx += r[d] * r[d];
              nc += c[d] * c[d];
            }
          }
          ASSERT_NEAR(norm2[t], 1.0 + nx, 1e-5 * (1.0 + nx)) << t;
          ASSERT_NEAR(err2[t], 2.0 + nc, 1e-5 * (2.0 + nc)) << t;
          for (size_t k = 0; k < n; ++k) {
            const float* row = &basis[size_t{coords[k]} * dim];
            double want = 0, row2 = 0;
            for (size_t d = 0; d < dim; ++d) {
              want += c[d] * row[d];
              row2 += double{row[d]} * row[d];
            }
            // At most half a unit (a 32767th of each length) per element of each operand, and
            // float rounding of the rotation.
            const double bound = (std::sqrt(double(dim)) / 32767 + 1e-6) * std::sqrt(nc * row2);
            ASSERT_NEAR(y[k * tp + t], want, bound) << "token " << t << " coordinate " << k;
          }
        }
        for (size_t t = 0; t < tp; ++t) ASSERT_EQ(y[n * tp + t], -7.0f);
      }
}

TEST(PcaVnniEncode, CoordinatesMatchADoubleReference) {
  if (!Runs()) GTEST_SKIP() << "this CPU offers no AVX512-VNNI (or has AMX tiles)";
  CoordinatesMatchADoubleReference(kVnni);
}

TEST(PcaAvx2Encode, CoordinatesMatchADoubleReference) {
  if (!kAvx2.runs()) GTEST_SKIP() << "this CPU offers no AVX2, FMA and F16C";
  CoordinatesMatchADoubleReference(kAvx2);
}

// A value that is not finite, in any token and type, is refused.
void RefusesValuesThatAreNotFinite(const Projection& projection) {
  using Type = internal::PcaRows::Type;
  const size_t dim = 64, tokens = 40, tp = 48;
  std::vector<float> basis(dim * dim, 0.125f), mean(dim, 0.0f);
  std::vector<uint32_t> coords = {0, 1, 2};
  internal::PcaVnniBasis b;
  internal::BuildPcaVnniBasis(basis.data(), coords.data(), coords.size(), dim, &b);
  for (const Type type : {Type::kFloat32, Type::kFloat16, Type::kBFloat16})
    for (const float bad : {INFINITY, -INFINITY, NAN})
      for (const size_t at : {size_t{0}, size_t{33 * dim + 17}, tokens * dim - 1}) {
        std::vector<float> x(tokens * dim, 1.0f);
        x[at] = bad;
        const std::vector<uint16_t> narrow = Narrow(x, type);
        const internal::PcaInput in{type == Type::kFloat32 ? static_cast<const void*>(x.data())
                                                           : narrow.data(),
                                    type, dim};
        std::vector<float> y(coords.size() * tp);
        std::vector<double> norm2(tp), err2(tp);
        std::vector<uint32_t> scratch;
        EXPECT_FALSE(projection.project(in, nullptr, tokens, dim, mean.data(), b, tp,
                                        norm2.data(), err2.data(), y.data(), &scratch))
            << static_cast<int>(type) << " " << bad << " at " << at;
      }
}

TEST(PcaVnniEncode, RefusesValuesThatAreNotFinite) {
  if (!Runs()) GTEST_SKIP() << "this CPU offers no AVX512-VNNI (or has AMX tiles)";
  RefusesValuesThatAreNotFinite(kVnni);
}

TEST(PcaAvx2Encode, RefusesValuesThatAreNotFinite) {
  if (!kAvx2.runs()) GTEST_SKIP() << "this CPU offers no AVX2, FMA and F16C";
  RefusesValuesThatAreNotFinite(kAvx2);
}

// The tiles' encoder reading the block's rows (PcaEncodeHeadAmxRows) against the tiles on the
// rows converted and rotated back first (ToFloat, RopeRows), as the encoder did before: the same
// coordinates, norms and centred energies, bit for bit. fp32, fp16 and bf16 rows, with and
// without RoPE; one and both bf16 halves; tokens 1 .. 256 (a group's tail, a pair's tail), 1 to
// dim coordinates, two heads per row (the second read).
TEST(PcaAmxEncode, RowsReadFromTheBlockAreTheConvertedRows) {
  if (!internal::PcaAmxAvailable()) GTEST_SKIP() << "this CPU offers no AMX tiles";
  using Type = internal::PcaRows::Type;
  std::mt19937 rng(43);
  std::normal_distribution<float> g;
  std::uniform_real_distribution<float> angle(0.0f, 6.2831853f);
  for (const Type type : {Type::kFloat32, Type::kFloat16, Type::kBFloat16})
  for (const bool rope : {false, true})
  for (const bool split : {false, true})
  for (const size_t dim : {64u, 96u, 128u})
    for (const size_t tokens : {1u, 16u, 40u, 256u})
      for (const size_t n : {size_t{1}, size_t{33}, dim}) {
        SCOPED_TRACE(::testing::Message() << "type " << static_cast<int>(type) << " rope "
                                          << rope << " split " << split << " dim " << dim
                                          << " tokens " << tokens << " n " << n);
        const size_t heads = 2, stride = heads * dim, tp = (tokens + 15) / 16 * 16, h = 1;
        std::vector<float> basis(dim * dim), mean(dim), x(tokens * stride);
        for (float& b : basis) b = g(rng) / std::sqrt(float(dim));
        for (float& m : mean) m = g(rng);
        for (size_t i = 0; i < x.size(); ++i) x[i] = (i % dim == 5 ? 300.0f : 1.0f) * g(rng);
        std::vector<float> cos(tokens * dim / 2), sin(tokens * dim / 2);
        for (size_t i = 0; i < cos.size(); ++i) {
          const float a = angle(rng);
          cos[i] = std::cos(a);
          sin[i] = std::sin(a);
        }
        std::vector<uint32_t> coords(n);
        for (size_t k = 0; k < n; ++k) coords[k] = static_cast<uint32_t>((k * 7 + 3) % dim);
        internal::PcaAmxBasis b;
        internal::BuildPcaAmxBasis(basis.data(), coords.data(), n, dim, split, &b);
        ASSERT_GT(b.kpad, 0u);
        // Before: the block as floats, rotated back in place, then the tiles.
        const std::vector<uint16_t> narrow = Narrow(x, type);
        std::vector<float> f(x);
        if (type != Type::kFloat32)
          for (size_t i = 0; i < f.size(); ++i) f[i] = Rounded(x[i], type);
        if (rope) internal::RopeRows(f.data(), tokens, heads, dim, cos.data(), sin.data(), true);
        std::vector<float> y0(b.kpad * tp, -7.0f), y1(b.kpad * tp, -7.0f);
        std::vector<double> n0(tp, 1.0), e0(tp, 2.0), n1(tp, 1.0), e1(tp, 2.0);
        std::vector<uint16_t> scratch;
        internal::PcaEncodeHeadAmx(f.data() + h * dim, stride, tokens, dim, mean.data(), b, tp,
                                   n0.data(), e0.data(), y0.data(), &scratch);
        const internal::PcaInput in{
            type == Type::kFloat32 ? static_cast<const void*>(x.data() + h * dim)
                                   : static_cast<const void*>(narrow.data() + h * dim),
            type, stride};
        const internal::PcaRope angles{cos.data(), sin.data()};
        ASSERT_TRUE(internal::PcaEncodeHeadAmxRows(in, rope ? &angles : nullptr, tokens, dim,
                                                   mean.data(), b, tp, n1.data(), e1.data(),
                                                   y1.data(), &scratch));
        ASSERT_EQ(0, std::memcmp(y0.data(), y1.data(), y0.size() * sizeof(float)));
        ASSERT_EQ(0, std::memcmp(n0.data(), n1.data(), n0.size() * sizeof(double)));
        ASSERT_EQ(0, std::memcmp(e0.data(), e1.data(), e0.size() * sizeof(double)));
        // Not every coordinate zero: the comparison compared something.
        ASSERT_TRUE(std::any_of(y1.begin(), y1.begin() + tokens, [](float v) { return v != 0; }));
      }
}

// The tiles' coordinates against a double reference: within the bf16 roundings' bound (one
// product: each operand rounded once, 2^-9 of itself; both halves: ~2^-16), every coded row and
// token; the padding rows (to 16, the axes tile's height: a last half block of 16 rows takes
// half the products) and the tokens past the end zero; norms and centred energies as summed in
// double.
TEST(PcaAmxEncode, CoordinatesMatchADoubleReference) {
  if (!internal::PcaAmxAvailable()) GTEST_SKIP() << "this CPU offers no AMX tiles";
  std::mt19937 rng(47);
  std::normal_distribution<float> g;
  for (const bool split : {false, true})
  for (const size_t dim : {64u, 128u})
    for (const size_t tokens : {40u, 256u})
      for (const size_t n : {size_t{1}, size_t{16}, size_t{17}, size_t{32}, size_t{48}, dim}) {
        SCOPED_TRACE(::testing::Message() << "split " << split << " dim " << dim << " tokens "
                                          << tokens << " n " << n);
        const size_t tp = (tokens + 15) / 16 * 16;
        std::vector<float> basis(dim * dim), mean(dim), x(tokens * dim);
        for (float& b : basis) b = g(rng) / std::sqrt(float(dim));
        for (float& m : mean) m = g(rng);
        for (float& v : x) v = g(rng);
        std::vector<uint32_t> coords(n);
        for (size_t k = 0; k < n; ++k) coords[k] = static_cast<uint32_t>((k * 5 + 1) % dim);
        internal::PcaAmxBasis b;
        internal::BuildPcaAmxBasis(basis.data(), coords.data(), n, dim, split, &b);
        ASSERT_EQ(b.kpad, (n + 15) / 16 * 16);
        std::vector<float> y(b.kpad * tp, -7.0f);
        std::vector<double> norm2(tp, 0.0), err2(tp, 0.0);
        std::vector<uint16_t> scratch;
        internal::PcaEncodeHeadAmx(x.data(), dim, tokens, dim, mean.data(), b, tp, norm2.data(),
                                   err2.data(), y.data(), &scratch);
        const double rel = split ? 0x1p-15 : 0x1p-7;
        for (size_t t = 0; t < tp; ++t) {
          double n2 = 0, e2 = 0;
          for (size_t c = 0; c < dim && t < tokens; ++c) {
            n2 += double{x[t * dim + c]} * x[t * dim + c];
            e2 += (double{x[t * dim + c]} - mean[c]) * (double{x[t * dim + c]} - mean[c]);
          }
          ASSERT_NEAR(norm2[t], n2, 1e-5 * n2 + 1e-30) << "token " << t;
          ASSERT_NEAR(err2[t], e2, 1e-5 * e2 + 1e-30) << "token " << t;
          for (size_t k = 0; k < b.kpad; ++k) {
            const float got = y[k * tp + t];
            if (k >= n || t >= tokens) {
              ASSERT_EQ(got, 0.0f) << "padding row " << k << " token " << t;
              continue;
            }
            double want = 0, scale = 0;
            for (size_t c = 0; c < dim; ++c) {
              const double term =
                  double{basis[size_t{coords[k]} * dim + c]} * (double{x[t * dim + c]} - mean[c]);
              want += term;
              scale += std::abs(term);
            }
            ASSERT_NEAR(got, want, rel * scale) << "row " << k << " token " << t;
          }
        }
      }
}

// A value that is not finite in the block, or that the rotation takes past float's range, is
// refused by the tiles' row reader.
TEST(PcaAmxEncode, RefusesValuesThatAreNotFinite) {
  if (!internal::PcaAmxAvailable()) GTEST_SKIP() << "this CPU offers no AMX tiles";
  using Type = internal::PcaRows::Type;
  const size_t dim = 64, tokens = 40, tp = 48;
  std::vector<float> basis(dim * dim, 0.125f), mean(dim, 0.0f);
  std::vector<uint32_t> coords = {0, 1, 2};
  internal::PcaAmxBasis b;
  internal::BuildPcaAmxBasis(basis.data(), coords.data(), coords.size(), dim, false, &b);
  std::vector<float> cos(tokens * dim / 2, 0.70710677f), sin(tokens * dim / 2, 0.70710677f);
  const internal::PcaRope angles{cos.data(), sin.data()};
  auto accepts = [&](const std::vector<float>& x, Type type, bool rope) {
    const std::vector<uint16_t> narrow = Narrow(x, type);
    const internal::PcaInput in{type == Type::kFloat32 ? static_cast<const void*>(x.data())
                                                       : narrow.data(),
                                type, dim};
    std::vector<float> y(b.kpad * tp);
    std::vector<double> norm2(tp), err2(tp);
    std::vector<uint16_t> scratch;
    return internal::PcaEncodeHeadAmxRows(in, rope ? &angles : nullptr, tokens, dim, mean.data(),
                                          b, tp, norm2.data(), err2.data(), y.data(), &scratch);
  };
  for (const Type type : {Type::kFloat32, Type::kFloat16, Type::kBFloat16})
    for (const bool rope : {false, true}) {
      ASSERT_TRUE(accepts(std::vector<float>(tokens * dim, 1.0f), type, rope));
      for (const float bad : {INFINITY, -INFINITY, NAN})
        for (const size_t at : {size_t{0}, size_t{33 * dim + 17}, tokens * dim - 1}) {
          std::vector<float> x(tokens * dim, 1.0f);
          x[at] = bad;
          EXPECT_FALSE(accepts(x, type, rope))
              << static_cast<int>(type) << " " << rope << " " << bad << " at " << at;
        }
    }
  // Finite, but a rotation by 45 degrees of two values near float's largest passes it.
  std::vector<float> x(tokens * dim, 1.0f);
  x[7 * dim + 3] = 3e38f;
  x[7 * dim + 3 + dim / 2] = -3e38f;
  EXPECT_TRUE(accepts(x, Type::kFloat32, false));
  EXPECT_FALSE(accepts(x, Type::kFloat32, true));
}

// Per coordinate in turn, PcaQuantizeT's bits: symbols, the tokens' largest |q| and their error
// sums (float gains over the head, added to the double error once); with values past the
// clamp, ties of rounding and coordinates 0 .. 19; and the same written straight into the slots'
// runs as bytes.
TEST(PcaAvx512Encode, QuantisationMatchesTheKernelPerCoordinate) {
  if (!internal::PcaLanesSupported()) GTEST_SKIP() << "this CPU offers no AVX-512";
  std::mt19937 rng(43);
  std::normal_distribution<float> g;
  for (const size_t tp : {16u, 48u, 256u})
    for (const size_t n : {0u, 1u, 7u, 20u}) {
      SCOPED_TRACE(::testing::Message() << "tp " << tp << " n " << n);
      std::vector<float> y(n * tp), steps(n), inv(n);
      for (size_t k = 0; k < n; ++k) {
        steps[k] = 0.01f + std::abs(g(rng));
        inv[k] = 1.0f / steps[k];
        for (size_t t = 0; t < tp; ++t) {
          const float scale = t % 5 == 0 ? 600.0f : 3.0f;
          y[k * tp + t] = t % 7 == 3 ? (std::round(scale * g(rng)) + 0.5f) * steps[k]
                                     : scale * g(rng) * steps[k];
        }
      }
      std::vector<int32_t> q(n * tp, -1), q_want(n * tp, -1), most(tp), most_want(tp);
      std::vector<double> err2(tp), err2_want(tp);
      for (size_t t = 0; t < tp; ++t) {
        most[t] = most_want[t] = static_cast<int32_t>(t % 3);
        err2[t] = err2_want[t] = 0.25 * static_cast<double>(t);
      }
      std::vector<float> gain(tp, 0.0f);
      for (size_t k = 0; k < n; ++k)
        internal::PcaQuantizeT(y.data() + k * tp, tp, inv[k], steps[k], 1000.0f,
                               q_want.data() + k * tp, gain.data(), most_want.data());
      for (size_t t = 0; t < tp; ++t) err2_want[t] += gain[t];
      internal::PcaQuantizeHeadAvx512(y.data(), n, tp, steps.data(), inv.data(), 1000.0f,
                                      q.data(), err2.data(), most.data());
      EXPECT_EQ(q, q_want);
      EXPECT_EQ(most, most_want);
      EXPECT_EQ(err2, err2_want);
      // Straight into runs: slots in another order (and one more, untouched), int8 saturated.
      const size_t nslots = n + 1;
      std::vector<uint32_t> slot(n);
      for (size_t k = 0; k < n; ++k) slot[k] = static_cast<uint32_t>((k * 5 + 2) % nslots);
      std::vector<int8_t> runs(tp * nslots, 99);
      for (size_t t = 0; t < tp; ++t) {
        most[t] = static_cast<int32_t>(t % 3);
        err2[t] = 0.25 * static_cast<double>(t);
      }
      internal::PcaQuantizeHeadRunsAvx512(y.data(), n, tp, steps.data(), inv.data(), 1000.0f,
                                          slot.data(), nslots, runs.data(), err2.data(),
                                          most.data());
      EXPECT_EQ(most, most_want);
      EXPECT_EQ(err2, err2_want);
      std::vector<bool> written(nslots, false);
      for (size_t k = 0; k < n; ++k) written[slot[k]] = true;
      for (size_t t = 0; t < tp; ++t)
        for (size_t j = 0; j < nslots; ++j) {
          const int8_t got = runs[(t / 16 * nslots + j) * 16 + t % 16];
          if (!written[j]) {
            ASSERT_EQ(got, 99);
            continue;
          }
          const size_t k = std::find(slot.begin(), slot.end(), j) - slot.begin();
          ASSERT_EQ(got, std::clamp(q_want[k * tp + t], -128, 127)) << t << " " << k;
        }
    }
}

// Synthetic KV (2 layers, 2 heads of 128, 64 tokens per block) calibrated at 1.5 and at 4
// bits/value from other blocks: with VNNI the encoder projects every head as int16 products, and
// its blobs decode (by the same float decoder) to the float kernels' values in nearly every head
// vector (98 % at 1.5 bits, 80 % at 4), as far from the input to within 0.1 % of the error
// energy, at nearly their size.
void BlobsMatchTheFloatKernels(const Projection& projection) {
  for (const double bits : {1.5, 4.0}) {
    SCOPED_TRACE(::testing::Message() << bits << " bits/value");
    test::CalibratedSynthetic c(6, test::AtBits(bits));
    const KvLayout& layout = c.layout;
    const size_t bb = c.bb;
    CodecParams& p = c.p;
    Encoder& enc = c.enc;
    Decoder& dec = c.dec;
    for (size_t i = 4; i < 6; ++i, p.first_position += 64) {
      const std::span<const uint8_t> in = c.Block(i);
      std::vector<uint8_t> vnni_blob, float_blob, vnni(bb), floats(bb);
      const uint64_t before = projection.projected();
      ASSERT_TRUE(enc.Encode(layout, p, in, &vnni_blob).ok());
      EXPECT_EQ(projection.projected() - before, 2u * 2 * 2);  // every head
      internal::SetPcaVnniEnabledForTest(false);
      ASSERT_TRUE(enc.Encode(layout, p, in, &float_blob).ok());
      EXPECT_EQ(projection.projected() - before, 2u * 2 * 2);
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

TEST(PcaVnniEncode, BlobsMatchTheFloatKernels) {
  if (!Runs()) GTEST_SKIP() << "this CPU offers no AVX512-VNNI (or has AMX tiles)";
  BlobsMatchTheFloatKernels(kVnni);
}

// Where neither AMX tiles nor VNNI project (pinned to AVX2 where the CPU has AVX-512).
TEST(PcaAvx2Encode, BlobsMatchTheFloatKernels) {
  if (!kAvx2.runs()) GTEST_SKIP() << "this CPU offers no AVX2, FMA and F16C";
  if (internal::PcaAmxSupported()) GTEST_SKIP() << "AMX tiles project on this CPU";
  if ((hwy::SupportedTargets() & HWY_AVX2) == 0) GTEST_SKIP() << "Highway offers no AVX2 here";
  hwy::SetSupportedTargetsForTest(HWY_AVX2);
  BlobsMatchTheFloatKernels(kAvx2);
  hwy::SetSupportedTargetsForTest(0);
}

// Through the encoder, on every path it takes here (the VNNI projection reading the block
// itself, and the float kernels after a conversion pass): infinities and NaNs in a key (RoPE
// undone) or a value section are refused with a clear error, at any token.
TEST(PcaEncoder, RefusesValuesThatAreNotFinite) {
  CalibrateOptions o;
  o.rope_theta = 10000;
  test::CalibratedSynthetic c(5, o);
  const KvLayout& layout = c.layout;
  const size_t bb = c.bb;
  const std::vector<uint8_t>& kv = c.kv;
  const CodecParams& p = c.p;
  Encoder& enc = c.enc;
  const size_t section = bb / 4;  // layer 0 keys, layer 0 values, layer 1 keys, values
  for (const bool vnni : {true, false}) {
    internal::SetPcaVnniEnabledForTest(vnni);
    for (const uint16_t bad : {uint16_t{0x7C00}, uint16_t{0xFC00}, uint16_t{0x7E00}})
      for (const size_t at : {size_t{0}, section + 2 * 777, 3 * section + bb / 4 - 2}) {
        std::vector<uint8_t> block(kv.begin() + 4 * bb, kv.end());
        std::memcpy(&block[at], &bad, 2);
        std::vector<uint8_t> blob;
        const absl::Status st = enc.Encode(layout, p, block, &blob);
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument)
            << "vnni " << vnni << " value " << bad << " at " << at << ": " << st;
        EXPECT_NE(st.message().find("non-finite"), std::string::npos) << st;
      }
    std::vector<uint8_t> blob;  // and the block itself is fine
    EXPECT_TRUE(enc.Encode(layout, p, std::span(kv).subspan(4 * bb, bb), &blob).ok());
  }
  internal::SetPcaVnniEnabledForTest(true);
}

}  // namespace
}  // namespace strata::codec
