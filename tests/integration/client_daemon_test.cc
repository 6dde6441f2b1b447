// End-to-end tests: a real stratad process on loopback driven by libstrata.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

#include "codec/half.h"
#include "codec/synthetic_kv.h"
#include "strata/client.h"
#include "strata/v1/cache.grpc.pb.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/scoped_env.h"
#include "tests/support/test_data.h"
#include "transport/ucx.h"

namespace strata {
namespace {

using testing::DaemonProcess;
using testing::RandomBlocks;
using testing::RunCommand;
using testing::Tokens;

constexpr uint32_t kTokensPerBlock = 16;

NamespaceSpec Spec(const std::string& model = "llama-test") {
  NamespaceSpec s;
  s.model_id = model;
  s.model_revision = "r1";
  s.layout = KvLayout{4, 2, 64, DType::kFloat16, kTokensPerBlock, KvKind::kSeparateKV};
  return s;
}

std::unique_ptr<Client> Connect(const DaemonProcess& d, absl::Duration rpc = absl::Seconds(5)) {
  ClientOptions o;
  o.endpoint = d.endpoint();
  o.rpc_timeout = rpc;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

std::unique_ptr<v1::Cache::Stub> RawStub(const DaemonProcess& d) {
  return v1::Cache::NewStub(grpc::CreateChannel(d.endpoint(), grpc::InsecureChannelCredentials()));
}

void Deadline(grpc::ClientContext& c) {
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
}

TEST(ClientDaemonTest, PublishLookupFetchIsByteIdentical) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto ns = client->OpenNamespace(Spec(), "tenant-a");
  ASSERT_TRUE(ns.ok()) << ns.status();

  auto tokens = Tokens(8 * kTokensPerBlock + 5, 1);  // 8 full blocks + a partial one
  auto blocks = RandomBlocks(8, 64 << 10, 2);
  auto pub = client->Publish(*ns, tokens, testing::BufferViews(blocks));
  ASSERT_TRUE(pub.ok()) << pub.status();
  EXPECT_EQ(pub->stored, 8u);
  EXPECT_EQ(pub->bytes_sent, 8u * (64 << 10));

  auto extended = tokens;
  auto more = Tokens(3 * kTokensPerBlock, 99);
  extended.insert(extended.begin() + 8 * kTokensPerBlock, more.begin(), more.end());
  auto look = client->Lookup(*ns, extended);
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->ids.size(), 11u);
  EXPECT_EQ(look->prefix_blocks, 8u);
  EXPECT_EQ(look->prefix_tokens, 8u * kTokensPerBlock);

  std::vector<std::vector<uint8_t>> out(8, std::vector<uint8_t>(64 << 10, 0));
  std::vector<MutableBuffer> bufs;
  for (auto& b : out) bufs.push_back({b.data(), b.size()});
  ASSERT_TRUE(client->RegisterBuffer(out[0].data(), out[0].size()).ok());
  auto fetched = client->Fetch(*ns, std::span(look->ids).first(8), bufs);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->fetched, 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(fetched->status[i], BlockStatus::kOk);
    EXPECT_EQ(out[i], blocks[i]) << "block " << i;
  }
  // A second process computing the same tokens gets the same ids and finds them.
  auto other = Connect(d);
  ASSERT_TRUE(other);
  auto ns2 = other->OpenNamespace(Spec(), "tenant-a");
  ASSERT_TRUE(ns2.ok());
  EXPECT_EQ(*ns2, *ns);
  EXPECT_EQ(other->Lookup(*ns2, tokens)->prefix_blocks, 8u);
}

TEST(ClientDaemonTest, RepublishIsADedupNoOp) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto ns = *client->OpenNamespace(Spec(), "t");
  auto tokens = Tokens(4 * kTokensPerBlock, 3);
  auto blocks = RandomBlocks(4, 100000, 4);
  ASSERT_EQ(client->Publish(ns, tokens, testing::BufferViews(blocks))->stored, 4u);
  auto again = client->Publish(ns, tokens, testing::BufferViews(blocks));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->stored, 0u);
  EXPECT_EQ(again->deduplicated, 4u);
  EXPECT_EQ(again->bytes_sent, 0u);
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->host_blocks, 4u);
  bool saw = false;
  for (auto& [k, v] : stats->counters)
    if (k == "dedup_blocks_total") {
      EXPECT_EQ(v, 4u);
      saw = true;
    }
  EXPECT_TRUE(saw);
}

