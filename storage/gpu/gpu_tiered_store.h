// Device memory over host memory: the GPU tier as a BlockStore on top of the node's other tiers
// (HostBlockStore or TieredStore, "below").
//
// The device pool (DeviceMemory) is indexed by a HostTier of its own: the same extent allocator,
// reserve/commit, leases, pins, watermarks and eviction policy as host memory, with write-back
// on, so that its victims come to this store's demotion thread instead of being dropped.
//
// The tier holds copies: a promotion copies a block up from host memory and leaves the host copy
// where it is. Host memory is what CPU clients and other nodes read (over UCX), so its copy stays
// useful; the device copy is a hot replica for consumers on the device (same-node engines, NCCL
// peers). Consequences:
//   - A device victim whose block host memory (or NVMe below it) still holds leaves without a
//     copy; one that only the device holds is demoted: a host extent is reserved, the bytes are
//     copied down and committed with the host tier's CRC32C re-read, and only then does the
//     device extent go. No room below, or a failed copy: the victim is dropped and counted.
//   - A host fetch (Acquire) of a block that only the device holds (host memory evicted its copy
//     meanwhile) first stages it down the same way.
//   - Publishes land in host memory as always; ids already on the device answer kExists.
//   - Lookup reports kGpu for blocks on the device, else the tier below that holds them.
// Promotion is on demand: AcquireOnDevice (a consumer on the device) and Promote (reposition to
// the GPU tier). A host-memory hit by a CPU client does not promote: it would gain nothing.
//
// Integrity: a promoted block is recorded with the CRC32C host memory verified when it was
// committed; every copy down is verified against it by the host tier, and a device copy that
// fails is dropped from the device, never served. Device consumers that need the check on their
// side have the CRC in their lease.
//
// Operator views (List, Inspect, UsageByNamespace) stay those of host memory, where CPU fetches
// are served from; Counters() gives the device pool's. Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/block_store_wrapper.h"
#include "storage/gpu/device_memory.h"
#include "storage/host_tier.h"
#include "storage/tier.h"

namespace strata {

// What CopyToPeer did, per id in request order.
struct PeerFetchResult {
  std::vector<BlockStatus> status;  // kOk, kNotFound, kInvalid (does not fit at its offset)
  std::vector<uint64_t> sizes;      // bytes written (kOk)
  std::vector<uint32_t> crcs;       // their CRC32C, as the tiers verified them
  std::vector<Tier> sources;        // kGpu or kHost (kOk), else kNone
  uint64_t bytes = 0;
  bool declined = false;  // a device-only fetch the device alone could not serve: nothing copied
};

struct GpuTieredStoreOptions {
  // The device pool's bookkeeping: alignment, watermarks, eviction_policy, timeouts,
  // max_pin_ttl, tenant_max_share (for namespaces charged with SetNamespaceTenant: one tenant's
  // promotions then evict its own device copies, never another's). write_back is forced on;
  // zones and tenant_max_reserved_bytes are not used.
  HostTierOptions device;
  size_t demotion_batch = 16;  // victims copied down per batch
  // Operator-facing warnings (failed copies, CRC failures); may be null.
  std::function<void(const std::string&)> warn;
};

class GpuTieredStore final : public BlockStoreWrapper {
 public:
  // `below` must outlive the store. Registers below's host arena with the device for fast
  // copies (a failure there is a warning: copies then go through the runtime's staging).
  static absl::StatusOr<std::unique_ptr<GpuTieredStore>> Open(
      BlockStore* below, std::unique_ptr<DeviceMemory> memory, GpuTieredStoreOptions options);
  ~GpuTieredStore() override;
  GpuTieredStore(const GpuTieredStore&) = delete;
  GpuTieredStore& operator=(const GpuTieredStore&) = delete;

