// The staged-publish header's flags and the publish acknowledgement with stratad's CRC: what a
// client and a daemon of different versions must agree on.
#include "common/am_wire.h"

#include <gtest/gtest.h>

namespace strata::am_wire {
namespace {

PublishStagedHeader Staged(uint32_t flags) {
  return PublishStagedHeader{{7, 11, 4096, 1 << 20, 3}, 99, 8192, flags ? 0u : 0xDEADBEEFu, flags};
}

TEST(AmWireTest, StagedHeaderCarriesTheCrcByDaemonFlagAndRefusesOthers) {
  for (uint32_t flags : {0u, kStagedCrcByDaemon}) {
    const std::string h = EncodePublishStagedHeader(Staged(flags));
    ASSERT_EQ(h.size(), kPublishStagedHeaderBytes);
    auto d = DecodePublishStagedHeader(h);
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(d->flags, flags);
    EXPECT_EQ(d->crc32c, Staged(flags).crc32c);
    EXPECT_EQ(d->staging_offset, 8192u);
    EXPECT_EQ(EncodePublishStagedHeader(*d), h);
  }
  std::string unknown = EncodePublishStagedHeader(Staged(0));
  unknown[kPublishStagedHeaderBytes - 4] = 2;  // a flag this version does not know
  EXPECT_FALSE(DecodePublishStagedHeader(unknown).has_value());
  unknown[kPublishStagedHeaderBytes - 4] = 0;
  unknown[kPublishStagedHeaderBytes - 1] = 1;
  EXPECT_FALSE(DecodePublishStagedHeader(unknown).has_value());
}

TEST(AmWireTest, PublishAckCarriesACrcOnlyWhenItHasOne) {
  const std::string plain = EncodePublishAck({5, 2, 0, std::nullopt});
  EXPECT_EQ(plain.size(), kPublishAckHeaderBytes) << "older clients read exactly this";
  auto p = DecodePublishAck(plain);
  ASSERT_TRUE(p.has_value());
  EXPECT_FALSE(p->crc32c.has_value());
  const std::string with = EncodePublishAck({5, 2, 0, 0xCAFEF00Du});
  EXPECT_EQ(with.size(), kPublishAckWithCrcBytes);
  auto w = DecodePublishAck(with);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->crc32c, 0xCAFEF00Du);
  EXPECT_EQ(w->index, 2u);
  EXPECT_FALSE(DecodePublishAck(with.substr(0, 18)).has_value());
  EXPECT_FALSE(DecodePublishAck(with + "x").has_value());
}

TEST(AmWireTest, PublishInOneDataRoundTripsAndRefusesWhatDoesNotAddUp) {
  const std::string reserve = "serialized reserve request";
  const uint32_t crcs[] = {1, 2, 3};
  const std::string blocks = "aaaabbbbbbcc";
  const std::string data = EncodePublishInOnePrefix(reserve, crcs) + blocks;
  auto d = DecodePublishInOneData(data);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->reserve, reserve);
  EXPECT_EQ(d->crc32c, std::vector<uint32_t>({1, 2, 3}));
  EXPECT_EQ(d->blocks, blocks);
  // Truncated inside the prefix; lengths that run past the end; no blocks at all; too many.
  for (size_t cut = 0; cut < 8 + reserve.size() + 12; ++cut)
    EXPECT_FALSE(DecodePublishInOneData(data.substr(0, cut)).has_value()) << cut;
  EXPECT_FALSE(DecodePublishInOneData(EncodePublishInOnePrefix(reserve, {})).has_value());
  std::vector<uint32_t> many(kMaxControlIds + 1, 0);
  EXPECT_FALSE(DecodePublishInOneData(EncodePublishInOnePrefix(reserve, many)).has_value());
  EXPECT_FALSE(DecodePublishInOneData(EncodePublishInOnePrefix(reserve, crcs) +
                                      std::string(kMaxPublishInOneBytes + 1, 'x'))
                   .has_value());
  std::string lying = data;
  PutU32(lying.data(), 0xfffffff0u);
  EXPECT_FALSE(DecodePublishInOneData(lying).has_value());
}

}  // namespace
}  // namespace strata::am_wire