TEST(ClientDaemonTest, ConcurrentPublishersAndFetchers) {
  DaemonProcess d("host_tier:\n  capacity: 256MiB\n");
  ASSERT_TRUE(d.ok()) << d.log();
  constexpr int kThreads = 8, kRounds = 12, kBlocks = 4;
  constexpr size_t kBytes = 128 << 10;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 4; ++i) {
    clients.push_back(Connect(d));
    ASSERT_TRUE(clients.back());
  }
  auto ns = *clients[0]->OpenNamespace(Spec(), "t");
  for (auto& c : clients) ASSERT_TRUE(c->OpenNamespace(Spec(), "t").ok());
  // All threads share a common 2-block prefix, so publishers race on the same ids.
  auto shared_prefix = Tokens(2 * kTokensPerBlock, 5);
  std::atomic<int> failures{0}, verified{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Client& c = *clients[t % clients.size()];
      for (int r = 0; r < kRounds; ++r) {
        auto tokens = shared_prefix;
        auto tail = Tokens((kBlocks - 2) * kTokensPerBlock, 1000 + t * 100 + r);
        tokens.insert(tokens.end(), tail.begin(), tail.end());
        // Block contents derive from the ids so every publisher of an id sends the same bytes.
        auto ids = ComputeBlockIds(ns, kTokensPerBlock, tokens);
        std::vector<std::vector<uint8_t>> blocks;
        for (auto& id : ids)
          blocks.push_back(RandomBlocks(1, kBytes, id.bytes[0] | id.bytes[1] << 8)[0]);
        auto pub = c.Publish(ns, tokens, testing::BufferViews(blocks));
        if (!pub.ok()) {
          ++failures;
          continue;
        }
        for (auto s : pub->status)
          if (s != BlockStatus::kOk && s != BlockStatus::kExists && s != BlockStatus::kInProgress)
            ++failures;
        std::vector<std::vector<uint8_t>> out(kBlocks, std::vector<uint8_t>(kBytes));
        std::vector<MutableBuffer> bufs;
        for (auto& b : out) bufs.push_back({b.data(), b.size()});
        auto f = c.Fetch(ns, ids, bufs);
        if (!f.ok()) {
          ++failures;
          continue;
        }
        for (int i = 0; i < kBlocks; ++i) {
          if (f->status[i] == BlockStatus::kOk) {
            if (out[i] != blocks[i])
              ++failures;
            else
              ++verified;
          } else if (pub->status[i] != BlockStatus::kInProgress) {
            ++failures;  // we stored or found it, so it must be fetchable
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GE(verified.load(), kThreads * kRounds * (kBlocks - 2));
  auto stats = clients[0]->Stats();
  EXPECT_EQ(stats->open_reservations, 0u);
}

TEST(ClientDaemonTest, CapacityPressureEvictsLruButNeverLeasedOrPinned) {
  DaemonProcess d(
      "host_tier:\n  capacity: 16MiB\n  high_watermark: 0.9\n  low_watermark: 0.7\n"
      "  max_block_size: 1MiB\n");
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto ns = *client->OpenNamespace(Spec(), "t");
  constexpr size_t kBytes = 1 << 20;
  // Blocks 0..3 first: 0 pinned, 1 leased (held through a raw Acquire), 2 and 3 unprotected.
  std::vector<std::vector<uint32_t>> prompts;
  std::vector<BlockId> first_ids;
  for (int i = 0; i < 40; ++i) {
    prompts.push_back(Tokens(kTokensPerBlock, 500 + i));
    first_ids.push_back(ComputeBlockIds(ns, kTokensPerBlock, prompts.back())[0]);
  }
  auto payload = RandomBlocks(1, kBytes, 9);
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(client->Publish(ns, prompts[i], testing::BufferViews(payload))->stored, 1u);
  ASSERT_EQ((*client->Pin(ns, {&first_ids[0], 1}, absl::Minutes(5)))[0], BlockStatus::kOk);
  auto stub = RawStub(d);
  v1::AcquireRequest acq;
  acq.set_namespace_id(std::string(ns.AsBytes()));
  acq.set_ids(std::string(first_ids[1].AsBytes()));
  v1::AcquireResponse lease;
  grpc::ClientContext c;
  Deadline(c);
  ASSERT_TRUE(stub->Acquire(&c, acq, &lease).ok());
  ASSERT_EQ(lease.status(0), v1::BLOCK_OK);

  for (int i = 4; i < 40; ++i) {
    auto pub = client->Publish(ns, prompts[i], testing::BufferViews(payload));
    ASSERT_TRUE(pub.ok()) << pub.status();
    ASSERT_EQ(pub->stored, 1u) << "block " << i << " " << BlockStatusName(pub->status[0]);
  }
  EXPECT_EQ(*client->LookupIds(ns, {&first_ids[0], 1}), 1u) << "pinned block was evicted";
  EXPECT_EQ(*client->LookupIds(ns, {&first_ids[1], 1}), 1u) << "leased block was evicted";
  EXPECT_EQ(*client->LookupIds(ns, {&first_ids[2], 1}), 0u) << "LRU block survived";
  EXPECT_EQ(*client->LookupIds(ns, {&first_ids[39], 1}), 1u) << "newest block is gone";
  auto stats = client->Stats();
  EXPECT_LE(stats->host_used_bytes, 16u << 20);
  uint64_t lru = 0;
  for (auto& [k, v] : stats->counters)
    if (k == "evictions_lru_total") lru = v;
  EXPECT_GE(lru, 20u);
  // The pinned and leased blocks still hold their original bytes.
  std::vector<uint8_t> out(kBytes);
  MutableBuffer buf{out.data(), out.size()};
  auto f = client->Fetch(ns, {&first_ids[1], 1}, {&buf, 1});
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->status[0], BlockStatus::kOk);
  EXPECT_EQ(out, payload[0]);
}

TEST(ClientDaemonTest, ClientKilledBetweenReserveAndCommitLeavesNothing) {
  DaemonProcess d("host_tier:\n  capacity: 64MiB\nreservation_timeout: 1s\n");
  ASSERT_TRUE(d.ok()) << d.log();
  auto [code, out] =
      RunCommand(std::string(PUBLISH_AND_DIE_BIN) + " " + d.endpoint() + " 4 1048576");
  EXPECT_NE(out.find("dying before commit"), std::string::npos) << out;
  EXPECT_NE(code, 0);
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->host_blocks, 0u);  // nothing visible
  // Space comes back once the reservation expires.
  auto deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    stats = client->Stats();
    if (stats->open_reservations == 0 && stats->host_used_bytes == 0) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(stats->open_reservations, 0u);
  EXPECT_EQ(stats->host_used_bytes, 0u);
  EXPECT_EQ(stats->host_blocks, 0u);
}

TEST(ClientDaemonTest, CommitWithWrongCrcIsRefused) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto ns = *client->OpenNamespace(Spec(), "t");
  auto stub = RawStub(d);
  auto id = ComputeBlockIds(ns, kTokensPerBlock, Tokens(kTokensPerBlock, 8))[0];
  v1::ReserveRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_ids(std::string(id.AsBytes()));
  req.add_sizes(4096);
  v1::ReserveResponse res;
  {
    grpc::ClientContext c;
    Deadline(c);
    ASSERT_TRUE(stub->Reserve(&c, req, &res).ok());
  }
  ASSERT_EQ(res.status(0), v1::BLOCK_OK);
  v1::CommitRequest commit;
  commit.set_reservation_id(res.reservation_id());
  commit.add_crc32c(0xDEADBEEF);  // not the CRC of what the arena holds
  v1::CommitResponse cr;
  {
    grpc::ClientContext c;
    Deadline(c);
    ASSERT_TRUE(stub->Commit(&c, commit, &cr).ok());
  }
  EXPECT_EQ(cr.status(0), v1::BLOCK_CRC_MISMATCH);
  EXPECT_EQ(*client->LookupIds(ns, {&id, 1}), 0u);
  auto stats = client->Stats();
  EXPECT_EQ(stats->host_used_bytes, 0u);
}

// Overwrites 64 bytes at `at` of block `id` in the daemon's arena, behind its back.
void DamageInArena(DaemonProcess& d, const NamespaceId& ns, const BlockId& id, uint64_t at) {
  auto stub = RawStub(d);
  v1::ConnectResponse conn;
  {
    grpc::ClientContext c;
    Deadline(c);
    ASSERT_TRUE(stub->Connect(&c, {}, &conn).ok());
  }
  v1::AcquireRequest acq;
  acq.set_namespace_id(std::string(ns.AsBytes()));
  acq.set_ids(std::string(id.AsBytes()));
  v1::AcquireResponse where;
  {
    grpc::ClientContext c;
    Deadline(c);
    ASSERT_TRUE(stub->Acquire(&c, acq, &where).ok());
  }
  auto ctx = transport::Context::Create(false);
  auto worker = transport::Worker::Create(*ctx);
  auto ep = (*worker)->Connect(conn.worker_address());
  ASSERT_TRUE(ep.ok());
  ASSERT_TRUE((*ep)->SetRemoteKey(conn.arena_rkey()).ok());
  char garbage[64];
  std::memset(garbage, 0x5a, sizeof garbage);
  transport::RmaOp put{transport::RmaOp::kPut, garbage, sizeof garbage,
                       conn.arena_base() + where.offsets(0) + at};
  ASSERT_TRUE((*ep)->Transfer({&put, 1}, absl::Now() + absl::Seconds(5)).ok());
}