  // --- On the device ---
  // Copies the blocks of `ns` among `ids` up from the tiers below. Per id: kOk (on the device
  // when the call returns: already, or copied up), kNotFound (no tier holds it), kNoSpace (the
  // device is full of leased or pinned blocks, those of this call included), kInvalid (the
  // copy failed; counted and logged).
  std::vector<BlockStatus> Promote(const NamespaceId& ns, std::span<const BlockId> ids);
  // Leases blocks on the device, promoting those below first. Offsets are relative to
  // memory().device_address() and stay valid until ReleaseOnDevice or the lease's expiry.
  // With `promote` false, only blocks already on the device are leased.
  AcquireResult AcquireOnDevice(const NamespaceId& ns, std::span<const BlockId> ids,
                                bool promote = true);
  absl::Status ReleaseOnDevice(uint64_t lease_id);
  // Keeps a device lease's extents allocated while a consumer on the device reads them, even
  // past the lease's expiry (HostTier::BeginLeaseRead); false when the lease is gone or does
  // not cover them. Extents are device offsets.
  bool BeginDeviceRead(uint64_t lease_id, std::span<const ArenaExtent> extents) {
    return device_.BeginLeaseRead(lease_id, extents, /*holds=*/1);
  }
  void EndDeviceRead(uint64_t lease_id) { device_.EndLeaseRead(lease_id); }
  // Drops the device copies of blocks of `ns` that a tier below also holds (a demotion that
  // needs no copy). Per id: kOk (dropped), kNotFound (not on the device), kInProgress (only the
  // device holds it: it stays), kPinned.
  std::vector<BlockStatus> DropFromDevice(const NamespaceId& ns, std::span<const BlockId> ids);
  // Copies blocks of `ns` into a buffer another process on the node lent (DeviceMemory::
  // OpenPeerBuffer), block i at peer_offsets[i]: from the device, promoting blocks that only the
  // tiers below hold first unless `promote` is false; from host memory when the device has no
  // room for them (or `promote` is false). A block that does not fit at its offset is kInvalid
  // and nothing of it is written. An error when the copies failed: then no block is known to be
  // written whole.
  // `device_only_max_bytes` > 0: only when every block is on the device already and they come
  // to at most that many bytes (device-to-device copies, a bounded wait), and no other copy into
  // a lent buffer is under way; otherwise nothing is copied and the result is `declined`. For
  // callers that must not wait on host memory or on other callers' copies.
  absl::StatusOr<PeerFetchResult> CopyToPeer(const NamespaceId& ns, std::span<const BlockId> ids,
                                             std::span<const uint64_t> peer_offsets,
                                             PeerBuffer& peer, bool promote = true,
                                             uint64_t device_only_max_bytes = 0);

  // --- Blocks that arrive on the device from another node (device links, NCCL) ---
  // Device extents for `items` of `ns`, offsets relative to memory().device_address(). An id
  // the device or a tier below holds already is kExists (promote it instead). The reservation
  // never expires: the receiver commits or aborts it once its link is done with the extents.
  ReserveResult ReserveOnDevice(const NamespaceId& ns, std::span<const ReserveItem> items);
  // Makes the reserved blocks visible: `ids` and `crcs` are the reservation's kOk entries in
  // order, each CRC32C the sender's (its tiers verified them), recorded as given and checked by
  // every copy down. They are device-only blocks: demoted, not dropped, when evicted. The change
  // hook hears of them (kStored, tier kGpu) so the directory does.
  absl::StatusOr<std::vector<BlockStatus>> CommitOnDevice(uint64_t reservation_id,
                                                          std::span<const BlockId> ids,
                                                          std::span<const uint32_t> crcs);
  absl::Status AbortOnDevice(uint64_t reservation_id) { return device_.Abort(reservation_id); }

