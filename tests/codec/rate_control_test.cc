// Rate control (CodecParams::rate_bits, spec `quant:...:rR`): every blob stays within its bit
// budget, spends it (more budget, more bits and less error), is the plain encoding where the
// ceiling fits and the 2-bit floor where nothing does, and decodes with the plain Decoder.
#include <cmath>
#include <cstring>
#include <vector>

#include "codec/codec.h"
#include "codec/half.h"
#include "codec/synthetic_kv.h"
#include "gtest/gtest.h"
#include "tests/codec/test_layout.h"

namespace strata::codec {
namespace {

using test::Layout;

double BitsPerValue(const KvLayout& l, size_t blob_bytes) {
  return 8.0 * static_cast<double>(blob_bytes) /
         static_cast<double>(l.BlockBytes() / DTypeBytes(l.dtype));
}

// Mean squared error of the decoded block against the input (fp16).
double Mse(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  double sum = 0;
  for (size_t i = 0; i + 1 < a.size(); i += 2) {
    uint16_t x, y;
    std::memcpy(&x, a.data() + i, 2);
    std::memcpy(&y, b.data() + i, 2);
    const double d = double(HalfToFloat(x)) - double(HalfToFloat(y));
    sum += d * d;
  }
  return sum / static_cast<double>(a.size() / 2);
}

TEST(RateControl, SpecsParseAndPrintBack) {
  auto p = ParseCodecSpec("quant:k4v4:ol:r2.5");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FLOAT_EQ(p->rate_bits, 2.5f);
  EXPECT_EQ(CodecSpecString(*p), "quant:k4v4:ol:r2.5");
  for (const char* bad : {"quant:k4v4:r0", "quant:k4v4:r-1", "quant:k4v4:r17", "quant:k4v4:rx"})
    EXPECT_FALSE(ParseCodecSpec(bad).ok()) << bad;
  CodecParams g = *ParseCodecSpec("int4-g64");
  g.rate_bits = 2;
  EXPECT_EQ(g.Validate(Layout(2, 2, 64, 16, DType::kFloat16)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RateControl, BlobsStayWithinTheBudgetAndSpendIt) {
  const KvLayout l = Layout(8, 2, 64, 32, DType::kFloat16);
  SyntheticKvParams sp;
  sp.seed = 5;
  const std::vector<uint8_t> block = GenerateSyntheticKv(l, 1, sp);
  // The ceiling and the floor, coded plainly.
  auto top = Encode(l, *ParseCodecSpec("quant:k4v4:ol"), block);
  CodecParams floor_plan = *ParseCodecSpec("quant:k4v4:ol");  // 2 bits in every layer
  floor_plan.layer_key_bits.assign(l.num_layers, 2);
  floor_plan.layer_value_bits.assign(l.num_layers, 2);
  auto floor = Encode(l, floor_plan, block);
  ASSERT_TRUE(top.ok() && floor.ok());
  const double top_bits = BitsPerValue(l, top->size()), floor_bits = BitsPerValue(l, floor->size());
  ASSERT_LT(floor_bits, top_bits);
  double last_bits = 0, last_mse = 1e30;
  Encoder enc;
  std::vector<uint8_t> blob, out(block.size());
  for (int step = 0; step <= 10; ++step) {
    const double budget = floor_bits + (top_bits - floor_bits) * step / 10.0;
    CodecParams p = *ParseCodecSpec("quant:k4v4:ol");
    p.rate_bits = static_cast<float>(budget);
    ASSERT_TRUE(enc.Encode(l, p, block, &blob).ok());
    const double bits = BitsPerValue(l, blob.size());
    SCOPED_TRACE(testing::Message() << "budget " << budget << " got " << bits);
    EXPECT_LE(bits, static_cast<double>(p.rate_bits) + 1e-9);
    ASSERT_TRUE(Decode(blob, out).ok());
    const double mse = Mse(block, out);
    EXPECT_GE(bits, last_bits - 1e-9) << "more budget, never fewer bits";
    EXPECT_LE(mse, last_mse * 1.0001) << "more bits, never more error";
    last_bits = bits;
    last_mse = mse;
    if (step > 0 && step < 10) {
      EXPECT_GT(bits, budget - (top_bits - floor_bits) / 4);
    }
  }
  // Where the ceiling fits, the plain encoding; below the floor, the floor (stored, not refused).
  CodecParams p = *ParseCodecSpec("quant:k4v4:ol");
  p.rate_bits = 16;
  ASSERT_TRUE(enc.Encode(l, p, block, &blob).ok());
  EXPECT_EQ(blob, *top);
  p.rate_bits = 0.5;
  ASSERT_TRUE(enc.Encode(l, p, block, &blob).ok());
  EXPECT_EQ(blob, *floor);
}

TEST(RateControl, LayersTakeDifferentBitsToFillTheBudget) {
  const KvLayout l = Layout(6, 2, 64, 32, DType::kBFloat16);
  const std::vector<uint8_t> block = GenerateSyntheticKv(l, 1);
  auto k3v3 = Encode(l, *ParseCodecSpec("quant:k3v3:had"), block);
  auto k3v4 = Encode(l, *ParseCodecSpec("quant:k3v4:had"), block);
  ASSERT_TRUE(k3v3.ok() && k3v4.ok());
  CodecParams p = *ParseCodecSpec("quant:k8v8:had");
  p.rate_bits = static_cast<float>(
      (BitsPerValue(l, k3v3->size()) + BitsPerValue(l, k3v4->size())) / 2);
  EncodeStats stats;
  Encoder enc;
  std::vector<uint8_t> blob;
  ASSERT_TRUE(enc.Encode(l, p, block, &blob, &stats).ok());
  EXPECT_EQ(stats.blob_bytes, blob.size()) << "stats count the chosen blob once";
  auto info = InspectBlob(blob);
  ASSERT_TRUE(info.ok()) << info.status();
  std::vector<int> value_bits;
  for (const SectionEntry& e : info->sections)
    if (e.type == SectionType::kQuant && e.tensor == 1) value_bits.push_back(e.bits);
  ASSERT_EQ(value_bits.size(), 6u);
  // Between the two rungs: the first layers one value bit higher than the rest.
  EXPECT_EQ(value_bits.front(), 4);
  EXPECT_EQ(value_bits.back(), 3);
  EXPECT_LE(blob.size(), static_cast<size_t>(p.rate_bits * (l.BlockBytes() / 2) / 8));
  // Deterministic: the same block and budget, the same bytes.
  std::vector<uint8_t> again;
  ASSERT_TRUE(Encoder().Encode(l, p, block, &again).ok());
  EXPECT_EQ(again, blob);
}

}  // namespace
}  // namespace strata::codec