TEST(ClientDaemonTest, BlockCorruptedInTheArenaIsReportedNotServed) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto ns = *client->OpenNamespace(Spec(), "t");
  auto tokens = Tokens(3 * kTokensPerBlock, 61);
  auto blocks = RandomBlocks(3, 3 << 20, 62);  // big enough for the pipelined/parallel paths
  ASSERT_EQ(client->Publish(ns, tokens, testing::BufferViews(blocks))->stored, 3u);
  auto ids = ComputeBlockIds(ns, kTokensPerBlock, tokens);
  ASSERT_NO_FATAL_FAILURE(DamageInArena(d, ns, ids[1], 1000));

  std::vector<std::vector<uint8_t>> out(3, std::vector<uint8_t>(3 << 20));
  std::vector<MutableBuffer> bufs;
  for (auto& b : out) bufs.push_back({b.data(), b.size()});
  auto f = client->Fetch(ns, ids, bufs);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->status[0], BlockStatus::kOk);
  EXPECT_EQ(f->status[1], BlockStatus::kCrcMismatch);
  EXPECT_EQ(f->status[2], BlockStatus::kOk);
  EXPECT_EQ(f->fetched, 2u);
  EXPECT_EQ(out[0], blocks[0]);
  EXPECT_EQ(out[2], blocks[2]);
}

// Blocks published under a codec policy travel and are stored encoded, and come back decoded:
// bit-exact for lossless, within quantization error for quant.
TEST(ClientDaemonTest, CodecPoliciesEncodeOnPublishAndDecodeOnFetch) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Connect(d);
  ASSERT_TRUE(client);
  KvLayout layout{2, 2, 64, DType::kFloat16, kTokensPerBlock, KvKind::kSeparateKV};
  const size_t kBlocks = 4;
  auto kv = codec::GenerateSyntheticKv(layout, kBlocks, codec::SyntheticKvParams{});
  ASSERT_EQ(kv.size(), kBlocks * layout.BlockBytes());
  std::vector<ConstBuffer> in;
  for (size_t b = 0; b < kBlocks; ++b)
    in.push_back({kv.data() + b * layout.BlockBytes(), layout.BlockBytes()});
  auto tokens = Tokens(kBlocks * kTokensPerBlock, 81);

  for (std::string policy : {"lossless", "quant:k4v4", "int8-g64"}) {
    SCOPED_TRACE(policy);
    NamespaceSpec spec = Spec();
    spec.layout = layout;
    spec.codec_policy = policy;
    auto ns = client->OpenNamespace(spec, "t");
    ASSERT_TRUE(ns.ok()) << ns.status();
    auto pub = client->Publish(*ns, tokens, in);
    ASSERT_TRUE(pub.ok()) << pub.status();
    ASSERT_EQ(pub->stored, kBlocks);
    // What travels is the encoded blob: ~4.5 bits/value for k4v4, ~8.5 for int8 with scales,
    // plus per-section headers and rANS states, which weigh on these tiny 16 KiB blocks.
    const double limit = policy == "lossless" ? 1.05 : policy == "int8-g64" ? 0.6 : 0.45;
    EXPECT_LT(pub->bytes_sent, kv.size() * limit) << "blob larger than expected";

    std::vector<uint8_t> out(kv.size());
    std::vector<MutableBuffer> bufs;
    for (size_t b = 0; b < kBlocks; ++b)
      bufs.push_back({out.data() + b * layout.BlockBytes(), layout.BlockBytes()});
    auto f = client->Fetch(*ns, pub->ids, bufs);
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_EQ(f->fetched, kBlocks);
    EXPECT_EQ(f->sizes[0], layout.BlockBytes());
    EXPECT_EQ(f->bytes_received, pub->bytes_sent);
    if (policy == "lossless") {
      EXPECT_EQ(out, kv);
    } else {
      double err = 0, ref = 0;
      for (size_t i = 0; i < kv.size() / 2; ++i) {
        uint16_t a, b;
        std::memcpy(&a, kv.data() + 2 * i, 2);
        std::memcpy(&b, out.data() + 2 * i, 2);
        double x = codec::HalfToFloat(a), y = codec::HalfToFloat(b);
        err += (x - y) * (x - y);
        ref += x * x;
      }
      EXPECT_LT(err / ref, policy == "int8-g64" ? 1e-3 : 0.05);
    }
  }
  // A block of the wrong size is refused under a codec policy, with the sizes named.
  NamespaceSpec spec = Spec();
  spec.layout = layout;
  spec.codec_policy = "lossless";
  auto ns = *client->OpenNamespace(spec, "t");
  std::vector<uint8_t> small(100);
  ConstBuffer bad{small.data(), small.size()};
  auto pub = client->Publish(ns, Tokens(kTokensPerBlock, 82), {&bad, 1});
  EXPECT_EQ(pub.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(pub.status().message().find("needs"), std::string::npos) << pub.status();
  // An unknown codec policy is refused at OpenNamespace.
  spec.codec_policy = "zip-9";
  auto bad_ns = client->OpenNamespace(spec, "t");
  EXPECT_NE(bad_ns.status().message().find("codec_policy"), std::string::npos) << bad_ns.status();
}

TEST(ClientDaemonTest, UnknownIdsAndWrongNamespacesGetClearErrors) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto ns_a = *client->OpenNamespace(Spec(), "tenant-a");
  auto ns_b = *client->OpenNamespace(Spec(), "tenant-b");
  ASSERT_NE(ns_a, ns_b);
  auto tokens = Tokens(2 * kTokensPerBlock, 11);
  auto blocks = RandomBlocks(2, 4096, 12);
  ASSERT_EQ(client->Publish(ns_a, tokens, testing::BufferViews(blocks))->stored, 2u);

  // Tenant B computing the same tokens gets other ids and finds nothing.
  EXPECT_EQ(client->Lookup(ns_b, tokens)->prefix_blocks, 0u);
  // Tenant B presenting tenant A's ids gets per-block misses, never A's bytes.
  auto ids_a = ComputeBlockIds(ns_a, kTokensPerBlock, tokens);
  std::vector<uint8_t> out(4096);
  std::vector<MutableBuffer> bufs(2, MutableBuffer{out.data(), out.size()});
  auto f = client->Fetch(ns_b, ids_a, bufs);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->status[0], BlockStatus::kNotFound);
  EXPECT_EQ(f->fetched, 0u);
  // Unknown ids: per-block not found.
  BlockId unknown = ComputeBlockId(ns_a, std::vector<uint32_t>{1, 2, 3});
  auto f2 = client->Fetch(ns_a, {&unknown, 1}, {&bufs[0], 1});
  ASSERT_TRUE(f2.ok());
  EXPECT_EQ(f2->status[0], BlockStatus::kNotFound);
  // A namespace never opened on the daemon: a clear error naming it.
  NamespaceId never = ComputeBlockId(Digest{}, std::vector<uint32_t>{42});
  auto f3 = client->LookupIds(never, {&unknown, 1});
  EXPECT_EQ(f3.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(f3.status().message().find(never.ShortHex()), std::string::npos) << f3.status();
  EXPECT_NE(f3.status().message().find("not open"), std::string::npos) << f3.status();
  // A malformed request: ids not a multiple of 32 bytes.
  auto stub = RawStub(d);
  v1::LookupRequest bad;
  bad.set_namespace_id(std::string(ns_a.AsBytes()));
  bad.set_ids("short");
  v1::LookupResponse lr;
  grpc::ClientContext c;
  Deadline(c);
  auto s = stub->Lookup(&c, bad, &lr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("multiple of 32"), std::string::npos);
  // A fetch buffer too small for the block is reported for that block.
  std::vector<uint8_t> tiny(100);
  MutableBuffer tb{tiny.data(), tiny.size()};
  auto f4 = client->Fetch(ns_a, {&ids_a[0], 1}, {&tb, 1});
  ASSERT_TRUE(f4.ok());
  EXPECT_EQ(f4->status[0], BlockStatus::kInvalid);
  // An invalid namespace spec is refused with the field named.
  auto bad_spec = Spec();
  bad_spec.layout.head_dim = 0;
  auto open = client->OpenNamespace(bad_spec, "t");
  EXPECT_NE(open.status().message().find("head_dim"), std::string::npos);
}

