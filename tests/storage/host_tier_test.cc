#include "storage/host_tier.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <thread>

#include "common/crc32c.h"
#include "storage/arena.h"

namespace strata {
namespace {

BlockId Id(int i) {
  return ComputeBlockId(Digest{}, std::vector<uint32_t>{static_cast<uint32_t>(i)});
}

class HostTierTest : public ::testing::Test {
 protected:
  void Make(uint64_t capacity, double high = 1.0, double low = 1.0) {
    arena_ = *MmapArena::Create(capacity, false);
    HostTierOptions o;
    o.alignment = 1024;
    o.high_watermark = high;
    o.low_watermark = low;
    o.reservation_timeout = absl::Seconds(10);
    o.lease_timeout = absl::Seconds(10);
    o.clock = [this] { return now_; };
    tier_ = std::make_unique<HostTier>(arena_->data(), arena_->size(), o);
  }

  // Reserve, fill with a pattern, commit; returns the commit statuses.
  BlockStatus Publish(const NamespaceId& ns, int i, uint64_t size, bool corrupt = false) {
    ReserveItem item{Id(i), {}, size};
    auto r = tier_->Reserve(ns, {&item, 1});
    if (r.status[0] != BlockStatus::kOk) return r.status[0];
    uint8_t* p = tier_->base() + r.offsets[0];
    std::memset(p, i & 0xff, size);
    uint32_t crc = Crc32c(p, size) ^ (corrupt ? 1u : 0u);
    auto c = tier_->Commit(r.reservation_id, {&crc, 1});
    EXPECT_TRUE(c.ok()) << c.status();
    return (*c)[0];
  }

  size_t Has(const NamespaceId& ns, int i) {
    BlockId id = Id(i);
    return tier_->Lookup(ns, {&id, 1});
  }

  absl::Time now_ = absl::FromUnixSeconds(1000000);
  std::unique_ptr<MmapArena> arena_;
  std::unique_ptr<HostTier> tier_;
  NamespaceId ns_ = ComputeBlockId(Digest{}, std::vector<uint32_t>{42});
  NamespaceId other_ns_ = ComputeBlockId(Digest{}, std::vector<uint32_t>{43});
};

TEST_F(HostTierTest, TwoPhasePublishAndVisibility) {
  Make(1 << 20);
  ReserveItem item{Id(1), {}, 4000};
  auto r = tier_->Reserve(ns_, {&item, 1});
  ASSERT_EQ(r.status[0], BlockStatus::kOk);
  EXPECT_EQ(Has(ns_, 1), 0u);  // reserved is not visible
  auto again = tier_->Reserve(ns_, {&item, 1});
  EXPECT_EQ(again.status[0], BlockStatus::kInProgress);
  std::memset(tier_->base() + r.offsets[0], 7, 4000);
  uint32_t crc = Crc32c(tier_->base() + r.offsets[0], 4000);
  auto c = tier_->Commit(r.reservation_id, {&crc, 1});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0], BlockStatus::kOk);
  EXPECT_EQ(Has(ns_, 1), 1u);
  EXPECT_EQ(Has(other_ns_, 1), 0u);  // other namespace sees nothing
  // Republish is a cheap no-op.
  auto dup = tier_->Reserve(ns_, {&item, 1});
  EXPECT_EQ(dup.status[0], BlockStatus::kExists);
  EXPECT_EQ(dup.reservation_id, 0u);
  EXPECT_FALSE(tier_->Commit(r.reservation_id, {&crc, 1}).ok());  // already consumed
}

TEST_F(HostTierTest, WrongCrcIsRefusedAndSpaceReturned) {
  Make(1 << 20);
  EXPECT_EQ(Publish(ns_, 1, 5000, /*corrupt=*/true), BlockStatus::kCrcMismatch);
  EXPECT_EQ(Has(ns_, 1), 0u);
  auto s = tier_->Stats();
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.crc_failures, 1u);
  EXPECT_EQ(Publish(ns_, 1, 5000), BlockStatus::kOk);  // a correct retry works
}

