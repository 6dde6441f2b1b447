#include "bench/replay/tier_manager.h"

#include <list>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"
#include "tests/eviction/test_ids.h"

namespace strata {
namespace {

using testing::Id;

constexpr uint64_t kBlock = 10;

std::unique_ptr<TierManager> Make(uint64_t host_blocks, uint64_t nvme_blocks,
                                  std::string policy = "lru", std::string admission = "always") {
  TierManagerOptions o;
  o.host.capacity_bytes = host_blocks * kBlock;
  o.nvme.capacity_bytes = nvme_blocks * kBlock;
  o.host.policy = o.nvme.policy = policy;
  o.admission = admission;
  o.typical_block_bytes = kBlock;
  auto tm = TierManager::Create(o);
  EXPECT_TRUE(tm.ok()) << tm.status();
  return tm.ok() ? std::move(*tm) : nullptr;
}

bool HasMove(const std::vector<TierMove>& moves, uint32_t id, Tier from, Tier to) {
  for (const TierMove& m : moves) {
    if (m.id == Id(id) && m.from == from && m.to == to) return true;
  }
  return false;
}

std::vector<TierMove> MustInsert(TierManager& tm, uint32_t id, uint32_t parent = 0) {
  auto r = tm.Insert(Id(id), parent == 0 ? BlockId{} : Id(parent), kBlock);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::vector<TierMove>{};
}

TEST(TierManager, DemotesHostVictimsToNvme) {
  auto tm = Make(2, 2);
  MustInsert(*tm, 1);
  MustInsert(*tm, 2);
  auto moves = MustInsert(*tm, 3);
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_TRUE(HasMove(moves, 1, Tier::kHost, Tier::kNvme));
  EXPECT_EQ(tm->Locate(Id(1)), Tier::kNvme);
  EXPECT_EQ(tm->Locate(Id(3)), Tier::kHost);
  const auto s = tm->Stats();
  EXPECT_EQ(s.demotions, 1u);
  EXPECT_EQ(s.host.blocks, 2u);
  EXPECT_EQ(s.nvme.blocks, 1u);
  EXPECT_EQ(s.nvme.bytes_written, kBlock);
  EXPECT_EQ(s.host.bytes_written, 3 * kBlock);
  EXPECT_EQ(s.host.evictions, 1u);
  EXPECT_EQ(s.dropped, 0u);
}

TEST(TierManager, PromotesOnNvmeHit) {
  auto tm = Make(2, 2);
  MustInsert(*tm, 1);
  MustInsert(*tm, 2);
  MustInsert(*tm, 3);  // 1 -> nvme
  AccessResult r = tm->Access(Id(1));
  EXPECT_EQ(r.found, Tier::kNvme);
  ASSERT_EQ(r.moves.size(), 2u);
  // The promotion is listed first (its read precedes the write that reuses the space).
  EXPECT_TRUE(r.moves[0].id == Id(1) && r.moves[0].from == Tier::kNvme &&
              r.moves[0].to == Tier::kHost);
  EXPECT_TRUE(HasMove(r.moves, 2, Tier::kHost, Tier::kNvme));
  EXPECT_EQ(tm->Locate(Id(1)), Tier::kHost);
  EXPECT_EQ(tm->Locate(Id(2)), Tier::kNvme);
  EXPECT_EQ(tm->Access(Id(1)).found, Tier::kHost);
  EXPECT_EQ(tm->Access(Id(42)).found, Tier::kNone);
  const auto s = tm->Stats();
  EXPECT_EQ(s.nvme.hits, 1u);
  EXPECT_EQ(s.host.hits, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.accesses, 3u);
  EXPECT_EQ(s.nvme.bytes_read, kBlock);
}

TEST(TierManager, NvmeVictimsAreDroppedInCascade) {
  auto tm = Make(1, 2);
  MustInsert(*tm, 1);
  MustInsert(*tm, 2);               // 1 -> nvme
  MustInsert(*tm, 3);               // 2 -> nvme
  auto moves = MustInsert(*tm, 4);  // 3 -> nvme, which drops 1
  EXPECT_TRUE(HasMove(moves, 3, Tier::kHost, Tier::kNvme));
  EXPECT_TRUE(HasMove(moves, 1, Tier::kNvme, Tier::kNone));
  // The drop that makes room comes before the write into it.
  ASSERT_EQ(moves.size(), 2u);
  EXPECT_EQ(moves[0].to, Tier::kNone);
  EXPECT_EQ(tm->Locate(Id(1)), Tier::kNone);
  const auto s = tm->Stats();
  EXPECT_EQ(s.dropped, 1u);
  EXPECT_EQ(s.nvme.evictions, 1u);
  EXPECT_EQ(s.host.evictions, 3u);
}

TEST(TierManager, WithoutNvmeHostVictimsAreDropped) {
  auto tm = Make(2, 0);
  MustInsert(*tm, 1);
  MustInsert(*tm, 2);
  auto moves = MustInsert(*tm, 3);
  EXPECT_TRUE(HasMove(moves, 1, Tier::kHost, Tier::kNone));
  EXPECT_EQ(tm->Stats().dropped, 1u);
}

TEST(TierManager, SecondAccessAdmissionSkipsOneHitBlocks) {
  auto tm = Make(1, 2, "lru", "second-access");
  MustInsert(*tm, 1);
  auto moves = MustInsert(*tm, 2);  // 1 was never hit: not written to NVMe
  EXPECT_TRUE(HasMove(moves, 1, Tier::kHost, Tier::kNone));
  EXPECT_EQ(tm->Locate(Id(1)), Tier::kNone);
  EXPECT_EQ(tm->Stats().rejected, 1u);
  EXPECT_EQ(tm->Stats().nvme.bytes_written, 0u);

  // 2 is hit, so it is admitted when evicted.
  EXPECT_EQ(tm->Access(Id(2)).found, Tier::kHost);
  moves = MustInsert(*tm, 3);
  EXPECT_TRUE(HasMove(moves, 2, Tier::kHost, Tier::kNvme));

  // 1 comes back (a ghost hit): admitted on its second life even without a hit.
  EXPECT_EQ(tm->Access(Id(1)).found, Tier::kNone);
  MustInsert(*tm, 1);  // evicts 3: one-hit, rejected
  EXPECT_EQ(tm->Locate(Id(3)), Tier::kNone);
  moves = MustInsert(*tm, 4);
  EXPECT_TRUE(HasMove(moves, 1, Tier::kHost, Tier::kNvme));
  const auto s = tm->Stats();
  EXPECT_EQ(s.rejected, 2u);
  EXPECT_EQ(s.demotions, 2u);
  EXPECT_EQ(s.nvme.bytes_written, 2 * kBlock);
}

TEST(TierManager, RemoveCascadesAlongChains) {
  auto tm = Make(10, 10);
  MustInsert(*tm, 1);
  MustInsert(*tm, 2, 1);
  MustInsert(*tm, 3, 2);
  MustInsert(*tm, 4, 1);
  MustInsert(*tm, 5);
  const BlockId two[] = {Id(2)};
  RemoveResult r = tm->Remove(two, /*cascade=*/true);
  EXPECT_EQ(r.removed_blocks, 2u);
  EXPECT_TRUE(HasMove(r.moves, 2, Tier::kHost, Tier::kNone));
  EXPECT_TRUE(HasMove(r.moves, 3, Tier::kHost, Tier::kNone));
  EXPECT_EQ(tm->Locate(Id(1)), Tier::kHost);
  EXPECT_EQ(tm->Locate(Id(4)), Tier::kHost);
  const BlockId one[] = {Id(1)};
  r = tm->Remove(one, /*cascade=*/false);
  EXPECT_EQ(r.removed_blocks, 1u);
  EXPECT_EQ(tm->Locate(Id(4)), Tier::kHost);
  // A later cascade from 1 (no longer resident) still reaches its chained blocks.
  r = tm->Remove(one, /*cascade=*/true);
  EXPECT_EQ(r.removed_blocks, 1u);
  EXPECT_EQ(tm->Locate(Id(4)), Tier::kNone);
  EXPECT_EQ(tm->Locate(Id(5)), Tier::kHost);
  EXPECT_EQ(tm->Stats().removed_explicit, 4u);
  EXPECT_EQ(tm->Stats().host.used_bytes, kBlock);
}

TEST(TierManager, PinnedBlocksStay) {
  auto tm = Make(2, 0);
  MustInsert(*tm, 1);
  ASSERT_TRUE(tm->Pin(Id(1)).ok());
  MustInsert(*tm, 2);
  auto moves = MustInsert(*tm, 3);  // 1 is older but pinned: 2 goes
  EXPECT_TRUE(HasMove(moves, 2, Tier::kHost, Tier::kNone));
  EXPECT_EQ(tm->Locate(Id(1)), Tier::kHost);
  ASSERT_TRUE(tm->Pin(Id(3)).ok());
  // Everything pinned: no room, and nothing changed.
  auto full = tm->Insert(Id(4), BlockId{}, kBlock);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(tm->Locate(Id(4)), Tier::kNone);
  const BlockId three[] = {Id(3)};
  EXPECT_EQ(tm->Remove(three, false).pinned_skipped, 1u);
  EXPECT_EQ(tm->Locate(Id(3)), Tier::kHost);
  EXPECT_EQ(tm->Stats().pinned_blocks, 2u);
  ASSERT_TRUE(tm->Unpin(Id(1)).ok());
  EXPECT_EQ(tm->Unpin(Id(1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tm->Pin(Id(77)).code(), absl::StatusCode::kNotFound);
  moves = MustInsert(*tm, 4);
  EXPECT_TRUE(HasMove(moves, 1, Tier::kHost, Tier::kNone));
  EXPECT_EQ(tm->Remove(three, false, /*force=*/true).removed_blocks, 1u);
  EXPECT_EQ(tm->Stats().pinned_blocks, 0u);
}

TEST(TierManager, WatermarksEvictDownToLow) {
  TierManagerOptions o;
  o.host.capacity_bytes = 10 * kBlock;
  o.host.high_watermark = 0.8;
  o.host.low_watermark = 0.5;
  auto made = TierManager::Create(o);
  ASSERT_TRUE(made.ok()) << made.status();
  auto& tm = **made;
  for (uint32_t i = 1; i <= 8; ++i) MustInsert(tm, i);
  EXPECT_EQ(tm.Stats().host.blocks, 8u);  // at the high watermark, not above
  auto moves = MustInsert(tm, 9);
  EXPECT_EQ(moves.size(), 4u);
  EXPECT_EQ(tm.Stats().host.blocks, 5u);
  EXPECT_EQ(tm.Locate(Id(4)), Tier::kNone);
  EXPECT_EQ(tm.Locate(Id(5)), Tier::kHost);
  EXPECT_TRUE(tm.Reclaim().empty());
}

TEST(TierManager, RejectsBadOptionsAndBlocks) {
  TierManagerOptions o;
  EXPECT_FALSE(TierManager::Create(o).ok());  // no host capacity
  o.host.capacity_bytes = 100;
  o.host.low_watermark = 0.9;
  o.host.high_watermark = 0.5;
  EXPECT_EQ(TierManager::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.host.low_watermark = o.host.high_watermark = 1.0;
  o.host.policy = "belady";
  EXPECT_FALSE(TierManager::Create(o).ok());
  o.host.policy = "lru";
  o.nvme.capacity_bytes = 100;
  o.admission = "sometimes";
  EXPECT_FALSE(TierManager::Create(o).ok());
  o.admission = "always";
  auto tm = TierManager::Create(o);
  ASSERT_TRUE(tm.ok());
  EXPECT_EQ((*tm)->Insert(Id(1), BlockId{}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*tm)->Insert(Id(1), BlockId{}, 101).status().code(),
            absl::StatusCode::kResourceExhausted);
  // A duplicate insert changes nothing.
  ASSERT_TRUE((*tm)->Insert(Id(1), BlockId{}, 10).ok());
  auto again = (*tm)->Insert(Id(1), BlockId{}, 10);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->empty());
  EXPECT_EQ((*tm)->Stats().inserts, 1u);
  EXPECT_EQ((*tm)->Stats().host.used_bytes, 10u);
}

// Exclusive tiers with LRU in both and demotion on eviction behave as one LRU cache of the
// combined size: same hits on a random workload as a reference LRU.
TEST(TierManager, TwoTierLruMatchesOneLruOfCombinedSize) {
  auto tm = Make(3, 5);
  std::list<uint32_t> ref;  // front: most recent
  std::mt19937 rng(99);
  uint64_t ref_hits = 0, hits = 0;
  for (int i = 0; i < 5000; ++i) {
    const uint32_t b = 1 + rng() % 14;
    auto it = std::find(ref.begin(), ref.end(), b);
    if (it != ref.end()) {
      ++ref_hits;
      ref.erase(it);
    }
    ref.push_front(b);
    if (ref.size() > 8) ref.pop_back();
    if (tm->Access(Id(b)).found != Tier::kNone) {
      ++hits;
    } else {
      MustInsert(*tm, b);
    }
  }
  EXPECT_EQ(hits, ref_hits);
  EXPECT_GT(hits, 0u);
  EXPECT_EQ(tm->Stats().host.hits + tm->Stats().nvme.hits, hits);
}

// Random operations with random sizes under every policy: used bytes never pass a tier's
// capacity, Stats agrees with Locate, and moves describe every placement change.
TEST(TierManager, CapacityNeverExceeded) {
  for (const char* policy : {"lru", "s3fifo", "prefix-lru", "prefix-freq"}) {
    for (const char* admission : {"always", "second-access"}) {
      TierManagerOptions o;
      o.host.capacity_bytes = 1000;
      o.nvme.capacity_bytes = 3000;
      o.host.high_watermark = 0.9;
      o.host.low_watermark = 0.7;
      o.host.policy = o.nvme.policy = policy;
      o.admission = admission;
      o.typical_block_bytes = 100;
      auto made = TierManager::Create(o);
      ASSERT_TRUE(made.ok()) << made.status();
      TierManager& tm = **made;
      std::mt19937 rng(4242);
      absl::flat_hash_map<uint32_t, Tier> where;  // maintained from moves alone
      auto apply = [&](const std::vector<TierMove>& moves) {
        for (const TierMove& m : moves) {
          for (uint32_t b = 1; b <= 60; ++b) {
            if (Id(b) == m.id) {
              if (m.to == Tier::kNone) {
                where.erase(b);
              } else {
                where[b] = m.to;
              }
            }
          }
        }
      };
      for (int i = 0; i < 4000; ++i) {
        const uint32_t b = 1 + rng() % 60;
        const uint32_t op = rng() % 100;
        if (op < 70) {
          AccessResult r = tm.Access(Id(b));
          apply(r.moves);
          if (r.found == Tier::kNone) {
            auto moves = tm.Insert(Id(b), b > 1 ? Id(b - 1) : BlockId{}, 20 + rng() % 200);
            ASSERT_TRUE(moves.ok()) << moves.status();
            where[b] = Tier::kHost;
            apply(*moves);
          }
        } else if (op < 80) {
          const BlockId ids[] = {Id(b)};
          apply(tm.Remove(ids, rng() % 2 == 0, true).moves);
        } else if (op < 90) {
          if (tm.Pin(Id(b)).ok()) {
            ASSERT_TRUE(tm.Unpin(Id(b)).ok());
          }
        } else {
          apply(tm.Reclaim());
        }
        const TierManagerStats s = tm.Stats();
        ASSERT_LE(s.host.used_bytes, o.host.capacity_bytes) << policy;
        ASSERT_LE(s.nvme.used_bytes, o.nvme.capacity_bytes) << policy;
        uint64_t host = 0, nvme = 0;
        for (uint32_t k = 1; k <= 60; ++k) {
          const Tier t = tm.Locate(Id(k));
          host += t == Tier::kHost;
          nvme += t == Tier::kNvme;
          auto w = where.find(k);
          ASSERT_EQ(t, w == where.end() ? Tier::kNone : w->second)
              << policy << " " << admission << " block " << k << " op " << i;
        }
        ASSERT_EQ(host, s.host.blocks);
        ASSERT_EQ(nvme, s.nvme.blocks);
      }
      const TierManagerStats s = tm.Stats();
      EXPECT_GT(s.host.evictions, 0u) << policy;
      EXPECT_GT(s.host.hits, 0u) << policy;
    }
  }
}

TEST(TierManager, TranscodedVictimsStaySmallerAndLeaveOnTheirSecondEviction) {
  TierManagerOptions o;
  o.host.capacity_bytes = 4 * kBlock;  // blocks of 10 bytes, transcoded to 5
  o.transcode_ratio = 0.5;
  auto made = TierManager::Create(o);
  ASSERT_TRUE(made.ok()) << made.status();
  TierManager& tm = **made;
  for (uint32_t id = 1; id <= 4; ++id) MustInsert(tm, id);
  // Full: block 1 (least recently used) is transcoded instead of dropped.
  auto moves = MustInsert(tm, 5);
  EXPECT_TRUE(HasMove(moves, 1, Tier::kHost, Tier::kHost));
  EXPECT_FALSE(HasMove(moves, 1, Tier::kHost, Tier::kNone));
  // 4 bytes short of room: 2 is transcoded as well, and both fit beside 3, 4 and 5.
  EXPECT_TRUE(HasMove(moves, 2, Tier::kHost, Tier::kHost));
  for (uint32_t id = 1; id <= 5; ++id) EXPECT_EQ(tm.Locate(Id(id)), Tier::kHost) << id;
  auto s = tm.Stats();
  EXPECT_EQ(s.transcoded, 2u);
  EXPECT_EQ(s.host.used_bytes, 3 * kBlock + kBlock);
  EXPECT_EQ(s.dropped, 0u);
  EXPECT_EQ(tm.Access(Id(1)).found, Tier::kHost);
  EXPECT_EQ(tm.Stats().transcoded_hits, 1u);
  EXPECT_EQ(tm.Access(Id(3)).found, Tier::kHost);
  EXPECT_EQ(tm.Stats().transcoded_hits, 1u);
  // More blocks: every victim is transcoded once, then dropped on its next eviction, never
  // transcoded twice; used bytes never pass the capacity.
  for (uint32_t id = 6; id <= 40; ++id) {
    MustInsert(tm, id);
    EXPECT_LE(tm.Stats().host.used_bytes, o.host.capacity_bytes);
  }
  s = tm.Stats();
  EXPECT_GT(s.dropped, 0u);
  EXPECT_EQ(s.dropped + s.host.blocks, 40u);
  // Every dropped block was transcoded first, and each block at most once: the transcoded ones
  // are the dropped plus the resident half-size ones.
  const uint64_t resident_transcoded = (kBlock * s.host.blocks - s.host.used_bytes) / (kBlock / 2);
  EXPECT_EQ(s.transcoded, s.dropped + resident_transcoded);

  o.transcode_ratio = 1.0;
  EXPECT_FALSE(TierManager::Create(o).ok());
}

}  // namespace
}  // namespace strata
