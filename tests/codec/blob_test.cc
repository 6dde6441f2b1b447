#include "codec/blob.h"

#include <cstring>
#include <random>
#include <vector>

#include "codec/codec.h"
#include "codec/synthetic_kv.h"
#include "gtest/gtest.h"

namespace strata::codec {
namespace {

KvLayout SmallLayout() {
  KvLayout l;
  l.num_layers = 2;
  l.num_kv_heads = 2;
  l.head_dim = 32;
  l.tokens_per_block = 16;
  l.dtype = DType::kFloat16;
  return l;
}

std::vector<uint8_t> EncodeOrDie(const KvLayout& l, const std::string& spec,
                                 const std::vector<uint8_t>& data) {
  auto p = ParseCodecSpec(spec);
  EXPECT_TRUE(p.ok()) << p.status();
  auto blob = Encode(l, *p, data);
  EXPECT_TRUE(blob.ok()) << blob.status();
  return *blob;
}

TEST(Blob, RawRoundTripAndHeader) {
  const KvLayout l = SmallLayout();
  auto data = GenerateSyntheticKv(l, 1);
  auto blob = EncodeOrDie(l, "raw", data);
  EXPECT_EQ(blob.size(), RawBlobBytes(data.size()));
  EXPECT_EQ(std::memcmp(blob.data(), "SKVC", 4), 0);
  std::vector<uint8_t> out(data.size());
  ASSERT_TRUE(Decode(blob, out).ok());
  EXPECT_EQ(out, data);
  auto info = InspectBlob(blob);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->layout, l);
  EXPECT_EQ(info->params.mode, Mode::kRaw);
}

TEST(Blob, InspectReportsParams) {
  const KvLayout l = SmallLayout();
  auto data = GenerateSyntheticKv(l, 1);
  auto blob = EncodeOrDie(l, "quant:k3v2:g32:had", data);
  auto info = InspectBlob(blob);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(CodecSpecString(info->params), "quant:k3v2:g32:had");
  // Two layers' K and V, then the stream their symbols share.
  ASSERT_EQ(info->sections.size(), 5u);
  EXPECT_EQ(info->sections.back().type, SectionType::kStream);
}

class BlobCorruption : public ::testing::TestWithParam<const char*> {};

TEST_P(BlobCorruption, EveryTruncationFails) {
  const KvLayout l = SmallLayout();
  auto data = GenerateSyntheticKv(l, 1);
  auto blob = EncodeOrDie(l, GetParam(), data);
  std::vector<uint8_t> out(data.size());
  Decoder d;
  for (size_t n = 0; n < blob.size(); ++n) {
    std::vector<uint8_t> cut(blob.begin(), blob.begin() + n);  // exact-size copy: no slack
    absl::Status s = d.Decode(cut, out);
    ASSERT_FALSE(s.ok()) << n;
    ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << n << " " << s;
  }
}

TEST_P(BlobCorruption, BitFlipsAreCaughtByTheCrc) {
  const KvLayout l = SmallLayout();
  auto data = GenerateSyntheticKv(l, 1);
  auto blob = EncodeOrDie(l, GetParam(), data);
  std::vector<uint8_t> out(data.size());
  Decoder d;
  std::mt19937 rng(1);
  for (int i = 0; i < 200; ++i) {
    auto bad = blob;
    bad[rng() % bad.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    EXPECT_FALSE(d.Decode(bad, out).ok());
  }
}

// Behind the checksum: mutate bytes and decode with CRC verification off. Every outcome must be
// a clean Status or a successful decode of the right size (run under ASan in the fuzz build).
TEST_P(BlobCorruption, MutationsBehindTheCrcNeverCrash) {
  const KvLayout l = SmallLayout();
  auto data = GenerateSyntheticKv(l, 1);
  auto blob = EncodeOrDie(l, GetParam(), data);
  std::vector<uint8_t> out(data.size());
  Decoder d;
  DecodeOptions opts;
  opts.verify_crc = false;
  std::mt19937 rng(2);
  int failed = 0;
  for (int i = 0; i < 3000; ++i) {
    auto bad = blob;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] = static_cast<uint8_t>(rng());
    failed += !d.Decode(bad, out, opts).ok();
  }
  // Structure checks catch a good share of mutations even without the CRC (payload mutations
  // in stored bytes decode to other values, which is what the CRC is for).
  EXPECT_GT(failed, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, BlobCorruption,
                         ::testing::Values("raw", "lossless", "int4-g64", "int3-g32", "quant:k4v4",
                                           "quant:k2v3:had", "quant:k8v8:nodelta", "quant:k8v8:ol",
                                           "quant:k7v8:had"));

TEST(Blob, HeaderFieldChecks) {
  const KvLayout l = SmallLayout();
  auto data = GenerateSyntheticKv(l, 1);
  auto blob = EncodeOrDie(l, "quant:k4v4", data);
  std::vector<uint8_t> out(data.size());
  DecodeOptions nocrc;
  nocrc.verify_crc = false;
  Decoder d;
  auto expect_fail = [&](size_t at, uint8_t v, const char* what) {
    auto bad = blob;
    bad[at] = v;
    absl::Status s = d.Decode(bad, out, nocrc);
    EXPECT_FALSE(s.ok()) << what;
  };
  expect_fail(0, 'X', "magic");
  expect_fail(4, 9, "version");
  expect_fail(8, 7, "mode");
  expect_fail(12, 0, "layers = 0");
  expect_fail(28, 9, "dtype");
  expect_fail(32, 200, "section count");
  expect_fail(kHeaderBytes + 0, 9, "section type");
  expect_fail(kHeaderBytes + 4, 1, "section bits");
  expect_fail(kHeaderBytes + 15, 0x80, "section offset");
  // Wrong output size is an argument error, not data loss.
  std::vector<uint8_t> small(data.size() - 2);
  EXPECT_EQ(d.Decode(blob, small).code(), absl::StatusCode::kInvalidArgument);
  // Version mismatch is reported as such.
  auto v2 = blob;
  v2[4] = 2;
  EXPECT_EQ(d.Decode(v2, out, nocrc).code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace strata::codec
