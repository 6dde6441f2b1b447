// Several real stratad processes on loopback forming one cluster (static membership): blocks
// published on one node are found and fetched through another, survive the loss of a node when
// replicated, move on reposition, and leave a draining node.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "strata/client.h"
#include "strata/v1/admin.grpc.pb.h"
#include "strata/v1/peer.grpc.pb.h"
#include "tests/cluster/cluster_fixture.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/free_port.h"
#include "tests/support/scoped_env.h"
#include "tests/support/test_data.h"

namespace strata {
namespace {

using testing::DaemonProcess;
using testing::FreePort;
using testing::MakeTempDir;
using testing::RunCommand;
using testing::Tokens;

using namespace cluster_fixture;  // NOLINT(build/namespaces): the shared fixture of these tests

// Three nodes; node 0 publishes and node 2 reads through the directory.
class ThreeNodeTest : public ::testing::Test {
 protected:
  // Node 0 publishes `n` blocks (tokens from `seed`); node 2 opens the namespace and sees them.
  void PublishOnN0SeenFromN2(size_t n, uint32_t seed) {
    ASSERT_TRUE(cl.ok()) << cl.logs();
    n0 = Connect(cl.node(0));
    n2 = Connect(cl.node(2));
    ASSERT_TRUE(n0 && n2);
    p = Publish(*n0, n, seed);
    ASSERT_TRUE(n2->OpenNamespace(Spec(), "tenant-a").ok());
    ASSERT_EQ(AwaitPrefix(*n2, p.ns, p), p.ids.size()) << cl.logs();
  }
  Cluster cl{3};
  std::unique_ptr<Client> n0, n2;
  Published p;
};

TEST(ClusterTest, PublishOnOneNodeFetchThroughAnother) {
  Cluster cl(3);
  ASSERT_TRUE(cl.ok()) << cl.logs();
  auto a = Connect(cl.node(0));
  auto c = Connect(cl.node(2));
  ASSERT_TRUE(a && c);
  Published p = Publish(*a, 12, 1);
  auto ns_c = c->OpenNamespace(Spec(), "tenant-a");
  ASSERT_TRUE(ns_c.ok());
  ASSERT_EQ(*ns_c, p.ns) << "same spec, tenant and secret give the same namespace everywhere";
  ASSERT_EQ(AwaitPrefix(*c, p.ns, p), p.ids.size()) << cl.logs();
  auto look = c->Lookup(p.ns, p.tokens);
  ASSERT_TRUE(look.ok());
  ASSERT_EQ(look->nodes.size(), p.ids.size());
  for (const auto& n : look->nodes) EXPECT_EQ(n, "n0");
  size_t remote = 0;
  EXPECT_EQ(FetchIdentical(*c, p.ns, p, &remote), p.ids.size());
  EXPECT_EQ(remote, p.ids.size()) << "node n2 held none of them: all came from n0";

  // Another tenant derives other ids: it finds nothing.
  auto other = c->OpenNamespace(Spec(), "tenant-b");
  ASSERT_TRUE(other.ok());
  auto miss = c->Lookup(*other, p.tokens);
  ASSERT_TRUE(miss.ok());
  EXPECT_EQ(miss->prefix_blocks, 0u);
}

// The node holding the blocks dies while their bytes stream over tcp to a client of another
// node: the fetch in flight ends within seconds (not at the transfer deadline) with the
// blocks not fetched, and no byte that came back reported kOk is wrong.
TEST(ClusterTest, AHolderKilledMidFetchEndsTheFetchInFlightSoon) {
  // tcp: what crosses between nodes without RDMA. The daemons inherit it.
  testing::ScopedEnv tcp_only("UCX_TLS", "tcp");
  Cluster cl(2);
  ASSERT_TRUE(cl.ok()) << cl.logs();
  auto holder = Connect(cl.node(1));
  auto reader = Connect(cl.node(0));
  ASSERT_TRUE(holder && reader);
  constexpr size_t kBig = 2 << 20, kCount = 24;  // 48 MiB: tens of ms on tcp loopback
  auto ns = holder->OpenNamespace(Spec(), "tenant-a");
  ASSERT_TRUE(ns.ok()) << ns.status();
  const std::vector<uint32_t> tokens = Tokens(kCount * kTokensPerBlock, 9);
  const std::vector<std::vector<uint8_t>> blocks = testing::RandomBlocks(kCount, kBig, 9);
  std::vector<ConstBuffer> in;
  for (const auto& b : blocks) in.push_back({b.data(), b.size()});
  auto pub = holder->Publish(*ns, tokens, in);
  ASSERT_TRUE(pub.ok() && pub->stored == kCount) << (pub.ok() ? "" : pub.status().ToString());
  ASSERT_TRUE(reader->OpenNamespace(Spec(), "tenant-a").ok());
  std::vector<std::vector<uint8_t>> out(kCount, std::vector<uint8_t>(kBig));
  std::vector<MutableBuffer> bufs;
  for (auto& b : out) bufs.push_back({b.data(), b.size()});
  std::atomic<int> fetches{0};
  std::atomic<bool> killed{false}, stop{false};
  double longest_after_kill_s = 0;
  size_t wrong = 0;
  std::thread loop([&] {
    while (!stop.load()) {
      const bool after = killed.load();
      auto t0 = std::chrono::steady_clock::now();
      auto r = reader->Fetch(*ns, pub->ids, bufs);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (after || killed.load()) longest_after_kill_s = std::max(longest_after_kill_s, s);
      if (r.ok())
        for (size_t i = 0; i < kCount; ++i)
          wrong += r->status[i] == BlockStatus::kOk && out[i] != blocks[i];
      ++fetches;
    }
  });
  while (fetches.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(7));  // somewhere inside a transfer
  killed = true;
  cl.Kill(1);
  const int at_kill = fetches.load();
  while (fetches.load() < at_kill + 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  stop = true;
  loop.join();
  EXPECT_EQ(wrong, 0u);
  // Without the endpoint's watch (or with UCX's own detection but waits that ignored it) the
  // fetch in flight ran into the 10 s transfer deadline.
  EXPECT_LT(longest_after_kill_s, 2.0);
  std::cerr << "longest fetch after the kill: " << longest_after_kill_s << " s\n";
}

// The Locate calls a node served (clients finding the holders of blocks it lacks).
uint64_t Locates(Client& c) {
  auto st = c.Stats();
  if (st.ok())
    for (const auto& [name, value] : st->counters)
      if (name == "locates_total") return value;
  return ~uint64_t{0};
}

// A remote fetch first asks the node that served most of the namespace's last one, without a
// Locate: a client fed by one node locates once; blocks held elsewhere cost the hinted node a
// miss, one Locate, and move the hint; a few blocks elsewhere do not move it; a hinted node that
// died costs a quick fallback.
TEST(ClusterTest, ARemoteFetchAsksTheLastHolderBeforeLocating) {
  Cluster cl(3);
  ASSERT_TRUE(cl.ok()) << cl.logs();
  auto n0 = Connect(cl.node(0));
  auto n1 = Connect(cl.node(1));
  auto reader = Connect(cl.node(2));
  ASSERT_TRUE(n0 && n1 && reader);
  const Published a1 = Publish(*n0, 6, 31), a2 = Publish(*n0, 6, 32), a3 = Publish(*n0, 6, 33);
  const Published b1 = Publish(*n1, 6, 34), b2 = Publish(*n1, 6, 35), b3 = Publish(*n1, 6, 36);
  const Published b4 = Publish(*n1, 6, 37), a4 = Publish(*n0, 2, 38);
  ASSERT_TRUE(reader->OpenNamespace(Spec(), "tenant-a").ok());
  for (const Published* p : {&a1, &a2, &a3, &a4, &b1, &b2, &b3, &b4})
    ASSERT_EQ(AwaitPrefix(*reader, p->ns, *p), p->ids.size()) << cl.logs();
  auto remotely = [&](const Published& p) {
    size_t remote = 0;
    EXPECT_EQ(FetchIdentical(*reader, p.ns, p, &remote), p.ids.size());
    return remote;
  };
  const uint64_t locates = Locates(*reader);
  ASSERT_NE(locates, ~uint64_t{0}) << "stratad reports locates_total";
  EXPECT_EQ(remotely(a1), a1.ids.size());
  EXPECT_EQ(Locates(*reader), locates + 1) << "the first remote fetch locates its holder";
  EXPECT_EQ(remotely(a2), a2.ids.size());
  EXPECT_EQ(Locates(*reader), locates + 1) << "n0, the hint, held them all";
  EXPECT_EQ(remotely(b1), b1.ids.size());
  EXPECT_EQ(Locates(*reader), locates + 2) << "n0 held none: located on n1, the next hint";
  EXPECT_EQ(remotely(b2), b2.ids.size());
  EXPECT_EQ(Locates(*reader), locates + 2);
  Published mixed = b3;  // six blocks on n1, the hint, and two on n0
  mixed.ids.insert(mixed.ids.end(), a4.ids.begin(), a4.ids.end());
  mixed.blocks.insert(mixed.blocks.end(), a4.blocks.begin(), a4.blocks.end());
  EXPECT_EQ(remotely(mixed), mixed.ids.size());
  EXPECT_EQ(Locates(*reader), locates + 3) << "the two on n0 were located";
  EXPECT_EQ(remotely(b4), b4.ids.size());
  EXPECT_EQ(Locates(*reader), locates + 3) << "n1, which served most, is still the hint";
  // The hinted node dies: the next fetch asks it, fails, and locates the blocks on n0.
  cl.Kill(1);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(remotely(a3), a3.ids.size()) << cl.logs();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 2.0) << "a dead hint costs a fallback, not the transfer deadline";
  std::cerr << "fetch with a dead hint: " << s << " s\n";
  EXPECT_EQ(Locates(*reader), locates + 4);
}

TEST(ClusterTest, LookupSpansBlocksSpreadOverNodes) {
  Cluster cl(3);
  ASSERT_TRUE(cl.ok()) << cl.logs();
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(Connect(cl.node(i)));
  auto ns = clients[0]->OpenNamespace(Spec(), "tenant-a");
  ASSERT_TRUE(ns.ok());
  for (int i = 1; i < 3; ++i) ASSERT_TRUE(clients[i]->OpenNamespace(Spec(), "tenant-a").ok());
  // One chain of 9 blocks, block k published on node k % 3.
  auto tokens = Tokens(9 * kTokensPerBlock, 7);
  auto ids = ComputeBlockIds(*ns, kTokensPerBlock, tokens);
  auto blocks = testing::RandomBlocks(9, kBlockBytes, 7);
  for (size_t k = 0; k < ids.size(); ++k) {
    BlockId parent = k == 0 ? BlockId{} : ids[k - 1];
    ConstBuffer buf{blocks[k].data(), blocks[k].size()};
    auto r = clients[k % 3]->PublishIds(*ns, {&ids[k], 1}, {&parent, 1}, {&buf, 1});
    ASSERT_TRUE(r.ok()) << r.status();
  }
  Published p{*ns, tokens, ids, blocks};
  ASSERT_EQ(AwaitPrefix(*clients[0], *ns, p), 9u) << cl.logs();
  auto look = clients[0]->Lookup(*ns, tokens);
  ASSERT_TRUE(look.ok());
  for (size_t k = 0; k < 9; ++k) EXPECT_EQ(look->nodes[k], absl::StrCat("n", k % 3)) << k;
  size_t remote = 0;
  EXPECT_EQ(FetchIdentical(*clients[0], *ns, p, &remote), 9u);
  EXPECT_EQ(remote, 6u);
}

// With two replicas, whichever node dies, every committed block is still fetchable.
class ReplicationTest : public ::testing::TestWithParam<int> {};

TEST_P(ReplicationTest, KillingAnyOneNodeLosesNoBlock) {
  const int victim = GetParam();
  Cluster cl(3, /*replicas=*/2);
  ASSERT_TRUE(cl.ok()) << cl.logs();
  auto a = Connect(cl.node(0));
  ASSERT_TRUE(a);
  Published p = Publish(*a, 16, 3);
  // Each block has two holders (the directory learns of the copies asynchronously).
  size_t with_two = 0;
  for (int attempt = 0; attempt < 60 && with_two < p.ids.size(); ++attempt) {
    if (attempt) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto holders = a->Locate(p.ns, p.ids);
    ASSERT_TRUE(holders.ok()) << holders.status();
    with_two = 0;
    for (const auto& hs : *holders) {
      std::vector<std::string> nodes;
      for (const auto& h : hs) nodes.push_back(h.node);
      std::sort(nodes.begin(), nodes.end());
      nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
      with_two += nodes.size() == 2;
    }
  }
  EXPECT_EQ(with_two, p.ids.size()) << cl.logs();
  cl.Kill(victim);
  const int reader = victim == 2 ? 1 : 2;
  auto c = Connect(cl.node(reader));
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->OpenNamespace(Spec(), "tenant-a").ok());
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(FetchIdentical(*c, p.ns, p, nullptr), p.ids.size()) << cl.logs();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

INSTANTIATE_TEST_SUITE_P(Victims, ReplicationTest, ::testing::Values(0, 1, 2));

// A replica that stops answering (SIGSTOP: its sockets stay open) costs a Commit peer_timeout
// (500 ms here) and the bytes' time at a floor rate, not the client's whole deadline: the
// publish succeeds on this node.
TEST(ReplicationDeadlineTest, AStalledReplicaCostsPeerTimeoutNotTheCallersDeadline) {
  Cluster cl(2, /*replicas=*/2);
  ASSERT_TRUE(cl.ok()) << cl.logs();
  ClientOptions o;
  o.endpoint = cl.node(0).endpoint();
  o.rpc_timeout = absl::Seconds(30);
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(cl.node(1).Stop()) << cl.logs();
  const absl::Time t0 = absl::Now();
  Published p = Publish(**c, 4, 41);
  const absl::Duration took = absl::Now() - t0;
  cl.node(1).Signal(SIGCONT);
  EXPECT_EQ(p.ids.size(), 4u);
  EXPECT_LT(took, absl::Seconds(6)) << cl.logs();
}

TEST_F(ThreeNodeTest, UnreplicatedBlocksOfADeadNodeAreMissesWithinTheDeadline) {
  ASSERT_NO_FATAL_FAILURE(PublishOnN0SeenFromN2(6, 5));
  auto& c = n2;
  cl.Kill(0);
  std::vector<std::vector<uint8_t>> out(p.ids.size(), std::vector<uint8_t>(kBlockBytes));
  std::vector<MutableBuffer> bufs;
  for (auto& b : out) bufs.push_back({b.data(), b.size()});
  auto t0 = std::chrono::steady_clock::now();
  auto r = c->Fetch(p.ns, p.ids, bufs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(6));
  for (auto s : r->status) EXPECT_NE(s, BlockStatus::kOk);
  EXPECT_EQ(r->fetched, 0u);
}

TEST_F(ThreeNodeTest, PrefetchAndMove) {
  ASSERT_NO_FATAL_FAILURE(PublishOnN0SeenFromN2(8, 9));
  auto& a = n0;
  auto& c = n2;
  // Decode node n2 prefetches what prefill node n0 computed: afterwards it serves them itself.
  auto pre = c->Prefetch(p.ns, p.ids);
  ASSERT_TRUE(pre.ok()) << pre.status();
  EXPECT_EQ(pre->copied, p.ids.size());
  size_t remote = 99;
  EXPECT_EQ(FetchIdentical(*c, p.ns, p, &remote), p.ids.size());
  EXPECT_EQ(remote, 0u);
  auto again = c->Prefetch(p.ns, p.ids);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->already_there, p.ids.size());

