// The Locator of one node driven directly against two other in-process nodes over loopback:
// real directories and rendezvous rings, gRPC Peer.Locate, and UCX active messages. Also the
// active-message reply format on its own.
#include "daemon/cluster/locator.h"

#include <gtest/gtest.h>

#include <chrono>

#include "daemon/cluster/locate_wire.h"
#include "tests/cluster/test_node.h"

namespace strata {
namespace {

using daemon::Locator;
using placement::LocationTier;
using testing::InstallView;
using testing::TestClusterConfig;
using testing::TestId;
using testing::TestNode;

class LocatorTest : public ::testing::Test {
 protected:
  void Make(std::shared_ptr<transport::Context> ucx = nullptr) {
    for (const char* id : {"a", "b", "c"})
      nodes_.push_back(std::make_unique<TestNode>(id, TestClusterConfig(2), ucx));
    InstallView({nodes_[0].get(), nodes_[1].get(), nodes_[2].get()}, 1);
    ring_ = a().ctx->ring.Get();
  }
  TestNode& a() { return *nodes_[0]; }
  TestNode& node(uint32_t rendezvous_index) { return *nodes_[rendezvous_index]; }  // sorted ids

  // What holders do: tell each owner of `id` (or only the owner of rank `rank`) that `holder`
  // has it.
  void Seed(const BlockId& id, const std::string& holder, LocationTier tier, int rank = -1) {
    const LocationTier tiers[] = {tier};
    auto owners = ring_->rendezvous.TopR(id, 2);
    for (size_t k = 0; k < owners.size(); ++k)
      if (rank < 0 || static_cast<int>(k) == rank)
        node(owners[k]).directory.Announce(holder, {&id, 1}, tiers, absl::Now() + absl::Minutes(1));
  }
  uint32_t Primary(const BlockId& id) { return ring_->rendezvous.TopR(id, 2)[0]; }

