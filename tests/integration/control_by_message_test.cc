// Reserve and Commit as active messages (am_wire kReserveRequestAm, kCommitRequestAm; issue 15,
// item 2): a publish through libstrata makes neither gRPC call, keeps every answer of the gRPC
// route (dedup, per-block refusals), and a daemon whose commits must reach other nodes sends
// the Commit back to gRPC.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "strata/client.h"
#include "strata/v1/cache.grpc.pb.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/client_calls.h"
#include "tests/support/free_port.h"
#include "tests/support/scoped_env.h"
#include "tests/support/test_data.h"

namespace strata {
namespace {

using testing::DaemonProcess;
using testing::RandomBlocks;
using testing::Tokens;

constexpr uint32_t kTokensPerBlock = 16;

NamespaceSpec Spec() { return testing::SmallSpec("control-by-message"); }

std::unique_ptr<Client> Connect(const DaemonProcess& d) {
  return testing::ConnectClient(d.endpoint());
}
uint64_t Counter(Client& c, const std::string& name) { return testing::StatsCounter(c, name); }

// Fetches `ids` into buffers of `bytes` each: the result and what landed.
struct Fetched {
  absl::StatusOr<FetchResult> result;
  std::vector<std::vector<uint8_t>> blocks;
};
Fetched FetchInto(Client& c, const NamespaceId& ns, std::span<const BlockId> ids, size_t bytes) {
  Fetched out{FetchResult{}, std::vector<std::vector<uint8_t>>(ids.size(),
                                                               std::vector<uint8_t>(bytes))};
  std::vector<MutableBuffer> bufs;
  for (auto& b : out.blocks) bufs.push_back({b.data(), b.size()});
  out.result = c.Fetch(ns, ids, bufs);
  return out;
}

uint64_t ByMessage(Client& c) { return Counter(c, "reserves_and_commits_by_message_total"); }

TEST(ControlByMessageTest, APublishMakesNoGrpcCall) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto ns = client->OpenNamespace(Spec(), "t");
  ASSERT_TRUE(ns.ok()) << ns.status();
  const uint64_t before = ByMessage(*client);
  // Where blocks move by messages (the tcp pass) a small publish is one request (Reserve,
  // blocks and Commit together); over shared memory the client copies the blocks itself between
  // a Reserve and a Commit.
  const char* tls = std::getenv("UCX_TLS");
  const bool in_one = tls != nullptr && std::string(tls) == "tcp";
  auto tokens = Tokens(4 * kTokensPerBlock, 51);
  auto blocks = RandomBlocks(4, 8192, 52);
  auto first = client->Publish(*ns, tokens, testing::BufferViews(blocks));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->stored, 4u);
  EXPECT_EQ(ByMessage(*client) - before, in_one ? 1u : 2u) << "one request, or Reserve and Commit";
  EXPECT_EQ(Counter(*client, "publishes_in_one_total"), in_one ? 1u : 0u);
  // Dedup holds: the second publish reserves nothing (so commits nothing either).
  auto again = client->Publish(*ns, tokens, testing::BufferViews(blocks));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->deduplicated, 4u);
  EXPECT_EQ(again->stored, 0u);
  EXPECT_EQ(ByMessage(*client) - before, in_one ? 2u : 3u);
  // Half new, half held: the new ones are stored, the others counted as deduplicated.
  auto more_tokens = tokens;
  for (size_t i = 2 * kTokensPerBlock; i < more_tokens.size(); ++i) more_tokens[i] ^= 0x5a5a;
  auto mixed = client->Publish(*ns, more_tokens, testing::BufferViews(blocks));
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ(mixed->deduplicated, 2u);
  EXPECT_EQ(mixed->stored, 2u);
  Fetched mf = FetchInto(*client, *ns, ComputeBlockIds(*ns, kTokensPerBlock, more_tokens), 8192);
  ASSERT_TRUE(mf.result.ok()) << mf.result.status();
  EXPECT_EQ(mf.result->fetched, 4u);
  EXPECT_EQ(mf.blocks, blocks);
  // So small a fetch comes inside the daemon's answer, and leaves no lease behind (elsewhere
  // the lease's release is still on its way).
  EXPECT_EQ(Counter(*client, "fetches_in_one_total"), in_one ? 1u : 0u);
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  if (in_one) {
    EXPECT_EQ(stats->open_leases, 0u);
  }
  Fetched f = FetchInto(*client, *ns, ComputeBlockIds(*ns, kTokensPerBlock, tokens), 8192);
  ASSERT_TRUE(f.result.ok()) << f.result.status();
  EXPECT_EQ(f.result->fetched, 4u);
  EXPECT_EQ(f.blocks, blocks);
  // A block the tier cannot hold is refused per block, as by gRPC.
  std::vector<std::vector<uint8_t>> huge(1, std::vector<uint8_t>(80 << 20, 1));
  auto refused = client->Publish(*ns, Tokens(kTokensPerBlock, 53), testing::BufferViews(huge));
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->stored, 0u);
  EXPECT_NE(refused->status[0], BlockStatus::kOk);
}

