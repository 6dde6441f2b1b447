// The Announcer of one node driven directly: real host-tier stores, real directories, other
// nodes reached over loopback gRPC. Blocks committed are announced to their owners before a
// flush returns, evicted ones withdrawn, demoted-but-held ones kept, and a node keeps only the
// directory share it owns.
#include "daemon/cluster/announcer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "tests/cluster/test_node.h"

namespace strata {
namespace {

using testing::InstallView;
using testing::TestClusterConfig;
using testing::TestNode;

const NamespaceId kNs = ComputeBlockId(Digest{}, std::vector<uint32_t>{77});

std::vector<std::string> HoldersAt(const placement::Directory& d, const BlockId& id) {
  const auto found = d.Locate({&id, 1}, absl::Now());
  std::vector<std::string> out;
  for (const auto& l : found[0]) out.push_back(l.node);
  return out;
}

void Announce(TestNode& n) {
  daemon::Announcer* a = n.announcer.get();
  n.store->SetChangeHook([a](const BlockEvent& e) { a->OnBlockEvent(e); });
  a->Start();
}

TEST(AnnouncerTest, CommitsReachEveryOwnerBeforeAFlushReturns) {
  TestNode a("a", TestClusterConfig(2)), b("b", TestClusterConfig(2));
  InstallView({&a, &b}, 1);
  Announce(a);
  std::vector<BlockId> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(a.Publish(kNs, i));
  a.announcer->FlushAnnouncements(absl::Now() + absl::Seconds(5));
  // Two owners of two nodes: both hold every entry (a's own share went to its directory).
  for (const BlockId& id : ids) {
    EXPECT_EQ(HoldersAt(a.directory, id), std::vector<std::string>{"a"});
    EXPECT_EQ(HoldersAt(b.directory, id), std::vector<std::string>{"a"});
  }
  EXPECT_GE(a.ctx->counters.announced.load(), ids.size());
  EXPECT_GE(b.endpoint().announce_calls(), 1);
}

TEST(AnnouncerTest, EachIdGoesToItsOwnersOnly) {
  TestNode a("a", TestClusterConfig(1)), b("b", TestClusterConfig(1)), c("c", TestClusterConfig(1));
  InstallView({&a, &b, &c}, 1);
  Announce(a);
  std::vector<BlockId> ids;
  for (int i = 0; i < 24; ++i) ids.push_back(a.Publish(kNs, i));
  a.announcer->FlushAnnouncements(absl::Now() + absl::Seconds(5));
  auto ring = a.ctx->ring.Get();
  TestNode* by_index[] = {&a, &b, &c};  // the view is sorted by id
  std::vector<int> owned(3, 0);
  for (const BlockId& id : ids) {
    const uint32_t owner = ring->rendezvous.TopR(id, 1)[0];
    ++owned[owner];
    for (uint32_t n = 0; n < 3; ++n)
      EXPECT_EQ(HoldersAt(by_index[n]->directory, id).size(), n == owner ? 1u : 0u) << n;
  }
  for (int n : owned) EXPECT_GT(n, 0) << "24 ids leave no owner without a share";
}

TEST(AnnouncerTest, EvictionsAreWithdrawn) {
  TestNode a("a", TestClusterConfig(2)), b("b", TestClusterConfig(2));
  InstallView({&a, &b}, 1);
  Announce(a);
  std::vector<BlockId> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(a.Publish(kNs, i));
  a.announcer->FlushAnnouncements(absl::Now() + absl::Seconds(5));
  a.store->Evict(kNs, std::span<const BlockId>(ids).first(2), false, false);
  a.announcer->FlushAnnouncements(absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(HoldersAt(b.directory, ids[0]).empty());
  EXPECT_TRUE(HoldersAt(b.directory, ids[1]).empty());
  EXPECT_EQ(HoldersAt(b.directory, ids[2]).size(), 1u);
  EXPECT_GE(a.ctx->counters.withdrawn.load(), 2u);
}

TEST(AnnouncerTest, ABlockThatLeftHostMemoryButIsStillHeldStaysAnnounced) {
  // A demotion to NVMe tells the hook kRemoved while the store still holds the block.
  TestNode a("a", TestClusterConfig(2)), b("b", TestClusterConfig(2));
  InstallView({&a, &b}, 1);
  Announce(a);
  const BlockId id = a.Publish(kNs, 1);
  a.announcer->FlushAnnouncements(absl::Now() + absl::Seconds(5));
  a.announcer->OnBlockEvent({BlockEvent::kRemoved, id});
  a.announcer->FlushAnnouncements(absl::Now() + absl::Seconds(5));
  EXPECT_EQ(HoldersAt(b.directory, id), std::vector<std::string>{"a"});
  EXPECT_EQ(a.ctx->counters.withdrawn.load(), 0u);
}

TEST(AnnouncerTest, ARefreshRestoresEntriesAnOwnerLost) {
  TestNode a("a", TestClusterConfig(2)), b("b", TestClusterConfig(2));
  InstallView({&a, &b}, 1);
  Announce(a);
  const BlockId id = a.Publish(kNs, 3);
  a.announcer->FlushAnnouncements(absl::Now() + absl::Seconds(5));
  ASSERT_EQ(b.directory.RemoveNode("a"), 1u);
  a.announcer->RequestFullRefresh();
  for (int i = 0; i < 100 && HoldersAt(b.directory, id).empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(HoldersAt(b.directory, id), std::vector<std::string>{"a"});
}

TEST(AnnouncerTest, RetainOwnedKeepsOnlyTheShareThisNodeOwns) {
  TestNode a("a", TestClusterConfig(1)), b("b", TestClusterConfig(1)), c("c", TestClusterConfig(1));
  std::vector<BlockId> ids;
  const placement::LocationTier host[] = {placement::LocationTier::kHost};
  for (int i = 0; i < 30; ++i) ids.push_back(testing::TestId(i));
  b.directory.Announce("a", ids, host, absl::Now() + absl::Minutes(1));
  InstallView({&a, &b, &c}, 2);
  b.announcer->RetainOwned(*b.ctx->ring.Get());
  auto ring = b.ctx->ring.Get();
  size_t kept = 0;
  for (const BlockId& id : ids) {
    const bool mine = static_cast<int>(ring->rendezvous.TopR(id, 1)[0]) == ring->self;
    EXPECT_EQ(HoldersAt(b.directory, id).size(), mine ? 1u : 0u);
    kept += mine;
  }
  EXPECT_GT(kept, 0u);
  EXPECT_LT(kept, ids.size());
}

TEST(AnnouncerTest, HandleAnnounceKeepsTiersAndTtl) {
  TestNode b("b", TestClusterConfig(2));
  const BlockId ids[] = {testing::TestId(1), testing::TestId(2)};
  v1::AnnounceRequest req;
  req.set_node_id("c");
  req.add_tiers(v1::TIER_NVME);
  req.set_ttl_ms(60'000);
  b.announcer->HandleAnnounce(req, ids);
  auto found = b.directory.Locate(ids, absl::Now());
  ASSERT_EQ(found[1].size(), 1u);
  EXPECT_EQ(found[1][0].node, "c");
  EXPECT_EQ(found[1][0].tier, placement::LocationTier::kNvme);
  EXPECT_TRUE(b.directory.Locate(ids, absl::Now() + absl::Minutes(2))[0].empty())
      << "the entry expires after the announced ttl";
  req.set_withdraw(true);
  b.announcer->HandleAnnounce(req, {&ids[0], 1});
  EXPECT_TRUE(HoldersAt(b.directory, ids[0]).empty());
  EXPECT_EQ(HoldersAt(b.directory, ids[1]).size(), 1u);
}

TEST(AnnouncerTest, AfterStopFlushesReturnAtOnce) {
  TestNode a("a", TestClusterConfig(2)), b("b", TestClusterConfig(2));
  InstallView({&a, &b}, 1);
  Announce(a);
  a.Publish(kNs, 9);  // queued before the stop: the flush below waits for it, or for the stop
  a.announcer->Stop();
  const auto t0 = std::chrono::steady_clock::now();
  a.announcer->FlushAnnouncements(absl::Now() + absl::Seconds(10));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  a.announcer->Stop();  // idempotent
  // A drained node keeps serving its engine: what it publishes after the stop is not queued
  // for a thread that has ended (the queue grew by an event per block until the process left).
  const size_t queued = a.announcer->QueuedEvents();
  for (int i = 10; i < 60; ++i) a.Publish(kNs, i);
  EXPECT_EQ(a.announcer->QueuedEvents(), queued);
}

}  // namespace
}  // namespace strata
