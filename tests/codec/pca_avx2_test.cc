// The pca decoder's int16 sums on AVX2 cores (codec/pca_avx2.cc, PcaReconstructAvx2): the
// plain sum within the int16 terms' rounding on every shape a head can have, the VNNI decoder's
// rows bit for bit where that one can run too, and in the codec as close to the input as the
// float kernels.
#include <cstring>
#include <vector>

#include "codec/codec.h"
#include "codec/half.h"
#include "codec/internal/kernels.h"
#include "codec/internal/pca_avx2.h"
#include "codec/internal/pca_avx512.h"
#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "tests/codec/calibrated_synthetic.h"
#include "tests/codec/pca_kernel_cases.h"

namespace strata::codec {
namespace {

using internal::PcaRows;
using test::Decoded;
using test::Fp16Errors;
using test::Head;
using test::HeadShape;
using test::SquaredErrors;

TEST(PcaAvx2, SumsAsThePlainSum) {
  if (!internal::PcaAvx2Supported()) GTEST_SKIP() << "this CPU offers no AVX2, FMA and F16C";
  // An odd coordinate count (a last pair of one), one token to a block's 256, a last group of
  // 1, 8 and 15 tokens, symbols up to 127 steps either side.
  for (const HeadShape& sh : {HeadShape{64, 61, 40, 61, 20}, HeadShape{64, 64, 256, 65, 127},
                              HeadShape{64, 17, 1, 19, 3}, HeadShape{128, 105, 256, 111, 12},
                              HeadShape{128, 1, 47, 3, 60}, HeadShape{256, 200, 33, 201, 7},
                              HeadShape{32, 31, 24, 31, 100}}) {
    SCOPED_TRACE(::testing::Message() << "dim " << sh.dim << " n " << sh.n << " tokens "
                                      << sh.tokens << " maxq " << sh.maxq);
    const Head h(sh.dim, sh.n, sh.tokens, sh.nslots, sh.maxq, static_cast<uint32_t>(sh.n + 1));
    const internal::PcaVnniAxes axes = h.Int16Axes();
    ASSERT_GT(axes.pairs, 0u);
    const internal::PcaRope rope{h.cos.data(), h.sin.data()};
    for (const internal::PcaRope* r : {static_cast<const internal::PcaRope*>(nullptr), &rope}) {
      double energy = 0;
      const std::vector<double> want = h.Reference(0.75f, r != nullptr, &energy);
      std::vector<uint8_t> first;
      std::vector<float> f32;  // the float rows: the typed ones are their conversions
      for (const auto type :
           {PcaRows::Type::kFloat32, PcaRows::Type::kFloat16, PcaRows::Type::kBFloat16})
        for (const size_t offset : {size_t{0}, size_t{2}}) {
          SCOPED_TRACE(::testing::Message() << "type " << static_cast<int>(type) << " offset "
                                            << offset << (r ? " rope" : ""));
          std::vector<float> scratch;
          const uint64_t before = internal::PcaAvx2HeadsDecoded();
          const std::vector<uint8_t> got = Decoded(h, type, offset, [&](const PcaRows& rows) {
            EXPECT_TRUE(internal::PcaReconstructAvx2(h.Symbols(), h.slot.data(), h.n, axes,
                                                     h.dim, 0.75f, h.mean.data(), r, rows,
                                                     &scratch));
          });
          EXPECT_EQ(internal::PcaAvx2HeadsDecoded() - before, 1u);
          if (offset == 0) {
            first = got;
          } else {
            EXPECT_TRUE(got == first);  // streamed and plain stores write the same values
          }
          if (type != PcaRows::Type::kFloat32) {
            size_t converted = 0;
            for (size_t i = 0; i < f32.size(); ++i) {
              uint16_t v;
              std::memcpy(&v, got.data() + 2 * i, 2);
              converted += v == (type == PcaRows::Type::kFloat16 ? FloatToHalf(f32[i])
                                                                  : FloatToBF16(f32[i]));
            }
            EXPECT_EQ(converted, f32.size());
          } else {
            std::vector<float>& rows = f32;
            rows.resize(want.size());
            std::memcpy(rows.data(), got.data(), got.size());
            double apart = 0;
            for (size_t i = 0; i < want.size(); ++i)
              apart += (rows[i] - want[i]) * (rows[i] - want[i]);
            // Int16 terms: each off by at most 2^-16 of its column's largest per unit symbol.
            EXPECT_LT(apart, 1e-7 * energy);
          }
          if (internal::PcaVnniSupported()) {  // the VNNI decoder's rows, bit for bit
            std::vector<float> vnni_scratch;
            const std::vector<uint8_t> vnni = Decoded(h, type, offset, [&](const PcaRows& rows) {
              internal::PcaReconstructVnni(h.Symbols(), h.slot.data(), h.n, axes, h.dim, 0.75f,
                                           h.mean.data(), r, rows, &vnni_scratch);
            });
            EXPECT_TRUE(got == vnni);
          }
        }
    }
  }
}

// The heads it does not take write nothing and say so: int8 terms in the axes, wide symbols.
TEST(PcaAvx2, RefusesHeadsThatDoNotQualify) {
  if (!internal::PcaAvx2Supported()) GTEST_SKIP() << "this CPU offers no AVX2, FMA and F16C";
  const Head h(64, 61, 40, 61, 20, 5);
  const internal::PcaVnniAxes bytes = h.Int8Axes();
  ASSERT_GT(bytes.quads, 0u);
  std::vector<float> scratch;
  const std::vector<uint8_t> untouched(h.tokens * h.dim * 4, 0xA5);
  const uint64_t before = internal::PcaAvx2HeadsDecoded();
  std::vector<uint8_t> out = untouched;
  const PcaRows rows{out.data(), PcaRows::Type::kFloat32, h.dim};
  EXPECT_FALSE(internal::PcaReconstructAvx2(h.Symbols(), h.slot.data(), h.n, bytes, h.dim, 1.0f,
                                            h.mean.data(), nullptr, rows, &scratch));
  std::vector<uint16_t> wide_sym(h.sym.begin(), h.sym.end());
  const internal::PcaSymbols wide{wide_sym.data(), true, h.nslots, h.tokens, h.maxq};
  EXPECT_FALSE(internal::PcaReconstructAvx2(wide, h.slot.data(), h.n, h.Int16Axes(), h.dim, 1.0f,
                                            h.mean.data(), nullptr, rows, &scratch));
  EXPECT_EQ(internal::PcaAvx2HeadsDecoded(), before);
  EXPECT_TRUE(out == untouched);
}

// In the codec, where neither AMX tiles nor AVX-512 decode (pinned to AVX2 where the CPU has
// AVX-512): every head of a byte section takes the AVX2 sums, and the decoded block is as far
// from the input as the float kernels' (within 1 % of the codec's error energy) and apart from
// theirs by < 1 % of it, at the calibrated steps and at 16x finer ones.
TEST(PcaAvx2, DecoderIsAsCloseAsTheFloatKernels) {
  if (!internal::PcaAvx2Supported()) GTEST_SKIP() << "this CPU offers no AVX2, FMA and F16C";
  if (internal::PcaAmxSupported()) GTEST_SKIP() << "AMX tiles decode on this CPU";
  if ((hwy::SupportedTargets() & HWY_AVX2) == 0) GTEST_SKIP() << "Highway offers no AVX2 here";
  hwy::SetSupportedTargetsForTest(HWY_AVX2);
  ASSERT_TRUE(internal::DispatchesToAvx2());
  test::CalibratedSynthetic c(5, test::AtBits(1.5));
  for (const uint8_t code : {uint8_t{0}, uint8_t{1}}) {
    SCOPED_TRACE(::testing::Message() << "step code " << int{code});
    c.p.pca_step_code = code;
    std::vector<uint8_t> blob, avx2(c.bb), floats(c.bb);
    ASSERT_TRUE(c.enc.Encode(c.layout, c.p, c.Block(4), &blob).ok());
    const uint64_t before = internal::PcaAvx2HeadsDecoded();
    ASSERT_TRUE(c.dec.Decode(blob, avx2).ok());
    EXPECT_GE(internal::PcaAvx2HeadsDecoded() - before, 2u * 2);
    internal::SetPcaVnniEnabledForTest(false);  // the float kernels
    const uint64_t after = internal::PcaAvx2HeadsDecoded();
    ASSERT_TRUE(c.dec.Decode(blob, floats).ok());
    EXPECT_EQ(internal::PcaAvx2HeadsDecoded(), after);
    internal::SetPcaVnniEnabledForTest(true);
    const SquaredErrors e = Fp16Errors(c.Block(4), avx2, floats);  // b: the codec's own error
    EXPECT_GT(e.b, 0);
    EXPECT_LT(e.apart, 0.01 * e.b);
    EXPECT_NEAR(e.a, e.b, 0.01 * e.b);
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace
}  // namespace strata::codec