// Where blocks move by push (the tcp pass), a fetch is one request: the daemon pushes the
// leased blocks right behind its answer. Over shared memory the client copies them itself.
TEST(ControlByMessageTest, AFetchByPushIsOneRequest) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto ns = client->OpenNamespace(Spec(), "t");
  ASSERT_TRUE(ns.ok()) << ns.status();
  auto tokens = Tokens(3 * kTokensPerBlock, 61);
  auto blocks = RandomBlocks(3, 300 << 10, 62);  // over the eager size: rendezvous
  blocks[0].resize(8192);                          // and one eager
  auto pub = client->Publish(*ns, tokens, testing::BufferViews(blocks));
  ASSERT_TRUE(pub.ok()) << pub.status();
  ASSERT_EQ(pub->stored, 3u);
  std::vector<std::vector<uint8_t>> got(3, std::vector<uint8_t>(300 << 10));
  std::vector<MutableBuffer> bufs;
  for (auto& b : got) bufs.push_back({b.data(), b.size()});
  for (int round = 0; round < 3; ++round) {
    auto f = client->Fetch(*ns, pub->ids, bufs);
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_EQ(f->fetched, 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_TRUE(std::equal(blocks[i].begin(), blocks[i].end(), got[i].begin())) << i;
  }
  const char* tls = std::getenv("UCX_TLS");
  const bool push = tls != nullptr && std::string(tls) == "tcp";
  EXPECT_EQ(Counter(*client, "acquires_with_push_total"), push ? 3u : 0u);
  // Each answer rode in its first block's header: no message of its own.
  EXPECT_EQ(Counter(*client, "answers_in_first_block_total"), push ? 3u : 0u);
  if (!push) {
    // Over shared memory the client copies the blocks itself and ends each lease by message.
    for (int i = 0; i < 200 && Counter(*client, "releases_by_message_total") < 3; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(Counter(*client, "releases_by_message_total"), 3u);
    return;
  }
  // The daemon ends each pushed fetch's lease itself: the client sends no Release, and no lease
  // stays open.
  // The daemon ends a lease when its push completes, which may be just after the fetch returned
  // (a loaded machine): wait for it, bounded.
  EXPECT_EQ(Counter(*client, "releases_by_message_total"), 0u);
  uint64_t open_leases = ~0ull;
  for (int i = 0; i < 200 && open_leases != 0; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    auto stats = client->Stats();
    ASSERT_TRUE(stats.ok()) << stats.status();
    open_leases = stats->open_leases;
  }
  EXPECT_EQ(open_leases, 0u);
}

// A block whose bytes changed in the daemon's memory after its commit is reported damaged, never
// handed over as fetched: on the tcp pass it comes inside the daemon's answer (fetch in one),
// over shared memory the client copies it itself. The bytes are changed through
// /proc/PID/mem, as a bad DIMM or a stray write would.
TEST(ControlByMessageTest, ABlockChangedInTheArenaIsReportedDamaged) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto ns = client->OpenNamespace(Spec(), "t");
  ASSERT_TRUE(ns.ok()) << ns.status();
  auto tokens = Tokens(2 * kTokensPerBlock, 71);
  auto blocks = RandomBlocks(2, 8192, 72);
  auto pub = client->Publish(*ns, tokens, testing::BufferViews(blocks));
  ASSERT_TRUE(pub.ok()) << pub.status();
  ASSERT_EQ(pub->stored, 2u);
  auto stub =
      v1::Cache::NewStub(grpc::CreateChannel(d.endpoint(), grpc::InsecureChannelCredentials()));
  v1::ConnectResponse conn;
  v1::AcquireResponse lease;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Connect(&ctx, v1::ConnectRequest(), &conn).ok());
  }
  ASSERT_NE(conn.arena_base(), 0u) << "one tenant: the daemon says where its arena is";
  {
    grpc::ClientContext ctx;
    v1::AcquireRequest req;
    req.set_namespace_id(std::string(ns->AsBytes()));
    req.set_ids(std::string(pub->ids[1].AsBytes()));
    ASSERT_TRUE(stub->Acquire(&ctx, req, &lease).ok());
    grpc::ClientContext release_ctx;
    v1::ReleaseRequest release;
    release.set_lease_id(lease.lease_id());
    v1::ReleaseResponse ignored;
    ASSERT_TRUE(stub->Release(&release_ctx, release, &ignored).ok());
  }
  ASSERT_EQ(lease.offsets_size(), 1);
  {
    std::fstream mem("/proc/" + std::to_string(d.pid()) + "/mem",
                     std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(mem.is_open());
    const uint64_t at = conn.arena_base() + lease.offsets(0) + 100;
    char byte = 0;
    mem.seekg(static_cast<std::streamoff>(at));
    mem.read(&byte, 1);
    byte ^= 0x10;
    mem.seekp(static_cast<std::streamoff>(at));
    mem.write(&byte, 1);
    ASSERT_TRUE(mem.good());
  }
  Fetched f = FetchInto(*client, *ns, pub->ids, 8192);
  ASSERT_TRUE(f.result.ok()) << f.result.status();
  EXPECT_EQ(f.result->status[0], BlockStatus::kOk);
  EXPECT_EQ(f.blocks[0], blocks[0]);
  EXPECT_EQ(f.result->status[1], BlockStatus::kCrcMismatch);
  EXPECT_EQ(f.result->fetched, 1u);
}

