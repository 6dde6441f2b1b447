#include "strata/block_id.h"

#include <gtest/gtest.h>

#include <numeric>

namespace strata {
namespace {

// Expected values were computed with Python's hashlib/hmac from the encodings documented in
// include/strata/block_id.h, an implementation independent of ours.
NamespaceSpec TestSpec() {
  NamespaceSpec s;
  s.model_id = "llama-3-8b";
  s.model_revision = "rev1";
  s.layout = KvLayout{32, 8, 128, DType::kFloat16, 16, KvKind::kSeparateKV};
  s.codec_policy = "raw";
  return s;
}

TEST(BlockIdTest, TenantSaltKnownAnswer) {
  EXPECT_EQ(ComputeTenantSalt("cluster-secret", "tenant-a").ToHex(),
            "df4450b7050c9c06fb4b71e6a0a242d2869c62e0152125e53eb6f9281c2462e5");
}

TEST(BlockIdTest, NamespaceKnownAnswer) {
  auto salt = ComputeTenantSalt("cluster-secret", "tenant-a");
  EXPECT_EQ(ComputeNamespaceId(TestSpec(), salt).ToHex(),
            "09b6f9f5f037721532e20265ca49ff83f550fe271e84d52a387358411451908e");
}

TEST(BlockIdTest, ChainKnownAnswerAndPartialBlockIgnored) {
  auto ns = ComputeNamespaceId(TestSpec(), ComputeTenantSalt("cluster-secret", "tenant-a"));
  std::vector<uint32_t> tokens(40);
  std::iota(tokens.begin(), tokens.end(), 0);
  auto ids = ComputeBlockIds(ns, 16, tokens);
  ASSERT_EQ(ids.size(), 2u);  // 40 tokens = 2 full blocks + 8 unaddressed
  EXPECT_EQ(ids[0].ToHex(), "5170aea79c56b83b42d2a79eaebcd036a8ac7857f878b55043e4d258a346ec38");
  EXPECT_EQ(ids[1].ToHex(), "7a43cb0993e27dfe6c509f5c6407e072d556d9dac8afa85d464e77f6a11e4ed2");
  EXPECT_EQ(ComputeBlockId(ids[0], std::span(tokens).subspan(16, 16)), ids[1]);
}

TEST(BlockIdTest, TenantsAndNamespacesSeparateIds) {
  auto spec = TestSpec();
  auto a = ComputeNamespaceId(spec, ComputeTenantSalt("s", "tenant-a"));
  auto b = ComputeNamespaceId(spec, ComputeTenantSalt("s", "tenant-b"));
  auto c = ComputeNamespaceId(spec, ComputeTenantSalt("other-secret", "tenant-a"));
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  spec.tp_rank = 0;
  spec.tp_size = 2;
  EXPECT_NE(ComputeNamespaceId(spec, ComputeTenantSalt("s", "tenant-a")), a);
  std::vector<uint32_t> tokens(16, 7);
  EXPECT_NE(ComputeBlockIds(a, 16, tokens)[0], ComputeBlockIds(b, 16, tokens)[0]);
}

TEST(BlockIdTest, PrefixSharingAndDivergence) {
  auto ns = ComputeNamespaceId(TestSpec(), ComputeTenantSalt("s", "t"));
  std::vector<uint32_t> x(64), y(64);
  std::iota(x.begin(), x.end(), 100);
  y = x;
  y[40] = 1;  // differs in block 2
  auto ix = ComputeBlockIds(ns, 16, x), iy = ComputeBlockIds(ns, 16, y);
  EXPECT_EQ(ix[0], iy[0]);
  EXPECT_EQ(ix[1], iy[1]);
  EXPECT_NE(ix[2], iy[2]);
  EXPECT_NE(ix[3], iy[3]);  // the chain carries the difference forward
}

TEST(BlockIdTest, HexRoundTripAndErrors) {
  auto id = ComputeBlockId(Digest{}, std::vector<uint32_t>{1, 2, 3});
  auto back = Digest::FromHex(id.ToHex());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, id);
  EXPECT_FALSE(Digest::FromHex("abc").ok());
  EXPECT_FALSE(Digest::FromHex(std::string(64, 'z')).ok());
  EXPECT_FALSE(Digest::FromBytes("short").ok());
}

TEST(KvLayoutTest, BlockBytesAndValidation) {
  KvLayout l{32, 8, 128, DType::kFloat16, 256, KvKind::kSeparateKV};
  EXPECT_TRUE(l.Validate().ok());
  EXPECT_EQ(l.BlockBytes(), 32ull * 2 * 256 * 8 * 128 * 2);  // 32 MiB
  KvLayout bad = l;
  bad.head_dim = 0;
  EXPECT_NE(bad.Validate().message().find("head_dim"), std::string::npos);
  KvLayout mla{61, 1, 576, DType::kBFloat16, 64, KvKind::kMlaLatent};
  EXPECT_TRUE(mla.Validate().ok());
  EXPECT_EQ(mla.BlockBytes(), 61ull * 64 * 576 * 2);
}

}  // namespace
}  // namespace strata
