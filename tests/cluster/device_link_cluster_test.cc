// Blocks from one node's GPU tier straight into another's over device links, with real stratad
// processes whose GPU tiers are host memory standing in for the device (the stand-in link is
// TCP where NCCL would be): Reposition into another node's GPU tier, both ends of a pair
// running it, blocks only in host memory going over UCX, damaged and refused transfers, a dead
// source, the Peer calls of the link refused to strangers; and blocks published out of an
// engine's lent buffer, replicated like any publish.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <set>
#include <thread>

#include "common/packed_ids.h"
#include "strata/device_buffer.h"
#include "strata/v1/peer.grpc.pb.h"
#include "tests/cluster/cluster_fixture.h"

namespace strata {
namespace {

using namespace cluster_fixture;  // NOLINT(build/namespaces): the shared fixture of these tests

constexpr char kGpu[] = "gpu:\n  capacity: 4MiB\n  memory: host-stand-in\n";

uint64_t Counter(Client& c, const std::string& name) {
  auto s = c.Stats();
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return 0;
  for (const auto& [k, v] : s->counters)
    if (k == name) return v;
  return 0;
}

// The tiers node `node` holds `id` in, as Locate through `c` reports them.
std::vector<std::string> TiersAt(Client& c, const NamespaceId& ns, const BlockId& id,
                                 const std::string& node) {
  std::vector<std::string> tiers;
  auto located = c.Locate(ns, {&id, 1});
  EXPECT_TRUE(located.ok()) << located.status();
  if (located.ok())
    for (const BlockHolder& h : (*located)[0])
      if (h.node == node) tiers.push_back(h.tier);
  return tiers;
}

// A client of `d` that never fetches from other nodes: what it gets, `d` holds.
std::unique_ptr<Client> LocalOnly(DaemonProcess& d) {
  ClientOptions o;
  o.endpoint = d.endpoint();
  o.rpc_timeout = absl::Seconds(5);
  o.remote_fetch = false;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

class DeviceLinkClusterTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(cl.ok()) << cl.logs(); }
  Cluster cl{3, 1, "", kGpu};
};

TEST_F(DeviceLinkClusterTest, BlocksGoFromOneGpuTierIntoAnothersWhicheverEndRunsTheLink) {
  auto n0 = Connect(cl.node(0));
  auto n1 = Connect(cl.node(1));
  auto n2 = Connect(cl.node(2));
  ASSERT_TRUE(n0 && n1 && n2);
  // n0 publishes 8 blocks and puts them on its device.
  Published p = Publish(*n0, 8, 21);
  auto up = n0->Reposition(p.ns, p.ids, "", false, "gpu");
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_TRUE(n1->OpenNamespace(Spec(), "tenant-a").ok());
  ASSERT_TRUE(n2->OpenNamespace(Spec(), "tenant-a").ok());
  ASSERT_EQ(AwaitPrefix(*n1, p.ns, p), p.ids.size()) << cl.logs();

  // Into n1's GPU tier, asked through n2: n1 receives, n0 (the lower id) runs the link.
  std::vector<BlockId> first(p.ids.begin(), p.ids.begin() + 4);
  auto mv = n2->Reposition(p.ns, first, "n1", false, "gpu");
  ASSERT_TRUE(mv.ok()) << mv.status();
  for (auto s : mv->status) EXPECT_EQ(s, BlockStatus::kOk);
  EXPECT_EQ(mv->copied, 4u);
  EXPECT_EQ(Counter(*n1, "device_link_blocks_in_total"), 4u);
  EXPECT_EQ(Counter(*n1, "device_link_bytes_in_total"), 4 * kBlockBytes);
  EXPECT_EQ(Counter(*n0, "device_link_blocks_out_total"), 4u);
  EXPECT_EQ(Counter(*n0, "device_links_opened_total"), 1u);
  for (const BlockId& id : first)
    EXPECT_EQ(TiersAt(*n1, p.ns, id, "n1"), std::vector<std::string>{"gpu"}) << cl.logs();
  // n1 serves them itself (host readers get them staged down, checked against n0's CRCs).
  auto n1_local = LocalOnly(cl.node(1));
  ASSERT_TRUE(n1_local && n1_local->OpenNamespace(Spec(), "tenant-a").ok());
  Published firsts{p.ns, {}, first, {p.blocks.begin(), p.blocks.begin() + 4}};
  EXPECT_EQ(FetchIdentical(*n1_local, p.ns, firsts, nullptr), 4u);

  // The other way round on a pair: n2 publishes, n1 (the lower id) receives and runs the link.
  Published q = Publish(*n2, 4, 22);
  ASSERT_TRUE(n2->Reposition(q.ns, q.ids, "", false, "gpu").ok());
  auto back = n1->Reposition(q.ns, q.ids, "", false, "gpu");
  ASSERT_TRUE(back.ok()) << back.status();
  for (auto s : back->status) EXPECT_EQ(s, BlockStatus::kOk);
  EXPECT_EQ(Counter(*n1, "device_link_blocks_in_total"), 8u);
  EXPECT_EQ(Counter(*n2, "device_link_blocks_out_total"), 4u);
  EXPECT_EQ(FetchIdentical(*n1_local, q.ns, q, nullptr), 4u);

  // The link stays: a second transfer n0 -> n1 reuses it.
  std::vector<BlockId> second(p.ids.begin() + 4, p.ids.end());
  ASSERT_TRUE(n0->Reposition(p.ns, second, "n1", false, "gpu").ok());
  EXPECT_EQ(Counter(*n0, "device_links_opened_total"), 1u);
  EXPECT_EQ(Counter(*n1, "device_link_blocks_in_total"), 12u);
  EXPECT_EQ(Counter(*n1, "device_link_failures_total"), 0u);
  EXPECT_EQ(FetchIdentical(*n1_local, p.ns, p, nullptr), 8u);
}

// Both nodes of a pair pull from each other at once, many times: rank 0 runs every transfer of
// the link, so the two ends never wait on each other's sends.
TEST_F(DeviceLinkClusterTest, TransfersBothWaysAtOnceOnOneLinkAllArrive) {
  auto n0 = Connect(cl.node(0));
  auto n1 = Connect(cl.node(1));
  ASSERT_TRUE(n0 && n1);
  constexpr size_t kRounds = 12, kPerRound = 2;
  Published a = Publish(*n0, kRounds * kPerRound, 31);
  Published b = Publish(*n1, kRounds * kPerRound, 32);
  ASSERT_TRUE(n0->Reposition(a.ns, a.ids, "", false, "gpu").ok());
  ASSERT_TRUE(n1->Reposition(b.ns, b.ids, "", false, "gpu").ok());
  ASSERT_EQ(AwaitPrefix(*n1, a.ns, a), a.ids.size()) << cl.logs();
  ASSERT_EQ(AwaitPrefix(*n0, b.ns, b), b.ids.size()) << cl.logs();
  auto pull_all = [&](Client& into, const Published& p) {
    size_t ok = 0;
    for (size_t r = 0; r < kRounds; ++r) {
      std::vector<BlockId> batch(p.ids.begin() + r * kPerRound,
                                 p.ids.begin() + (r + 1) * kPerRound);
      auto got = into.Reposition(p.ns, batch, "", false, "gpu");
      if (got.ok())
        for (auto s : got->status) ok += s == BlockStatus::kOk;
    }
    return ok;
  };
  auto n1_pulls = std::async(std::launch::async, [&] { return pull_all(*n1, a); });
  const size_t n0_got = pull_all(*n0, b);
  EXPECT_EQ(n0_got, b.ids.size());
  EXPECT_EQ(n1_pulls.get(), a.ids.size());
  EXPECT_EQ(Counter(*n0, "device_link_blocks_in_total"), b.ids.size());
  EXPECT_EQ(Counter(*n1, "device_link_blocks_in_total"), a.ids.size());
  EXPECT_EQ(Counter(*n0, "device_link_failures_total"), 0u);
  EXPECT_EQ(Counter(*n1, "device_link_failures_total"), 0u);
  EXPECT_EQ(Counter(*n0, "device_links_opened_total"), 1u);
  auto n0_local = LocalOnly(cl.node(0));
  auto n1_local = LocalOnly(cl.node(1));
  ASSERT_TRUE(n0_local && n0_local->OpenNamespace(Spec(), "tenant-a").ok());
  ASSERT_TRUE(n1_local && n1_local->OpenNamespace(Spec(), "tenant-a").ok());
  EXPECT_EQ(FetchIdentical(*n0_local, b.ns, b, nullptr), b.ids.size());
  EXPECT_EQ(FetchIdentical(*n1_local, a.ns, a, nullptr), a.ids.size());
}

// The directory knows which holders have a block on their device, and a reposition into a GPU
// tier takes it from one of them, device to device, over a holder with host memory only.
TEST_F(DeviceLinkClusterTest, AGpuTierIsFilledFromAHolderThatHasTheBlockOnItsDevice) {
  auto n0 = Connect(cl.node(0));
  auto n1 = Connect(cl.node(1));
  auto n2 = Connect(cl.node(2));
  ASSERT_TRUE(n0 && n1 && n2);
  Published p = Publish(*n0, 4, 29);  // n0: host memory only
  ASSERT_TRUE(n1->OpenNamespace(Spec(), "tenant-a").ok());
  ASSERT_TRUE(n2->OpenNamespace(Spec(), "tenant-a").ok());
  ASSERT_EQ(AwaitPrefix(*n1, p.ns, p), p.ids.size()) << cl.logs();
  auto up = n1->Reposition(p.ns, p.ids, "", false, "gpu");  // n1: over UCX, then promoted
  ASSERT_TRUE(up.ok()) << up.status();
  for (auto s : up->status) ASSERT_EQ(s, BlockStatus::kOk);
  // n2 learns from the directory that n1 has them on its device.
  bool seen = false;
  for (int i = 0; i < 100 && !seen; ++i) {
    seen = true;
    for (const BlockId& id : p.ids) seen &= TiersAt(*n2, p.ns, id, "n1") ==
                                            std::vector<std::string>{"gpu"};
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(seen) << cl.logs();
  EXPECT_EQ(TiersAt(*n2, p.ns, p.ids[0], "n0"), std::vector<std::string>{"host"});
  auto mv = n2->Reposition(p.ns, p.ids, "", false, "gpu");
  ASSERT_TRUE(mv.ok()) << mv.status();
  for (auto s : mv->status) EXPECT_EQ(s, BlockStatus::kOk);
  EXPECT_EQ(Counter(*n2, "device_link_blocks_in_total"), p.ids.size());
  EXPECT_EQ(Counter(*n1, "device_link_blocks_out_total"), p.ids.size());
  // The device copies leave n1 (evicted there): the directory says n1 no longer has them.
  ASSERT_TRUE(n1->Evict(p.ns, p.ids).ok());
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = TiersAt(*n2, p.ns, p.ids[0], "n1").empty();
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(gone);
}

TEST_F(DeviceLinkClusterTest, BlocksOnlyInHostMemoryGoOverUcxAndAreThenPromoted) {
  auto n0 = Connect(cl.node(0));
  auto n2 = Connect(cl.node(2));
  ASSERT_TRUE(n0 && n2);
  Published p = Publish(*n0, 4, 23);  // not on n0's device
  ASSERT_TRUE(n2->OpenNamespace(Spec(), "tenant-a").ok());
  ASSERT_EQ(AwaitPrefix(*n2, p.ns, p), p.ids.size()) << cl.logs();
  auto mv = n0->Reposition(p.ns, p.ids, "n2", false, "gpu");
  ASSERT_TRUE(mv.ok()) << mv.status();
  for (auto s : mv->status) EXPECT_EQ(s, BlockStatus::kOk);
  EXPECT_EQ(Counter(*n2, "device_link_blocks_in_total"), 0u);
  for (const BlockId& id : p.ids) {
    auto tiers = TiersAt(*n2, p.ns, id, "n2");
    ASSERT_FALSE(tiers.empty());
    EXPECT_EQ(tiers[0], "gpu");
  }
  // Blocks n2 holds already (host memory) are promoted there when asked again.
  auto again = n0->Reposition(p.ns, p.ids, "n2", false, "gpu");
  ASSERT_TRUE(again.ok()) << again.status();
  for (auto s : again->status) EXPECT_EQ(s, BlockStatus::kOk);
  EXPECT_EQ(again->copied, 0u);
  // A node without room: n2's 4 MiB device cannot hold 80 blocks of 64 KiB at once.
  Published big = Publish(*n0, 80, 24);
  ASSERT_EQ(AwaitPrefix(*n2, big.ns, big), big.ids.size()) << cl.logs();
  auto full = n0->Reposition(big.ns, big.ids, "n2", false, "gpu");
  ASSERT_TRUE(full.ok()) << full.status();
  size_t no_space = 0;
  for (auto s : full->status) no_space += s == BlockStatus::kNoSpace;
  EXPECT_GT(no_space, 0u);
  EXPECT_EQ(FetchIdentical(*n2, big.ns, big, nullptr), big.ids.size());  // nothing lost
}

TEST_F(DeviceLinkClusterTest, AStuckOrDeadSourceCostsADeadlineNotAHang) {
  auto n0 = Connect(cl.node(0));
  auto n1 = Connect(cl.node(1));
  ASSERT_TRUE(n0 && n1);
  Published p = Publish(*n1, 4, 25);
  ASSERT_TRUE(n1->Reposition(p.ns, p.ids, "", false, "gpu").ok());
  ASSERT_TRUE(n0->OpenNamespace(Spec(), "tenant-a").ok());
  ASSERT_EQ(AwaitPrefix(*n0, p.ns, p), p.ids.size()) << cl.logs();
  // One transfer n1 -> n0 makes the link (n0 runs it).
  std::vector<BlockId> one(p.ids.begin(), p.ids.begin() + 1);
  ASSERT_TRUE(n0->Reposition(p.ns, one, "", false, "gpu").ok());
  EXPECT_EQ(Counter(*n0, "device_link_blocks_in_total"), 1u);
  // n1 stops answering (SIGSTOP: its sockets stay open, nothing moves), then dies.
  ASSERT_TRUE(cl.node(1).Stop()) << cl.logs();
  std::vector<BlockId> rest(p.ids.begin() + 1, p.ids.end());
  const absl::Time t0 = absl::Now();
  auto stuck = n0->Reposition(p.ns, rest, "", false, "gpu");
  EXPECT_LT(absl::Now() - t0, absl::Seconds(8));  // peer_timeout is 500 ms; RPCs 5 s at most
  if (stuck.ok()) {
    for (auto s : stuck->status) EXPECT_NE(s, BlockStatus::kOk);
  }
  // Back again: the next transfer goes through (on a new link if the last one broke).
  cl.node(1).Signal(SIGCONT);
  std::vector<BlockId> two(p.ids.begin() + 1, p.ids.begin() + 2);
  auto resumed = n0->Reposition(p.ns, two, "", false, "gpu");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->status[0], BlockStatus::kOk) << cl.logs();
  EXPECT_EQ(Counter(*n0, "device_link_blocks_in_total"), 2u);
  rest.assign(p.ids.begin() + 2, p.ids.end());
  cl.Kill(1);
  auto dead = n0->Reposition(p.ns, rest, "", false, "gpu");
  if (dead.ok()) {
    for (auto s : dead->status) EXPECT_NE(s, BlockStatus::kOk);
  }
  // n0 is whole: what arrived is served, nothing else is claimed.
  auto n0_local = LocalOnly(cl.node(0));
  ASSERT_TRUE(n0_local && n0_local->OpenNamespace(Spec(), "tenant-a").ok());
  Published got{p.ns, {}, {p.ids[0], p.ids[1]}, {p.blocks[0], p.blocks[1]}};
  EXPECT_EQ(FetchIdentical(*n0_local, p.ns, got, nullptr), 2u);
  auto stats = n0->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_TRUE(cl.node(0).Running()) << cl.logs();
}

// A drained node's device copies go device to device into the next nodes' GPU tiers; its other
// blocks into their host memory, as always.
TEST_F(DeviceLinkClusterTest, DrainSendsDeviceCopiesDeviceToDevice) {
  auto n1 = Connect(cl.node(1));
  ASSERT_TRUE(n1);
  Published p = Publish(*n1, 8, 27);
  std::vector<BlockId> hot(p.ids.begin(), p.ids.begin() + 5);
  ASSERT_TRUE(n1->Reposition(p.ns, hot, "", false, "gpu").ok());
  auto [rc, out] = testing::RunCommand(
      absl::StrCat(STRATACTL_BIN, " --endpoint ", cl.node(1).endpoint(), " drain --json"));
  ASSERT_EQ(rc, 0) << out << cl.logs();
  EXPECT_NE(out.find("\"blocks\":8,\"moved\":8,\"failed\":0"), std::string::npos) << out;
  auto n0 = Connect(cl.node(0));
  auto n2 = Connect(cl.node(2));
  ASSERT_TRUE(n0 && n2);
  EXPECT_EQ(Counter(*n1, "device_link_blocks_out_total"), hot.size());
  EXPECT_EQ(Counter(*n0, "device_link_blocks_in_total") + Counter(*n2, "device_link_blocks_in_total"),
            hot.size());
  ASSERT_TRUE(n0->OpenNamespace(Spec(), "tenant-a").ok());
  ASSERT_EQ(AwaitPrefix(*n0, p.ns, p), p.ids.size()) << cl.logs();
  // Each holder reports its own tiers (the directory knows holders, not their tiers).
  ASSERT_TRUE(n2->OpenNamespace(Spec(), "tenant-a").ok());
  for (const BlockId& id : hot) {
    auto located = n0->Locate(p.ns, {&id, 1});
    ASSERT_TRUE(located.ok() && !(*located)[0].empty());
    const std::string holder = (*located)[0][0].node;
    Client& at = holder == "n0" ? *n0 : *n2;
    auto tiers = TiersAt(at, p.ns, id, holder);
    ASSERT_FALSE(tiers.empty()) << holder;
    EXPECT_EQ(tiers[0], "gpu") << holder;
  }
  EXPECT_EQ(FetchIdentical(*n0, p.ns, p, nullptr), p.ids.size());
}

TEST_F(DeviceLinkClusterTest, TheLinksPeerCallsAreRefusedToWhatIsNotAPeerOfTheView) {
  auto channel = grpc::CreateChannel(cl.node(1).endpoint(), grpc::InsecureChannelCredentials());
  auto stub = v1::Peer::NewStub(channel);
  auto call = [&](auto method, const auto& req, auto* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return ((*stub).*method)(&ctx, req, resp);
  };
  // A stranger (not in the view) cannot make a link, prepare or run a transfer.
  v1::JoinDeviceLinkRequest join;
  join.set_node_id("mallory");
  join.set_link_id("127.0.0.1 1 00000000000000000000000000000000");
  join.set_epoch(1);
  join.set_kind("stand-in");
  v1::JoinDeviceLinkResponse jr;
  EXPECT_EQ(call(&v1::Peer::Stub::JoinDeviceLink, join, &jr).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // A node of the view with a higher id is not rank 0 of the pair: it does not make links.
  join.set_node_id("n2");
  EXPECT_EQ(call(&v1::Peer::Stub::JoinDeviceLink, join, &jr).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Rank 0 with links of another kind.
  join.set_node_id("n0");
  join.set_kind("nccl");
  EXPECT_EQ(call(&v1::Peer::Stub::JoinDeviceLink, join, &jr).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  v1::PrepareDeviceSendRequest prep;
  prep.set_node_id("mallory");
  v1::PrepareDeviceSendResponse pr;
  EXPECT_EQ(call(&v1::Peer::Stub::PrepareDeviceSend, prep, &pr).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  prep.set_node_id("n0");
  prep.set_ids("short");  // not N x 32 bytes
  EXPECT_EQ(call(&v1::Peer::Stub::PrepareDeviceSend, prep, &pr).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // A made-up transfer on a link that does not exist.
  v1::RunDeviceTransferRequest run;
  run.set_node_id("n0");
  run.set_epoch(7);
  run.set_transfer_id(12345);
  v1::RunDeviceTransferResponse rr;
  EXPECT_EQ(call(&v1::Peer::Stub::RunDeviceTransfer, run, &rr).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  // Only rank 0 of a pair runs its transfers: n2 cannot ask n1 to conduct.
  run.set_node_id("n2");
  EXPECT_EQ(call(&v1::Peer::Stub::RunDeviceTransfer, run, &rr).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  run.set_conduct(true);
  run.set_node_id("n0");
  EXPECT_EQ(call(&v1::Peer::Stub::RunDeviceTransfer, run, &rr).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(cl.node(1).Running());
}

// n0 has no GPU tier (so no device links): the others stop asking it for a while, and its
// blocks reach their GPU tiers over UCX.
// Blocks an engine publishes out of its lent buffer are published like any other: replicated
// before the call returns, so losing the publishing node loses none of them.
TEST(DevicePublishClusterTest, BlocksPublishedFromADeviceBufferAreReplicated) {
  Cluster cl(3, /*replicas=*/2, "", kGpu);
  ASSERT_TRUE(cl.ok()) << cl.logs();
  auto a = Connect(cl.node(0));
  ASSERT_TRUE(a);
  auto ns = a->OpenNamespace(Spec(), "tenant-a", 2);
  ASSERT_TRUE(ns.ok()) << ns.status();
  const size_t n = 6;
  const auto blocks = testing::RandomBlocks(n, kBlockBytes, 31);
  auto buffer = StandInDeviceBuffer::Create(n * kBlockBytes);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::vector<uint64_t> offsets, sizes(n, kBlockBytes);
  for (size_t i = 0; i < n; ++i) {
    std::memcpy((*buffer)->data() + i * kBlockBytes, blocks[i].data(), kBlockBytes);
    offsets.push_back(i * kBlockBytes);
  }
  auto loan = a->LendDeviceBuffer((*buffer)->handle());
  ASSERT_TRUE(loan.ok()) << loan.status();
  const auto tokens = Tokens(n * kTokensPerBlock, 31);
  auto ids = a->BlockIds(*ns, tokens);
  ASSERT_TRUE(ids.ok());
  auto pub = a->PublishFromDevice(*ns, *loan, *ids, {}, offsets, sizes);
  ASSERT_TRUE(pub.ok()) << pub.status();
  ASSERT_EQ(pub->stored, n);
  ASSERT_TRUE(a->ReturnDeviceBuffer(*loan).ok());
  // Another node holds each block too (the replica is made before PublishFromDevice returns).
  auto located = a->Locate(*ns, *ids);
  ASSERT_TRUE(located.ok()) << located.status();
  for (size_t i = 0; i < n; ++i) {
    std::set<std::string> nodes;
    for (const BlockHolder& h : (*located)[i]) nodes.insert(h.node);
    EXPECT_EQ(nodes.size(), 2u) << "block " << i;
  }
  cl.Kill(0);
  for (int reader : {1, 2}) {
    auto c = Connect(cl.node(reader));
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->OpenNamespace(Spec(), "tenant-a", 2).ok());
    std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(kBlockBytes));
    std::vector<MutableBuffer> bufs;
    for (auto& b : out) bufs.push_back({b.data(), b.size()});
    auto f = c->Fetch(*ns, *ids, bufs);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->fetched, n) << "through n" << reader << "\n" << cl.logs();
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(out[i], blocks[i]) << i;
  }
}

TEST(DeviceLinkClusterTestMixed, BlocksFromANodeWithoutDeviceLinksComeOverUcx) {
  Cluster cl{2, 1, "host_tier:\n  capacity: 64MiB\n", kGpu};
  ASSERT_TRUE(cl.ok()) << cl.logs();
  auto n0 = Connect(cl.node(0));
  auto n1 = Connect(cl.node(1));
  ASSERT_TRUE(n0 && n1);
  Published p = Publish(*n0, 4, 28);
  ASSERT_TRUE(n1->OpenNamespace(Spec(), "tenant-a").ok());
  ASSERT_EQ(AwaitPrefix(*n1, p.ns, p), p.ids.size()) << cl.logs();
  for (int round = 0; round < 2; ++round) {
    std::vector<BlockId> two(p.ids.begin() + 2 * round, p.ids.begin() + 2 * round + 2);
    auto mv = n1->Reposition(p.ns, two, "", false, "gpu");
    ASSERT_TRUE(mv.ok()) << mv.status();
    for (auto s : mv->status) EXPECT_EQ(s, BlockStatus::kOk);
  }
  EXPECT_EQ(Counter(*n1, "device_link_blocks_in_total"), 0u);
  EXPECT_EQ(Counter(*n1, "device_link_failures_total"), 0u);
  const std::string log = cl.node(1).log();
  size_t said = 0;
  for (size_t at = log.find("no device link with 'n0'"); at != std::string::npos;
       at = log.find("no device link with 'n0'", at + 1))
    ++said;
  EXPECT_EQ(said, 1u) << log;  // asked once, then left alone
  for (const BlockId& id : p.ids) {
    auto tiers = TiersAt(*n1, p.ns, id, "n1");
    ASSERT_FALSE(tiers.empty());
    EXPECT_EQ(tiers[0], "gpu");
  }
}

TEST(DeviceLinkClusterTestNoGpu, ANodeWithoutAGpuTierSaysSo) {
  Cluster cl{2};
  ASSERT_TRUE(cl.ok()) << cl.logs();
  auto n0 = Connect(cl.node(0));
  ASSERT_TRUE(n0);
  Published p = Publish(*n0, 2, 26);
  auto mv = n0->Reposition(p.ns, p.ids, "n1", false, "gpu");
  ASSERT_TRUE(mv.ok()) << mv.status();
  for (auto s : mv->status) EXPECT_EQ(s, BlockStatus::kInvalid);
  auto here = n0->Reposition(p.ns, p.ids, "", false, "gpu");
  EXPECT_EQ(here.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace strata
