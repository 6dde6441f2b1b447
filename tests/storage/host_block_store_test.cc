// The host tier alone behind the BlockStore seam: every block is a host block, the node's
// block listings cover every page, and the change hook can be installed, replaced and cleared.
#include "storage/host_block_store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/crc32c.h"
#include "storage/arena.h"

namespace strata {
namespace {

BlockId Id(int i) {
  return ComputeBlockId(Digest{}, std::vector<uint32_t>{static_cast<uint32_t>(i)});
}

class HostBlockStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    arena_ = *MmapArena::Create(1 << 20, false);
    HostTierOptions o;
    o.alignment = 1024;
    o.reservation_timeout = absl::Seconds(7);
    o.lease_timeout = absl::Seconds(9);
    tier_ = std::make_unique<HostTier>(arena_->data(), arena_->size(), o);
    store_ = std::make_unique<HostBlockStore>(tier_.get());
  }

  void Publish(int i, size_t bytes = 2000) {
    ReserveItem item{Id(i), {}, bytes};
    BlockStore& s = *store_;
    ReserveResult r = s.Reserve(ns_, {&item, 1});
    ASSERT_EQ(r.status[0], BlockStatus::kOk);
    std::memset(s.arena_base() + r.offsets[0], i, bytes);
    const uint32_t crc = Crc32c(s.arena_base() + r.offsets[0], bytes);
    auto c = s.Commit(r.reservation_id, {&crc, 1});
    ASSERT_TRUE(c.ok() && (*c)[0] == BlockStatus::kOk);
  }

  std::unique_ptr<MmapArena> arena_;
  std::unique_ptr<HostTier> tier_;
  std::unique_ptr<HostBlockStore> store_;
  NamespaceId ns_ = Id(1000);
};

TEST_F(HostBlockStoreTest, ArenaAndTimeoutsAreTheHostTiers) {
  EXPECT_EQ(store_->arena_base(), tier_->base());
  EXPECT_EQ(store_->arena_bytes(), tier_->capacity());
  EXPECT_EQ(store_->reservation_timeout(), absl::Seconds(7));
  EXPECT_EQ(store_->lease_timeout(), absl::Seconds(9));
  EXPECT_FALSE(store_->Stats().nvme.has_value());
}

TEST_F(HostBlockStoreTest, LookupReportsEveryPrefixBlockInHostMemory) {
  for (int i = 0; i < 3; ++i) Publish(i);
  const BlockId ids[] = {Id(0), Id(1), Id(2), Id(3), Id(0)};
  std::vector<Tier> tiers;
  EXPECT_EQ(store_->Lookup(ns_, ids, &tiers), 3u);
  EXPECT_EQ(tiers, std::vector<Tier>(3, Tier::kHost));
  EXPECT_EQ(store_->Lookup(ns_, ids, nullptr), 3u);
  EXPECT_EQ(store_->Lookup(Id(999), ids, &tiers), 0u) << "another namespace";
  EXPECT_TRUE(tiers.empty());
}

TEST_F(HostBlockStoreTest, AllBlocksAndIdsCoverEveryBlockOnce) {
  for (int i = 0; i < 40; ++i) Publish(i, 1000);
  auto blocks = store_->AllBlocks();
  auto ids = store_->AllIds();
  ASSERT_EQ(blocks.size(), 40u);
  ASSERT_EQ(ids.size(), 40u);
  for (int i = 0; i < 40; ++i) {
    EXPECT_TRUE(store_->Holds(Id(i))) << i;
    EXPECT_NE(std::find(ids.begin(), ids.end(), Id(i)), ids.end()) << i;
  }
  EXPECT_FALSE(store_->Holds(Id(40)));
}

TEST_F(HostBlockStoreTest, TheChangeHookSeesCommitsAndRemovalsUntilCleared) {
  std::vector<BlockEvent> events;
  store_->SetChangeHook([&](const BlockEvent& e) { events.push_back(e); });
  Publish(1);
  const BlockId one = Id(1);
  store_->Evict(ns_, {&one, 1}, false, false);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, BlockEvent::kStored);
  EXPECT_EQ(events[1].kind, BlockEvent::kRemoved);
  EXPECT_EQ(events[1].id, one);
  store_->SetChangeHook(nullptr);
  Publish(2);
  EXPECT_EQ(events.size(), 2u);
}

TEST_F(HostBlockStoreTest, PushFetchLeaseChecksGoThroughTheStore) {
  Publish(5, 3000);
  const BlockId id = Id(5);
  AcquireResult a = store_->Acquire(ns_, {&id, 1});
  ASSERT_EQ(a.status[0], BlockStatus::kOk);
  const ArenaExtent held{a.offsets[0], a.sizes[0]}, other{a.offsets[0], a.sizes[0] + 1};
  EXPECT_TRUE(store_->BeginLeaseRead(a.lease_id, {&held, 1}, 1));
  store_->EndLeaseRead(a.lease_id);
  EXPECT_FALSE(store_->BeginLeaseRead(a.lease_id, {&other, 1}, 1));
  EXPECT_TRUE(store_->Release(a.lease_id).ok());
  EXPECT_FALSE(store_->BeginLeaseRead(a.lease_id, {&held, 1}, 1));
}

}  // namespace
}  // namespace strata
