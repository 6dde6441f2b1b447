// HostTier transcoding: watermark victims of transcodable namespaces are rewritten smaller
// instead of evicted (storage/host_tier_transcode.cc).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "common/crc32c.h"
#include "storage/arena.h"
#include "storage/host_tier.h"

namespace strata {
namespace {

constexpr uint64_t kBlock = 8 << 10;

BlockId Id(int i) {
  return ComputeBlockId(Digest{}, std::vector<uint32_t>{static_cast<uint32_t>(i)});
}

class HostTierTranscodeTest : public ::testing::Test {
 protected:
  // 8 blocks of 8 KiB; evicting above 6 down to 4.
  void SetUp() override {
    arena_ = *MmapArena::Create(8 * kBlock, false);
    HostTierOptions o;
    o.alignment = 1024;
    o.high_watermark = 0.75;
    o.low_watermark = 0.5;
    o.transcode = true;
    o.clock = [this] { return now_; };
    tier_ = std::make_unique<HostTier>(arena_->data(), arena_->size(), o);
    tier_->SetNamespaceTranscodable(ns_, true);
  }

  void Publish(const NamespaceId& ns, int i) {
    ReserveItem item{Id(i), {}, kBlock};
    auto r = tier_->Reserve(ns, {&item, 1});
    ASSERT_EQ(r.status[0], BlockStatus::kOk) << i;
    uint8_t* p = tier_->base() + r.offsets[0];
    std::memset(p, i, kBlock);
    uint32_t crc = Crc32c(p, kBlock);
    auto c = tier_->Commit(r.reservation_id, {&crc, 1});
    ASSERT_TRUE(c.ok()) << c.status();
  }

  bool Has(const NamespaceId& ns, int i) {
    BlockId id = Id(i);
    return tier_->Lookup(ns, {&id, 1}) == 1;
  }

  // A stand-in for the re-encoded blob: `bytes` of a pattern only this block has.
  static std::vector<uint8_t> SmallerBlob(int i, uint64_t bytes) {
    return std::vector<uint8_t>(bytes, static_cast<uint8_t>(0x80 | i));
  }

