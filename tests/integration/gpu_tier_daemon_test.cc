// The GPU tier in a real stratad, with host memory standing in for the device (config
// gpu.memory: host-stand-in): reposition into it, locate and stats see it, fetches stay whole
// while it fills and evicts, eviction reaches it; a daemon without a tier, or with a CUDA tier
// and no device, says so.
#include <gtest/gtest.h>

#include "storage/gpu/device_memory.h"
#include "tests/integration/auth_fixture.h"

namespace strata {
namespace {

using namespace auth_fixture;  // NOLINT(build/namespaces): the shared fixture of these tests

constexpr char kStandIn[] =
    "host_tier:\n  capacity: 64MiB\n"
    "gpu:\n  capacity: 4MiB\n  memory: host-stand-in\n  high_watermark: 1.0\n"
    "  low_watermark: 1.0\n";

uint64_t Counter(const DaemonStats& s, const std::string& name) {
  for (const auto& [k, v] : s.counters)
    if (k == name) return v;
  ADD_FAILURE() << "no counter " << name;
  return 0;
}

std::vector<std::string> TiersOf(Client& c, const NamespaceId& ns, const BlockId& id) {
  auto located = c.Locate(ns, {&id, 1});
  EXPECT_TRUE(located.ok()) << located.status();
  std::vector<std::string> tiers;
  if (located.ok())
    for (const BlockHolder& h : (*located)[0]) tiers.push_back(h.tier);
  return tiers;
}

TEST(GpuTierDaemonTest, RepositionFillsTheTierAndFetchesStayWhole) {
  DaemonProcess d(kStandIn);
  ASSERT_TRUE(d.ok()) << d.log();
  EXPECT_NE(d.log().find("gpu tier: 4.0MiB of host-stand-in memory"), std::string::npos)
      << d.log();
  auto client = ConnectAs(d, "");
  ASSERT_TRUE(client);
  auto ns = client->OpenNamespace(Spec(), "t");
  ASSERT_TRUE(ns.ok()) << ns.status();
  const auto blocks = testing::RandomBlocks(8, 1 << 20, 3);
  std::vector<ConstBuffer> views;
  for (const auto& b : blocks) views.push_back({b.data(), b.size()});
  auto pub = client->Publish(*ns, testing::Tokens(8 * kTokensPerBlock, 4), views);
  ASSERT_TRUE(pub.ok()) << pub.status();
  ASSERT_EQ(pub->stored, 8u);
  const std::vector<BlockId>& ids = pub->ids;

  auto r = client->Reposition(*ns, {ids.data(), 2}, "", false, "gpu");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, std::vector<BlockStatus>(2, BlockStatus::kOk));
  EXPECT_EQ(TiersOf(*client, *ns, ids[0]), (std::vector<std::string>{"gpu", "host"}));
  EXPECT_EQ(TiersOf(*client, *ns, ids[5]), (std::vector<std::string>{"host"}));
  auto stats = client->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(Counter(*stats, "gpu_promotions_total"), 2u);

  // The tier fills: the oldest blocks leave it (host memory still has them), nothing is lost.
  r = client->Reposition(*ns, {ids.data() + 2, 4}, "", false, "gpu");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, std::vector<BlockStatus>(4, BlockStatus::kOk));
  auto on_gpu = [&] {
    std::vector<size_t> out;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto t = TiersOf(*client, *ns, ids[i]);
      if (!t.empty() && t[0] == "gpu") out.push_back(i);
    }
    return out;
  };
  EXPECT_EQ(on_gpu(), (std::vector<size_t>{2, 3, 4, 5}));
  // More than it holds in one call: what is there stays, what does not fit says so.
  r = client->Reposition(*ns, ids, "", false, "gpu");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status,
            (std::vector<BlockStatus>{BlockStatus::kNoSpace, BlockStatus::kNoSpace,
                                      BlockStatus::kOk, BlockStatus::kOk, BlockStatus::kOk,
                                      BlockStatus::kOk, BlockStatus::kNoSpace,
                                      BlockStatus::kNoSpace}));
  EXPECT_EQ(on_gpu(), (std::vector<size_t>{2, 3, 4, 5}));
  ExpectFetched(*client, *ns, ids, blocks);
  stats = client->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(Counter(*stats, "gpu_victims_held_below_total"), 2u);
  EXPECT_EQ(Counter(*stats, "gpu_victims_dropped_total"), 0u);
  EXPECT_EQ(Counter(*stats, "gpu_copy_errors_total"), 0u);

  // Eviction removes every copy.
  auto ev = client->Evict(*ns, {&ids[7], 1});
  ASSERT_TRUE(ev.ok()) << ev.status();
  EXPECT_TRUE(TiersOf(*client, *ns, ids[7]).empty());
}

TEST(GpuTierDaemonTest, StratactlShowsTheTier) {
  DaemonProcess d(kStandIn);
  ASSERT_TRUE(d.ok()) << d.log();
  auto [rc, out] = testing::RunCommand(std::string(STRATACTL_BIN) + " --endpoint " +
                                       d.endpoint() + " status");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("gpu tier    0B of 4.0MiB used"), std::string::npos) << out;
}

TEST(GpuTierDaemonTest, RepositionToAGpuTierThisNodeLacksIsAClearError) {
  DaemonProcess d("host_tier:\n  capacity: 64MiB\n");
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = ConnectAs(d, "");
  ASSERT_TRUE(client);
  auto ns = client->OpenNamespace(Spec(), "t");
  ASSERT_TRUE(ns.ok());
  const BlockId id = ComputeBlockIds(*ns, kTokensPerBlock, testing::Tokens(kTokensPerBlock, 1))[0];
  auto r = client->Reposition(*ns, {&id, 1}, "", false, "gpu");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("no GPU tier"), std::string::npos) << r.status();
  r = client->Reposition(*ns, {&id, 1}, "", false, "tape");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
}

TEST(GpuTierDaemonTest, ACudaTierWithoutADeviceRefusesToStartAndSaysWhy) {
  if (CudaDeviceAvailable().ok()) GTEST_SKIP() << "a CUDA device is visible here";
  DaemonProcess d("host_tier:\n  capacity: 64MiB\ngpu:\n  capacity: 4MiB\n");
  EXPECT_FALSE(d.ok());
  EXPECT_NE(d.log().find("gpu tier (config section 'gpu')"), std::string::npos) << d.log();
}

TEST(GpuTierDaemonTest, AStandInLargerThanTheHostIsRefused) {
  DaemonProcess d("host_tier:\n  capacity: 64MiB\ngpu:\n  capacity: 64TiB\n"
                  "  memory: host-stand-in\n");
  EXPECT_FALSE(d.ok());
  EXPECT_NE(d.log().find("gpu.capacity"), std::string::npos) << d.log();
}

}  // namespace
}  // namespace strata