  // Move the first half from wherever it is to n1: n1 holds them, n0 and n2 no longer do.
  std::vector<BlockId> half(p.ids.begin(), p.ids.begin() + 4);
  auto mv = a->Reposition(p.ns, half, "n1", /*move=*/true);
  ASSERT_TRUE(mv.ok()) << mv.status();
  for (auto s : mv->status) EXPECT_EQ(s, BlockStatus::kOk);
  EXPECT_EQ(mv->copied, 4u);
  auto b = Connect(cl.node(1));
  ASSERT_TRUE(b->OpenNamespace(Spec(), "tenant-a").ok());
  ClientOptions local_only;
  local_only.endpoint = cl.node(1).endpoint();
  local_only.remote_fetch = false;
  auto b_local = Client::Connect(local_only);
  ASSERT_TRUE(b_local.ok());
  ASSERT_TRUE((*b_local)->OpenNamespace(Spec(), "tenant-a").ok());
  Published first{p.ns, {}, half, {p.blocks.begin(), p.blocks.begin() + 4}};
  EXPECT_EQ(FetchIdentical(**b_local, p.ns, first, nullptr), 4u);
  auto bad = a->Reposition(p.ns, half, "no-such-node");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound) << bad.status();
}

TEST(ClusterTest, DrainMovesEveryBlockOffTheNode) {
  Cluster cl(3);
  ASSERT_TRUE(cl.ok()) << cl.logs();
  auto a = Connect(cl.node(0));
  Published p = Publish(*a, 20, 11);
  auto [rc, out] = RunCommand(
      absl::StrCat(STRATACTL_BIN, " --endpoint ", cl.node(0).endpoint(), " drain --json"));
  ASSERT_EQ(rc, 0) << out << cl.logs();
  EXPECT_NE(out.find("\"moved\":20"), std::string::npos) << out;
  auto stats = a->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->host_blocks, 0u);
  auto c = Connect(cl.node(2));
  ASSERT_TRUE(c->OpenNamespace(Spec(), "tenant-a").ok());
  ASSERT_EQ(AwaitPrefix(*c, p.ns, p), p.ids.size()) << cl.logs();
  EXPECT_EQ(FetchIdentical(*c, p.ns, p, nullptr), p.ids.size());
}