// Lookups of up to 1,024 ids ride the UCX active-message fast path, longer ones gRPC: both give
// the same answers, including partial prefixes and the namespace error.
TEST(ClientDaemonTest, FastPathAndGrpcLookupsAgree) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto ns = *client->OpenNamespace(Spec(), "tenant-a");
  constexpr size_t kBlocks = 1500;
  auto tokens = Tokens(kBlocks * kTokensPerBlock, 21);
  std::vector<uint8_t> blob(256, 3);
  std::vector<ConstBuffer> views(kBlocks, ConstBuffer{blob.data(), blob.size()});
  auto pub = client->Publish(ns, tokens, views);
  ASSERT_TRUE(pub.ok()) << pub.status();
  const auto& ids = pub->ids;
  EXPECT_EQ(*client->LookupIds(ns, ids), kBlocks);                       // gRPC
  EXPECT_EQ(*client->LookupIds(ns, std::span(ids).first(1000)), 1000u);  // fast path
  ASSERT_TRUE(client->Evict(ns, {&ids[700], 1}).ok());
  EXPECT_EQ(*client->LookupIds(ns, ids), 700u);
  EXPECT_EQ(*client->LookupIds(ns, std::span(ids).first(1000)), 700u);
  EXPECT_EQ(*client->LookupIds(ns, std::span(ids).subspan(701)), 799u);
  auto look = client->Lookup(ns, std::span(tokens).first(900 * kTokensPerBlock));
  ASSERT_TRUE(look.ok());
  EXPECT_EQ(look->prefix_blocks, 700u);
  NamespaceId never = ComputeBlockId(Digest{}, std::vector<uint32_t>{43});
  auto err = client->LookupIds(never, std::span(ids).first(4));
  EXPECT_EQ(err.status().code(), absl::StatusCode::kFailedPrecondition) << err.status();
}

// A counter of the daemon's Stats answer; 0 when it has none (or Stats failed).
uint64_t DaemonCounter(Client& c, const std::string& counter) {
  auto stats = c.Stats();
  if (stats.ok())
    for (const auto& [name, n] : stats->counters)
      if (name == counter) return n;
  return 0;
}

// Where the arena is not mapped, fetched bytes move by one-sided get ("rma") or by the daemon
// pushing them ("push"); both must deliver the same verified bytes, large blocks (rendezvous) and
// small ones (eager) alike, and push mode must really push.
TEST(ClientDaemonTest, RmaAndPushFetchesAgree) {
  const char* tls = std::getenv("UCX_TLS");
  if (tls == nullptr || std::string(tls) != "tcp")
    GTEST_SKIP() << "runs in the UCX_TLS=tcp pass: with shared memory the arena is mapped "
                    "and both modes copy through the mapping";
  DaemonProcess d("host_tier:\n  capacity: 256MiB\n");
  ASSERT_TRUE(d.ok()) << d.log();
  auto tokens = Tokens(6 * kTokensPerBlock, 31);
  std::vector<std::vector<uint8_t>> blocks = RandomBlocks(3, 3 << 20, 32);
  for (auto& b : RandomBlocks(3, 1000, 33)) blocks.push_back(b);
  std::vector<std::vector<uint8_t>> got[2];
  const char* modes[2] = {"rma", "push"};
  NamespaceId ns;
  for (int m = 0; m < 2; ++m) {
    ClientOptions o;
    o.endpoint = d.endpoint();
    o.fetch_transfer = modes[m];
    // As for a daemon on another node (peer-failure detection): over tcp the arena is then not
    // mapped (with same_node it still was: the push path went untested), so the bytes move by
    // rma or push.
    o.same_node = false;
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    ns = *(*c)->OpenNamespace(Spec(), "t");
    if (m == 0) {
      // The large blocks commit through gRPC: the daemon checks them on a gRPC thread, while UCX
      // wrote them on its progress thread (under TSan, ProgressThread::OrderAfterProgress). The
      // small ones commit by active message, on the progress thread itself.
      ClientOptions by_grpc = o;
      by_grpc.control_by_message = false;
      auto g = Client::Connect(by_grpc);
      ASSERT_TRUE(g.ok()) << g.status();
      ASSERT_TRUE((*g)->OpenNamespace(Spec(), "t").ok());
      std::vector<std::vector<uint8_t>> large(blocks.begin(), blocks.begin() + 3);
      // Checked before use: a failed publish must end the test with the daemon's log, which
      // DaemonProcess prints (e.g. a sanitizer's report), not abort the process.
      auto first = (*g)->Publish(ns, std::span(tokens).first(3 * kTokensPerBlock),
                                 testing::BufferViews(large));
      ASSERT_TRUE(first.ok()) << first.status();
      ASSERT_EQ(first->stored, 3u);
      auto rest = (*c)->Publish(ns, tokens, testing::BufferViews(blocks));
      ASSERT_TRUE(rest.ok()) << rest.status();
      ASSERT_EQ(rest->stored, 3u);
    }
    auto ids = ComputeBlockIds(ns, kTokensPerBlock, tokens);
    got[m].assign(6, std::vector<uint8_t>(3 << 20));
    std::vector<MutableBuffer> bufs;
    for (auto& b : got[m]) bufs.push_back({b.data(), b.size()});
    auto pushed = [&] { return DaemonCounter(**c, "pushed_blocks_total"); };
    const uint64_t pushed_before = pushed();
    auto f = (*c)->Fetch(ns, ids, bufs);
    ASSERT_TRUE(f.ok()) << modes[m] << ": " << f.status();
    ASSERT_EQ(f->fetched, 6u) << modes[m];
    // The daemon pushed the blocks in push mode and none in rma mode.
    EXPECT_EQ(pushed() - pushed_before, m == 1 ? 6u : 0u) << modes[m];
    for (size_t i = 0; i < 6; ++i) {
      ASSERT_EQ(f->sizes[i], blocks[i].size());
      EXPECT_TRUE(std::equal(blocks[i].begin(), blocks[i].end(), got[m][i].begin()))
          << modes[m] << " block " << i;
    }
  }
}

uint64_t OpenLeases(Client& c) {
  auto st = c.Stats();
  return st.ok() ? st->open_leases : ~0ull;
}

