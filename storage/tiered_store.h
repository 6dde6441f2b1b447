// Host DRAM over NVMe: the NVMe tier as the host tier's write-back target.
//
// The host tier (storage/host_tier.h, with options.write_back) chooses its victims with its own
// eviction policy and queues them; a background thread here drains the queue: the NVMe
// admission rule decides whether a victim is written down or dropped, the NVMe eviction policy
// makes room (dropping NVMe blocks) when the NVMe tier would pass its high watermark, then the
// victims are written (data durable, then catalog entry) and only then leave host memory. A
// victim that does not fit even after NVMe eviction (disk full, everything pinned) is dropped
// and counted; the host tier keeps serving.
//
// A fetch (Acquire) of an NVMe block promotes it first: a host extent is reserved, the block
// is read into it, its CRC32C is verified by the host tier's commit (and by the store on the
// first read after a restart), and it becomes a host block; it leaves NVMe (tiers are
// exclusive). A block failing its CRC is dropped from NVMe, counted, and reported not found.
// Lookup, Evict (with cascade across both tiers), Pin and Unpin see both tiers.
//
// On open the NVMe blocks are recovered from the RocksDB catalog (NvmeBlockStore).
//
// Write failures (a full disk under the tier files or the catalog, an I/O error): the victims
// concerned are dropped and counted, the store reports itself degraded (Degraded(), Counters),
// and the write-back thread probes once a second (NvmeBlockStore::ProbeWrites) until writes
// work again, then clears it; no restart is needed. An NVMe eviction whose catalog delete fails
// keeps its block (and its place in the eviction policy), so no extent is ever lost to a
// failure.
//
// Locking: `io_mu_` serializes NVMe I/O against removal (a block is never removed while read);
// `meta_mu_` guards the NVMe policy, admission and pins and is a leaf lock. No lock of this
// class is held while calling into the host tier, except io_mu_ (the host tier never calls
// back into paths that take it).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "storage/block_store.h"
#include "storage/eviction/admission_policy.h"
#include "storage/eviction/eviction_policy.h"
#include "storage/host_tier.h"
#include "storage/nvme_tier.h"
#include "storage/watermarks.h"

namespace strata {

struct TieredStoreOptions {
  NvmeBlockStoreOptions nvme;
  double nvme_high_watermark = kDefaultHighWatermark;
  double nvme_low_watermark = kDefaultLowWatermark;
  std::string nvme_policy = "lru";   // OnlineEvictionPolicyNames()
  std::string admission = "always";  // AdmissionPolicyNames()
  size_t write_back_batch = 16;      // victims written per NVMe batch
  // Operator-facing warnings (disk full, write errors, CRC failures); may be null.
  std::function<void(const std::string&)> warn;
};

class TieredStore final : public BlockStore {
 public:
  // `host` must outlive the store and have options().write_back set.
  static absl::StatusOr<std::unique_ptr<TieredStore>> Open(HostTier* host,
                                                           TieredStoreOptions options);
  ~TieredStore() override;
  TieredStore(const TieredStore&) = delete;
  TieredStore& operator=(const TieredStore&) = delete;

  // Reserve items already on NVMe are answered kExists (dedup) instead of being reserved again.
  ReserveResult Reserve(const NamespaceId& ns, std::span<const ReserveItem> items) override;
  absl::StatusOr<std::vector<BlockStatus>> Commit(
      uint64_t reservation_id, std::span<const uint32_t> crcs,
      CommitCheck check = CommitCheck::kReread) override {
    return host_->Commit(reservation_id, crcs, check);
  }
  absl::Status Abort(uint64_t reservation_id) override { return host_->Abort(reservation_id); }
  absl::StatusOr<BlockStatus> RenameReserved(uint64_t reservation_id, const NamespaceId& ns,
                                             const ReserveItem& item) override;

  // Leading blocks present in either tier; `tiers` gets kHost or kNvme for each.
  size_t Lookup(const NamespaceId& ns, std::span<const BlockId> ids,
                std::vector<Tier>* tiers) override;
  // Promotes the NVMe blocks among `ids`, then leases them all from the host tier.
  AcquireResult Acquire(const NamespaceId& ns, std::span<const BlockId> ids) override;
  absl::Status Release(uint64_t lease_id) override { return host_->Release(lease_id); }
  bool BeginLeaseRead(uint64_t lease_id, std::span<const ArenaExtent> extents,
                      uint32_t holds) override {
    return host_->BeginLeaseRead(lease_id, extents, holds);
  }
  void EndLeaseRead(uint64_t lease_id) override { host_->EndLeaseRead(lease_id); }
  absl::Status BeginReservedWrite(uint64_t reservation_id, ArenaExtent extent) override {
    return host_->BeginReservedWrite(reservation_id, extent);
  }
  void EndReservedWrite(uint64_t reservation_id) override {
    host_->EndReservedWrite(reservation_id);
  }
  std::vector<ArenaExtent> ReservedExtents(uint64_t reservation_id) const override {
    return host_->ReservedExtents(reservation_id);
  }

