// Regression test for issue 14, finding 5 ("one client reserving the full capacity evicts every
// tenant and starves all publishers"), against a real stratad: with limits.tenant_max_share a
// tenant publishing far more than its share evicts only its own blocks, and with
// limits.tenant_max_reserved_bytes a tenant holding open reservations gets NO_SPACE while the
// others keep publishing. Invalid quota settings stop the daemon with an error naming the field.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "strata/client.h"
#include "strata/v1/cache.grpc.pb.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/test_data.h"

namespace strata {
namespace {

using testing::DaemonProcess;
using testing::RandomBlocks;
using testing::Tokens;

constexpr uint32_t kTokensPerBlock = 16;
constexpr size_t kBlock = 1 << 20;

NamespaceSpec Spec() { return testing::SmallSpec("quota-test"); }

std::unique_ptr<Client> Connect(const DaemonProcess& d) {
  ClientOptions o;
  o.endpoint = d.endpoint();
  o.rpc_timeout = absl::Seconds(10);
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

// 64 MiB host tier, 1 MiB blocks, default watermarks (0.95 / 0.85). One publish reserves all its
// blocks at once, so the reservation cap must cover the largest publish (16 blocks here).
constexpr char kConfig[] =
    "host_tier:\n  capacity: 64MiB\n  max_block_size: 1MiB\n"
    "limits:\n  tenant_max_share: 0.5\n  tenant_max_reserved_bytes: 16MiB\n";

TEST(TenantQuotaDaemonTest, TenantOverItsShareEvictsOnlyItsOwnBlocks) {
  DaemonProcess d(kConfig);
  ASSERT_TRUE(d.ok()) << d.log();
  auto a = Connect(d), b = Connect(d);
  ASSERT_TRUE(a && b);
  auto ns_a = a->OpenNamespace(Spec(), "tenant-a");
  auto ns_b = b->OpenNamespace(Spec(), "tenant-b");
  ASSERT_TRUE(ns_a.ok() && ns_b.ok()) << ns_a.status() << " " << ns_b.status();

  // B: 16 blocks (a quarter of the tier), published first, so they are the least recently used
  // blocks of the whole tier: the global LRU would evict them before any of A's.
  const auto b_tokens = Tokens(16 * kTokensPerBlock, 7);
  const auto b_blocks = RandomBlocks(16, kBlock, 8);
  auto pub = b->Publish(*ns_b, b_tokens, testing::BufferViews(b_blocks));
  ASSERT_TRUE(pub.ok()) << pub.status();
  ASSERT_EQ(pub->stored, 16u);

  // A: 3x the tier's capacity, 8 blocks per publish; every publish must still store its blocks.
  const auto a_blocks = RandomBlocks(8, kBlock, 9);
  std::vector<uint32_t> last_a_tokens, first_a_tokens;
  for (uint32_t round = 0; round < 24; ++round) {
    auto tokens = Tokens(8 * kTokensPerBlock, 1000 + round);
    auto p = a->Publish(*ns_a, tokens, testing::BufferViews(a_blocks));
    ASSERT_TRUE(p.ok()) << "round " << round << ": " << p.status();
    ASSERT_EQ(p->stored, 8u) << "round " << round << ": " << BlockStatusName(p->status[0]);
    if (round == 0) first_a_tokens = tokens;
    last_a_tokens = tokens;
  }

  // Every one of B's blocks is still there, with its bytes.
  auto look = b->Lookup(*ns_b, b_tokens);
  ASSERT_TRUE(look.ok()) << look.status();
  ASSERT_EQ(look->prefix_blocks, 16u) << "tenant A's publishes evicted tenant B's blocks";
  std::vector<std::vector<uint8_t>> out(16, std::vector<uint8_t>(kBlock, 0));
  std::vector<MutableBuffer> bufs;
  for (auto& o : out) bufs.push_back({o.data(), o.size()});
  auto fetched = b->Fetch(*ns_b, look->ids, bufs);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  ASSERT_EQ(fetched->fetched, 16u);
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(out[i], b_blocks[i]) << "block " << i;

  // A works as an LRU cache within its share: its newest blocks are there, its oldest are gone.
  EXPECT_EQ(a->Lookup(*ns_a, last_a_tokens)->prefix_blocks, 8u);
  EXPECT_EQ(a->Lookup(*ns_a, first_a_tokens)->prefix_blocks, 0u);
  auto stats = a->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_LE(stats->host_used_bytes, (32u + 16u) << 20);
}

TEST(TenantQuotaDaemonTest, ReservationsBeyondTheTenantCapAreRefusedWhileOthersPublish) {
  DaemonProcess d(kConfig);
  ASSERT_TRUE(d.ok()) << d.log();
  auto a = Connect(d), b = Connect(d);
  ASSERT_TRUE(a && b);
  auto ns_a = a->OpenNamespace(Spec(), "tenant-a");
  auto ns_b = b->OpenNamespace(Spec(), "tenant-b");
  ASSERT_TRUE(ns_a.ok() && ns_b.ok());

  auto stub =
      v1::Cache::NewStub(grpc::CreateChannel(d.endpoint(), grpc::InsecureChannelCredentials()));
  auto reserve = [&](uint8_t first, int n, v1::ReserveResponse* resp) {
    v1::ReserveRequest req;
    req.set_namespace_id(std::string(ns_a->AsBytes()));
    for (int i = 0; i < n; ++i) {
      req.mutable_ids()->append(std::string(32, static_cast<char>(first + i)));
      req.add_sizes(kBlock);
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub->Reserve(&ctx, req, resp);
  };
  // A holds open reservations up to its cap (16 MiB)...
  v1::ReserveResponse held;
  ASSERT_TRUE(reserve(1, 16, &held).ok());
  for (int i = 0; i < 16; ++i) ASSERT_EQ(held.status(i), v1::BLOCK_OK) << i;
  // ...and gets NO_SPACE for more, though the tier has room.
  v1::ReserveResponse more;
  ASSERT_TRUE(reserve(40, 2, &more).ok());
  EXPECT_EQ(more.status(0), v1::BLOCK_NO_SPACE);
  EXPECT_EQ(more.status(1), v1::BLOCK_NO_SPACE);

  // B reserves and publishes as usual.
  const auto blocks = RandomBlocks(12, kBlock, 3);
  auto pub = b->Publish(*ns_b, Tokens(12 * kTokensPerBlock, 4), testing::BufferViews(blocks));
  ASSERT_TRUE(pub.ok()) << pub.status();
  EXPECT_EQ(pub->stored, 12u);

  // Once A gives its reservations back it can reserve again.
  {
    v1::AbortRequest abort;
    abort.set_reservation_id(held.reservation_id());
    v1::AbortResponse done;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Abort(&ctx, abort, &done).ok());
  }
  v1::ReserveResponse again;
  ASSERT_TRUE(reserve(40, 2, &again).ok());
  EXPECT_EQ(again.status(0), v1::BLOCK_OK);
  EXPECT_EQ(again.status(1), v1::BLOCK_OK);
}

TEST(TenantQuotaDaemonTest, InvalidQuotasStopTheDaemonNamingTheField) {
  struct Case {
    const char* yaml;
    const char* field;
  };
  for (const Case& k :
       {Case{"host_tier:\n  capacity: 64MiB\nlimits:\n  tenant_max_share: 0\n",
             "limits.tenant_max_share"},
        Case{"host_tier:\n  capacity: 64MiB\nlimits:\n  tenant_max_share: 1.5\n",
             "limits.tenant_max_share"},
        Case{"host_tier:\n  capacity: 64MiB\nlimits:\n  tenant_max_reserved_bytes: 1GiB\n",
             "limits.tenant_max_reserved_bytes"},
        Case{"host_tier:\n  capacity: 64MiB\nlimits:\n  tenant_max_reserved_bytes: lots\n",
             "limits.tenant_max_reserved_bytes"}}) {
    DaemonProcess d(k.yaml);
    EXPECT_FALSE(d.ok()) << k.yaml;
    EXPECT_EQ(d.WaitExit(std::chrono::seconds(10)), 2) << k.yaml << d.log();
    EXPECT_NE(d.log().find(k.field), std::string::npos) << d.log();
  }
}

}  // namespace
}  // namespace strata
