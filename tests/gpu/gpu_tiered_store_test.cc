// The GPU tier's bookkeeping with host memory standing in for the device: promotion copies up
// and keeps the host copy, lookups see the best tier, victims leave without a copy while host
// memory holds them and are demoted when it does not, host fetches of device-only blocks are
// staged down, and eviction, pins and the change hook span both tiers.
#include <gtest/gtest.h>

#include "gpu_tier_fixture.h"

namespace strata::testing_gpu {
namespace {

TEST_F(GpuTierTest, PromotionCopiesUpAndKeepsTheHostCopy) {
  Open(8);
  for (int i = 0; i < 3; ++i) Publish(i);
  const BlockId ids[] = {Id(0), Id(1), Id(2), Id(3)};
  auto st = store_->Promote(ns_, ids);
  EXPECT_EQ(st, (std::vector<BlockStatus>{BlockStatus::kOk, BlockStatus::kOk, BlockStatus::kOk,
                                          BlockStatus::kNotFound}));
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(store_->HoldsOnDevice(Id(i)));
    EXPECT_TRUE(below_->Holds(Id(i))) << "promotion keeps the host copy";
    EXPECT_TRUE(DeviceBytesMatch(i));
  }
  std::vector<Tier> tiers;
  EXPECT_EQ(store_->Lookup(ns_, ids, &tiers), 3u);
  EXPECT_EQ(tiers, (std::vector<Tier>{Tier::kGpu, Tier::kGpu, Tier::kGpu}));
  GpuTierCounters c = Counters();
  EXPECT_EQ(c.memory, "host-stand-in");
  EXPECT_EQ(c.promotions, 3u);
  EXPECT_EQ(c.promoted_bytes, 3 * kBlock);
  EXPECT_EQ(c.device.blocks, 3u);
  // Promoting again copies nothing.
  EXPECT_EQ(store_->Promote(ns_, {ids, 3}), std::vector<BlockStatus>(3, BlockStatus::kOk));
  EXPECT_EQ(Counters().promotions, 3u);
  ASSERT_TRUE(store_->Stats().gpu.has_value());
  EXPECT_EQ(store_->Stats().gpu->device.committed_bytes, 3 * kBlock);
}

TEST_F(GpuTierTest, AnotherNamespaceSeesNothingOnTheDevice) {
  Open(8);
  Publish(0);
  const BlockId id = Id(0);
  ASSERT_EQ(store_->Promote(ns_, {&id, 1})[0], BlockStatus::kOk);
  const NamespaceId other = Id(424242);
  EXPECT_EQ(store_->Promote(other, {&id, 1})[0], BlockStatus::kNotFound);
  AcquireResult a = store_->AcquireOnDevice(other, {&id, 1});
  EXPECT_EQ(a.status[0], BlockStatus::kNotFound);
  EXPECT_EQ(store_->Lookup(other, {&id, 1}, nullptr), 0u);
  DropFromHost(0);
  EXPECT_EQ(store_->Acquire(other, {&id, 1}).status[0], BlockStatus::kNotFound);
}

TEST_F(GpuTierTest, LookupReportsTheBestTierOfEachPrefixBlock) {
  Open(8);
  for (int i = 0; i < 4; ++i) Publish(i, i - 1);
  const BlockId ids[] = {Id(0), Id(1), Id(2), Id(3), Id(4), Id(2)};
  ASSERT_EQ(store_->Promote(ns_, {&ids[1], 1})[0], BlockStatus::kOk);
  DropFromHost(1);  // only on the device now
  ASSERT_EQ(store_->Promote(ns_, {&ids[2], 1})[0], BlockStatus::kOk);
  std::vector<Tier> tiers;
  EXPECT_EQ(store_->Lookup(ns_, ids, &tiers), 4u);
  EXPECT_EQ(tiers, (std::vector<Tier>{Tier::kHost, Tier::kGpu, Tier::kGpu, Tier::kHost}));
}

TEST_F(GpuTierTest, DeviceLeasesKeepBlocksAndOffsetsUntilReleased) {
  Open(2);
  for (int i = 0; i < 4; ++i) Publish(i);
  const BlockId ids[] = {Id(0), Id(1)};
  AcquireResult a = store_->AcquireOnDevice(ns_, ids);
  ASSERT_NE(a.lease_id, 0u);
  ASSERT_EQ(a.status, std::vector<BlockStatus>(2, BlockStatus::kOk));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(a.sizes[i], kBlock);
    EXPECT_EQ(std::memcmp(pool_ + a.offsets[i], Bytes(i, kBlock).data(), kBlock), 0);
  }
  // The device is full of leased blocks: nothing else fits, nothing leased moves.
  const BlockId more[] = {Id(2)};
  EXPECT_EQ(store_->Promote(ns_, more)[0], BlockStatus::kNoSpace);
  EXPECT_EQ(std::memcmp(pool_ + a.offsets[1], Bytes(1, kBlock).data(), kBlock), 0);
  ASSERT_TRUE(store_->ReleaseOnDevice(a.lease_id).ok());
  EXPECT_FALSE(store_->ReleaseOnDevice(a.lease_id).ok()) << "a lease ends once";
  // Released: the oldest block makes room (host memory holds it, so it leaves without a copy).
  EXPECT_EQ(store_->Promote(ns_, more)[0], BlockStatus::kOk);
  EXPECT_TRUE(Eventually([&] { return Counters().victims_held_below >= 1; }));
  EXPECT_TRUE(DeviceBytesMatch(2));
  EXPECT_EQ(Counters().demotions, 0u) << "no copy down while host memory holds the block";
}