TEST_F(HostTierTest, AWriterChecksummedCommitRecordsTheCrcUnread) {
  Make(1 << 20);
  ReserveItem item{Id(1), {}, 5000};
  auto r = tier_->Reserve(ns_, {&item, 1});
  ASSERT_EQ(r.status[0], BlockStatus::kOk);
  std::memset(tier_->base() + r.offsets[0], 3, 5000);
  const uint32_t claimed = Crc32c(tier_->base() + r.offsets[0], 5000) ^ 1u;  // not the bytes'
  auto c = tier_->Commit(r.reservation_id, {&claimed, 1}, CommitCheck::kWriterChecksummed);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)[0], BlockStatus::kOk);
  EXPECT_EQ(tier_->Stats().crc_failures, 0u);
  // A reader gets the CRC the writer gave, and so sees the mismatch.
  BlockId id = Id(1);
  auto lease = tier_->Acquire(ns_, {&id, 1});
  ASSERT_EQ(lease.status[0], BlockStatus::kOk);
  EXPECT_EQ(lease.crcs[0], claimed);
  EXPECT_NE(Crc32c(tier_->base() + lease.offsets[0], 5000), lease.crcs[0]);
}

TEST_F(HostTierTest, LargeCommitVerifiesEveryBlockOnTwoThreads) {
  Make(64 << 20);
  // 3 blocks, 17 MiB in all (over the parallel threshold), sizes not multiples of the piece size.
  std::vector<ReserveItem> items = {
      {Id(1), {}, (5 << 20) + 123}, {Id(2), {}, 7 << 20}, {Id(3), {}, (5 << 20) - 77}};
  auto r = tier_->Reserve(ns_, items);
  std::vector<uint32_t> crcs;
  for (size_t i = 0; i < items.size(); ++i) {
    ASSERT_EQ(r.status[i], BlockStatus::kOk);
    uint8_t* p = tier_->base() + r.offsets[i];
    for (uint64_t k = 0; k < items[i].size; ++k) p[k] = static_cast<uint8_t>(k * 7 + i);
    crcs.push_back(Crc32c(p, items[i].size));
  }
  crcs[1] ^= 0x10;  // the middle block is wrong
  auto c = tier_->Commit(r.reservation_id, crcs);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0], BlockStatus::kOk);
  EXPECT_EQ((*c)[1], BlockStatus::kCrcMismatch);
  EXPECT_EQ((*c)[2], BlockStatus::kOk);
  EXPECT_EQ(Has(ns_, 1), 1u);
  EXPECT_EQ(Has(ns_, 2), 0u);
  EXPECT_EQ(Has(ns_, 3), 1u);
}

TEST_F(HostTierTest, CommitWithWrongCrcCountIsAnError) {
  Make(1 << 20);
  ReserveItem items[2] = {{Id(1), {}, 100}, {Id(2), {}, 100}};
  auto r = tier_->Reserve(ns_, items);
  uint32_t crc = 0;
  auto c = tier_->Commit(r.reservation_id, {&crc, 1});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(tier_->Abort(r.reservation_id).ok());
  EXPECT_EQ(tier_->Stats().allocated_bytes, 0u);
}