  // Charges the device copies of `ns` to `tenant` (options.device.tenant_max_share).
  void SetNamespaceTenant(const NamespaceId& ns, std::string_view tenant) {
    device_.SetNamespaceTenant(ns, tenant);
  }
  // The device's own view of blocks it holds (parents, sizes), in any namespace.
  std::vector<BlockInfo> InspectOnDevice(std::span<const BlockId> ids) const {
    return device_.Inspect(ids);
  }
  // Whether the device holds the block (any namespace).
  bool HoldsOnDevice(const BlockId& id) const;
  // Which of `ids` the device holds in `ns` (one look at the device's index for all of them).
  absl::flat_hash_set<BlockId> HeldOnDevice(const NamespaceId& ns,
                                            std::span<const BlockId> ids) const;
  DeviceMemory& memory() const { return *memory_; }
  GpuTierCounters Counters() const;
  // Blocks read out of buffers same-node engines lent (PublishFromDevice), `encoded_on_device`
  // of them quantised there: counted here with the tier's other copies to and from engines.
  void NotePeerReads(uint64_t blocks, uint64_t bytes, uint64_t encoded_on_device) {
    n_.peer_reads.fetch_add(blocks);
    n_.peer_read_bytes.fetch_add(bytes);
    n_.peer_device_encodes.fetch_add(encoded_on_device);
  }
  // Stops the demotion thread; queued victims are dropped. Idempotent.
  void Stop();

  // --- BlockStore: host memory's contract, with the device tier folded in (see the top); the
  // calls not named here go to the store below as they are ---
  ReserveResult Reserve(const NamespaceId& ns, std::span<const ReserveItem> items) override;
  absl::StatusOr<BlockStatus> RenameReserved(uint64_t reservation_id, const NamespaceId& ns,
                                             const ReserveItem& item) override;
  size_t Lookup(const NamespaceId& ns, std::span<const BlockId> ids,
                std::vector<Tier>* tiers) override;
  AcquireResult Acquire(const NamespaceId& ns, std::span<const BlockId> ids) override;
  EvictResult Evict(const NamespaceId& ns, std::span<const BlockId> ids, bool cascade,
                    bool force) override;
  std::vector<BlockStatus> Pin(const NamespaceId& ns, std::span<const BlockId> ids,
                               absl::Duration ttl) override;
  std::vector<BlockStatus> Unpin(const NamespaceId& ns, std::span<const BlockId> ids) override;
  std::vector<BlockInfo> AllBlocks() const override;
  std::vector<BlockId> AllIds() const override;
  bool Holds(const BlockId& id) const override {
    return below()->Holds(id) || HoldsOnDevice(id);
  }
  BlockStoreStats Stats() const override;
  void ReclaimExpired() override {
    below()->ReclaimExpired();
    device_.ReclaimExpired();
  }
  void SetChangeHook(BlockEventHook hook) override;

 private:
  GpuTieredStore(BlockStore* below, std::unique_ptr<DeviceMemory> memory,
                 GpuTieredStoreOptions options);
  static HostTierOptions DeviceIndexOptions(HostTierOptions o);
  // Device blocks of `ns` among `ids`, with their parents (BlockInfo).
  absl::flat_hash_map<BlockId, BlockInfo> OnDevice(const NamespaceId& ns,
                                                   std::span<const BlockId> ids) const;
  // `leases` gets a device lease on the blocks it promoted.
  void PromoteBatch(const NamespaceId& ns, std::span<const BlockId> ids,
                    absl::flat_hash_map<BlockId, BlockStatus>& out, std::vector<uint64_t>& leases);
  // Copies device-only blocks down into host memory (host fetches of them).
  void StageDown(const NamespaceId& ns, std::span<const BlockId> ids);
  void DemotionLoop();
  void Demote(std::span<const DemotionItem> items);
  BlockStore* below() const { return target(); }
  void Warn(const std::string& msg) const {
    if (options_.warn) options_.warn(msg);
  }

  const std::unique_ptr<DeviceMemory> memory_;
  const GpuTieredStoreOptions options_;
  HostTier device_;  // the device pool's index; its base() is a device address, never read

  struct Atomics {
    std::atomic<uint64_t> promotions{0}, promoted_bytes{0}, demotions{0}, demoted_bytes{0},
        victims_held_below{0}, victims_dropped{0}, staged_down{0}, staged_down_bytes{0},
        copy_errors{0}, crc_failures{0}, peer_copies{0}, peer_copied_bytes{0}, peer_reads{0},
        peer_read_bytes{0}, peer_device_encodes{0}, peer_fetches_device_only{0};
  } n_;
  std::atomic<bool> stop_{false};
  std::thread demoter_;
};

}  // namespace strata