  std::vector<std::unique_ptr<TestNode>> nodes_;
  std::shared_ptr<const daemon::Ring> ring_;
};

std::vector<std::string> Nodes(const std::vector<placement::Location>& ls) {
  std::vector<std::string> out;
  for (const auto& l : ls) out.push_back(l.node);
  std::sort(out.begin(), out.end());
  return out;
}

TEST_F(LocatorTest, FindsHoldersAtTheirOwnersOverGrpc) {
  Make();
  std::vector<BlockId> ids;
  for (int i = 0; i < 20; ++i) {
    ids.push_back(TestId(i));
    Seed(ids.back(), i % 2 ? "b" : "c", i % 2 ? LocationTier::kHost : LocationTier::kNvme);
  }
  auto found = a().locator->Locate(ids, absl::Now() + absl::Seconds(5));
  ASSERT_EQ(found.size(), ids.size());
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(found[i].size(), 1u) << i;
    EXPECT_EQ(found[i][0].node, i % 2 ? "b" : "c");
    EXPECT_EQ(found[i][0].tier, i % 2 ? LocationTier::kHost : LocationTier::kNvme);
  }
}

TEST_F(LocatorTest, ThisNodesShareIsAnsweredFromItsOwnDirectory) {
  Make();
  std::vector<BlockId> mine;
  for (int i = 0; mine.size() < 5; ++i)
    if (Primary(TestId(i)) == 0) mine.push_back(TestId(i));
  for (const BlockId& id : mine) Seed(id, "b", LocationTier::kHost);
  auto found = a().locator->Locate(mine, absl::Now() + absl::Seconds(5));
  for (const auto& hs : found) EXPECT_EQ(Nodes(hs), std::vector<std::string>{"b"});
  EXPECT_EQ(node(1).endpoint().locate_calls() + node(2).endpoint().locate_calls(), 0);
}

TEST_F(LocatorTest, PrimaryFirstAsksTheOtherOwnersOnlyForWhatThePrimaryDidNotKnow) {
  Make();
  std::vector<BlockId> ids;
  for (int i = 0; i < 12; ++i) {
    ids.push_back(TestId(100 + i));
    // Even ids: only the second owner knows them (the primary is new since a view change).
    Seed(ids.back(), "b", LocationTier::kHost, i % 2 == 0 ? 1 : 0);
  }
  auto found = a().locator->Locate(ids, absl::Now() + absl::Seconds(5));
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(Nodes(found[i]), std::vector<std::string>{"b"});
}

TEST_F(LocatorTest, AllOwnersMergesWhatEachOwnerKnows) {
  Make();
  const BlockId id = TestId(7);
  Seed(id, "b", LocationTier::kHost, 0);
  Seed(id, "c", LocationTier::kHost, 1);
  EXPECT_EQ(Nodes(a().locator->Locate({&id, 1}, absl::Now() + absl::Seconds(5))[0]),
            std::vector<std::string>{"b"});
  EXPECT_EQ(Nodes(a().locator->Locate({&id, 1}, absl::Now() + absl::Seconds(5),
                                      Locator::Mode::kAllOwners)[0]),
            (std::vector<std::string>{"b", "c"}));
}

TEST_F(LocatorTest, HoldersThatLeftTheViewAreNotReportedByOtherOwners) {
  Make();
  // An id a does not own (its own directory is trusted as it is; callers check the view).
  BlockId id;
  for (int i = 0;; ++i) {
    id = TestId(400 + i);
    auto owners = ring_->rendezvous.TopR(id, 2);
    if (std::find(owners.begin(), owners.end(), 0u) == owners.end()) break;
  }
  Seed(id, "gone", LocationTier::kHost);
  Seed(id, "c", LocationTier::kHost);
  EXPECT_EQ(Nodes(a().locator->Locate({&id, 1}, absl::Now() + absl::Seconds(5),
                                      Locator::Mode::kAllOwners)[0]),
            std::vector<std::string>{"c"});
}

TEST_F(LocatorTest, ADeadOwnerIsCoveredByTheOtherWithinTheDeadline) {
  Make();
  std::vector<BlockId> ids;
  for (int i = 0; i < 30; ++i) {
    ids.push_back(TestId(200 + i));
    Seed(ids.back(), "b", LocationTier::kHost);
  }
  node(2).endpoint().Shutdown();  // c dies; its entries live on at the other owners
  const auto t0 = std::chrono::steady_clock::now();
  auto found = a().locator->Locate(ids, absl::Now() + absl::Seconds(3));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(3500));
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(Nodes(found[i]), std::vector<std::string>{"b"}) << i;
  EXPECT_GT(a().ctx->counters.peer_failures.load(), 0u);
}

TEST_F(LocatorTest, AnswersTravelAsActiveMessagesWhenUcxIsThere) {
  auto ucx = transport::Context::Create(/*wakeup=*/true);
  ASSERT_TRUE(ucx.ok()) << ucx.status();
  Make(*ucx);
  std::vector<BlockId> ids;
  for (int i = 0; i < 16; ++i) {
    ids.push_back(TestId(300 + i));
    Seed(ids.back(), i % 2 ? "b" : "c", LocationTier::kNvme);
  }
  // The first round learns the peers' worker addresses; later ones go over UCX alone.
  auto first = a().locator->Locate(ids, absl::Now() + absl::Seconds(5));
  const int grpc_before = node(1).endpoint().locate_calls() + node(2).endpoint().locate_calls();
  auto found = a().locator->Locate(ids, absl::Now() + absl::Seconds(5));
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(found[i].size(), 1u) << i;
    EXPECT_EQ(found[i][0].node, i % 2 ? "b" : "c");
    EXPECT_EQ(found[i][0].tier, LocationTier::kNvme);
    EXPECT_EQ(Nodes(first[i]), Nodes(found[i]));
  }
  EXPECT_EQ(node(1).endpoint().locate_calls() + node(2).endpoint().locate_calls(), grpc_before)
      << "no Peer.Locate once the active-message path is up";
}