TEST_F(HostTierTest, AbandonedReservationIsReclaimed) {
  Make(1 << 20);
  ReserveItem item{Id(1), {}, 200000};
  auto r = tier_->Reserve(ns_, {&item, 1});
  ASSERT_EQ(r.status[0], BlockStatus::kOk);
  EXPECT_GT(tier_->Stats().allocated_bytes, 0u);
  now_ += absl::Seconds(5);
  tier_->ReclaimExpired();
  EXPECT_EQ(tier_->Stats().open_reservations, 1u);  // not yet
  now_ += absl::Seconds(6);
  tier_->ReclaimExpired();
  auto s = tier_->Stats();
  EXPECT_EQ(s.open_reservations, 0u);
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.reservations_expired, 1u);
  uint32_t crc = 0;
  EXPECT_EQ(tier_->Commit(r.reservation_id, {&crc, 1}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(Has(ns_, 1), 0u);
}

TEST_F(HostTierTest, LruEvictsOldestButNeverLeasedOrPinned) {
  Make(10 * 1024);  // room for ten 1 KiB blocks
  for (int i = 0; i < 10; ++i) ASSERT_EQ(Publish(ns_, i, 1024), BlockStatus::kOk);
  BlockId b0 = Id(0), b1 = Id(1);
  auto lease = tier_->Acquire(ns_, {&b0, 1});  // oldest, but leased
  ASSERT_EQ(lease.status[0], BlockStatus::kOk);
  tier_->Pin(ns_, {&b1, 1}, absl::Minutes(1));  // second oldest, pinned
  ASSERT_EQ(Publish(ns_, 10, 1024), BlockStatus::kOk);
  EXPECT_EQ(Has(ns_, 0), 1u);
  EXPECT_EQ(Has(ns_, 1), 1u);
  EXPECT_EQ(Has(ns_, 2), 0u);  // the oldest unprotected block went
  EXPECT_EQ(tier_->Stats().evictions_lru, 1u);
  // The leased block's bytes are intact while leased.
  EXPECT_EQ(tier_->base()[lease.offsets[0]], 0);
  EXPECT_EQ(Crc32c(tier_->base() + lease.offsets[0], 1024), lease.crcs[0]);
}

TEST_F(HostTierTest, FullOfProtectedBlocksReportsNoSpace) {
  Make(4 * 1024);
  std::vector<BlockId> ids;
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(Publish(ns_, i, 1024), BlockStatus::kOk);
    ids.push_back(Id(i));
  }
  tier_->Pin(ns_, ids, absl::Minutes(1));
  EXPECT_EQ(Publish(ns_, 99, 1024), BlockStatus::kNoSpace);
  now_ += absl::Minutes(2);  // pins expire
  EXPECT_EQ(Publish(ns_, 99, 1024), BlockStatus::kOk);
}

TEST_F(HostTierTest, WatermarksEvictDownToLow) {
  Make(100 * 1024, 0.9, 0.5);
  for (int i = 0; i < 90; ++i) ASSERT_EQ(Publish(ns_, i, 1024), BlockStatus::kOk);
  EXPECT_LE(tier_->Stats().allocated_bytes, 90u * 1024);
  ASSERT_EQ(Publish(ns_, 1000, 1024), BlockStatus::kOk);  // crosses the high watermark
  auto s = tier_->Stats();
  EXPECT_LE(s.allocated_bytes, 51u * 1024);
  EXPECT_EQ(Has(ns_, 1000), 1u);  // the newest survives
  EXPECT_EQ(Has(ns_, 0), 0u);
}

TEST_F(HostTierTest, EvictLeasedBlockHidesItAndFreesAtRelease) {
  Make(1 << 20);
  ASSERT_EQ(Publish(ns_, 1, 4096), BlockStatus::kOk);
  BlockId b = Id(1);
  auto lease = tier_->Acquire(ns_, {&b, 1});
  auto ev = tier_->Evict(ns_, {&b, 1}, false, false);
  EXPECT_EQ(ev.status[0], BlockStatus::kOk);
  EXPECT_EQ(Has(ns_, 1), 0u);
  EXPECT_EQ(tier_->Stats().allocated_bytes, 4096u);  // still held for the reader
  ASSERT_TRUE(tier_->Release(lease.lease_id).ok());
  EXPECT_EQ(tier_->Stats().allocated_bytes, 0u);
  EXPECT_FALSE(tier_->Release(lease.lease_id).ok());
}

TEST_F(HostTierTest, ExpiredLeaseIsReleased) {
  Make(1 << 20);
  ASSERT_EQ(Publish(ns_, 1, 4096), BlockStatus::kOk);
  BlockId b = Id(1);
  auto lease = tier_->Acquire(ns_, {&b, 1});
  EXPECT_EQ(tier_->Stats().open_leases, 1u);
  now_ += absl::Seconds(11);
  tier_->ReclaimExpired();
  EXPECT_EQ(tier_->Stats().open_leases, 0u);
  EXPECT_EQ(tier_->Stats().leases_expired, 1u);
}

TEST_F(HostTierTest, PinnedRefusesEvictUnlessForced) {
  Make(1 << 20);
  ASSERT_EQ(Publish(ns_, 1, 100), BlockStatus::kOk);
  BlockId b = Id(1);
  tier_->Pin(ns_, {&b, 1}, absl::Minutes(1));
  EXPECT_EQ(tier_->Evict(ns_, {&b, 1}, false, false).status[0], BlockStatus::kPinned);
  tier_->Unpin(ns_, {&b, 1});
  EXPECT_EQ(tier_->Evict(ns_, {&b, 1}, false, false).status[0], BlockStatus::kOk);
  ASSERT_EQ(Publish(ns_, 2, 100), BlockStatus::kOk);
  BlockId c = Id(2);
  tier_->Pin(ns_, {&c, 1}, absl::Minutes(1));
  EXPECT_EQ(tier_->Evict(ns_, {&c, 1}, false, true).status[0], BlockStatus::kOk);
}

