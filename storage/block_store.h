// The blocks of one node, whatever tiers hold them: the one storage seam the daemon's services
// and its cluster layer see.
//
// Implementations: HostBlockStore (storage/host_block_store.h), the host tier alone;
// TieredStore (storage/tiered_store.h), host memory over NVMe; GpuTieredStore
// (storage/gpu/gpu_tiered_store.h), device memory over either of them. Publishes always land in host
// memory and fetches are always served from it (a fetch stages lower-tier blocks up first), so
// reservation, lease and offset semantics are the host tier's (storage/host_tier.h): offsets are
// relative to arena_base(), and a leased extent stays valid until its lease ends.
//
// Thread-safe: every call may come from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "storage/host_tier.h"
#include "storage/tier.h"
#include "strata/block_id.h"
#include "strata/block_status.h"

namespace strata {

// The NVMe tier under host memory (TieredStore).
struct NvmeTierCounters {
  uint64_t nvme_capacity_bytes = 0;
  uint64_t nvme_used_bytes = 0;
  uint64_t nvme_blocks = 0;
  uint64_t nvme_pinned_blocks = 0;
  uint64_t demotions = 0;  // host victims now on NVMe
  uint64_t demoted_bytes = 0;
  uint64_t promotions = 0;  // NVMe blocks staged into host memory by a fetch
  uint64_t promoted_bytes = 0;
  uint64_t admission_rejected = 0;  // host victims the admission rule dropped
  uint64_t nvme_evictions = 0;      // NVMe blocks dropped by the NVMe policy to make room
  uint64_t nvme_full_drops = 0;     // host victims dropped because NVMe had no room
  uint64_t nvme_write_errors = 0;   // host victims dropped because the NVMe write failed
  uint64_t nvme_read_errors = 0;
  uint64_t nvme_crc_failures = 0;  // NVMe blocks dropped because their CRC32C failed
  uint64_t nvme_removed_explicit = 0;
  // Writes to the tier fail (a full disk, an I/O error) and have not worked again since: host
  // victims are dropped instead of demoted. Cleared by TieredStore's periodic probe.
  bool degraded = false;
  std::string degraded_reason;
};

// The GPU tier over host memory (GpuTieredStore).
struct GpuTierCounters {
  std::string memory;  // DeviceMemory::kind(): "cuda" or "host-stand-in"
  HostTierStats device;  // the device pool's own bookkeeping: capacity, blocks, leases, pins...
  uint64_t promotions = 0;  // blocks copied up from host memory
  uint64_t promoted_bytes = 0;
  uint64_t demotions = 0;  // victims copied down because host memory no longer held them
  uint64_t demoted_bytes = 0;
  uint64_t victims_held_below = 0;  // victims left without a copy: host memory still held them
  uint64_t victims_dropped = 0;     // victims lost: no room below, or their copy failed
  uint64_t staged_down = 0;         // device-only blocks copied to host memory for a fetch
  uint64_t staged_down_bytes = 0;
  uint64_t copy_errors = 0;   // device copies that failed
  uint64_t crc_failures = 0;  // device copies whose bytes failed their CRC32C below
  uint64_t peer_copies = 0;   // blocks copied into buffers same-node engines lent
  uint64_t peer_copied_bytes = 0;
  uint64_t peer_reads = 0;  // blocks read out of lent buffers to be published
  uint64_t peer_read_bytes = 0;
  uint64_t peer_device_encodes = 0;  // of those, blocks the codec quantised on the device
  uint64_t peer_fetches_device_only = 0;  // CopyToPeer calls served by the device alone
};

struct BlockStoreStats {
  HostTierStats host;
  std::optional<NvmeTierCounters> nvme;  // absent without an NVMe tier
  std::optional<GpuTierCounters> gpu;    // absent without a GPU tier
};

class BlockStore {
 public:
  virtual ~BlockStore() = default;

