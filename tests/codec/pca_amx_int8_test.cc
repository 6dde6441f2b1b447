// The pca decoder's int8 sums on AMX tiles (codec/pca_amx.cc, PcaReconstructAmxInt8): the
// VNNI decoder's sums bit for bit, on every shape a head can have, and taken by the codec only
// where the VNNI rule admits every coordinate of a head as int8.
#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "codec/codec.h"
#include "codec/half.h"
#include "codec/internal/pca_amx.h"
#include "codec/internal/pca_avx512.h"
#include "gtest/gtest.h"
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

TEST(PcaAmxInt8, SumsAsTheVnniDecoderBitForBit) {
  if (!internal::PcaAmxInt8Supported())
    GTEST_SKIP() << "no AMX-INT8 here (or STRATA_CODEC_AMX_INT8=0)";
  // Coordinates short of, at and past a tile's 64 (and of a quad), one token to a block's 256,
  // a last group of 1, 8 and 15 tokens, symbols up to 127 steps either side.
  for (const HeadShape& sh : {HeadShape{64, 61, 40, 61, 20}, HeadShape{64, 64, 256, 65, 127},
                              HeadShape{64, 17, 1, 19, 3}, HeadShape{128, 105, 256, 111, 12},
                              HeadShape{128, 65, 47, 67, 60}, HeadShape{128, 128, 16, 129, 1},
                              HeadShape{256, 200, 33, 201, 7}, HeadShape{32, 16, 24, 17, 100}}) {
    SCOPED_TRACE(::testing::Message() << "dim " << sh.dim << " n " << sh.n << " tokens "
                                      << sh.tokens << " maxq " << sh.maxq);
    const Head h(sh.dim, sh.n, sh.tokens, sh.nslots, sh.maxq, static_cast<uint32_t>(sh.n));
    const internal::PcaVnniAxes axes = h.Int8Axes();
    ASSERT_EQ(axes.pairs, 0u);
    ASSERT_GT(axes.quads, 0u);
    const internal::PcaRope rope{h.cos.data(), h.sin.data()};
    for (const internal::PcaRope* r : {static_cast<const internal::PcaRope*>(nullptr), &rope})
      for (const auto type :
           {PcaRows::Type::kFloat32, PcaRows::Type::kFloat16, PcaRows::Type::kBFloat16})
        for (const size_t offset : {size_t{0}, size_t{2}}) {
          SCOPED_TRACE(::testing::Message() << "type " << static_cast<int>(type) << " offset "
                                            << offset << (r ? " rope" : ""));
          std::vector<float> vnni_scratch;
          const std::vector<uint8_t> want = Decoded(h, type, offset, [&](const PcaRows& rows) {
            internal::PcaReconstructVnni(h.Symbols(), h.slot.data(), h.n, axes, h.dim, 0.75f,
                                         h.mean.data(), r, rows, &vnni_scratch);
          });
          internal::PcaAmxScratch scratch;
          const uint64_t before = internal::PcaAmxInt8HeadsDecoded();
          const std::vector<uint8_t> got = Decoded(h, type, offset, [&](const PcaRows& rows) {
            EXPECT_TRUE(internal::PcaReconstructAmxInt8(h.Symbols(), h.slot.data(), h.n, axes,
                                                        h.dim, 0.75f, h.mean.data(), r, rows,
                                                        &scratch));
          });
          EXPECT_EQ(internal::PcaAmxInt8HeadsDecoded() - before, 1u);
          EXPECT_TRUE(got == want);
        }
  }
}