TEST_F(HostTierTest, CascadeEvictRemovesDescendants) {
  Make(1 << 20);
  // Chain a -> b -> c, and an unrelated d.
  std::vector<uint32_t> t(64);
  for (int i = 0; i < 64; ++i) t[i] = i;
  auto ids = ComputeBlockIds(ns_, 16, t);
  for (size_t i = 0; i < 3; ++i) {
    ReserveItem item{ids[i], i ? ids[i - 1] : BlockId{}, 128};
    auto r = tier_->Reserve(ns_, {&item, 1});
    uint32_t crc = Crc32c(tier_->base() + r.offsets[0], 128);
    ASSERT_TRUE(tier_->Commit(r.reservation_id, {&crc, 1}).ok());
  }
  ASSERT_EQ(Publish(ns_, 500, 128), BlockStatus::kOk);
  EXPECT_EQ(tier_->Lookup(ns_, std::span(ids).first(3)), 3u);
  auto ev = tier_->Evict(ns_, {&ids[1], 1}, /*cascade=*/true, false);
  EXPECT_EQ(ev.removed_blocks, 2u);
  EXPECT_EQ(tier_->Lookup(ns_, std::span(ids).first(3)), 1u);
  EXPECT_EQ(Has(ns_, 500), 1u);
}

TEST_F(HostTierTest, WrongNamespaceCannotReadEvictOrPin) {
  Make(1 << 20);
  ASSERT_EQ(Publish(ns_, 1, 100), BlockStatus::kOk);
  BlockId b = Id(1);
  EXPECT_EQ(tier_->Acquire(other_ns_, {&b, 1}).status[0], BlockStatus::kNotFound);
  EXPECT_EQ(tier_->Evict(other_ns_, {&b, 1}, false, true).status[0], BlockStatus::kNotFound);
  EXPECT_EQ(tier_->Pin(other_ns_, {&b, 1}, absl::Minutes(1))[0], BlockStatus::kNotFound);
  ReserveItem item{b, {}, 100};
  EXPECT_EQ(tier_->Reserve(other_ns_, {&item, 1}).status[0], BlockStatus::kInvalid);
  EXPECT_EQ(Has(ns_, 1), 1u);
}