TEST_F(GpuTierTest, DeviceOnlyVictimsAreDemotedIntoHostMemory) {
  Open(2);
  for (int i = 0; i < 4; ++i) Publish(i);
  const BlockId first[] = {Id(0), Id(1)};
  ASSERT_EQ(store_->Promote(ns_, first), std::vector<BlockStatus>(2, BlockStatus::kOk));
  DropFromHost(0);
  DropFromHost(1);
  const BlockId next[] = {Id(2), Id(3)};
  ASSERT_EQ(store_->Promote(ns_, next), std::vector<BlockStatus>(2, BlockStatus::kOk));
  ASSERT_TRUE(Eventually([&] { return Counters().demotions == 2; }));
  GpuTierCounters c = Counters();
  EXPECT_EQ(c.demoted_bytes, 2 * kBlock);
  EXPECT_EQ(c.victims_dropped, 0u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_FALSE(store_->HoldsOnDevice(Id(i)));
    EXPECT_TRUE(below_->Holds(Id(i))) << "a device-only victim goes down, not away";
    EXPECT_EQ(FetchFromHost(i), BlockStatus::kOk);
  }
  EXPECT_EQ(c.device.allocated_bytes, 2 * kBlock);
}

TEST_F(GpuTierTest, HostFetchOfADeviceOnlyBlockStagesItDown) {
  Open(4);
  Publish(0);
  Publish(1, 0);
  const BlockId ids[] = {Id(0), Id(1)};
  ASSERT_EQ(store_->Promote(ns_, ids), std::vector<BlockStatus>(2, BlockStatus::kOk));
  DropFromHost(1);
  EXPECT_FALSE(below_->Holds(Id(1)));
  AcquireResult a = store_->Acquire(ns_, ids);
  ASSERT_EQ(a.status, std::vector<BlockStatus>(2, BlockStatus::kOk));
  EXPECT_EQ(std::memcmp(store_->arena_base() + a.offsets[1], Bytes(1, kBlock).data(), kBlock), 0);
  ASSERT_TRUE(store_->Release(a.lease_id).ok());
  EXPECT_EQ(Counters().staged_down, 1u);
  EXPECT_EQ(Counters().staged_down_bytes, kBlock);
  EXPECT_TRUE(store_->HoldsOnDevice(Id(1))) << "staging down copies; the device keeps its copy";
  // Staged with its parent: a cascade from block 0 still reaches it in host memory.
  EXPECT_EQ(below_->Inspect({&ids[1], 1}).at(0).parent, Id(0));
}

TEST_F(GpuTierTest, PublishingAnIdTheDeviceHoldsIsAnswered_Exists) {
  Open(4);
  Publish(0);
  const BlockId id = Id(0);
  ASSERT_EQ(store_->Promote(ns_, {&id, 1})[0], BlockStatus::kOk);
  DropFromHost(0);
  ReserveItem items[] = {{Id(0), {}, kBlock}, {Id(1), {}, kBlock}};
  ReserveResult r = store_->Reserve(ns_, items);
  EXPECT_EQ(r.status, (std::vector<BlockStatus>{BlockStatus::kExists, BlockStatus::kOk}));
  ASSERT_NE(r.reservation_id, 0u);
  EXPECT_TRUE(store_->Abort(r.reservation_id).ok());
}