// The heads it does not take write nothing and say so: int16 coordinates in the axes, wide
// symbols.
TEST(PcaAmxInt8, RefusesHeadsThatDoNotQualify) {
  if (!internal::PcaAmxInt8Supported())
    GTEST_SKIP() << "no AMX-INT8 here (or STRATA_CODEC_AMX_INT8=0)";
  const Head h(64, 61, 40, 61, 20, 5);
  std::vector<float> decaying(h.n);
  for (size_t k = 0; k < h.n; ++k) decaying[k] = 50.0f / static_cast<float>(k + 1);
  internal::PcaVnniAxes mixed;
  internal::BuildPcaVnniAxes(h.basis.data(), h.coords.data(), h.steps.data(), decaying.data(),
                             h.n, h.dim, &mixed);
  ASSERT_GT(mixed.pairs, 0u);
  internal::PcaAmxScratch scratch;
  const std::vector<uint8_t> untouched(h.tokens * h.dim * 4, 0xA5);
  const uint64_t before = internal::PcaAmxInt8HeadsDecoded();
  std::vector<uint8_t> out = untouched;
  const PcaRows rows{out.data(), PcaRows::Type::kFloat32, h.dim};
  EXPECT_FALSE(internal::PcaReconstructAmxInt8(h.Symbols(), h.slot.data(), h.n, mixed, h.dim,
                                               1.0f, h.mean.data(), nullptr, rows, &scratch));
  std::vector<uint16_t> wide_sym(h.sym.begin(), h.sym.end());
  const internal::PcaSymbols wide{wide_sym.data(), true, h.nslots, h.tokens, h.maxq};
  EXPECT_FALSE(internal::PcaReconstructAmxInt8(wide, h.slot.data(), h.n, h.Int8Axes(), h.dim,
                                               1.0f, h.mean.data(), nullptr, rows, &scratch));
  EXPECT_EQ(internal::PcaAmxInt8HeadsDecoded(), before);
  EXPECT_TRUE(out == untouched);
}

// In the codec: at the calibrated steps the tiles take int8 terms for the heads the VNNI rule
// admits whole, adding at most about kMaxAddedError of the codec's own error to the bf16
// products' decode; at 16x finer steps (step code 1) none qualifies and the bf16 products
// decode every head.
TEST(PcaAmxInt8, TakenWhereTheVnniRuleAdmitsEveryCoordinate) {
  if (!internal::PcaAmxInt8Supported())
    GTEST_SKIP() << "no AMX-INT8 here (or STRATA_CODEC_AMX_INT8=0)";
  if (!internal::PcaVnniBytesAvailable()) GTEST_SKIP() << "STRATA_CODEC_VNNI=16: int16 only";
  test::CalibratedSynthetic c(7, test::AtBits(1.5));
  for (const uint8_t code : {uint8_t{0}, uint8_t{1}}) {
    c.p.pca_step_code = code;
    for (size_t b = 4; b < 7; ++b) {
      SCOPED_TRACE(::testing::Message() << "step code " << int{code} << " block " << b);
      std::vector<uint8_t> blob, int8(c.bb), bf16(c.bb);
      ASSERT_TRUE(c.enc.Encode(c.layout, c.p, c.Block(b), &blob).ok());
      const uint64_t before = internal::PcaAmxInt8HeadsDecoded();
      ASSERT_TRUE(c.dec.Decode(blob, int8).ok());
      const uint64_t taken = internal::PcaAmxInt8HeadsDecoded() - before;
      if (code == 0) {
        EXPECT_GT(taken, 0u);
      } else {
        EXPECT_EQ(taken, 0u);
      }
      internal::SetPcaAmxInt8EnabledForTest(false);
      const uint64_t after = internal::PcaAmxInt8HeadsDecoded();
      ASSERT_TRUE(c.dec.Decode(blob, bf16).ok());
      internal::SetPcaAmxInt8EnabledForTest(true);
      EXPECT_EQ(internal::PcaAmxInt8HeadsDecoded(), after);
      const SquaredErrors e = Fp16Errors(c.Block(b), int8, bf16);
      EXPECT_GT(e.b, 0);
      if (code == 1) {
        EXPECT_TRUE(int8 == bf16);
        continue;
      }
      // Twice the bound: fp16 rounding of the outputs, and held-out blocks' own variances.
      EXPECT_GT(e.apart, 0);
      EXPECT_LT(e.apart, 2 * internal::kMaxAddedError * e.b);
      EXPECT_LT(e.a, (1 + 2 * internal::kMaxAddedError) * e.b);
    }
  }
}

}  // namespace
}  // namespace strata::codec