TEST(ClusterTest, DrainMovesNvmeBlocksToo) {
  // Node 0: a 4 MiB host tier over a 64 MiB NVMe tier, so part of 5 MiB of blocks demotes.
  Cluster cl(3, 1,
             "host_tier:\n  capacity: 4MiB\n"
             "nvme:\n  files: [{path: $DIR/n0.nvme, capacity: 64MiB}]\n");
  ASSERT_TRUE(cl.ok()) << cl.logs();
  auto a = Connect(cl.node(0));
  // Four publishes of 20 blocks (1.25 MiB each): one call cannot reserve more than the host tier.
  Published p;
  for (int part = 0; part < 4; ++part) {
    Published q = Publish(*a, 20, 13 + part);
    p.ns = q.ns;
    p.tokens.insert(p.tokens.end(), q.tokens.begin(), q.tokens.end());
    p.ids.insert(p.ids.end(), q.ids.begin(), q.ids.end());
    p.blocks.insert(p.blocks.end(), q.blocks.begin(), q.blocks.end());
  }
  auto stats = a->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_LT(stats->host_blocks, 80u) << "some blocks live on NVMe only";
  uint64_t demotions = 0;
  for (const auto& [name, value] : stats->counters)
    if (name == "demotions_total") demotions = value;
  EXPECT_GT(demotions, 0u) << "blocks went to the NVMe tier before the drain";
  auto [rc, out] = RunCommand(
      absl::StrCat(STRATACTL_BIN, " --endpoint ", cl.node(0).endpoint(), " drain --json"));
  ASSERT_EQ(rc, 0) << out << cl.logs();
  EXPECT_NE(out.find("\"blocks\":80,\"moved\":80,\"failed\":0"), std::string::npos) << out;
  auto c = Connect(cl.node(2));
  ASSERT_TRUE(c->OpenNamespace(Spec(), "tenant-a").ok());
  EXPECT_EQ(FetchIdentical(*c, p.ns, p, nullptr), p.ids.size()) << cl.logs();
}