TEST_F(GpuTierTest, EvictionRemovesEveryCopyAndCascadesAcrossTiers) {
  Open(8);
  for (int i = 0; i < 4; ++i) Publish(i, i - 1);  // chain 0 <- 1 <- 2 <- 3
  const BlockId mid[] = {Id(1), Id(2)};
  ASSERT_EQ(store_->Promote(ns_, mid), std::vector<BlockStatus>(2, BlockStatus::kOk));
  DropFromHost(1);  // the chain is split: 0 host, 1 device only, 2 both, 3 host
  const BlockId root = Id(0);
  EvictResult r = store_->Evict(ns_, {&root, 1}, /*cascade=*/true, /*force=*/false);
  EXPECT_EQ(r.status[0], BlockStatus::kOk);
  EXPECT_EQ(r.removed_blocks, 4u);
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(store_->Holds(Id(i))) << i;
  EXPECT_EQ(Counters().device.blocks, 0u);

  Publish(5);
  const BlockId five = Id(5);
  ASSERT_EQ(store_->Promote(ns_, {&five, 1})[0], BlockStatus::kOk);
  r = store_->Evict(ns_, {&five, 1}, false, false);
  EXPECT_EQ(r.status[0], BlockStatus::kOk);
  EXPECT_EQ(r.removed_blocks, 1u);
  EXPECT_FALSE(store_->Holds(five));
}

TEST_F(GpuTierTest, PinsHoldBlocksOnTheDevice) {
  Open(2);
  for (int i = 0; i < 4; ++i) Publish(i);
  const BlockId ids[] = {Id(0), Id(1)};
  ASSERT_EQ(store_->Promote(ns_, ids), std::vector<BlockStatus>(2, BlockStatus::kOk));
  EXPECT_EQ(store_->Pin(ns_, ids, absl::Minutes(5)),
            std::vector<BlockStatus>(2, BlockStatus::kOk));
  const BlockId two = Id(2);
  EXPECT_EQ(store_->Promote(ns_, {&two, 1})[0], BlockStatus::kNoSpace);
  EXPECT_TRUE(store_->HoldsOnDevice(Id(0)));
  EXPECT_EQ(store_->Evict(ns_, ids, false, false).status[0], BlockStatus::kPinned);
  EXPECT_EQ(store_->Unpin(ns_, {&ids[0], 1})[0], BlockStatus::kOk);
  EXPECT_EQ(store_->Promote(ns_, {&two, 1})[0], BlockStatus::kOk);
  EXPECT_TRUE(store_->HoldsOnDevice(Id(1))) << "the pinned block stayed";
  EXPECT_FALSE(store_->HoldsOnDevice(Id(0)));
}

TEST_F(GpuTierTest, TheChangeHookHearsDeviceCopiesComeAndGo) {
  Open(4);
  Publish(0);
  Publish(1);
  absl::Mutex mu;
  std::vector<BlockEvent> events;
  store_->SetChangeHook([&](const BlockEvent& e) {
    absl::MutexLock l(&mu);
    events.push_back(e);
  });
  const BlockId ids[] = {Id(0), Id(1)};
  ASSERT_EQ(store_->Promote(ns_, ids), std::vector<BlockStatus>(2, BlockStatus::kOk));
  {
    absl::MutexLock l(&mu);
    ASSERT_EQ(events.size(), 2u) << "a promotion is a GPU-tier copy stored";
    for (const BlockEvent& e : events) {
      EXPECT_EQ(e.kind, BlockEvent::kStored);
      EXPECT_EQ(e.tier, Tier::kGpu);
    }
    events.clear();
  }
  DropFromHost(0);  // host event; the device still holds it, so Holds stays true
  EXPECT_TRUE(store_->Holds(Id(0)));
  store_->Evict(ns_, {&ids[0], 1}, false, true);
  EXPECT_FALSE(store_->Holds(Id(0)));
  absl::MutexLock l(&mu);
  size_t removed = 0, from_gpu = 0;
  for (const BlockEvent& e : events) {
    removed += e.kind == BlockEvent::kRemoved && e.id == Id(0);
    from_gpu += e.kind == BlockEvent::kRemoved && e.tier == Tier::kGpu;
  }
  EXPECT_EQ(removed, 2u) << "one from each tier; listeners check Holds";
  EXPECT_EQ(from_gpu, 1u);
}

