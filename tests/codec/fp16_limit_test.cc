// Blocks at fp16's limits: a lossy mode's reconstruction of a value near 65504 may round past
// it (a quantiser's error, a transform's), and fp16 would store an infinity, which attention
// turns into NaNs. The codec saturates instead (FloatToHalf, codec/half.h): every lossy mode
// decodes a finite block to a finite block, on every store path this CPU has. And blocks so
// far from what their mode expects that its blob would outgrow them are stored raw.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "codec/half.h"
#include "codec/internal/pca_amx.h"
#include "codec/synthetic_kv.h"
#include "tests/codec/calibrated_synthetic.h"

namespace strata::codec {
namespace {

// `b` scaled so that its largest magnitude is `over` times fp16's largest, clipped to it (over
// > 1: its loudest values flat at +-65504).
std::vector<uint8_t> AtTheLimit(std::span<const uint8_t> b, float over = 1) {
  std::vector<float> f(b.size() / 2);
  for (size_t i = 0; i < f.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, b.data() + 2 * i, 2);
    f[i] = HalfToFloat(h);
  }
  float most = 0;
  for (float v : f) most = std::max(most, std::abs(v));
  std::vector<uint8_t> out(b.size());
  for (size_t i = 0; i < f.size(); ++i) {
    const float x = f[i] * (over * 65504.0f / most);
    const uint16_t h = FloatToHalf(std::clamp(x, -65504.0f, 65504.0f));
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

// Every value +-65504, the sign alternating.
std::vector<uint8_t> Alternating(size_t bytes) {
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i + 1 < bytes; i += 2) {
    const uint16_t h = i % 4 == 0 ? 0x7BFF : 0xFBFF;
    std::memcpy(out.data() + i, &h, 2);
  }
  return out;
}

size_t Infinities(const std::vector<uint8_t>& block) {
  size_t n = 0;
  for (size_t i = 0; i + 1 < block.size(); i += 2) {
    uint16_t h;
    std::memcpy(&h, block.data() + i, 2);
    n += (h & 0x7C00) == 0x7C00;
  }
  return n;
}

// Before saturation, quant (with and without Hadamard rotation) and intN-gG decoded up to every
// value of such blocks to infinities, and pca a few hundred to a few thousand per block. (pca
// now stores blocks this far from its calibration raw where its blob would outgrow them: the
// next test holds pca's store passes.)
TEST(Fp16Limit, EveryLossyModeDecodesAFiniteBlockToAFiniteOne) {
  test::CalibratedSynthetic c(6, test::AtBits(1.5));
  const std::vector<std::vector<uint8_t>> blocks = {AtTheLimit(c.Block(4)),
                                                    AtTheLimit(c.Block(5)), Alternating(c.bb)};
  std::vector<CodecParams> modes;
  for (const char* spec : {"quant:k4v4", "quant:k2v2", "quant:k4v4:had", "quant:k3v3:nodelta",
                           "int4-g64", "int2-g32"}) {
    auto p = ParseCodecSpec(spec);
    ASSERT_TRUE(p.ok()) << spec;
    modes.push_back(*p);
  }
  modes.push_back(c.p);
  modes.back().rate_bits = 1.2f;  // pca within a budget: its coarsest steps
  modes.push_back(c.p);
  size_t decoded = 0;
  // Highway's stores (the quant and intN-gG decoders, pca's float kernels) on each target this
  // CPU has; the tiles' stores (pca on AMX cores) where it has them.
  for (int64_t t = hwy::SupportedTargets() & HWY_TARGETS; t != 0; t &= t - 1) {
    hwy::SetSupportedTargetsForTest(t & -t);
    SCOPED_TRACE(hwy::TargetName(t & -t));
    for (bool tiles : {true, false}) {
      internal::SetPcaAmxEnabledForTest(tiles);
      for (const CodecParams& p : modes) {
        SCOPED_TRACE(::testing::Message() << ModeName(p.mode) << " bits " << int{p.key_bits}
                                          << " budget " << p.rate_bits << " tiles " << tiles);
        for (const std::vector<uint8_t>& block : blocks) {
          std::vector<uint8_t> blob, out(c.bb);
          ASSERT_TRUE(c.enc.Encode(c.layout, p, block, &blob).ok());
          ASSERT_TRUE(c.dec.Decode(blob, out).ok());
          EXPECT_EQ(Infinities(out), 0u);
          ++decoded;
        }
      }
    }
  }
  internal::SetPcaAmxEnabledForTest(true);
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_GE(decoded, 2 * modes.size() * blocks.size());
}

// A namespace calibrated on blocks whose loudest values are clipped at the limit: their
// coordinates fit the steps, so pca's decoders take their usual paths (bytes on the tiles, VNNI
// or AVX2 lanes; the test above's blocks, far from its calibration, are stored raw or take the
// float kernels), and the reconstructions of the clipped values, some of which round past
// 65504, are stored finite.
TEST(Fp16Limit, APcaNamespaceOfBlocksAtTheLimitDecodesThemFinite) {
  const KvLayout layout = test::Layout(2, 2, 128, 64);
  const size_t bb = layout.BlockBytes();
  const std::vector<uint8_t> kv = GenerateSyntheticKv(layout, 6, SyntheticKvParams{});
  std::vector<std::vector<uint8_t>> blocks;
  for (size_t i = 0; i < 6; ++i)
    blocks.push_back(AtTheLimit(std::span(kv).subspan(i * bb, bb), 4));
  std::vector<std::span<const uint8_t>> samples(blocks.begin(), blocks.begin() + 4);
  auto cal = Calibrate(layout, samples, test::AtBits(1.5));
  ASSERT_TRUE(cal.ok()) << cal.status();
  CalibrationSet set;
  CodecParams p;
  p.mode = Mode::kPca;
  p.calibration_id = set.Add(std::make_shared<const Calibration>(*std::move(cal)));
  Encoder enc;
  Decoder dec;
  enc.set_calibrations(&set);
  dec.set_calibrations(&set);
  for (int64_t t = hwy::SupportedTargets() & HWY_TARGETS; t != 0; t &= t - 1) {
    hwy::SetSupportedTargetsForTest(t & -t);
    SCOPED_TRACE(hwy::TargetName(t & -t));
    for (bool tiles : {true, false}) {
      internal::SetPcaAmxEnabledForTest(tiles);
      for (size_t i = 4; i < 6; ++i) {
        SCOPED_TRACE(::testing::Message() << "block " << i << " tiles " << tiles);
        p.first_position = i * layout.tokens_per_block;
        std::vector<uint8_t> blob, out(bb);
        ASSERT_TRUE(enc.Encode(layout, p, blocks[i], &blob).ok());
        ASSERT_TRUE(dec.Decode(blob, out).ok());
        EXPECT_EQ(Infinities(out), 0u);
      }
    }
  }
  internal::SetPcaAmxEnabledForTest(true);
  hwy::SetSupportedTargetsForTest(0);
  EXPECT_EQ(enc.raw_fallbacks(), 0u);  // every block decoded through pca's kernels
}

// A block pca would code into more bytes than the block holds is stored raw: a budget's
// coarsest codes on values thousands of times past the calibration's (1.9x the block before).
// intN-gG keeps its blob however large (8-bit groups of two values: 1.5x), as its CUDA encoder
// writes it.
TEST(RawFallback, ABlockPcaWouldGrowIsStoredRaw) {
  test::CalibratedSynthetic c(6, test::AtBits(1.5));
  CodecParams budget = c.p;
  budget.rate_bits = 1.2f;
  auto pairs = ParseCodecSpec("int8-g2");
  ASSERT_TRUE(pairs.ok());
  auto mode_of = [](const std::vector<uint8_t>& blob) {
    auto v = ParseBlob(blob);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? static_cast<Mode>(v->header.mode) : Mode::kRaw;
  };
  const std::vector<uint8_t> far = Alternating(c.bb);
  std::vector<uint8_t> blob, out(c.bb);
  ASSERT_TRUE(c.enc.Encode(c.layout, budget, far, &blob).ok());
  EXPECT_EQ(c.enc.raw_fallbacks(), 1u);
  EXPECT_EQ(mode_of(blob), Mode::kRaw);
  EXPECT_EQ(blob.size(), RawBlobBytes(c.bb));
  ASSERT_TRUE(c.dec.Decode(blob, out).ok());
  EXPECT_EQ(out, far);
  // A block pca codes smaller keeps the mode; intN-gG keeps its own, larger or not.
  ASSERT_TRUE(c.enc.Encode(c.layout, budget, c.Block(5), &blob).ok());
  EXPECT_EQ(mode_of(blob), Mode::kPca);
  ASSERT_TRUE(c.enc.Encode(c.layout, *pairs, c.Block(5), &blob).ok());
  EXPECT_EQ(mode_of(blob), Mode::kGroupwise);
  EXPECT_GT(blob.size(), c.bb);
  EXPECT_EQ(c.enc.raw_fallbacks(), 1u);
}

}  // namespace
}  // namespace strata::codec