// A fetch of blocks in host memory takes its lease in one active-message round trip, not a
// gRPC call; a request with a block not in host memory (missing, or only on NVMe) goes through
// the gRPC Acquire, which reports it or stages it up.
TEST(ControlByMessageTest, AcquireByMessageForBlocksInHostMemory) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto ns = *client->OpenNamespace(Spec(), "t");
  auto tokens = Tokens(4 * kTokensPerBlock, 41);
  auto blocks = RandomBlocks(4, 8192, 42);
  ASSERT_EQ(client->Publish(ns, tokens, testing::BufferViews(blocks))->stored, 4u);
  auto ids = ComputeBlockIds(ns, kTokensPerBlock, tokens);
  // A small fetch over messages may come inside the answer (fetch in one): counted too.
  auto by_message = [&] {
    return Counter(*client, "acquires_by_message_total") +
           Counter(*client, "fetches_in_one_total");
  };
  const uint64_t before = by_message();
  std::vector<std::vector<uint8_t>> got(4, std::vector<uint8_t>(8192));
  std::vector<MutableBuffer> bufs;
  for (auto& b : got) bufs.push_back({b.data(), b.size()});
  for (int round = 0; round < 3; ++round) {
    auto f = client->Fetch(ns, ids, bufs);
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_EQ(f->fetched, 4u);
    EXPECT_EQ(got, blocks);
  }
  EXPECT_EQ(by_message() - before, 3u);
  // Their leases end by a one-way message too.
  uint64_t open_leases = 1;
  for (int i = 0; i < 200 && open_leases != 0; ++i) {
    auto stats = client->Stats();
    ASSERT_TRUE(stats.ok());
    open_leases = stats->open_leases;
    if (open_leases != 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(open_leases, 0u);
  // A block no tier holds is answered this way too (a remote fetch starts with such misses),
  // with the blocks beside it; and so is a fetch of misses only. (A block on NVMe goes to the
  // gRPC Acquire, which reads it: tests/tiering.)
  BlockId unknown, other;
  unknown.bytes[0] = 0x5a;
  other.bytes[0] = 0x5b;
  std::vector<BlockId> with_miss = {ids[0], unknown};
  for (auto& b : got) std::fill(b.begin(), b.end(), 0);  // (bufs point into them)
  auto f = client->Fetch(ns, with_miss, std::span(bufs).first(2));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->fetched, 1u);
  EXPECT_EQ(f->status[1], BlockStatus::kNotFound);
  EXPECT_EQ(got[0], blocks[0]);
  EXPECT_EQ(by_message() - before, 4u);
  std::vector<BlockId> misses = {unknown, other};
  f = client->Fetch(ns, misses, std::span(bufs).first(2));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->fetched, 0u);
  EXPECT_EQ(f->status[0], BlockStatus::kNotFound);
  EXPECT_EQ(f->status[1], BlockStatus::kNotFound);
  EXPECT_GE(by_message() - before, 5u);
}

