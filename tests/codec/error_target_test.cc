// Quality targets (CodecParams::error_target, spec `quant:...:eE`): every layer's keys and values
// meet the relative error asked for with the fewest bits that do (one bit less misses it), unless
// even the ceiling misses it; a tighter target never costs fewer bits; blobs decode with the
// plain Decoder.
#include <cmath>
#include <vector>

#include "codec/codec.h"
#include "codec/half.h"
#include "codec/synthetic_kv.h"
#include "gtest/gtest.h"
#include "tests/codec/test_layout.h"

namespace strata::codec {
namespace {

using test::Layout;

// ||x - x'|| / ||x|| of layer `layer`'s tensor `tensor` (fp16 blocks).
double SectionError(const KvLayout& l, const std::vector<uint8_t>& in,
                    const std::vector<uint8_t>& out, uint32_t layer, uint32_t tensor) {
  const size_t tensor_bytes = l.BlockBytes() / (size_t{l.num_layers} * l.TensorsPerLayer());
  const size_t base = (size_t{layer} * l.TensorsPerLayer() + tensor) * tensor_bytes;
  double err = 0, energy = 0;
  for (size_t i = base; i < base + tensor_bytes; i += 2) {
    const double x = HalfToFloat(static_cast<uint16_t>(in[i] | (in[i + 1] << 8)));
    const double y = HalfToFloat(static_cast<uint16_t>(out[i] | (out[i + 1] << 8)));
    err += (x - y) * (x - y);
    energy += x * x;
  }
  return std::sqrt(err / energy);
}

struct Plan {
  std::vector<uint8_t> key_bits, value_bits;
};

Plan BitsOf(const std::vector<uint8_t>& blob) {
  auto info = InspectBlob(blob);
  EXPECT_TRUE(info.ok()) << info.status();
  Plan plan;
  plan.key_bits.assign(info->layout.num_layers, 0);
  plan.value_bits.assign(info->layout.num_layers, 0);
  for (const SectionEntry& e : info->sections)
    if (e.type == SectionType::kQuant)
      (e.tensor == 0 ? plan.key_bits : plan.value_bits)[e.layer] = e.bits;
  return plan;
}

TEST(ErrorTarget, SpecsParsePrintBackAndConflictsAreRefused) {
  auto p = ParseCodecSpec("quant:k8v8:ol:e0.05");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FLOAT_EQ(p->error_target, 0.05f);
  EXPECT_EQ(CodecSpecString(*p), "quant:k8v8:ol:e0.05");
  for (const char* bad : {"quant:k4v4:e0", "quant:k4v4:e-1", "quant:k4v4:e1.5", "quant:k4v4:ex",
                          "quant:k4v4:e0.1:r2"})
    EXPECT_FALSE(ParseCodecSpec(bad).ok()) << bad;
  const KvLayout l = Layout(2, 2, 64, 16, DType::kFloat16);
  CodecParams g = *ParseCodecSpec("int4-g64");
  g.error_target = 0.1f;
  EXPECT_EQ(g.Validate(l).code(), absl::StatusCode::kInvalidArgument);
  CodecParams both = *ParseCodecSpec("quant:k4v4:e0.1");
  both.rate_bits = 3;
  EXPECT_EQ(both.Validate(l).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ErrorTarget, EverySectionMeetsTheTargetWithTheFewestBits) {
  const KvLayout l = Layout(4, 2, 64, 32, DType::kFloat16);
  SyntheticKvParams sp;
  sp.seed = 11;
  const std::vector<uint8_t> block = GenerateSyntheticKv(l, 1, sp);
  Encoder enc;
  std::vector<uint8_t> blob, out(block.size()), lower, lower_out(block.size());
  size_t last_size = 0;
  int below_ceiling = 0, above_floor = 0;
  for (double target : {0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005}) {
    SCOPED_TRACE(testing::Message() << "target " << target);
    CodecParams p = *ParseCodecSpec("quant:k8v8:ol");
    p.error_target = static_cast<float>(target);
    ASSERT_TRUE(enc.Encode(l, p, block, &blob).ok());
    ASSERT_TRUE(Decode(blob, out).ok());
    EXPECT_GE(blob.size(), last_size) << "a tighter target, never fewer bytes";
    last_size = blob.size();
    const Plan plan = BitsOf(blob);
    for (uint32_t layer = 0; layer < l.num_layers; ++layer)
      for (uint32_t t = 0; t < 2; ++t) {
        SCOPED_TRACE(testing::Message() << "layer " << layer << " tensor " << t);
        const uint8_t bits = (t == 0 ? plan.key_bits : plan.value_bits)[layer];
        if (bits < 8) {
          ++below_ceiling;
          EXPECT_LE(SectionError(l, block, out, layer, t), target);
        }
        if (bits > 2) {  // one bit less for this section alone misses the target
          ++above_floor;
          CodecParams fewer = *ParseCodecSpec("quant:k8v8:ol");
          fewer.layer_key_bits = plan.key_bits;
          fewer.layer_value_bits = plan.value_bits;
          --(t == 0 ? fewer.layer_key_bits : fewer.layer_value_bits)[layer];
          ASSERT_TRUE(enc.Encode(l, fewer, block, &lower).ok());
          ASSERT_TRUE(Decode(lower, lower_out).ok());
          EXPECT_GT(SectionError(l, block, lower_out, layer, t), target);
        }
      }
  }
  EXPECT_GT(below_ceiling, 0);
  EXPECT_GT(above_floor, 0);
}

TEST(ErrorTarget, TheExtremesAreTheFloorAndTheCeiling) {
  const KvLayout l = Layout(3, 2, 64, 32, DType::kFloat16);
  const std::vector<uint8_t> block = GenerateSyntheticKv(l, 1);
  CodecParams p = *ParseCodecSpec("quant:k6v5");
  p.error_target = 1e-7f;  // unreachable: the ceiling everywhere, the plain k6v5 bytes
  std::vector<uint8_t> blob;
  absl::Status st = Encoder().Encode(l, p, block, &blob);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(blob, *Encode(l, *ParseCodecSpec("quant:k6v5"), block));
  p.error_target = 1;  // anything goes: 2 bits everywhere
  ASSERT_TRUE(Encoder().Encode(l, p, block, &blob).ok());
  const Plan plan = BitsOf(blob);
  EXPECT_EQ(plan.key_bits, std::vector<uint8_t>(3, 2));
  EXPECT_EQ(plan.value_bits, std::vector<uint8_t>(3, 2));
}

}  // namespace
}  // namespace strata::codec