  // Two-phase publish into host memory. Ids already held in any tier are answered kExists.
  virtual ReserveResult Reserve(const NamespaceId& ns, std::span<const ReserveItem> items) = 0;
  // `crcs` holds one CRC per kOk entry of the reservation, in order.
  virtual absl::StatusOr<std::vector<BlockStatus>> Commit(
      uint64_t reservation_id, std::span<const uint32_t> crcs,
      CommitCheck check = CommitCheck::kReread) = 0;
  virtual absl::Status Abort(uint64_t reservation_id) = 0;
  // Names again the one block of an open reservation (a spare): HostTier::RenameReserved, and
  // an id another tier holds is answered kExists (the reservation given back).
  virtual absl::StatusOr<BlockStatus> RenameReserved(uint64_t reservation_id,
                                                     const NamespaceId& ns,
                                                     const ReserveItem& item) = 0;

  // Number of leading ids of `ns` held in any tier; `tiers` (when not null) gets the tier of
  // each of them.
  virtual size_t Lookup(const NamespaceId& ns, std::span<const BlockId> ids,
                        std::vector<Tier>* tiers) = 0;
  // Leases `ids` in host memory, staging blocks of lower tiers up first.
  virtual AcquireResult Acquire(const NamespaceId& ns, std::span<const BlockId> ids) = 0;
  virtual absl::Status Release(uint64_t lease_id) = 0;
  // Holds for transfers the daemon runs itself (push fetches, publishes by message): extents
  // stay theirs until the hold ends, whatever happens to the lease or reservation meanwhile
  // (see HostTier::BeginLeaseRead).
  virtual bool BeginLeaseRead(uint64_t lease_id, std::span<const ArenaExtent> extents,
                              uint32_t holds) = 0;
  virtual void EndLeaseRead(uint64_t lease_id) = 0;
  virtual absl::Status BeginReservedWrite(uint64_t reservation_id, ArenaExtent extent) = 0;
  virtual void EndReservedWrite(uint64_t reservation_id) = 0;
  // The extents of an open reservation's blocks, in the order Commit takes their CRCs; empty
  // when it is unknown.
  virtual std::vector<ArenaExtent> ReservedExtents(uint64_t reservation_id) const = 0;

  // Removes blocks from every tier (`cascade`: and every block chained after them).
  virtual EvictResult Evict(const NamespaceId& ns, std::span<const BlockId> ids, bool cascade,
                            bool force) = 0;
  virtual std::vector<BlockStatus> Pin(const NamespaceId& ns, std::span<const BlockId> ids,
                                       absl::Duration ttl) = 0;
  virtual std::vector<BlockStatus> Unpin(const NamespaceId& ns, std::span<const BlockId> ids) = 0;

  // Operator views of host memory, where fetches are served from (HostTier::List, Inspect,
  // UsageByNamespace); blocks only on a lower tier are not in them.
  virtual std::vector<BlockInfo> List(const NamespaceId* ns, size_t limit,
                                      uint64_t* cursor) const = 0;
  virtual std::vector<BlockInfo> Inspect(std::span<const BlockId> ids) const = 0;
  virtual absl::flat_hash_map<NamespaceId, std::pair<uint64_t, uint64_t>> UsageByNamespace()
      const = 0;

  // Every block of this node in any tier, each once (a block being demoted is briefly in two):
  // what the cluster layer announces (ids) and moves off the node (blocks). Any namespace.
  virtual std::vector<BlockInfo> AllBlocks() const = 0;
  virtual std::vector<BlockId> AllIds() const = 0;
  virtual bool Holds(const BlockId& id) const = 0;

  virtual BlockStoreStats Stats() const = 0;
  // Ends expired reservations, leases and pins; call periodically.
  virtual void ReclaimExpired() = 0;
  // Told when a block becomes visible in host memory or leaves it (demotion included: check
  // Holds to tell a demotion from a removal). See BlockEventHook; null clears it.
  virtual void SetChangeHook(BlockEventHook hook) = 0;

  // The host arena: reserved extents are written and leased ones read at arena_base() + offset.
  virtual uint8_t* arena_base() const = 0;
  virtual uint64_t arena_bytes() const = 0;
  virtual absl::Duration reservation_timeout() const = 0;
  virtual absl::Duration lease_timeout() const = 0;
};

}  // namespace strata
