// TieredStore's promotion (a fetch of NVMe blocks): batches past the batch limit, bytes intact
// in host memory, pins carried over, NVMe copies gone, a block evicted before the fetch not
// brought back.
#include "storage/tiered_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "common/crc32c.h"
#include "storage/arena.h"
#include "test_util.h"

namespace strata {
namespace {

using testing_nvme::IdOf;
using testing_nvme::Payload;
using testing_nvme::TempDir;

constexpr size_t kBlock = 100'000;  // not a multiple of 4 KiB: reads fill the extent's padding
constexpr int kBlocks = 220;        // 22 MB through a 16 MiB host tier

struct Fixture {
  TempDir dir;
  std::unique_ptr<MmapArena> arena;
  std::unique_ptr<HostTier> host;
  std::unique_ptr<TieredStore> store;
  NamespaceId ns = IdOf(777);
  std::vector<std::vector<std::byte>> data;

  void Open() {
    auto a = MmapArena::Create(16 << 20, /*huge_pages=*/false);
    ASSERT_TRUE(a.ok());
    arena = std::move(*a);
    HostTierOptions ho;
    ho.alignment = kNvmeAlignment;  // as stratad sets it with an NVMe tier
    ho.write_back = true;
    ho.high_watermark = 0.9;
    ho.low_watermark = 0.6;
    host = std::make_unique<HostTier>(arena->data(), arena->size(), ho);
    TieredStoreOptions to;
    to.nvme.tier.files = {{dir.Sub("tier.dat"), 64 << 20}};
    to.nvme.tier.sync_after_write = false;
    to.nvme.tier.shared_ring = true;
    to.nvme.catalog_path = dir.Sub("catalog");
    auto s = TieredStore::Open(host.get(), to);
    ASSERT_TRUE(s.ok()) << s.status();
    store = std::move(*s);
  }

  void Publish(int i) {
    data.push_back(Payload(1000 + i, kBlock));
    ReserveItem item{IdOf(i), BlockId{}, kBlock};
    ReserveResult r = store->Reserve(ns, {&item, 1});
    ASSERT_EQ(r.status[0], BlockStatus::kOk) << i;
    std::memcpy(host->base() + r.offsets[0], data.back().data(), kBlock);
    const uint32_t crc = Crc32c(data.back().data(), kBlock);
    auto c = host->Commit(r.reservation_id, {&crc, 1});
    ASSERT_TRUE(c.ok() && (*c)[0] == BlockStatus::kOk) << i;
  }