TEST(LocateWireTest, RepliesRoundTrip) {
  daemon::Holders in = {{{"n1", LocationTier::kHost}, {"n22", LocationTier::kNvme}},
                        {},
                        {{"n22", LocationTier::kHost}}};
  uint32_t nodes = 0;
  const std::string data = daemon::EncodeLocateReply(in, &nodes);
  EXPECT_EQ(nodes, 2u);
  auto out = daemon::DecodeLocateReply(data, nodes, in.size());
  ASSERT_TRUE(out.has_value());
  ASSERT_EQ(out->size(), 3u);
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ((*out)[i].size(), in[i].size());
    for (size_t k = 0; k < in[i].size(); ++k) {
      EXPECT_EQ((*out)[i][k].node, in[i][k].node);
      EXPECT_EQ((*out)[i][k].tier, in[i][k].tier);
    }
  }
}

TEST(LocateWireTest, MalformedRepliesAreRefused) {
  daemon::Holders in = {{{"node", LocationTier::kHost}}};
  uint32_t nodes = 0;
  const std::string data = daemon::EncodeLocateReply(in, &nodes);
  for (size_t cut = 0; cut < data.size(); ++cut)
    EXPECT_FALSE(daemon::DecodeLocateReply(data.substr(0, cut), nodes, 1).has_value()) << cut;
  EXPECT_FALSE(daemon::DecodeLocateReply(data, nodes, 2).has_value()) << "one id too many";
  EXPECT_FALSE(daemon::DecodeLocateReply(data, nodes + 1, 1).has_value());
  // A holder naming a node past the table is skipped, not trusted.
  std::string bad = data;
  bad[bad.size() - 3] = 9;
  auto out = daemon::DecodeLocateReply(bad, nodes, 1);
  ASSERT_TRUE(out.has_value());
  EXPECT_TRUE((*out)[0].empty());
}

// Found by tests/fuzz/locate_reply_fuzzer (corpus/locate_reply/crash-huge-node-count): the
// node-table size of the reply header sized an allocation before the data was looked at, so a
// peer's 0xffffffff threw bad_alloc out of the active-message handler.
TEST(LocateWireTest, ANodeCountTheDataCannotHoldIsRefused) {
  daemon::Holders in = {{{"node", LocationTier::kHost}}};
  uint32_t nodes = 0;
  const std::string data = daemon::EncodeLocateReply(in, &nodes);
  for (uint32_t lie : {0xffffffffu, 0x960a030au, static_cast<uint32_t>(data.size())})
    EXPECT_FALSE(daemon::DecodeLocateReply(data, lie, 1).has_value()) << lie;
  EXPECT_FALSE(daemon::DecodeLocateReply("", 0xffffffffu, 0).has_value());
  EXPECT_TRUE(daemon::DecodeLocateReply(data, nodes, 1).has_value());
}

TEST(RingTest, OnlyNewerViewsReplaceTheCurrentOne) {
  placement::MembershipView v1;
  v1.epoch = 3;
  v1.nodes = {{"a", "h:1", 0, 0, ""}, {"b", "h:2", 0, 0, ""}};
  daemon::CurrentRing current;
  EXPECT_EQ(current.Get(), nullptr);
  std::shared_ptr<const daemon::Ring> prev;
  ASSERT_TRUE(current.Replace(daemon::Ring::Make(v1, "b"), &prev));
  EXPECT_EQ(prev, nullptr);
  EXPECT_EQ(current.Get()->self, 1);
  EXPECT_EQ(current.Get()->NodeAt(0).address, "h:1");
  EXPECT_FALSE(current.Replace(daemon::Ring::Make(v1, "b"), &prev)) << "the same view again";
  placement::MembershipView older = v1;
  older.epoch = 2;
  older.nodes.pop_back();
  EXPECT_FALSE(current.Replace(daemon::Ring::Make(older, "b"), &prev)) << "an older view";
  placement::MembershipView newer = older;
  newer.epoch = 4;
  ASSERT_TRUE(current.Replace(daemon::Ring::Make(newer, "b"), &prev));
  EXPECT_EQ(prev->view.epoch, 3u);
  EXPECT_EQ(current.Get()->self, -1) << "b is not in the newer view";
}

}  // namespace
}  // namespace strata
