// The GPU tier over host memory over NVMe (all three tiers, host memory standing in for the
// device): promotion stages NVMe blocks through host memory, device victims whose blocks went on
// to NVMe leave without a copy, lookups report each block's best tier, a fetch of everything is
// byte-exact, and a cascade evict spans the three tiers.
#include <gtest/gtest.h>

#include <cstring>

#include "common/crc32c.h"
#include "storage/arena.h"
#include "storage/gpu/gpu_tiered_store.h"
#include "storage/tiered_store.h"
#include "tests/nvme/test_util.h"

namespace strata {
namespace {

using testing_nvme::IdOf;
using testing_nvme::Payload;
using testing_nvme::TempDir;

constexpr size_t kBlock = 64 << 10;

class GpuOverNvmeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    arena_ = *MmapArena::Create(8 * kBlock, false);
    HostTierOptions ho;
    ho.alignment = kNvmeAlignment;
    ho.write_back = true;
    ho.high_watermark = 1.0;
    ho.low_watermark = 1.0;
    host_ = std::make_unique<HostTier>(arena_->data(), arena_->size(), ho);
    TieredStoreOptions to;
    to.nvme.tier.files = {{dir_.Sub("tier.dat"), 64 * kBlock}};
    to.nvme.tier.sync_after_write = false;
    to.nvme.tier.shared_ring = true;
    to.nvme.catalog_path = dir_.Sub("catalog");
    auto tiered = TieredStore::Open(host_.get(), to);
    ASSERT_TRUE(tiered.ok()) << tiered.status();
    tiered_ = std::move(*tiered);
    auto memory = HostStandInMemory::Create(4 * kBlock);
    ASSERT_TRUE(memory.ok());
    GpuTieredStoreOptions go;
    go.device.high_watermark = go.device.low_watermark = 1.0;
    auto gpu = GpuTieredStore::Open(tiered_.get(), std::move(*memory), go);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    store_ = std::move(*gpu);
  }
  void TearDown() override {
    store_.reset();
    tiered_.reset();
  }

  void Publish(int i, int parent = -1) {
    const auto bytes = Payload(i, kBlock);
    ReserveItem item{IdOf(i), parent < 0 ? BlockId{} : IdOf(parent), kBlock};
    ReserveResult r = store_->Reserve(ns_, {&item, 1});
    ASSERT_EQ(r.status[0], BlockStatus::kOk) << i;
    std::memcpy(store_->arena_base() + r.offsets[0], bytes.data(), kBlock);
    const uint32_t crc = Crc32c(bytes.data(), kBlock);
    auto c = store_->Commit(r.reservation_id, {&crc, 1});
    ASSERT_TRUE(c.ok() && (*c)[0] == BlockStatus::kOk) << i;
  }

  std::vector<BlockId> Ids(int from, int to) {
    std::vector<BlockId> ids;
    for (int i = from; i < to; ++i) ids.push_back(IdOf(i));
    return ids;
  }

  TempDir dir_;
  std::unique_ptr<MmapArena> arena_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<TieredStore> tiered_;
  std::unique_ptr<GpuTieredStore> store_;
  NamespaceId ns_ = IdOf(99999);
};

TEST_F(GpuOverNvmeTest, BlocksMoveThroughAllThreeTiersAndStayWhole) {
  for (int i = 0; i < 24; ++i) Publish(i, i - 1);  // a chain, most of it written back to NVMe
  ASSERT_GE(tiered_->Counters().nvme_blocks, 16u);
  const auto first = Ids(0, 4);
  ASSERT_TRUE(tiered_->HoldsOnNvme(first[0]));
  EXPECT_EQ(store_->Promote(ns_, first), std::vector<BlockStatus>(4, BlockStatus::kOk));
  std::vector<Tier> tiers;
  const auto all = Ids(0, 24);
  EXPECT_EQ(store_->Lookup(ns_, all, &tiers), 24u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(tiers[i], Tier::kGpu) << i;
  for (int i = 4; i < 24; ++i) EXPECT_NE(tiers[i], Tier::kGpu) << i;

  // Host pressure sends the promoted blocks' host copies on to NVMe; the device keeps its own.
  for (int i = 24; i < 36; ++i) Publish(i);
  // Four more promotions take the device's place: the victims' blocks are below (host or NVMe),
  // so they leave without a copy.
  EXPECT_EQ(store_->Promote(ns_, Ids(8, 12)), std::vector<BlockStatus>(4, BlockStatus::kOk));
  for (int k = 0; k < 200 && store_->Counters().victims_held_below < 4; ++k)
    absl::SleepFor(absl::Milliseconds(5));
  GpuTierCounters c = store_->Counters();
  EXPECT_EQ(c.victims_held_below, 4u);
  EXPECT_EQ(c.demotions, 0u);
  EXPECT_EQ(c.victims_dropped, 0u);

  // Everything comes back byte-exact, a few blocks at a time (host memory holds eight).
  for (int i = 0; i < 36; i += 4) {
    const auto ids = Ids(i, i + 4);
    AcquireResult a = store_->Acquire(ns_, ids);
    ASSERT_EQ(a.status, std::vector<BlockStatus>(4, BlockStatus::kOk)) << i;
    for (int k = 0; k < 4; ++k)
      EXPECT_EQ(std::memcmp(store_->arena_base() + a.offsets[k], Payload(i + k, kBlock).data(),
                            kBlock),
                0)
          << i + k;
    ASSERT_TRUE(store_->Release(a.lease_id).ok());
  }

  // A cascade from the chain's root removes it from every tier.
  const BlockId root = IdOf(0);
  EvictResult r = store_->Evict(ns_, {&root, 1}, /*cascade=*/true, /*force=*/false);
  EXPECT_EQ(r.removed_blocks, 24u);
  for (const BlockId& id : all) EXPECT_FALSE(store_->Holds(id));
  EXPECT_TRUE(store_->Holds(IdOf(30)));
  EXPECT_EQ(store_->Counters().device.blocks, 0u);
}

}  // namespace
}  // namespace strata