TEST(ControlByMessageTest, FetchesOfMissesOnlyAreAnsweredNeverTimedOut) {
  // An answer of misses only carries a lease of no lifetime: the fetch then waits for nothing,
  // and the deadline that lifetime gives must not be checked as if it still waited. (A client
  // that polls without yielding handles the answer in the wait loop, where every 64th turn
  // looks at the deadline: one such fetch in 64 failed with DEADLINE_EXCEEDED.) Over tcp, as
  // a client of another node fetches: the blocks would be pushed.
  testing::ScopedEnv tcp("UCX_TLS", "tcp");
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  ClientOptions o;
  o.endpoint = d.endpoint();
  o.same_node = false;
  o.wait_spin = absl::InfiniteDuration();
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  auto ns = *(*client)->OpenNamespace(Spec(), "t");
  // Larger than a fetch whose bytes come inside the answer: acquired and pushed. Many ids make
  // the answer late enough for the wait loop to turn some hundreds of times first, varying.
  std::vector<uint8_t> buf(64 << 10);
  for (int round = 0; round < 300; ++round) {
    std::vector<MutableBuffer> into(256 + (round * 37) % 1024, {buf.data(), buf.size()});
    std::vector<BlockId> unknown(into.size());
    for (size_t i = 0; i < unknown.size(); ++i) {
      unknown[i].bytes[0] = 0x5c;
      std::memcpy(&unknown[i].bytes[1], &round, sizeof(round));
      std::memcpy(&unknown[i].bytes[8], &i, sizeof(i));
    }
    auto f = (*client)->Fetch(ns, unknown, into);
    ASSERT_TRUE(f.ok()) << "fetch " << round << ": " << f.status();
    ASSERT_EQ(f->fetched, 0u);
    ASSERT_EQ(f->status[0], BlockStatus::kNotFound);
  }
}

TEST(ControlByMessageTest, ANamespaceTheDaemonForgotIsOpenedAgainThroughGrpc) {
  // The gRPC route reopens a namespace the daemon no longer has; a refusal on the message route
  // must lead there, not fail the publish.
  DaemonProcess d("host_tier:\n  capacity: 64MiB\nreservation_timeout: 1s\n"
                  "limits:\n  namespace_idle_timeout: 1s\n");
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto ns = client->OpenNamespace(Spec(), "t");
  ASSERT_TRUE(ns.ok()) << ns.status();
  uint64_t open = 1;
  for (int i = 0; i < 100 && open != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto stats = client->Stats();
    ASSERT_TRUE(stats.ok());
    open = stats->namespaces;
  }
  ASSERT_EQ(open, 0u) << "released as idle";
  auto blocks = RandomBlocks(2, 4096, 54);
  auto r = client->Publish(*ns, Tokens(2 * kTokensPerBlock, 55), testing::BufferViews(blocks));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stored, 2u);
}

