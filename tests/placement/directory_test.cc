#include "placement/directory.h"

#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace strata::placement {
namespace {

BlockId Id(uint64_t n) {
  BlockId id;
  std::mt19937_64 rng(n * 0x9E3779B97F4A7C15ULL + 1);
  for (int i = 0; i < 32; i += 8) {
    uint64_t w = rng();
    for (int j = 0; j < 8; ++j) id.bytes[i + j] = static_cast<uint8_t>(w >> (8 * j));
  }
  return id;
}

std::vector<BlockId> Ids(uint64_t first, size_t n) {
  std::vector<BlockId> out;
  for (size_t i = 0; i < n; ++i) out.push_back(Id(first + i));
  return out;
}

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);
constexpr LocationTier kHost[] = {LocationTier::kHost};
constexpr LocationTier kNvme[] = {LocationTier::kNvme};

std::vector<std::string> Nodes(const std::vector<Location>& locs) {
  std::vector<std::string> out;
  for (const auto& l : locs) out.push_back(l.node);
  return out;
}

TEST(DirectoryTest, AnnounceAndLocateInAnnouncementOrder) {
  Directory d;
  auto ids = Ids(0, 3);
  d.Announce("b", ids, kHost, kT0 + absl::Seconds(60));
  d.Announce("a", std::span(ids).first(2), kNvme, kT0 + absl::Seconds(60));
  d.Announce("c", std::span(ids).first(1), kHost, kT0 + absl::Seconds(60));
  EXPECT_EQ(d.ids(), 3u);
  EXPECT_EQ(d.holders(), 6u);
  auto locs = d.Locate(std::vector<BlockId>{ids[0], ids[1], ids[2], Id(99)}, kT0);
  ASSERT_EQ(locs.size(), 4u);
  EXPECT_EQ(Nodes(locs[0]), (std::vector<std::string>{"b", "a", "c"}));
  EXPECT_EQ(Nodes(locs[1]), (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(Nodes(locs[2]), (std::vector<std::string>{"b"}));
  EXPECT_TRUE(locs[3].empty());
  EXPECT_EQ(locs[0][0].tier, LocationTier::kHost);
  EXPECT_EQ(locs[0][1].tier, LocationTier::kNvme);
}

TEST(DirectoryTest, PerIdTiersAndReannounceUpdates) {
  Directory d;
  auto ids = Ids(0, 2);
  std::vector<LocationTier> tiers = {LocationTier::kGpu, LocationTier::kNvme};
  d.Announce("a", ids, tiers, kT0 + absl::Seconds(10));
  auto locs = d.Locate(ids, kT0);
  EXPECT_EQ(locs[0][0].tier, LocationTier::kGpu);
  EXPECT_EQ(locs[1][0].tier, LocationTier::kNvme);
  // Re-announce: the tier changes, the expiry moves, no second holder appears.
  d.Announce("a", std::span(ids).first(1), kHost, kT0 + absl::Seconds(100));
  EXPECT_EQ(d.holders(), 2u);
  locs = d.Locate(ids, kT0 + absl::Seconds(50));
  ASSERT_EQ(locs[0].size(), 1u);
  EXPECT_EQ(locs[0][0].tier, LocationTier::kHost);
  EXPECT_TRUE(locs[1].empty());  // expired at +10s, even before Expire runs
}

TEST(DirectoryTest, Withdraw) {
  Directory d;
  auto ids = Ids(0, 4);
  d.Announce("a", ids, kHost, kT0 + absl::Seconds(60));
  d.Announce("b", ids, kHost, kT0 + absl::Seconds(60));
  d.Announce("c", ids, kHost, kT0 + absl::Seconds(60));
  d.Withdraw("a", std::span(ids).first(2));
  d.Withdraw("zz", ids);  // unknown node: nothing
  EXPECT_EQ(d.holders(), 10u);
  auto locs = d.Locate(ids, kT0);
  EXPECT_EQ(Nodes(locs[0]), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(Nodes(locs[3]), (std::vector<std::string>{"a", "b", "c"}));
  d.Withdraw("b", ids);
  d.Withdraw("c", ids);
  EXPECT_EQ(Nodes(d.Locate(ids, kT0)[3]), (std::vector<std::string>{"a"}));
  d.Withdraw("a", ids);
  EXPECT_EQ(d.ids(), 0u);
  EXPECT_EQ(d.holders(), 0u);
}

TEST(DirectoryTest, ExpireDropsOnlyStaleHolders) {
  Directory d;
  auto ids = Ids(0, 100);
  d.Announce("old", ids, kHost, kT0 + absl::Seconds(5));
  d.Announce("new", std::span(ids).first(50), kHost, kT0 + absl::Seconds(30));
  EXPECT_EQ(d.Expire(kT0 + absl::Seconds(4)), 0u);
  EXPECT_EQ(d.Expire(kT0 + absl::Seconds(6)), 100u);
  EXPECT_EQ(d.ids(), 50u);
  EXPECT_EQ(d.holders(), 50u);
  EXPECT_EQ(Nodes(d.Locate(ids, kT0 + absl::Seconds(6))[0]), (std::vector<std::string>{"new"}));
  EXPECT_EQ(d.Expire(kT0 + absl::Seconds(31)), 50u);
  EXPECT_EQ(d.ids(), 0u);
}

TEST(DirectoryTest, ExpiryIsNeverEarlyAndAtMostOneSecondLate) {
  Directory d;
  auto ids = Ids(0, 1);
  absl::Time expires = kT0 + absl::Milliseconds(10'300);
  d.Announce("a", ids, kHost, expires);
  EXPECT_EQ(d.Locate(ids, expires - absl::Milliseconds(1))[0].size(), 1u);
  EXPECT_EQ(d.Locate(ids, expires + absl::Seconds(1))[0].size(), 0u);
}

TEST(DirectoryTest, RemoveNode) {
  Directory d;
  auto ids = Ids(0, 1000);
  d.Announce("a", ids, kHost, kT0 + absl::Seconds(60));
  d.Announce("b", std::span(ids).first(10), kHost, kT0 + absl::Seconds(60));
  EXPECT_EQ(d.RemoveNode("a"), 1000u);
  EXPECT_EQ(d.RemoveNode("a"), 0u);
  EXPECT_EQ(d.ids(), 10u);
  EXPECT_EQ(d.holders(), 10u);
  EXPECT_EQ(Nodes(d.Locate(ids, kT0)[0]), (std::vector<std::string>{"b"}));
  // The freed node slot is reused by a new name, and names never alias.
  d.Announce("c", std::span(ids).subspan(10, 5), kHost, kT0 + absl::Seconds(60));
  EXPECT_EQ(Nodes(d.Locate(ids, kT0)[10]), (std::vector<std::string>{"c"}));
  EXPECT_EQ(Nodes(d.Locate(ids, kT0)[0]), (std::vector<std::string>{"b"}));
}

TEST(DirectoryTest, Retain) {
  Directory d;
  auto ids = Ids(0, 1000);
  d.Announce("a", ids, kHost, kT0 + absl::Seconds(60));
  d.Announce("b", std::span(ids).first(500), kHost, kT0 + absl::Seconds(60));
  size_t gone = d.Retain([](const BlockId& id) { return id.bytes[0] % 2 == 0; });
  size_t even = 0;
  for (const auto& id : ids) even += id.bytes[0] % 2 == 0;
  EXPECT_EQ(gone, 1000 - even);
  EXPECT_EQ(d.ids(), even);
  auto locs = d.Locate(ids, kT0);
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(locs[i].empty(), ids[i].bytes[0] % 2 != 0);
  }
}

TEST(DirectoryTest, ManyNodesAndConcurrentUse) {
  Directory d;
  auto ids = Ids(0, 200);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int n = 0; n < 50; ++n) {
        std::string node = absl::StrCat("node-", t, "-", n);
        d.Announce(node, ids, kHost, kT0 + absl::Seconds(60));
        (void)d.Locate(ids, kT0);
        if (n % 2) d.Withdraw(node, ids);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(d.ids(), 200u);
  EXPECT_EQ(d.holders(), 200u * 100);
  auto locs = d.Locate(ids, kT0);
  EXPECT_EQ(locs[7].size(), 100u);
  EXPECT_EQ(d.Expire(kT0 + absl::Seconds(61)), 200u * 100);
  EXPECT_EQ(d.holders(), 0u);
}

TEST(DirectoryTest, MemoryIsCompactAndHonest) {
  Directory d;
  EXPECT_LT(d.memory_bytes(), 1024u);
  const size_t n = 200'000;
  auto ids = Ids(0, n);
  d.Announce("holder-a", ids, kHost, kT0 + absl::Seconds(60));
  size_t one = d.memory_bytes();
  double per_entry = static_cast<double>(one) / n;
  // 32-byte key + 16-byte holder list + a control byte, at a Swiss-table load of 7/16..7/8.
  EXPECT_GT(per_entry, 49.0);
  EXPECT_LT(per_entry, 49.0 / (7.0 / 16) + 1);
  // A second holder on every id costs one small out-of-line array each.
  d.Announce("holder-b", ids, kHost, kT0 + absl::Seconds(60));
  size_t two = d.memory_bytes();
  EXPECT_GE(two - one, n * 24);
  EXPECT_LE(two - one, n * 48);
  // A third fits in the same array's growth.
  d.Announce("holder-c", std::span(ids).first(10), kHost, kT0 + absl::Seconds(60));
  EXPECT_GE(d.memory_bytes(), two);
  d.RemoveNode("holder-b");
  d.RemoveNode("holder-c");
  // Out-of-line arrays are freed; the table keeps its buckets (the intern table grew a little).
  EXPECT_NEAR(static_cast<double>(d.memory_bytes()), static_cast<double>(one), 1024.0);
}

}  // namespace
}  // namespace strata::placement