  // Publishes every block, waits until write-back moved the oldest to NVMe, and drops what is
  // still in host memory, so that promotions have room without write-back: `down` gets the
  // blocks on NVMe (at least 70, enough to cross a promotion batch).
  void PublishAndDemote(std::vector<BlockId>* down) {
    for (int i = 0; i < kBlocks; ++i) ASSERT_NO_FATAL_FAILURE(Publish(i));
    // Write-back runs on its own thread: wait until the oldest blocks are down.
    for (int t = 0; t < 500 && store->Counters().nvme_blocks < 80; ++t)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::vector<BlockId> up;
    for (int i = 0; i < kBlocks; ++i) (store->HoldsOnNvme(IdOf(i)) ? *down : up).push_back(IdOf(i));
    ASSERT_GE(down->size(), 70u) << "not enough blocks demoted to cross a promotion batch";
    store->Evict(ns, up, /*cascade=*/false, /*force=*/true);
  }
};

TEST(TieredStorePromote, BatchesKeepBytesPinsAndExclusiveTiers) {
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(f.Open());
  std::vector<BlockId> down;
  ASSERT_NO_FATAL_FAILURE(f.PublishAndDemote(&down));
  // A pin set while on NVMe must follow the block; a block evicted from NVMe must stay gone.
  const BlockId pinned = down[3], evicted = down[5];
  ASSERT_EQ(f.store->Pin(f.ns, {&pinned, 1}, absl::Hours(1))[0], BlockStatus::kOk);
  f.store->Evict(f.ns, {&evicted, 1}, false, true);

  const uint64_t promotions0 = f.store->Counters().promotions;
  AcquireResult a = f.store->Acquire(f.ns, down);
  ASSERT_EQ(a.status.size(), down.size());
  size_t ok = 0;
  for (size_t k = 0; k < down.size(); ++k) {
    const BlockId& id = down[k];
    if (id == evicted) {
      EXPECT_EQ(a.status[k], BlockStatus::kNotFound);
      continue;
    }
    ASSERT_EQ(a.status[k], BlockStatus::kOk) << k;
    ASSERT_EQ(a.sizes[k], kBlock);
    int i = -1;
    for (int j = 0; j < kBlocks; ++j)
      if (IdOf(j) == id) i = j;
    ASSERT_GE(i, 0);
    EXPECT_EQ(std::memcmp(f.host->base() + a.offsets[k], f.data[i].data(), kBlock), 0) << k;
    EXPECT_FALSE(f.store->HoldsOnNvme(id)) << "in both tiers: " << k;
    ++ok;
  }
  EXPECT_EQ(ok, down.size() - 1);
  EXPECT_EQ(f.store->Counters().promotions - promotions0, ok);
  EXPECT_FALSE(f.store->HoldsOnNvme(evicted));
  auto info = f.host->Inspect({&pinned, 1});
  ASSERT_EQ(info.size(), 1u);
  EXPECT_GT(info[0].pinned_for, absl::Minutes(50));
  EXPECT_TRUE(f.host->Release(a.lease_id).ok());
  f.store->Stop();
}

// An explicit evict of an NVMe block that a fetch promotes at the same moment: whichever comes
// first, the evict answers kOk and the block is gone from both tiers afterwards (the evict used
// to miss a block whose promotion was under way: kNotFound, and the block stayed in host memory).
TEST(TieredStorePromote, AnEvictRacingAPromotionRemovesTheBlock) {
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(f.Open());
  std::vector<BlockId> down;
  ASSERT_NO_FATAL_FAILURE(f.PublishAndDemote(&down));
  for (size_t k = 0; k < down.size(); ++k) {
    const BlockId id = down[k];
    std::atomic<int> ready{0};
    AcquireResult a;
    std::thread fetch([&] {
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      a = f.store->Acquire(f.ns, {&id, 1});
    });
    ready.fetch_add(1);
    while (ready.load() < 2) {
    }
    if (k % 2) std::this_thread::yield();
    const EvictResult e = f.store->Evict(f.ns, {&id, 1}, false, false);
    fetch.join();
    if (a.lease_id != 0) {
      EXPECT_TRUE(f.store->Release(a.lease_id).ok());
    }
    EXPECT_EQ(e.status[0], BlockStatus::kOk) << k;
    EXPECT_FALSE(f.store->Holds(id)) << k;
  }
  f.store->Stop();
}

// Listing the node's blocks for the cluster layer: host and NVMe blocks, each once.
TEST(TieredStoreList, AllBlocksAndIdsCoverBothTiersOnce) {
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(f.Open());
  for (int i = 0; i < kBlocks; ++i) ASSERT_NO_FATAL_FAILURE(f.Publish(i));
  for (int t = 0; t < 500 && f.store->Counters().nvme_blocks < 80; ++t)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  size_t on_nvme = 0;
  for (int i = 0; i < kBlocks; ++i) on_nvme += f.store->HoldsOnNvme(IdOf(i));
  ASSERT_GT(on_nvme, 0u);
  ASSERT_LT(on_nvme, static_cast<size_t>(kBlocks)) << "some blocks are still in host memory";
  const std::vector<BlockId> ids = f.store->AllIds();
  const std::vector<BlockInfo> blocks = f.store->AllBlocks();
  absl::flat_hash_set<BlockId> id_set(ids.begin(), ids.end()), block_set;
  for (const BlockInfo& b : blocks) {
    block_set.insert(b.id);
    EXPECT_EQ(b.size, kBlock);
  }
  EXPECT_EQ(ids.size(), static_cast<size_t>(kBlocks));
  EXPECT_EQ(blocks.size(), static_cast<size_t>(kBlocks));
  EXPECT_EQ(id_set.size(), ids.size()) << "an id listed twice";
  EXPECT_EQ(block_set, id_set);
  for (int i = 0; i < kBlocks; ++i) EXPECT_TRUE(f.store->Holds(IdOf(i))) << i;
  EXPECT_FALSE(f.store->Holds(IdOf(kBlocks + 1)));
  // Through the BlockStore seam, once write-back is idle (nothing publishes, so no block moves
  // between the reads below): each block's tier, and the NVMe counters in the stats.
  for (int t = 0; t < 500 && f.host->Stats().demoting_blocks > 0; ++t)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const BlockStore& seam = *f.store;
  std::vector<BlockId> all;
  for (int i = 0; i < kBlocks; ++i) all.push_back(IdOf(i));
  std::vector<Tier> tiers;
  ASSERT_EQ(f.store->Lookup(f.ns, all, &tiers), all.size());
  for (int i = 0; i < kBlocks; ++i)
    EXPECT_EQ(tiers[i], f.store->HoldsOnNvme(IdOf(i)) ? Tier::kNvme : Tier::kHost) << i;
  size_t now_on_nvme = 0;
  for (Tier t : tiers) now_on_nvme += t == Tier::kNvme;
  const BlockStoreStats stats = seam.Stats();
  ASSERT_TRUE(stats.nvme.has_value());
  EXPECT_EQ(stats.nvme->nvme_blocks, now_on_nvme);
  EXPECT_EQ(seam.arena_base(), f.host->base());
  f.store->Stop();
}

// While write-back moves blocks to NVMe, every listing still has every block: each move puts a
// block in its new tier before it leaves the old one, and the listing reads host memory, NVMe
// and host memory again. (Reading NVMe, then host memory, missed blocks demoted in between: the
// cluster layer then left them out of a drain.)
TEST(TieredStoreList, NoListingMissesABlockBeingWrittenBack) {
  Fixture f;
  ASSERT_NO_FATAL_FAILURE(f.Open());
  size_t listings = 0;
  for (int i = 0; i < kBlocks; ++i) {
    ASSERT_NO_FATAL_FAILURE(f.Publish(i));
    for (int again = 0; again < 3; ++again, ++listings) {
      const std::vector<BlockId> ids = f.store->AllIds();
      const std::vector<BlockInfo> blocks = f.store->AllBlocks();
      absl::flat_hash_set<BlockId> id_set(ids.begin(), ids.end()), block_set;
      for (const BlockInfo& b : blocks) block_set.insert(b.id);
      for (int j = 0; j <= i; ++j) {
        ASSERT_TRUE(id_set.contains(IdOf(j))) << "AllIds missed block " << j << " of " << i + 1;
        ASSERT_TRUE(block_set.contains(IdOf(j)))
            << "AllBlocks missed block " << j << " of " << i + 1;
      }
      EXPECT_EQ(ids.size(), id_set.size()) << "an id listed twice";
      EXPECT_EQ(blocks.size(), block_set.size()) << "a block listed twice";
    }
  }
  EXPECT_GT(f.store->Counters().demotions, 0u) << "nothing was written back while listing";
  EXPECT_GT(listings, 0u);
  f.store->Stop();
}

}  // namespace
}  // namespace strata