TEST_F(HostTierTest, ConcurrentPublishersAndReaders) {
  Make(64 << 20, 0.95, 0.85);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        int id = t * 1000 + i;
        BlockStatus s = Publish(ns_, id, 16 * 1024);
        EXPECT_TRUE(s == BlockStatus::kOk) << BlockStatusName(s);
        BlockId b = Id(id);
        auto a = tier_->Acquire(ns_, {&b, 1});
        if (a.status[0] == BlockStatus::kOk) {
          EXPECT_EQ(Crc32c(tier_->base() + a.offsets[0], a.sizes[0]), a.crcs[0]);
          EXPECT_TRUE(tier_->Release(a.lease_id).ok());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  auto s = tier_->Stats();
  EXPECT_EQ(s.committed_total, 1600u);
  EXPECT_EQ(s.open_leases, 0u);
  EXPECT_EQ(s.open_reservations, 0u);
}

// A lease covers exactly the extents of the blocks it holds, while it lasts.
TEST_F(HostTierTest, LeaseCoversItsBlocksExtentsOnly) {
  Make(1 << 20);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(Publish(ns_, i, 1000 + i), BlockStatus::kOk);
  BlockId ids[2] = {Id(0), Id(2)};
  auto lease = tier_->Acquire(ns_, ids);
  ASSERT_EQ(lease.status[0], BlockStatus::kOk);
  ASSERT_EQ(lease.status[1], BlockStatus::kOk);
  using E = ArenaExtent;
  const E held[2] = {{lease.offsets[0], lease.sizes[0]}, {lease.offsets[1], lease.sizes[1]}};
  EXPECT_TRUE(tier_->LeaseCovers(lease.lease_id, held));
  EXPECT_TRUE(tier_->LeaseCovers(lease.lease_id, {&held[1], 1}));
  const E wrong_size[1] = {{lease.offsets[0], lease.sizes[0] + 1}};
  EXPECT_FALSE(tier_->LeaseCovers(lease.lease_id, wrong_size));
  // Block 1 is committed but not in this lease.
  BlockId b1 = Id(1);
  auto other = tier_->Acquire(ns_, {&b1, 1});
  ASSERT_EQ(other.status[0], BlockStatus::kOk);
  const E not_leased[2] = {held[0], {other.offsets[0], other.sizes[0]}};
  EXPECT_FALSE(tier_->LeaseCovers(lease.lease_id, not_leased));
  EXPECT_FALSE(tier_->LeaseCovers(lease.lease_id + 1000, {&held[0], 1}));
  ASSERT_TRUE(tier_->Release(lease.lease_id).ok());
  EXPECT_FALSE(tier_->LeaseCovers(lease.lease_id, {&held[0], 1}));
}

// A write hold (a publish by message landing in the extent) keeps a reservation's extent
// allocated through expiry and abort; the last EndReservedWrite frees it. Commit waits for it.
TEST_F(HostTierTest, WriteHoldKeepsTheExtentUntilTheWriteEnds) {
  Make(1 << 20);
  ReserveItem item{Id(1), {}, 200000};
  auto r = tier_->Reserve(ns_, {&item, 1});
  ASSERT_EQ(r.status[0], BlockStatus::kOk);
  const ArenaExtent extent{r.offsets[0], 200000};
  EXPECT_EQ(tier_->BeginReservedWrite(r.reservation_id, {extent.offset, 1}).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(tier_->BeginReservedWrite(r.reservation_id + 1, extent).code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(tier_->BeginReservedWrite(r.reservation_id, extent).ok());
  uint32_t crc = 0;
  EXPECT_EQ(tier_->Commit(r.reservation_id, {&crc, 1}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  now_ += absl::Seconds(11);
  tier_->ReclaimExpired();
  EXPECT_GE(tier_->Stats().allocated_bytes, 200000u);  // still the writer's
  EXPECT_EQ(tier_->Abort(r.reservation_id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(tier_->Commit(r.reservation_id, {&crc, 1}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(tier_->BeginReservedWrite(r.reservation_id, extent).ok());
  tier_->EndReservedWrite(r.reservation_id);
  EXPECT_EQ(tier_->Stats().allocated_bytes, 0u);
  EXPECT_EQ(tier_->Stats().open_reservations, 0u);
  tier_->EndReservedWrite(r.reservation_id);  // a stray end changes nothing
}

// A read hold (a push fetch sending from the extent) keeps a lease's blocks through release
// and expiry: an evicted block's extent is not reused while its bytes may still be read.
TEST_F(HostTierTest, ReadHoldKeepsLeasedExtentsUntilTheReadEnds) {
  Make(1 << 20);
  ASSERT_EQ(Publish(ns_, 1, 300000), BlockStatus::kOk);
  BlockId id = Id(1);
  auto lease = tier_->Acquire(ns_, {&id, 1});
  ASSERT_EQ(lease.status[0], BlockStatus::kOk);
  const ArenaExtent held{lease.offsets[0], lease.sizes[0]};
  const ArenaExtent wrong{lease.offsets[0], lease.sizes[0] - 1};
  EXPECT_FALSE(tier_->BeginLeaseRead(lease.lease_id, {&wrong, 1}, 1));
  ASSERT_TRUE(tier_->BeginLeaseRead(lease.lease_id, {&held, 1}, 1));
  ASSERT_TRUE(tier_->Release(lease.lease_id).ok());
  EXPECT_EQ(tier_->Release(lease.lease_id).code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(tier_->LeaseCovers(lease.lease_id, {&held, 1}));
  tier_->Evict(ns_, {&id, 1}, false, true);
  EXPECT_EQ(Has(ns_, 1), 0u);
  EXPECT_GE(tier_->Stats().allocated_bytes, 300000u);  // the extent waits for the reader
  tier_->EndLeaseRead(lease.lease_id);
  EXPECT_EQ(tier_->Stats().allocated_bytes, 0u);
  EXPECT_EQ(tier_->Stats().open_leases, 0u);
}

// A push takes one hold per block it sends, all checked at once: the extents stay until the
// last of those holds ends, whichever order they end in.
TEST_F(HostTierTest, HoldsTakenTogetherEndOneByOne) {
  Make(1 << 20);
  ASSERT_EQ(Publish(ns_, 1, 100000), BlockStatus::kOk);
  ASSERT_EQ(Publish(ns_, 2, 200000), BlockStatus::kOk);
  const BlockId ids[] = {Id(1), Id(2)};
  auto lease = tier_->Acquire(ns_, ids);
  ASSERT_EQ(lease.status[1], BlockStatus::kOk);
  const ArenaExtent both[] = {{lease.offsets[0], lease.sizes[0]},
                              {lease.offsets[1], lease.sizes[1]}};
  const ArenaExtent one_wrong[] = {both[0], {lease.offsets[1], lease.sizes[1] + 1}};
  EXPECT_FALSE(tier_->BeginLeaseRead(lease.lease_id, one_wrong, 2));
  ASSERT_TRUE(tier_->BeginLeaseRead(lease.lease_id, both, 2));
  ASSERT_TRUE(tier_->Release(lease.lease_id).ok());
  tier_->Evict(ns_, ids, false, true);
  tier_->EndLeaseRead(lease.lease_id);
  EXPECT_GE(tier_->Stats().allocated_bytes, 300000u);  // one hold is still open
  EXPECT_EQ(tier_->Stats().open_leases, 1u);
  tier_->EndLeaseRead(lease.lease_id);
  EXPECT_EQ(tier_->Stats().allocated_bytes, 0u);
  EXPECT_EQ(tier_->Stats().open_leases, 0u);
  tier_->EndLeaseRead(lease.lease_id);  // a stray end changes nothing
}

// A spare: one extent reserved under an id nobody publishes, named when its block is known.
class HostTierSpareTest : public HostTierTest {
 protected:
  ReserveResult Spare(uint64_t size) {
    ReserveItem item{Id(1000 + spares_++), {}, size};
    return tier_->Reserve(ns_, {&item, 1});
  }
  int spares_ = 0;
};

TEST_F(HostTierSpareTest, ARenamedSpareCommitsUnderItsNewIdAndGivesItsTailBack) {
  Make(64 << 10);  // 64 extents of 1 KiB
  auto spare = Spare(16 << 10);
  ASSERT_EQ(spare.status[0], BlockStatus::kOk);
  EXPECT_EQ(tier_->Stats().reserved_bytes, 16u << 10);
  ReserveItem block{Id(1), Id(0), 5000};
  auto renamed = tier_->RenameReserved(spare.reservation_id, ns_, block);
  ASSERT_TRUE(renamed.ok()) << renamed.status();
  EXPECT_EQ(*renamed, BlockStatus::kOk);
  EXPECT_EQ(tier_->Stats().reserved_bytes, 5000u);
  // The tail past the block's 5 KiB (rounded to the 1 KiB alignment) is free again: 59 KiB fit.
  ReserveItem rest{Id(2), {}, 59 << 10};
  auto fits = tier_->Reserve(ns_, {&rest, 1});
  EXPECT_EQ(fits.status[0], BlockStatus::kOk);
  ASSERT_TRUE(tier_->Abort(fits.reservation_id).ok());
  // The id it was reserved under is nobody's now; the block is another publish's to wait for.
  ReserveItem placeholder{Id(1000), {}, 1024};
  auto again = tier_->Reserve(ns_, {&placeholder, 1});
  EXPECT_EQ(again.status[0], BlockStatus::kOk);
  ASSERT_TRUE(tier_->Abort(again.reservation_id).ok());
  EXPECT_EQ(tier_->Reserve(ns_, {&block, 1}).status[0], BlockStatus::kInProgress);

  uint8_t* p = tier_->base() + spare.offsets[0];
  std::memset(p, 9, 5000);
  uint32_t crc = Crc32c(p, 5000);
  auto c = tier_->Commit(spare.reservation_id, {&crc, 1});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)[0], BlockStatus::kOk);
  EXPECT_EQ(Has(ns_, 1), 1u);
  BlockId id = Id(1);
  auto lease = tier_->Acquire(ns_, {&id, 1});
  ASSERT_EQ(lease.status[0], BlockStatus::kOk);
  EXPECT_EQ(lease.offsets[0], spare.offsets[0]);
  EXPECT_EQ(lease.sizes[0], 5000u);
  EXPECT_EQ(lease.crcs[0], crc);
  const std::vector<BlockInfo> info = tier_->Inspect({&id, 1});
  ASSERT_EQ(info.size(), 1u);
  EXPECT_EQ(info[0].parent, Id(0));
  EXPECT_EQ(tier_->Stats().reserved_bytes, 0u);
  EXPECT_EQ(tier_->Stats().committed_bytes, 5000u);
}

TEST_F(HostTierSpareTest, ABlockHeldAlreadyOrTooLargeGivesTheSpareBack) {
  Make(1 << 20);
  ASSERT_EQ(Publish(ns_, 1, 4000), BlockStatus::kOk);
  const uint64_t dedup = tier_->Stats().dedup_total;

  auto spare = Spare(8192);
  ReserveItem held{Id(1), {}, 4000};
  auto answer = tier_->RenameReserved(spare.reservation_id, ns_, held);
  ASSERT_TRUE(answer.ok());
  EXPECT_EQ(*answer, BlockStatus::kExists);
  EXPECT_EQ(tier_->Stats().dedup_total, dedup + 1);
  EXPECT_EQ(tier_->Stats().open_reservations, 0u);
  EXPECT_EQ(tier_->Stats().reserved_bytes, 0u);
  uint32_t crc = 0;
  EXPECT_TRUE(absl::IsNotFound(tier_->Commit(spare.reservation_id, {&crc, 1}).status()));

  // Reserved by another publish.
  ReserveItem other{Id(2), {}, 1000};
  auto theirs = tier_->Reserve(ns_, {&other, 1});
  ASSERT_EQ(theirs.status[0], BlockStatus::kOk);
  spare = Spare(8192);
  answer = tier_->RenameReserved(spare.reservation_id, ns_, other);
  ASSERT_TRUE(answer.ok());
  EXPECT_EQ(*answer, BlockStatus::kInProgress);

  // Larger than the spare, or empty.
  for (uint64_t size : {uint64_t{8193}, uint64_t{0}}) {
    spare = Spare(8192);
    ReserveItem big{Id(3), {}, size};
    answer = tier_->RenameReserved(spare.reservation_id, ns_, big);
    ASSERT_TRUE(answer.ok());
    EXPECT_EQ(*answer, BlockStatus::kInvalid);
  }
  ASSERT_TRUE(tier_->Abort(theirs.reservation_id).ok());
  EXPECT_EQ(tier_->Stats().open_reservations, 0u);
  EXPECT_EQ(tier_->Stats().reserved_bytes, 0u);
}

TEST_F(HostTierSpareTest, WhatCannotBeRenamedIsAnErrorAndTheReservationStays) {
  Make(1 << 20);
  ReserveItem block{Id(1), {}, 1000};
  EXPECT_TRUE(absl::IsNotFound(tier_->RenameReserved(12345, ns_, block).status()));

  auto spare = Spare(4096);
  EXPECT_TRUE(absl::IsInvalidArgument(
      tier_->RenameReserved(spare.reservation_id, other_ns_, block).status()));
  ReserveItem two[2] = {{Id(5), {}, 1000}, {Id(6), {}, 1000}};
  auto pair = tier_->Reserve(ns_, two);
  EXPECT_TRUE(absl::IsInvalidArgument(
      tier_->RenameReserved(pair.reservation_id, ns_, block).status()));
  ASSERT_TRUE(tier_->BeginReservedWrite(spare.reservation_id, {spare.offsets[0], 4096}).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(
      tier_->RenameReserved(spare.reservation_id, ns_, block).status()));
  tier_->EndReservedWrite(spare.reservation_id);
  EXPECT_EQ(tier_->Stats().open_reservations, 2u);
  // Expired: gone, as for a commit.
  now_ += absl::Seconds(11);
  EXPECT_TRUE(absl::IsNotFound(tier_->RenameReserved(spare.reservation_id, ns_, block).status()));
}

}  // namespace
}  // namespace strata
