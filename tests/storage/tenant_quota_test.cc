// Per-tenant quotas of the host tier (HostTierOptions::tenant_*): a tenant over its share evicts
// its own least recently used blocks only, and its accounting follows commits, aborts, expiry,
// eviction and write-back.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "common/crc32c.h"
#include "storage/arena.h"
#include "storage/host_tier.h"

namespace strata {
namespace {

constexpr uint64_t kBlock = 64 << 10;
constexpr uint64_t kCapacity = 1 << 20;  // 16 blocks

BlockId Id(int i) {
  return ComputeBlockId(Digest{}, std::vector<uint32_t>{static_cast<uint32_t>(i), 7});
}

class TenantQuotaTest : public ::testing::Test {
 protected:
  void Make(double share, uint64_t max_reserved = 0, bool write_back = false) {
    arena_ = *MmapArena::Create(kCapacity, false);
    HostTierOptions o;
    o.alignment = 1024;
    o.high_watermark = 1.0;
    o.low_watermark = 1.0;
    o.reservation_timeout = absl::Seconds(10);
    o.tenant_max_share = share;
    o.tenant_max_reserved_bytes = max_reserved;
    o.write_back = write_back;
    o.write_back_wait = absl::Milliseconds(50);
    o.clock = [this] { return now_; };
    tier_ = std::make_unique<HostTier>(arena_->data(), arena_->size(), o);
    tier_->SetNamespaceTenant(a_, "a");
    tier_->SetNamespaceTenant(a2_, "a");
    tier_->SetNamespaceTenant(b_, "b");
  }

  BlockStatus Publish(const NamespaceId& ns, int i) {
    ReserveItem item{Id(i), {}, kBlock};
    auto r = tier_->Reserve(ns, {&item, 1});
    if (r.status[0] != BlockStatus::kOk) return r.status[0];
    std::memset(tier_->base() + r.offsets[0], i & 0xff, kBlock);
    uint32_t crc = Crc32c(tier_->base() + r.offsets[0], kBlock);
    auto c = tier_->Commit(r.reservation_id, {&crc, 1});
    EXPECT_TRUE(c.ok()) << c.status();
    return (*c)[0];
  }
  size_t Has(const NamespaceId& ns, int i) {
    BlockId id = Id(i);
    return tier_->Lookup(ns, {&id, 1});
  }
  HostTier::TenantUsage Usage(const std::string& t) { return tier_->UsageByTenant()[t]; }

  absl::Time now_ = absl::FromUnixSeconds(1000000);
  std::unique_ptr<MmapArena> arena_;
  std::unique_ptr<HostTier> tier_;
  NamespaceId a_ = ComputeBlockId(Digest{}, std::vector<uint32_t>{1});
  NamespaceId a2_ = ComputeBlockId(Digest{}, std::vector<uint32_t>{2});
  NamespaceId b_ = ComputeBlockId(Digest{}, std::vector<uint32_t>{3});
};

TEST_F(TenantQuotaTest, OverItsShareATenantEvictsOnlyItsOwnOldestBlocks) {
  Make(0.5);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(Publish(b_, 100 + i), BlockStatus::kOk);
  // A publishes 3x the capacity across two namespaces: always stored, never over 8 blocks.
  for (int i = 0; i < 48; ++i) {
    ASSERT_EQ(Publish(i % 2 ? a_ : a2_, i), BlockStatus::kOk) << i;
    ASSERT_LE(Usage("a").committed_bytes, kCapacity / 2) << i;
  }
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Has(b_, 100 + i), 1u) << "B lost block " << i;
  for (int i = 40; i < 48; ++i) EXPECT_EQ(Has(i % 2 ? a_ : a2_, i), 1u) << i;
  EXPECT_EQ(Has(a2_, 0), 0u);
  EXPECT_EQ(Usage("a").committed_bytes, 8 * kBlock);
  EXPECT_EQ(Usage("b").committed_bytes, 4 * kBlock);
  EXPECT_EQ(tier_->Stats().quota_evictions, 40u);
}

TEST_F(TenantQuotaTest, ATouchedBlockStaysLongerWithinTheTenant) {
  Make(0.5);
  for (int i = 0; i < 8; ++i) ASSERT_EQ(Publish(a_, i), BlockStatus::kOk);
  EXPECT_EQ(Has(a_, 0), 1u);  // now the most recently used
  ASSERT_EQ(Publish(a_, 8), BlockStatus::kOk);
  EXPECT_EQ(Has(a_, 0), 1u);
  EXPECT_EQ(Has(a_, 1), 0u);
}

TEST_F(TenantQuotaTest, PinnedAndLeasedOwnBlocksMeanNoSpaceButOthersPublish) {
  Make(0.5);
  std::vector<BlockId> ids;
  for (int i = 0; i < 8; ++i) {
    ASSERT_EQ(Publish(a_, i), BlockStatus::kOk);
    ids.push_back(Id(i));
  }
  tier_->Pin(a_, std::span(ids).first(4), absl::Hours(1));
  auto lease = tier_->Acquire(a_, std::span(ids).subspan(4));
  ASSERT_NE(lease.lease_id, 0u);
  EXPECT_EQ(Publish(a_, 8), BlockStatus::kNoSpace);
  EXPECT_EQ(tier_->Stats().quota_no_space, 1u);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(Publish(b_, 100 + i), BlockStatus::kOk);
  ASSERT_TRUE(tier_->Release(lease.lease_id).ok());
  EXPECT_EQ(Publish(a_, 8), BlockStatus::kOk);
  EXPECT_EQ(Has(a_, 4), 0u);  // the oldest unpinned one went
  EXPECT_EQ(Has(a_, 0), 1u);
}

TEST_F(TenantQuotaTest, ReservedBytesCapAndItsRelease) {
  Make(1.0, 4 * kBlock);
  std::vector<ReserveItem> items;
  for (int i = 0; i < 6; ++i) items.push_back({Id(i), {}, kBlock});
  auto r = tier_->Reserve(a_, items);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r.status[i], BlockStatus::kOk);
  EXPECT_EQ(r.status[4], BlockStatus::kNoSpace);
  EXPECT_EQ(r.status[5], BlockStatus::kNoSpace);
  EXPECT_EQ(Usage("a").reserved_bytes, 4 * kBlock);
  EXPECT_EQ(Publish(b_, 100), BlockStatus::kOk);
  ASSERT_TRUE(tier_->Abort(r.reservation_id).ok());
  EXPECT_EQ(Usage("a").reserved_bytes, 0u);
  // Expiry gives the quota back too.
  auto r2 = tier_->Reserve(a_, std::span(items).first(4));
  EXPECT_EQ(Usage("a").reserved_bytes, 4 * kBlock);
  now_ += absl::Seconds(11);
  tier_->ReclaimExpired();
  EXPECT_EQ(Usage("a").reserved_bytes, 0u);
  EXPECT_EQ(Publish(a_, 9), BlockStatus::kOk);
  EXPECT_EQ(Usage("a").committed_bytes, kBlock);
  EXPECT_NE(r2.reservation_id, 0u);
}