  absl::Time now_ = absl::FromUnixSeconds(1000000);
  std::unique_ptr<MmapArena> arena_;
  std::unique_ptr<HostTier> tier_;
  NamespaceId ns_ = ComputeBlockId(Digest{}, std::vector<uint32_t>{42});
  NamespaceId opaque_ns_ = ComputeBlockId(Digest{}, std::vector<uint32_t>{43});
};

TEST_F(HostTierTranscodeTest, VictimsAreRewrittenSmallerAndStay) {
  for (int i = 1; i <= 7; ++i) Publish(ns_, i);
  // Past the high watermark: the oldest blocks go to the transcoder, not away.
  auto items = tier_->TakeTranscodes(16, absl::ZeroDuration());
  ASSERT_FALSE(items.empty());
  EXPECT_EQ(items[0].id, Id(1));
  EXPECT_EQ(tier_->Stats().transcoding_blocks, items.size());
  for (int i = 1; i <= 7; ++i) EXPECT_TRUE(Has(ns_, i)) << i;  // readable meanwhile
  const uint64_t allocated_before = tier_->Stats().allocated_bytes;

  for (const TranscodeItem& item : items) {
    EXPECT_EQ(item.size, kBlock);
    EXPECT_EQ(item.crc, Crc32c(tier_->base() + item.offset, item.size));
    const int i = tier_->base()[item.offset];
    auto blob = SmallerBlob(i, kBlock / 4);
    EXPECT_TRUE(tier_->FinishTranscode(item.handle, blob, Crc32c(blob.data(), blob.size())));
  }
  const HostTierStats s = tier_->Stats();
  EXPECT_EQ(s.transcoded, items.size());
  EXPECT_EQ(s.transcoding_blocks, 0u);
  EXPECT_EQ(s.transcoded_bytes_in, items.size() * kBlock);
  EXPECT_EQ(s.transcoded_bytes_out, items.size() * kBlock / 4);
  EXPECT_EQ(s.allocated_bytes, allocated_before - items.size() * (kBlock - kBlock / 4));
  EXPECT_EQ(s.evictions_lru, 0u);

  // Every block is still there; a fetch gets the new blob and its CRC.
  for (int i = 1; i <= 7; ++i) EXPECT_TRUE(Has(ns_, i)) << i;
  BlockId first = Id(1);
  AcquireResult a = tier_->Acquire(ns_, {&first, 1});
  ASSERT_EQ(a.status[0], BlockStatus::kOk);
  EXPECT_EQ(a.sizes[0], kBlock / 4);
  const uint8_t* p = tier_->base() + a.offsets[0];
  EXPECT_EQ(p[0], 0x81);
  EXPECT_EQ(a.crcs[0], Crc32c(p, a.sizes[0]));
  ASSERT_TRUE(tier_->Release(a.lease_id).ok());
}

TEST_F(HostTierTranscodeTest, OnlyTranscodableNamespacesAndOnlyOnce) {
  for (int i = 1; i <= 7; ++i) Publish(opaque_ns_, i);
  EXPECT_TRUE(tier_->TakeTranscodes(16, absl::ZeroDuration()).empty());
  EXPECT_FALSE(Has(opaque_ns_, 1));  // evicted as before
  EXPECT_GT(tier_->Stats().evictions_lru, 0u);

  // A block that comes back from the transcoder is not handed out again: its next eviction is
  // final. Fill with transcodable blocks until block 100 is chosen twice (looked at without a
  // lookup, which would count as a use).
  Publish(ns_, 100);
  const BlockId watched = Id(100);
  auto resident = [&] { return !tier_->Inspect({&watched, 1}).empty(); };
  int next = 101;
  bool transcoded = false;
  while (resident() && next < 200) {
    Publish(ns_, next++);
    for (const TranscodeItem& item : tier_->TakeTranscodes(16, absl::ZeroDuration())) {
      if (item.id == Id(100)) {
        EXPECT_FALSE(transcoded) << "handed out twice";
        transcoded = true;
      }
      auto blob = SmallerBlob(1, kBlock / 2);
      tier_->FinishTranscode(item.handle, blob, Crc32c(blob.data(), blob.size()));
    }
  }
  EXPECT_TRUE(transcoded);
  EXPECT_FALSE(resident());
}

TEST_F(HostTierTranscodeTest, FailuresEvictAndLeasedBlocksKeepTheirBytes) {
  for (int i = 1; i <= 7; ++i) Publish(ns_, i);
  auto items = tier_->TakeTranscodes(16, absl::ZeroDuration());
  ASSERT_GE(items.size(), 3u);

  // Could not be transcoded: evicted as its watermark pass meant to.
  EXPECT_FALSE(tier_->FinishTranscode(items[0].handle, {}, 0));
  EXPECT_FALSE(Has(ns_, 1));
  // Not smaller: the same.
  auto same = SmallerBlob(2, kBlock);
  EXPECT_FALSE(tier_->FinishTranscode(items[1].handle, same, Crc32c(same.data(), same.size())));
  EXPECT_FALSE(Has(ns_, 2));
  EXPECT_EQ(tier_->Stats().transcode_failures, 2u);

  // Leased when the blob comes back: the reader's bytes stay as they were.
  BlockId third = Id(3);
  AcquireResult a = tier_->Acquire(ns_, {&third, 1});
  ASSERT_EQ(a.status[0], BlockStatus::kOk);
  auto blob = SmallerBlob(3, kBlock / 4);
  EXPECT_FALSE(tier_->FinishTranscode(items[2].handle, blob, Crc32c(blob.data(), blob.size())));
  EXPECT_EQ(tier_->Stats().transcode_skipped, 1u);
  EXPECT_EQ(tier_->base()[a.offsets[0]], 3);
  EXPECT_EQ(a.crcs[0], Crc32c(tier_->base() + a.offsets[0], kBlock));
  ASSERT_TRUE(tier_->Release(a.lease_id).ok());
  EXPECT_TRUE(Has(ns_, 3));
  // Pinned while with the transcoder (the pin answered kOk), then not transcoded: it stays.
  ASSERT_GE(items.size(), 4u);
  const BlockId fourth = Id(4);
  EXPECT_EQ(tier_->Pin(ns_, {&fourth, 1}, absl::Hours(1))[0], BlockStatus::kOk);
  EXPECT_FALSE(tier_->FinishTranscode(items[3].handle, {}, 0));
  EXPECT_TRUE(Has(ns_, 4));
  EXPECT_EQ(tier_->Stats().pinned_blocks, 1u);
  // Leased while with the transcoder, then not transcoded: it stays too.
  ASSERT_GE(items.size(), 5u);
  const BlockId fifth = Id(5);
  AcquireResult held = tier_->Acquire(ns_, {&fifth, 1});
  ASSERT_EQ(held.status[0], BlockStatus::kOk);
  EXPECT_FALSE(tier_->FinishTranscode(items[4].handle, {}, 0));
  ASSERT_TRUE(tier_->Release(held.lease_id).ok());
  EXPECT_TRUE(Has(ns_, 5));
  for (size_t k = 5; k < items.size(); ++k) tier_->FinishTranscode(items[k].handle, {}, 0);
}

TEST_F(HostTierTranscodeTest, EvictedWhileTranscodingFreesItsExtentAtTheEnd) {
  for (int i = 1; i <= 7; ++i) Publish(ns_, i);
  auto items = tier_->TakeTranscodes(1, absl::ZeroDuration());
  ASSERT_EQ(items.size(), 1u);
  const uint64_t allocated = tier_->Stats().allocated_bytes;
  BlockId first = Id(1);
  EvictResult ev = tier_->Evict(ns_, {&first, 1}, false, true);
  EXPECT_EQ(ev.removed_blocks, 1u);
  EXPECT_FALSE(Has(ns_, 1));
  // The transcoder still reads the extent: not freed yet.
  EXPECT_EQ(tier_->Stats().allocated_bytes, allocated);
  auto blob = SmallerBlob(1, kBlock / 4);
  EXPECT_FALSE(tier_->FinishTranscode(items[0].handle, blob, Crc32c(blob.data(), blob.size())));
  EXPECT_EQ(tier_->Stats().allocated_bytes, allocated - kBlock);

  // Stopping hands the waiting ones back to the eviction order, and nothing more comes.
  tier_->StopTranscoding();
  EXPECT_TRUE(tier_->TakeTranscodes(16, absl::Seconds(5)).empty());
  EXPECT_EQ(tier_->Stats().transcoding_blocks, 0u);
  for (int i = 2; i <= 7; ++i) EXPECT_TRUE(Has(ns_, i)) << i;
}

TEST_F(HostTierTranscodeTest, AReservationWithoutRoomWaitsForTheTranscoder) {
  for (int i = 1; i <= 6; ++i) Publish(ns_, i);  // at the high watermark, not above it
  // A block as large as the free space plus one: no room without making some.
  std::thread transcoder([this] {
    for (int round = 0; round < 50; ++round) {
      for (const TranscodeItem& item : tier_->TakeTranscodes(16, absl::Milliseconds(20))) {
        auto blob = SmallerBlob(1, kBlock / 4);
        tier_->FinishTranscode(item.handle, blob, Crc32c(blob.data(), blob.size()));
      }
    }
  });
  ReserveItem big{Id(50), {}, 3 * kBlock};
  auto r = tier_->Reserve(ns_, {&big, 1});
  transcoder.join();
  EXPECT_EQ(r.status[0], BlockStatus::kOk);
  const HostTierStats s = tier_->Stats();
  EXPECT_GT(s.transcoded, 0u);
  EXPECT_EQ(s.evictions_lru, 0u);  // room made by transcoding alone
  for (int i = 1; i <= 6; ++i) EXPECT_TRUE(Has(ns_, i)) << i;
  ASSERT_TRUE(tier_->Abort(r.reservation_id).ok());
}

// Two reservations of one id that both wait for room (two engines publishing one prefix, two
// fetches promoting one NVMe block): the wait releases the tier's lock, so the id is looked up
// again once room is found. One gets the extent, the other is told the block is in progress;
// nothing is reserved twice, and a later abort or evict leaves no bytes behind.
TEST_F(HostTierTranscodeTest, TwoReservationsOfOneIdWaitingForRoomGetOneExtent) {
  for (int i = 1; i <= 6; ++i) Publish(ns_, i);
  ReserveItem big{Id(50), {}, 3 * kBlock};
  ReserveResult ra, rb;
  std::thread a([&] { ra = tier_->Reserve(ns_, {&big, 1}); });
  std::thread b([&] { rb = tier_->Reserve(ns_, {&big, 1}); });
  absl::SleepFor(absl::Milliseconds(300));  // both waiting for the transcoder (none runs yet)
  std::thread transcoder([this] {
    for (int round = 0; round < 50; ++round) {
      for (const TranscodeItem& item : tier_->TakeTranscodes(16, absl::Milliseconds(20))) {
        auto blob = SmallerBlob(1, kBlock / 4);
        tier_->FinishTranscode(item.handle, blob, Crc32c(blob.data(), blob.size()));
      }
    }
  });
  a.join();
  b.join();
  transcoder.join();
  const bool a_won = ra.status[0] == BlockStatus::kOk;
  ReserveResult& won = a_won ? ra : rb;
  const ReserveResult& lost = a_won ? rb : ra;
  ASSERT_EQ(won.status[0], BlockStatus::kOk);
  EXPECT_EQ(lost.status[0], BlockStatus::kInProgress);
  EXPECT_EQ(lost.reservation_id, 0u);
  EXPECT_EQ(tier_->Stats().reserved_bytes, 3 * kBlock);
  const uint64_t before = tier_->Stats().allocated_bytes - 3 * kBlock;
  uint8_t* p = tier_->base() + won.offsets[0];
  std::memset(p, 50, 3 * kBlock);
  const uint32_t crc = Crc32c(p, 3 * kBlock);
  auto c = tier_->Commit(won.reservation_id, {&crc, 1});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)[0], BlockStatus::kOk);
  EXPECT_TRUE(Has(ns_, 50));
  const BlockId id = Id(50);
  EXPECT_EQ(tier_->Evict(ns_, {&id, 1}, false, true).status[0], BlockStatus::kOk);
  const HostTierStats s = tier_->Stats();
  EXPECT_EQ(s.allocated_bytes, before);
  EXPECT_EQ(s.reserved_bytes, 0u);
}

}  // namespace
}  // namespace strata