TEST_F(GpuTierTest, AllBlocksListsEveryBlockOnceWhateverItsTiers) {
  Open(8);
  for (int i = 0; i < 5; ++i) Publish(i);
  const BlockId ids[] = {Id(1), Id(2)};
  ASSERT_EQ(store_->Promote(ns_, ids), std::vector<BlockStatus>(2, BlockStatus::kOk));
  DropFromHost(2);
  auto all = store_->AllIds();
  std::sort(all.begin(), all.end());
  std::vector<BlockId> want;
  for (int i = 0; i < 5; ++i) want.push_back(Id(i));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(all, want);
  EXPECT_EQ(store_->AllBlocks().size(), 5u);
}

TEST_F(GpuTierTest, DropFromDeviceKeepsBlocksOnlyTheDeviceHolds) {
  Open(4);
  for (int i = 0; i < 3; ++i) Publish(i);
  const BlockId ids[] = {Id(0), Id(1), Id(2), Id(9)};
  ASSERT_EQ(store_->Promote(ns_, {ids, 3}), std::vector<BlockStatus>(3, BlockStatus::kOk));
  DropFromHost(1);
  ASSERT_EQ(store_->Pin(ns_, {&ids[2], 1}, absl::Minutes(1))[0], BlockStatus::kOk);
  EXPECT_EQ(store_->DropFromDevice(ns_, ids),
            (std::vector<BlockStatus>{BlockStatus::kOk, BlockStatus::kInProgress,
                                      BlockStatus::kPinned, BlockStatus::kNotFound}));
  EXPECT_FALSE(store_->HoldsOnDevice(Id(0)));
  EXPECT_TRUE(below_->Holds(Id(0)));
  EXPECT_TRUE(store_->HoldsOnDevice(Id(1)));
  EXPECT_EQ(FetchFromHost(0), BlockStatus::kOk);
}

// With limits.tenant_max_share, one tenant's promotions take at most its share of the device
// and make room among its own device copies, never another tenant's.
TEST_F(GpuTierTest, OneTenantsPromotionsStayWithinItsShareOfTheDevice) {
  Open(8, 64, {}, 0.5);
  const NamespaceId a = Id(200001), b = Id(200002);
  store_->SetNamespaceTenant(a, "a");
  store_->SetNamespaceTenant(b, "b");
  std::vector<BlockId> a_ids, b_ids;
  ns_ = a;
  for (int i = 0; i < 12; ++i) {
    Publish(i);
    a_ids.push_back(Id(i));
  }
  ns_ = b;
  for (int i = 20; i < 24; ++i) {
    Publish(i);
    b_ids.push_back(Id(i));
  }
  const std::span<const BlockId> a_first(a_ids.data(), 8), a_rest(a_ids.data() + 8, 4);
  size_t ok = 0, no_space = 0;
  for (BlockStatus s : store_->Promote(a, a_first)) {
    ok += s == BlockStatus::kOk;
    no_space += s == BlockStatus::kNoSpace;
  }
  EXPECT_EQ(ok, 4u);
  EXPECT_EQ(no_space, 4u);
  for (BlockStatus s : store_->Promote(b, b_ids)) EXPECT_EQ(s, BlockStatus::kOk);
  for (BlockStatus s : store_->Promote(a, a_rest)) EXPECT_EQ(s, BlockStatus::kOk);
  EXPECT_EQ(store_->HeldOnDevice(b, b_ids).size(), 4u);
  EXPECT_EQ(store_->HeldOnDevice(a, a_ids).size(), 4u);
  EXPECT_EQ(store_->HeldOnDevice(a, a_rest).size(), 4u);
  // Nothing was lost: host memory still has every block.
  ns_ = a;
  for (int i = 0; i < 12; ++i) EXPECT_EQ(FetchFromHost(i), BlockStatus::kOk);
}

}  // namespace
}  // namespace strata::testing_gpu