// Issue 14 leftover: Peer.Announce names the node holding the blocks; a node id outside the
// cluster view is refused, so the directory never sends readers to a node nobody vouched for.
TEST(ClusterTest, AnnounceForANodeOutsideTheViewIsRefused) {
  Cluster cl(2);
  ASSERT_TRUE(cl.ok()) << cl.logs();
  auto stub = v1::Peer::NewStub(
      grpc::CreateChannel(cl.node(0).endpoint(), grpc::InsecureChannelCredentials()));
  auto announce = [&](const std::string& node, bool withdraw) {
    v1::AnnounceRequest req;
    req.set_node_id(node);
    req.set_ids(std::string(32, '\x5a'));
    req.set_withdraw(withdraw);
    v1::AnnounceResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub->Announce(&ctx, req, &resp);
  };
  grpc::Status s = announce("intruder", false);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("'intruder' is not a member"), std::string::npos)
      << s.error_message();
  EXPECT_TRUE(announce("n1", false).ok()) << "a member's announce is accepted";
  EXPECT_TRUE(announce("intruder", true).ok()) << "withdrawals only remove entries";
}

// Issue 14, finding 2: Peer.Pull makes the daemon dial its source. Only another node of its
// view, at the address the view has for it: never a HOST:PORT the caller names.
TEST(ClusterTest, PullDialsOnlyAnotherNodeOfTheView) {
  Cluster cl(2);
  ASSERT_TRUE(cl.ok()) << cl.logs();
  // A listening port that would see the daemon's dial.
  const int trap = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(trap, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(trap, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(trap, 8), 0);
  ASSERT_EQ(getsockname(trap, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string trap_address = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  auto stub = v1::Peer::NewStub(
      grpc::CreateChannel(cl.node(0).endpoint(), grpc::InsecureChannelCredentials()));
  // A stranger, a member at another address than the view's, and the node itself.
  for (const char* node : {"intruder", "n1", "n0"}) {
    v1::PullRequest req;
    req.set_source_node(node);
    req.set_source_address(trap_address);
    req.set_ids(std::string(32, '\x5b'));
    v1::PullResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Status s = stub->Pull(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << node << ": " << s.error_message();
    EXPECT_NE(s.error_message().find("is not another node of this cluster view"), std::string::npos)
        << s.error_message();
  }
  pollfd pfd{trap, POLLIN, 0};
  EXPECT_EQ(poll(&pfd, 1, 300), 0) << "the daemon dialed the address a caller named";
  close(trap);
}

TEST(ClusterTest, StratactlNodesListsTheCluster) {
  Cluster cl(3);
  ASSERT_TRUE(cl.ok()) << cl.logs();
  auto [rc, out] = RunCommand(
      absl::StrCat(STRATACTL_BIN, " --endpoint ", cl.node(1).endpoint(), " nodes --json"));
  ASSERT_EQ(rc, 0) << out;
  for (const char* n : {"\"n0\"", "\"n1\"", "\"n2\""})
    EXPECT_NE(out.find(n), std::string::npos) << out;
  EXPECT_NE(out.find("\"membership\":\"static\""), std::string::npos) << out;
}

}  // namespace
}  // namespace strata
