// BlockMover's placement rules, through real stratad processes on loopback (a mover only acts
// through other daemons' Peer.Pull, so the daemons are the way to watch it): a replica lands on
// the next node of the block's rendezvous ranking and nowhere else, and a move from a remote
// holder removes the holder's copy.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "placement/rendezvous.h"
#include "strata/client.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/free_port.h"
#include "tests/support/test_data.h"

namespace strata {
namespace {

using testing::DaemonProcess;
using testing::FreePort;
using testing::MakeTempDir;

constexpr uint32_t kTokensPerBlock = 16;
constexpr size_t kBlockBytes = 32 << 10;

NamespaceSpec Spec() { return testing::SmallSpec("mover-test", 4, 32); }

// Three daemons n0, n1, n2 in one static cluster keeping `replicas` copies of each block.
class ThreeNodes {
 public:
  explicit ThreeNodes(int replicas) {
    dir_ = MakeTempDir("mover");
    std::ofstream(dir_ + "/secret") << "mover-test-secret-0123456789\n";
    for (int attempt = 0; attempt < 3 && !ok(); ++attempt) {
      daemons_.clear();
      std::vector<std::string> addrs;
      std::string peers;
      for (int i = 0; i < 3; ++i) {
        addrs.push_back(absl::StrCat("127.0.0.1:", FreePort()));
        peers += absl::StrCat("\"n", i, "@", addrs[i], "\", ");
      }
      for (int i = 0; i < 3; ++i)
        daemons_.push_back(std::make_unique<DaemonProcess>(
            absl::StrCat("node_id: n", i, "\ncluster_secret_file: ", dir_,
                         "/secret\nhost_tier:\n  capacity: 32MiB\ncluster:\n  static_nodes: [",
                         peers, "]\n  replicas: ", replicas, "\n  peer_timeout: 500ms\n"),
            std::vector<std::string>{"--listen", addrs[i]}));
    }
  }
  ~ThreeNodes() {
    daemons_.clear();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  bool ok() const { return daemons_.size() == 3 && testing::AllServing(daemons_); }
  std::string logs() const { return testing::AllLogs(daemons_); }
  // A client of node `i`; `local_only`: it never reads from other nodes.
  std::unique_ptr<Client> Connect(int i, bool local_only = false) {
    ClientOptions o;
    o.endpoint = daemons_[i]->endpoint();
    o.remote_fetch = !local_only;
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }
  // Which of `ids` node `i` holds itself.
  std::vector<bool> HeldBy(int i, std::span<const BlockId> ids) {
    auto c = Connect(i, /*local_only=*/true);
    auto ns = c->OpenNamespace(Spec(), "tenant-a");
    EXPECT_TRUE(ns.ok());
    std::vector<std::vector<uint8_t>> blobs;
    auto r = c->FetchBlobs(*ns, ids, &blobs);
    EXPECT_TRUE(r.ok()) << r.status();
    std::vector<bool> held;
    for (BlockStatus s : r->status) held.push_back(s == BlockStatus::kOk);
    return held;
  }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
};

std::vector<BlockId> Publish(Client& c, size_t n, uint32_t seed) {
  auto ns = c.OpenNamespace(Spec(), "tenant-a");
  EXPECT_TRUE(ns.ok()) << ns.status();
  auto blocks = testing::RandomBlocks(n, kBlockBytes, seed);
  std::vector<ConstBuffer> views;
  for (const auto& b : blocks) views.push_back({b.data(), b.size()});
  auto r = c.Publish(*ns, testing::Tokens(n * kTokensPerBlock, seed), views);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->ids : std::vector<BlockId>{};
}

TEST(BlockMoverTest, AReplicaLandsOnTheNextNodeOfTheRankingOnly) {
  ThreeNodes cl(/*replicas=*/2);
  ASSERT_TRUE(cl.ok()) << cl.logs();
  auto c = cl.Connect(0);
  const std::vector<BlockId> ids = Publish(*c, 16, 21);
  ASSERT_EQ(ids.size(), 16u);
  // Commit returned: every replica is in place already (replication is synchronous).
  const placement::Rendezvous ranking({"n0", "n1", "n2"});
  std::vector<std::vector<bool>> held;
  for (int i = 0; i < 3; ++i) held.push_back(cl.HeldBy(i, ids));
  for (size_t k = 0; k < ids.size(); ++k) {
    int expected = -1;
    for (uint32_t n : ranking.TopR(ids[k], 2))
      if (ranking.node(n) != "n0") {
        expected = static_cast<int>(n);
        break;
      }
    EXPECT_TRUE(held[0][k]) << "the publisher keeps its copy: " << k;
    for (int i = 1; i < 3; ++i)
      EXPECT_EQ(held[i][k], i == expected) << "block " << k << " on n" << i << "\n" << cl.logs();
  }
}

TEST(BlockMoverTest, AMoveFromARemoteHolderRemovesItsCopy) {
  ThreeNodes cl(/*replicas=*/1);
  ASSERT_TRUE(cl.ok()) << cl.logs();
  auto publisher = cl.Connect(0);
  const std::vector<BlockId> ids = Publish(*publisher, 6, 22);
  ASSERT_EQ(ids.size(), 6u);
  // n2 orchestrates: the blocks go from n0 to n1, and n0 drops them.
  auto c = cl.Connect(2);
  auto ns = c->OpenNamespace(Spec(), "tenant-a");
  ASSERT_TRUE(ns.ok());
  // The directory fills asynchronously: wait until it knows every block.
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto holders = c->Locate(*ns, ids);
    ASSERT_TRUE(holders.ok()) << holders.status();
    size_t known = 0;
    for (const auto& hs : *holders) known += !hs.empty();
    if (known == ids.size()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto r = c->Reposition(*ns, ids, "n1", /*move=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  const RepositionOutcome& mv = *r;
  EXPECT_EQ(mv.copied, ids.size()) << cl.logs();
  EXPECT_EQ(mv.removed_sources, ids.size());
  for (bool h : cl.HeldBy(0, ids)) EXPECT_FALSE(h);
  for (bool h : cl.HeldBy(1, ids)) EXPECT_TRUE(h);
  for (bool h : cl.HeldBy(2, ids)) EXPECT_FALSE(h);
}

}  // namespace
}  // namespace strata