// With three data-plane workers (each client's endpoint on one of them, every worker's
// progress thread running at once), six clients that each publish and fetch their own blocks
// concurrently get every byte back, every acquire, reserve and commit answered by message:
// over tcp the 1 MiB blocks go both ways in pieces, whose per-block state the workers share.
TEST(ClientDaemonTest, SeveralDataPlaneWorkersMoveEveryClientsBytes) {
  DaemonProcess d("host_tier:\n  capacity: 256MiB\ndata_plane_workers: 3\n");
  ASSERT_TRUE(d.ok()) << d.log();
  constexpr int kClients = 6, kRounds = 6, kBlocks = 3;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kClients; ++i) {
    ClientOptions o;
    o.endpoint = d.endpoint();
    o.same_node = false;  // by push and by message, not by mapping the arena
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(std::move(*c));
  }
  auto ns = *clients[0]->OpenNamespace(Spec(), "t");
  for (auto& c : clients) ASSERT_TRUE(c->OpenNamespace(Spec(), "t").ok());
  std::atomic<int> failures{0}, verified{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kClients; ++t)
    threads.emplace_back([&, t] {
      Client& c = *clients[t];
      for (int r = 0; r < kRounds; ++r) {
        const auto tokens = Tokens(kBlocks * kTokensPerBlock, 5000 + 100 * t + r);
        const auto blocks =
            RandomBlocks(kBlocks, (size_t{1} << 20) + 64 * t, static_cast<uint32_t>(t * 31 + r));
        auto pub = c.Publish(ns, tokens, testing::BufferViews(blocks));
        if (!pub.ok() || pub->stored != kBlocks) {
          ++failures;
          continue;
        }
        std::vector<std::vector<uint8_t>> out(kBlocks, std::vector<uint8_t>(blocks[0].size()));
        std::vector<MutableBuffer> bufs;
        for (auto& b : out) bufs.push_back({b.data(), b.size()});
        auto f = c.Fetch(ns, ComputeBlockIds(ns, kTokensPerBlock, tokens), bufs);
        if (!f.ok() || f->fetched != kBlocks) {
          ++failures;
          continue;
        }
        for (int i = 0; i < kBlocks; ++i) (out[i] == blocks[i] ? verified : failures)++;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(verified.load(), kClients * kRounds * kBlocks);
  auto stats = clients[0]->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->open_reservations, 0u);
  // A fetch's release is a message its worker takes in its own time (the Stats call goes by
  // gRPC): every lease is gone soon, not at once.
  for (int i = 0; i < 200 && OpenLeases(*clients[0]) != 0; ++i)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(OpenLeases(*clients[0]), 0u);
  // Every worker answered by message (a client whose worker did not would have fallen back to
  // gRPC): each fetch's acquire and each publish's reserve and commit, and no message dropped.
  Client& c0 = *clients[0];
  EXPECT_EQ(DaemonCounter(c0, "am_dropped_total"), 0u);
  EXPECT_GE(DaemonCounter(c0, "acquires_by_message_total"), uint64_t{kClients} * kRounds);
  EXPECT_GE(DaemonCounter(c0, "reserves_and_commits_by_message_total"),
            uint64_t{kClients} * kRounds);
  const char* tls = std::getenv("UCX_TLS");
  if (tls != nullptr && std::string(tls) == "tcp") {
    // Every block went both ways by the workers' messages: published in pieces, then pushed
    // (over shared memory the clients read the arena themselves).
    EXPECT_EQ(DaemonCounter(c0, "published_in_pieces_total"),
              uint64_t{kClients} * kRounds * kBlocks);
    EXPECT_GE(DaemonCounter(c0, "pushed_blocks_total"), uint64_t{kClients} * kRounds * kBlocks);
  }
}

// With several data-plane workers, a client whose endpoint maps the arena (shared memory: it
// copies its blocks itself) takes the first worker whatever turn Connect gave it, so the other
// workers' threads are left to clients whose bytes the daemon moves; those still go round the
// workers. Over tcp nothing maps, and every client keeps its turn.
TEST(ClientDaemonTest, ClientsThatMapTheArenaTakeTheFirstWorker) {
  DaemonProcess d("host_tier:\n  capacity: 64MiB\ndata_plane_workers: 3\n");
  ASSERT_TRUE(d.ok()) << d.log();
  // Each client's UCX context reads UCX_TLS when it is made: "tcp" there keeps a client from
  // mapping the arena (the daemon keeps every transport); its fetches are then pushed.
  auto connect = [&](bool over_tcp) {
    std::optional<testing::ScopedEnv> env;
    if (over_tcp) env.emplace("UCX_TLS", "tcp");
    ClientOptions o;
    o.endpoint = d.endpoint();
    if (over_tcp) o.fetch_transfer = "push";  // not RMA, even where an RDMA device is
    auto c = Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  };
  auto requests = [&](Client& c) {
    std::vector<uint64_t> r;
    for (int w = 0; w < 3; ++w)
      r.push_back(DaemonCounter(c, "data_plane_worker_" + std::to_string(w) + "_requests_total"));
    return r;
  };
  uint32_t seed = 300;
  // Three clients (Connect's turns 1, 2, 0 after the probe's 0) each publish and fetch two
  // blocks of their own.
  auto work = [&](bool over_tcp) {
    std::vector<std::unique_ptr<Client>> clients;
    for (int i = 0; i < 3; ++i) clients.push_back(connect(over_tcp));
    for (auto& c : clients) {
      ASSERT_NE(c, nullptr);
      auto ns = c->OpenNamespace(Spec(), "t");
      ASSERT_TRUE(ns.ok()) << ns.status();
      const auto tokens = Tokens(2 * kTokensPerBlock, ++seed * 1000);
      const auto blocks = RandomBlocks(2, 64 << 10, seed);
      auto pub = c->Publish(*ns, tokens, testing::BufferViews(blocks));
      ASSERT_TRUE(pub.ok()) << pub.status();
      ASSERT_EQ(pub->stored, 2u);
      std::vector<std::vector<uint8_t>> out(2, std::vector<uint8_t>(blocks[0].size()));
      std::vector<MutableBuffer> bufs;
      for (auto& b : out) bufs.push_back({b.data(), b.size()});
      auto f = c->Fetch(*ns, ComputeBlockIds(*ns, kTokensPerBlock, tokens), bufs);
      ASSERT_TRUE(f.ok()) << f.status();
      ASSERT_EQ(f->fetched, 2u);
      EXPECT_TRUE(out == blocks);
    }
  };
  auto probe = connect(false);
  ASSERT_NE(probe, nullptr);
  const std::vector<uint64_t> r0 = requests(*probe);
  const uint64_t pushed0 = DaemonCounter(*probe, "pushed_blocks_total");
  ASSERT_NO_FATAL_FAILURE(work(false));
  const std::vector<uint64_t> r1 = requests(*probe);
  ASSERT_GT(r1[0] + r1[1] + r1[2], r0[0] + r0[1] + r0[2]);  // counted at all
  // Where shared memory reaches the daemon (not the tcp pass, nor a host without a usable
  // /dev/shm) they fetched through the mapping, nothing pushed.
  const char* tls = std::getenv("UCX_TLS");
  const bool maps = DaemonCounter(*probe, "pushed_blocks_total") == pushed0;
  if (tls == nullptr) {
    EXPECT_TRUE(maps) << "no client mapped the arena over shared memory";
  }
  if (maps) {
    // Every request on the first worker.
    EXPECT_GT(r1[0], r0[0]);
    EXPECT_EQ(r1[1], r0[1]);
    EXPECT_EQ(r1[2], r0[2]);
  } else {
    for (int w = 0; w < 3; ++w) EXPECT_GT(r1[w], r0[w]) << "worker " << w;
  }
  // Clients whose bytes the daemon moves keep their turns: each worker served one of them.
  const uint64_t pushed1 = DaemonCounter(*probe, "pushed_blocks_total");
  ASSERT_NO_FATAL_FAILURE(work(true));
  EXPECT_GE(DaemonCounter(*probe, "pushed_blocks_total"), pushed1 + 6);
  const std::vector<uint64_t> r2 = requests(*probe);
  for (int w = 0; w < 3; ++w) EXPECT_GT(r2[w], r1[w]) << "worker " << w;
}

// Over tcp, a block larger than a receive segment is pushed in pieces, each copied and checked
// as it arrives: by the acquire-and-push request (the default) and by the push that follows a
// gRPC Acquire alike, a damaged block is still caught, and with pieces off the blocks come
// whole. Blocks over 256 KiB are published in pieces the same way round.
TEST(ClientDaemonTest, OverTcpLargeBlocksTravelInCheckedPieces) {
  const char* tls = std::getenv("UCX_TLS");
  if (tls == nullptr || std::string(tls) != "tcp")
    GTEST_SKIP() << "runs in the UCX_TLS=tcp pass: pieces are for endpoints over tcp";
  ::strata::testing::ScopedEnv segment("UCX_TCP_RX_SEG_SIZE", "64K");  // UCX's default
  DaemonProcess d("host_tier:\n  capacity: 256MiB\n");
  ASSERT_TRUE(d.ok()) << d.log();
  auto tokens = Tokens(4 * kTokensPerBlock, 71);
  std::vector<std::vector<uint8_t>> blocks;
  for (size_t n : {size_t{1000}, size_t{64} << 10, (size_t{1} << 20) + 17, size_t{3} << 20})
    blocks.push_back(RandomBlocks(1, n, 72 + static_cast<uint32_t>(blocks.size()))[0]);
  ClientOptions o;
  o.endpoint = d.endpoint();
  o.same_node = false;  // over tcp the arena is then not mapped: fetches go by push
  auto publisher = Client::Connect(o);
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  NamespaceId ns = *(*publisher)->OpenNamespace(Spec(), "t");
  // Published in pieces too: the two blocks over 256 KiB (smaller ones go whole and eagerly).
  const uint64_t in_pieces_before = DaemonCounter(**publisher, "published_in_pieces_total");
  auto published = (*publisher)->Publish(ns, tokens, testing::BufferViews(blocks));
  ASSERT_TRUE(published.ok()) << published.status();
  ASSERT_EQ(published->stored, 4u);
  EXPECT_EQ(DaemonCounter(**publisher, "published_in_pieces_total") - in_pieces_before, 2u);
  {
    // With pieces off the same blocks (other tokens) go whole.
    ClientOptions whole = o;
    whole.push_piece_bytes = 0;
    auto w = Client::Connect(whole);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->OpenNamespace(Spec(), "t").ok());
    auto again = (*w)->Publish(ns, Tokens(4 * kTokensPerBlock, 79), testing::BufferViews(blocks));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->stored, 4u);
    EXPECT_EQ(DaemonCounter(**w, "published_in_pieces_total") - in_pieces_before, 2u);
  }
  auto ids = ComputeBlockIds(ns, kTokensPerBlock, tokens);
  ASSERT_NO_FATAL_FAILURE(DamageInArena(d, ns, ids[2], 900000));  // in piece 15 of 17
  struct Variant {
    const char* name;
    bool by_message;
    std::optional<uint32_t> piece_bytes;
    std::vector<size_t> order;  // of the blocks in the fetch
    uint64_t pieces;
  };
  // 64 KiB: 2 pieces; 1 MiB + 17: 17; 3 MiB: 49. With a small block first (1000 bytes) it comes
  // whole, the answer in its header; with a larger one first the answer rides in its first
  // piece.
  const std::vector<size_t> in_order = {0, 1, 2, 3};
  for (const Variant& v :
       {Variant{"acquire-and-push", true, std::nullopt, in_order, 2 + 17 + 49},
        Variant{"acquire-and-push, 64 KiB first", true, std::nullopt, {1, 0, 2, 3}, 2 + 17 + 49},
        Variant{"acquire-and-push, largest first", true, std::nullopt, {3, 2, 1, 0}, 2 + 17 + 49},
        Variant{"gRPC acquire, then push", false, std::nullopt, in_order, 2 + 17 + 49},
        Variant{"pieces off", true, 0, in_order, 0}}) {
    ClientOptions vo = o;
    vo.control_by_message = v.by_message;
    vo.push_piece_bytes = v.piece_bytes;
    auto c = Client::Connect(vo);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->OpenNamespace(Spec(), "t").ok());
    const std::vector<size_t>& order = v.order;
    std::vector<BlockId> asked;
    std::vector<std::vector<uint8_t>> out;
    std::vector<MutableBuffer> bufs;
    for (size_t i : order) {
      asked.push_back(ids[i]);
      out.emplace_back(blocks[i].size());
    }
    for (auto& b : out) bufs.push_back({b.data(), b.size()});
    const uint64_t pieces_before = DaemonCounter(**c, "pushed_pieces_total");
    auto f = (*c)->Fetch(ns, asked, bufs);
    ASSERT_TRUE(f.ok()) << v.name << ": " << f.status();
    EXPECT_EQ(DaemonCounter(**c, "pushed_pieces_total") - pieces_before, v.pieces) << v.name;
    for (size_t k = 0; k < order.size(); ++k) {
      const size_t i = order[k];
      EXPECT_EQ(f->status[k], i == 2 ? BlockStatus::kCrcMismatch : BlockStatus::kOk)
          << v.name << " block " << i;
      if (i != 2) {
        EXPECT_EQ(out[k], blocks[i]) << v.name << " block " << i;
      }
    }
    // Every send's read hold ended with it: no lease outlives the fetch (a hold counted for a
    // piece that never went would keep the blocks leased, and unevictable, for ever). The one
    // DamageInArena took stays.
    for (int t = 0; t < 200 && OpenLeases(**c) != 1; ++t) absl::SleepFor(absl::Milliseconds(10));
    EXPECT_EQ(OpenLeases(**c), 1u) << v.name;
  }
}