TEST_F(TenantQuotaTest, ReservationsCountAgainstTheShare) {
  Make(0.25);  // 4 blocks
  std::vector<ReserveItem> items;
  for (int i = 0; i < 5; ++i) items.push_back({Id(i), {}, kBlock});
  auto r = tier_->Reserve(a_, items);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r.status[i], BlockStatus::kOk);
  EXPECT_EQ(r.status[4], BlockStatus::kNoSpace);
}

TEST_F(TenantQuotaTest, BlocksHeldBeforeTheTenantIsNamedAreCharged) {
  Make(0.5);
  NamespaceId late = ComputeBlockId(Digest{}, std::vector<uint32_t>{9});
  for (int i = 0; i < 3; ++i) ASSERT_EQ(Publish(late, i), BlockStatus::kOk);
  EXPECT_EQ(Usage("c").committed_bytes, 0u);
  tier_->SetNamespaceTenant(late, "c");
  EXPECT_EQ(Usage("c").committed_bytes, 3 * kBlock);
  for (int i = 3; i < 12; ++i) ASSERT_EQ(Publish(late, i), BlockStatus::kOk);
  EXPECT_EQ(Usage("c").committed_bytes, 8 * kBlock);
  EXPECT_EQ(Has(late, 0), 0u);
}

TEST_F(TenantQuotaTest, WriteBackVictimsLeaveTheShareAtOnce) {
  Make(0.5, 0, /*write_back=*/true);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(Publish(b_, 100 + i), BlockStatus::kOk);
  for (int i = 0; i < 8; ++i) ASSERT_EQ(Publish(a_, i), BlockStatus::kOk);
  ASSERT_EQ(Publish(a_, 8), BlockStatus::kOk);  // queues a's oldest for write-back
  EXPECT_EQ(Usage("a").committed_bytes, 8 * kBlock);
  auto queued = tier_->TakeDemotions(16, absl::ZeroDuration());
  ASSERT_EQ(queued.size(), 1u);
  EXPECT_EQ(queued[0].id, Id(0));
  EXPECT_TRUE(tier_->FinishDemotion(queued[0].handle, true));
  EXPECT_EQ(Usage("a").committed_bytes, 8 * kBlock);
  EXPECT_EQ(Usage("b").committed_bytes, 4 * kBlock);
  // An explicit evict of a queued block does not count it twice.
  ASSERT_EQ(Publish(a_, 9), BlockStatus::kOk);
  BlockId victim = Id(1);
  tier_->Evict(a_, {&victim, 1}, false, false);
  for (auto& d : tier_->TakeDemotions(16, absl::ZeroDuration()))
    tier_->FinishDemotion(d.handle, false);
  EXPECT_EQ(Usage("a").committed_bytes, 8 * kBlock);
  EXPECT_EQ(tier_->Stats().committed_bytes, 12 * kBlock);
}

}  // namespace
}  // namespace strata