// A daemon killed and started again on the same endpoint: the client's data-plane endpoint
// leads to shared memory nobody reads any more, where messages are lost without an error. The
// next calls reach the new daemon without waiting out a deadline on the old endpoint, with and
// without a gRPC call in between, and what they store fetches intact.
TEST(ControlByMessageTest, ARestartedDaemonIsReachedAgainWithoutWaitingOutADeadline) {
  std::vector<std::string> listen;
  // The same secret on both: the namespace keeps its id across the restart.
  const std::string dir = testing::MakeTempDir("restart");
  std::ofstream(dir + "/secret") << "restart-test-secret-0123456789abcdef\n";
  const std::string config =
      "cluster_secret_file: " + dir + "/secret\nhost_tier:\n  capacity: 64MiB\n";
  auto d = testing::OnFreePort(
      &listen, [&](const auto& l) { return std::make_unique<DaemonProcess>(config, l); });
  ASSERT_TRUE(d->ok()) << d->log();
  auto client = Connect(*d);
  ASSERT_TRUE(client);
  auto ns = client->OpenNamespace(Spec(), "t");
  ASSERT_TRUE(ns.ok()) << ns.status();
  uint32_t seed = 60;
  auto publish_and_fetch = [&](const char* when) {
    const auto blocks = RandomBlocks(2, 65536, ++seed);
    const absl::Time t0 = absl::Now();
    auto r = client->Publish(*ns, Tokens(2 * kTokensPerBlock, ++seed),
                             testing::BufferViews(blocks));
    const absl::Duration took = absl::Now() - t0;
    ASSERT_TRUE(r.ok()) << when << ": " << r.status();
    EXPECT_EQ(r->stored, 2u) << when;
    // The client's deadlines are 5 s: a call that waited one out on the old endpoint is slower.
    EXPECT_LT(took, absl::Seconds(2)) << when;
    Fetched f = FetchInto(*client, *ns, r->ids, 65536);
    ASSERT_TRUE(f.result.ok()) << when << ": " << f.result.status();
    EXPECT_EQ(f.result->fetched, 2u) << when;
    EXPECT_EQ(f.blocks, blocks) << when;
  };
  publish_and_fetch("before the restart");
  for (const bool grpc_between : {false, true}) {
    d.reset();  // SIGKILL
    d = std::make_unique<DaemonProcess>(config, listen);
    ASSERT_TRUE(d->ok()) << d->log();
    if (grpc_between) {
      // A gRPC call first (it finds the connection down and reconnects it).
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!client->Stats().ok() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    publish_and_fetch(grpc_between ? "after a restart and a gRPC call" : "right after a restart");
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST(ControlByMessageTest, CommitsThatMustReachOtherNodesGoThroughGrpc) {
  const std::string dir = testing::MakeTempDir("control-cluster");
  std::ofstream(dir + "/secret") << "control-by-message-secret-0123456789\n";
  std::string addr[2], peers;
  for (int i = 0; i < 2; ++i) addr[i] = absl::StrCat("127.0.0.1:", testing::FreePort());
  for (int i = 0; i < 2; ++i) peers += absl::StrCat("\"n", i, "@", addr[i], "\", ");
  std::vector<std::unique_ptr<DaemonProcess>> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(std::make_unique<DaemonProcess>(
        absl::StrCat("node_id: n", i, "\ncluster_secret_file: ", dir,
                     "/secret\nhost_tier:\n  capacity: 64MiB\ncluster:\n  membership: static\n"
                     "  static_nodes: [",
                     peers, "]\n  peer_timeout: 500ms\n"),
        std::vector<std::string>{"--listen", addr[i]}));
  ASSERT_TRUE(testing::AllServing(nodes)) << testing::AllLogs(nodes);
  auto a = Connect(*nodes[0]);
  auto b = Connect(*nodes[1]);
  ASSERT_TRUE(a && b);
  auto ns = a->OpenNamespace(Spec(), "t");
  ASSERT_TRUE(ns.ok());
  ASSERT_TRUE(b->OpenNamespace(Spec(), "t").ok());
  const uint64_t before = ByMessage(*a);
  auto tokens = Tokens(3 * kTokensPerBlock, 56);
  auto blocks = RandomBlocks(3, 8192, 57);
  auto r = a->Publish(*ns, tokens, testing::BufferViews(blocks));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stored, 3u);
  EXPECT_EQ(ByMessage(*a) - before, 1u) << "the Reserve only: the Commit announces to n1";
  // Published means findable at once from the other node.
  auto look = b->Lookup(*ns, tokens);
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->prefix_blocks, 3u);
  std::error_code ec;
  nodes.clear();
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace strata