  EvictResult Evict(const NamespaceId& ns, std::span<const BlockId> ids, bool cascade,
                    bool force) override;
  std::vector<BlockStatus> Pin(const NamespaceId& ns, std::span<const BlockId> ids,
                               absl::Duration ttl) override;
  std::vector<BlockStatus> Unpin(const NamespaceId& ns, std::span<const BlockId> ids) override;

  std::vector<BlockInfo> List(const NamespaceId* ns, size_t limit,
                              uint64_t* cursor) const override {
    return host_->List(ns, limit, cursor);
  }
  std::vector<BlockInfo> Inspect(std::span<const BlockId> ids) const override {
    return host_->Inspect(ids);
  }
  absl::flat_hash_map<NamespaceId, std::pair<uint64_t, uint64_t>> UsageByNamespace()
      const override {
    return host_->UsageByNamespace();
  }

  std::vector<BlockInfo> AllBlocks() const override;
  std::vector<BlockId> AllIds() const override;
  bool Holds(const BlockId& id) const override;

  BlockStoreStats Stats() const override {
    BlockStoreStats s;
    s.host = host_->Stats();
    s.nvme = Counters();
    return s;
  }
  void ReclaimExpired() override { host_->ReclaimExpired(); }
  void SetChangeHook(BlockEventHook hook) override { host_->SetChangeHook(std::move(hook)); }

  uint8_t* arena_base() const override { return host_->base(); }
  uint64_t arena_bytes() const override { return host_->capacity(); }
  absl::Duration reservation_timeout() const override {
    return host_->options().reservation_timeout;
  }
  absl::Duration lease_timeout() const override { return host_->options().lease_timeout; }

  // Stops the write-back thread; queued victims are dropped. Idempotent.
  void Stop();

  NvmeTierCounters Counters() const;
  // Every block on NVMe, and whether one is (any namespace).
  std::vector<BlockId> NvmeIds() const;
  // The same as BlockInfo (id, namespace, parent, size, CRC), for moving blocks off the node.
  std::vector<BlockInfo> NvmeBlocks() const;
  bool HoldsOnNvme(const BlockId& id) const;
  // True while NVMe writes fail (see the top); `why` gets the first error of the episode.
  bool Degraded(std::string* why = nullptr) const;
  const NvmeRecoveryReport& recovery() const { return store_->recovery(); }
  const NvmeTier& nvme_tier() const { return store_->tier(); }

 private:
  TieredStore(HostTier* host, TieredStoreOptions options)
      : host_(host), options_(std::move(options)) {}
  bool OnNvme(const NamespaceId& ns, const BlockId& id, CatalogEntry* entry = nullptr) const;
  // Every committed host-tier block, page by page.
  void ForEachHostBlock(const std::function<void(BlockInfo)>& fn) const;
  void WriteBackLoop();
  void WriteBack(std::vector<DemotionItem>& items);
  // Drops NVMe blocks until `need` more bytes fit under the limits. io_mu_ held.
  void MakeRoom(uint64_t need);
  // Removes an NVMe block (io_mu_ held). True if it was there.
  bool RemoveNvme(const BlockId& id);
  static constexpr size_t kPromoteBatch = 64;
  struct Promotion {
    BlockId id;
    CatalogEntry entry;
  };
  // Stages NVMe blocks into host memory: one host reservation per block (each commits or aborts
  // on its own), then one batched NVMe read for all of them, so a fetch of many NVMe blocks
  // keeps the queue depth busy instead of reading them one by one.
  void Promote(const NamespaceId& ns, std::span<const Promotion> blocks);
  bool PinnedOnNvme(const BlockId& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(meta_mu_);
  // Starts (or continues) a degraded episode; logs its first error.
  void MarkDegraded(const absl::Status& cause);
  // While degraded, at most once a second: probe writes, and end the episode when they work.
  void ProbeIfDegraded();
  void Warn(const std::string& msg) const {
    if (options_.warn) options_.warn(msg);
  }

  HostTier* const host_;
  const TieredStoreOptions options_;
  std::unique_ptr<NvmeBlockStore> store_;  // NvmeTier itself is thread-safe; see io_mu_

  absl::Mutex io_mu_;
  mutable absl::Mutex meta_mu_;
  std::unique_ptr<EvictionPolicy> policy_ ABSL_GUARDED_BY(meta_mu_);
  std::unique_ptr<AdmissionPolicy> admission_ ABSL_GUARDED_BY(meta_mu_);
  absl::flat_hash_map<BlockId, absl::Time> pins_ ABSL_GUARDED_BY(meta_mu_);

  struct Atomics {
    std::atomic<uint64_t> demotions{0}, demoted_bytes{0}, promotions{0}, promoted_bytes{0},
        admission_rejected{0}, nvme_evictions{0}, nvme_full_drops{0}, nvme_write_errors{0},
        nvme_read_errors{0}, nvme_crc_failures{0}, nvme_removed_explicit{0};
  } n_;

  std::atomic<bool> degraded_{false};
  mutable absl::Mutex health_mu_;
  std::string degraded_reason_ ABSL_GUARDED_BY(health_mu_);
  absl::Time last_probe_ ABSL_GUARDED_BY(health_mu_);

  std::atomic<bool> stop_{false};
  std::thread writer_;
};

}  // namespace strata