TEST(ClientDaemonTest, PinUnpinAndCascadeEvict) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto ns = *client->OpenNamespace(Spec(), "t");
  auto tokens = Tokens(5 * kTokensPerBlock, 21);
  auto blocks = RandomBlocks(5, 8192, 22);
  ASSERT_EQ(client->Publish(ns, tokens, testing::BufferViews(blocks))->stored, 5u);
  auto ids = ComputeBlockIds(ns, kTokensPerBlock, tokens);
  ASSERT_EQ((*client->Pin(ns, {&ids[4], 1}, absl::Minutes(1)))[0], BlockStatus::kOk);
  auto ev = client->Evict(ns, {&ids[2], 1}, /*cascade=*/true);
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(ev->removed_blocks, 2u);  // 2 and 3; 4 is pinned
  EXPECT_EQ(client->Lookup(ns, tokens)->prefix_blocks, 2u);
  EXPECT_EQ(*client->LookupIds(ns, {&ids[4], 1}), 1u);
  ASSERT_EQ((*client->Unpin(ns, {&ids[4], 1}))[0], BlockStatus::kOk);
  EXPECT_EQ(client->Evict(ns, {&ids[4], 1})->removed_blocks, 1u);
}

TEST(ClientDaemonTest, KilledDaemonMakesCallsFailWithinTheirDeadline) {
  auto d = std::make_unique<DaemonProcess>();
  ASSERT_TRUE(d->ok()) << d->log();
  auto client = Connect(*d, absl::Seconds(1));
  ASSERT_TRUE(client);
  auto ns = *client->OpenNamespace(Spec(), "t");
  auto tokens = Tokens(2 * kTokensPerBlock, 31);
  auto blocks = RandomBlocks(2, 65536, 32);
  ASSERT_EQ(client->Publish(ns, tokens, testing::BufferViews(blocks))->stored, 2u);
  auto ids = ComputeBlockIds(ns, kTokensPerBlock, tokens);
  d->Signal(SIGKILL);
  ASSERT_TRUE(d->WaitExit(std::chrono::seconds(5)).has_value());

  auto timed = [](auto&& fn) {
    absl::Time t0 = absl::Now();
    absl::Status s = fn();
    return std::make_pair(s, absl::Now() - t0);
  };
  std::vector<uint8_t> out(65536);
  std::vector<MutableBuffer> bufs(2, MutableBuffer{out.data(), out.size()});
  auto [s1, t1] = timed([&] { return client->Lookup(ns, tokens).status(); });
  auto [s2, t2] = timed([&] { return client->Fetch(ns, ids, bufs).status(); });
  auto more = Tokens(2 * kTokensPerBlock, 33);
  auto [s3, t3] = timed([&] { return client->Publish(ns, more, testing::BufferViews(blocks)).status(); });
  for (auto& [s, t] : {std::pair{s1, t1}, {s2, t2}, {s3, t3}}) {
    EXPECT_FALSE(s.ok());
    EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable ||
                s.code() == absl::StatusCode::kDeadlineExceeded)
        << s;
    EXPECT_LT(t, absl::Seconds(3)) << s;
  }
  EXPECT_NE(s1.message().find("did not answer"), std::string::npos) << s1;
}

TEST(ClientDaemonTest, DaemonKilledDuringFetchesFailsThemWithinTheDeadline) {
  auto d = std::make_unique<DaemonProcess>("host_tier:\n  capacity: 256MiB\n");
  ASSERT_TRUE(d->ok()) << d->log();
  ClientOptions o;
  o.endpoint = d->endpoint();
  o.rpc_timeout = absl::Seconds(1);
  o.transfer_timeout = absl::Seconds(2);
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok());
  auto ns = *(*client)->OpenNamespace(Spec(), "t");
  auto tokens = Tokens(16 * kTokensPerBlock, 51);
  auto blocks = RandomBlocks(16, 4 << 20, 52);
  ASSERT_EQ((*client)->Publish(ns, tokens, testing::BufferViews(blocks))->stored, 16u);
  auto ids = ComputeBlockIds(ns, kTokensPerBlock, tokens);
  std::vector<std::vector<uint8_t>> out(16, std::vector<uint8_t>(4 << 20));
  std::vector<MutableBuffer> bufs;
  for (auto& b : out) bufs.push_back({b.data(), b.size()});
  std::atomic<bool> stop{false};
  std::atomic<int> ok_calls{0}, failed_calls{0}, corrupt{0};
  absl::Duration slowest;
  std::thread fetcher([&] {
    while (!stop) {
      absl::Time t0 = absl::Now();
      auto f = (*client)->Fetch(ns, ids, bufs);
      slowest = std::max(slowest, absl::Now() - t0);
      if (!f.ok()) {
        ++failed_calls;
        continue;
      }
      ++ok_calls;
      for (size_t i = 0; i < 16; ++i)
        if (f->status[i] == BlockStatus::kOk && out[i] != blocks[i]) ++corrupt;
    }
  });
  // Kill it mid-stream, once fetches are flowing (a loaded machine may need a while).
  for (int i = 0; i < 500 && ok_calls.load() == 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  absl::SleepFor(absl::Milliseconds(50));
  d->Signal(SIGKILL);
  ASSERT_TRUE(d->WaitExit(std::chrono::seconds(5)).has_value());
  absl::SleepFor(absl::Milliseconds(1500));
  stop = true;
  fetcher.join();
  EXPECT_GT(ok_calls.load(), 0);
  EXPECT_GT(failed_calls.load(), 0);  // calls after the kill fail instead of hanging
  EXPECT_EQ(corrupt.load(), 0);       // nothing reported OK carries wrong bytes
  EXPECT_LT(slowest, absl::Seconds(3));
}

TEST(ClientDaemonTest, SigtermDrainsAndExitsZero) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto ns = *client->OpenNamespace(Spec(), "t");
  auto blocks = RandomBlocks(1, 4096, 41);
  ASSERT_EQ(client->Publish(ns, Tokens(kTokensPerBlock, 42), testing::BufferViews(blocks))->stored, 1u);
  d.Signal(SIGTERM);
  auto code = d.WaitExit(std::chrono::seconds(15));
  ASSERT_TRUE(code.has_value()) << "stratad did not exit after SIGTERM";
  EXPECT_EQ(*code, 0) << d.log();
  EXPECT_NE(d.log().find("exited cleanly"), std::string::npos) << d.log();
}

TEST(ClientDaemonTest, BadConfigIsRefusedNamingTheField) {
  struct Case {
    std::string yaml, field;
  };
  for (const Case& c :
       {Case{"host_tier:\n  capacity: lots\n", "host_tier.capacity"},
        Case{"host_tier:\n  high_watermark: 0.5\n  low_watermark: 0.9\n",
             "host_tier.low_watermark"},
        Case{"lease_timout: 5s\n", "lease_timout"}, Case{"log_level: chatty\n", "log_level"},
        Case{"listen: [1, 2]\n", "listen"}}) {
    DaemonProcess d(c.yaml);
    EXPECT_FALSE(d.ok());
    auto code = d.WaitExit(std::chrono::seconds(5));
    ASSERT_TRUE(code.has_value());
    EXPECT_EQ(*code, 2);
    EXPECT_NE(d.log().find("'" + c.field + "'"), std::string::npos) << d.log();
  }
}

TEST(ClientDaemonTest, ServesOnAUnixSocket) {
  std::string sock = testing::MakeTempDir("sock") + "/stratad.sock";
  DaemonProcess d("", {"--listen", "unix:" + sock});
  ASSERT_TRUE(d.ok()) << d.log();
  EXPECT_EQ(d.endpoint(), "unix:" + sock);
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto ns = *client->OpenNamespace(Spec(), "t");
  auto tokens = Tokens(kTokensPerBlock, 71);
  auto blocks = RandomBlocks(1, 8192, 72);
  ASSERT_EQ(client->Publish(ns, tokens, testing::BufferViews(blocks))->stored, 1u);
  EXPECT_EQ(client->Lookup(ns, tokens)->prefix_blocks, 1u);
}

TEST(ClientDaemonTest, StratactlStatusAndStatsJson) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto [code, out] =
      RunCommand(std::string(STRATACTL_BIN) + " --endpoint " + d.endpoint() + " status --json");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"status\":\"serving\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"capacity_bytes\":67108864"), std::string::npos) << out;
  auto [code2, out2] =
      RunCommand(std::string(STRATACTL_BIN) + " stats --json --endpoint " + d.endpoint());
  EXPECT_EQ(code2, 0);
  EXPECT_NE(out2.find("\"committed_blocks_total\":0"), std::string::npos) << out2;
  auto [code3, out3] =
      RunCommand(std::string(STRATACTL_BIN) + " status --endpoint 127.0.0.1:1 --timeout 1");
  EXPECT_EQ(code3, 3);
  EXPECT_NE(out3.find("cannot reach stratad"), std::string::npos) << out3;
}

TEST(ClientDaemonTest, StratactlListsInspectsAndPins) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto ns = *client->OpenNamespace(Spec("ctl-model"), "tenant-ctl");
  auto tokens = Tokens(3 * kTokensPerBlock, 91);
  auto blocks = RandomBlocks(3, 5000, 92);
  ASSERT_EQ(client->Publish(ns, tokens, testing::BufferViews(blocks))->stored, 3u);
  auto ids = ComputeBlockIds(ns, kTokensPerBlock, tokens);
  const std::string ctl = std::string(STRATACTL_BIN) + " --endpoint " + d.endpoint() + " ";

  auto [c1, namespaces] = RunCommand(ctl + "ls --json");
  EXPECT_EQ(c1, 0) << namespaces;
  EXPECT_NE(namespaces.find(ns.ToHex()), std::string::npos) << namespaces;
  EXPECT_NE(namespaces.find("\"tenant\":\"tenant-ctl\""), std::string::npos) << namespaces;
  EXPECT_NE(namespaces.find("\"blocks\":3,\"bytes\":15000"), std::string::npos) << namespaces;

  auto [c2, page] = RunCommand(ctl + "ls --json --page-size 2 --namespace " + ns.ToHex());
  EXPECT_EQ(c2, 0) << page;
  EXPECT_EQ(std::count(page.begin(), page.end(), '{') - 1, 2) << page;        // two blocks
  EXPECT_EQ(page.find("\"next_page_token\":0}"), std::string::npos) << page;  // more to come
  auto [c3, all] = RunCommand(ctl + "ls --json --all --page-size 2 --namespace " + ns.ToHex());
  EXPECT_EQ(c3, 0);
  for (const auto& id : ids) EXPECT_NE(all.find(id.ToHex()), std::string::npos) << all;

  auto [c4, inspected] = RunCommand(ctl + "inspect --json " + ids[1].ToHex());
  EXPECT_EQ(c4, 0) << inspected;
  EXPECT_NE(inspected.find("\"size_bytes\":5000"), std::string::npos) << inspected;
  EXPECT_NE(inspected.find("\"parent_id\":\"" + ids[0].ToHex()), std::string::npos) << inspected;
  BlockId unknown = ComputeBlockId(ns, std::vector<uint32_t>{5});
  auto [c5, missing] = RunCommand(ctl + "inspect " + unknown.ToHex());
  EXPECT_EQ(c5, 1) << missing;
  EXPECT_NE(missing.find("not held by this node"), std::string::npos) << missing;

  auto [c6, pinned] =
      RunCommand(ctl + "pin --ttl 5m --namespace " + ns.ToHex() + " " + ids[2].ToHex());
  EXPECT_EQ(c6, 0) << pinned;
  EXPECT_EQ(client->Evict(ns, {&ids[2], 1})->status[0], BlockStatus::kPinned);
  auto [c7, unpinned] = RunCommand(ctl + "unpin --namespace " + ns.ToHex() + " " + ids[2].ToHex());
  EXPECT_EQ(c7, 0) << unpinned;
  EXPECT_EQ(client->Evict(ns, {&ids[2], 1})->status[0], BlockStatus::kOk);

  auto [c8, nodes] = RunCommand(ctl + "nodes --json");
  EXPECT_EQ(c8, 0);
  EXPECT_NE(nodes.find("\"state\":\"serving\""), std::string::npos) << nodes;
  // A node alone has nowhere to drain to; an unknown node is named in the error.
  auto [c9, drain] = RunCommand(ctl + "drain node-1");
  EXPECT_EQ(c9, 1) << drain;
  EXPECT_NE(drain.find("'node-1' is not in the cluster view"), std::string::npos) << drain;
  auto [c9b, drain_self] = RunCommand(ctl + "drain");
  EXPECT_EQ(c9b, 1) << drain_self;
  EXPECT_NE(drain_self.find("nowhere to drain to"), std::string::npos) << drain_self;

  std::string good = d.dir() + "/good.yaml", bad = d.dir() + "/bad.yaml";
  std::ofstream(good) << "host_tier:\n  capacity: 2GiB\n";
  std::ofstream(bad) << "host_tier:\n  capacity: 2 bananas\n";
  auto [c10, v1] = RunCommand(std::string(STRATACTL_BIN) + " config validate " + good);
  EXPECT_EQ(c10, 0) << v1;
  auto [c11, v2] = RunCommand(std::string(STRATACTL_BIN) + " config validate " + bad);
  EXPECT_EQ(c11, 1) << v2;
  EXPECT_NE(v2.find("'host_tier.capacity'"), std::string::npos) << v2;
}

TEST(ClientDaemonTest, JsonLogsAreOneEscapedObjectPerLine) {
  DaemonProcess d("", {"--log-format", "json"});
  ASSERT_TRUE(d.ok()) << d.log();
  // A refused OpenNamespace is logged with the tenant name, quotes and all (sent raw: the
  // client library would refuse the spec itself).
  auto stub = RawStub(d);
  v1::OpenNamespaceRequest open;
  open.set_tenant("evil\"tenant");
  v1::OpenNamespaceResponse resp;
  grpc::ClientContext c;
  Deadline(c);
  EXPECT_EQ(stub->OpenNamespace(&c, open, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  d.Signal(SIGTERM);
  ASSERT_TRUE(d.WaitExit(std::chrono::seconds(15)).has_value());
  std::istringstream lines(d.log());
  std::string line;
  int n = 0;
  bool saw_tenant = false;
  while (std::getline(lines, line)) {
    ++n;
    EXPECT_EQ(line.rfind("{\"time\":\"", 0), 0u) << line;
    EXPECT_EQ(line.back(), '}') << line;
    EXPECT_NE(line.find("\"level\":\""), std::string::npos) << line;
    saw_tenant |= line.find("evil\\\"tenant") != std::string::npos;
  }
  EXPECT_GE(n, 3);  // start, the refusal, drain and exit
  EXPECT_TRUE(saw_tenant) << d.log();
}

TEST(ClientDaemonTest, QuickstartExampleRuns) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto [code, out] = RunCommand(std::string(QUICKSTART_BIN) + " " + d.endpoint());
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("cached prefix: 16 tokens"), std::string::npos) << out;
  EXPECT_NE(out.find("bytes identical"), std::string::npos) << out;
}

}  // namespace
}  // namespace strata
