// The host-DRAM tier: committed blobs in one fixed arena, an index by BlockId, two-phase
// publish (Reserve, then Commit with CRC32C verification), read leases, pins with a TTL, and LRU
// eviction between a high and a low watermark.
//
// Invariants:
// - A block becomes visible only after Commit verified its bytes.
// - A leased block is never freed or overwritten; evicting it only hides it, and its extent is
//   freed when the last lease ends.
// - A pinned block (pin not expired) is never chosen by LRU eviction.
// - Reservations and leases expire, so a client that dies gives every byte back.
//
// Thread-safe: one mutex guards the metadata; CRC verification runs outside it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/block_id.h"
#include "common/block_status.h"
#include "storage/extent_allocator.h"

namespace strata {

// A committed block became visible in this tier, or left it (evicted, removed, cascaded).
struct BlockEvent {
  enum Kind : uint8_t { kStored, kRemoved } kind;
  BlockId id;
};

struct HostTierOptions {
  uint64_t alignment = 256;
  double high_watermark = 0.95;
  double low_watermark = 0.85;
  absl::Duration reservation_timeout = absl::Seconds(30);
  absl::Duration lease_timeout = absl::Seconds(30);
  absl::Duration max_pin_ttl = absl::Hours(24);
  uint64_t max_block_bytes = uint64_t{1} << 30;
  // Commits of at least this many bytes verify their CRCs on two threads.
  uint64_t parallel_verify_bytes = 8 << 20;
  // Time source; tests substitute a fake one.
  std::function<absl::Time()> clock = [] { return absl::Now(); };
  // Told of every BlockEvent, with the tier's lock held: it must be cheap and must not call
  // back into the tier (the daemon queues events for the cluster directory).
  std::function<void(const BlockEvent&)> on_change;
};

struct ReserveItem {
  BlockId id;
  BlockId parent;  // zero for a chain's first block
  uint64_t size = 0;
};

struct ReserveResult {
  uint64_t reservation_id = 0;  // 0 when no item was reserved
  std::vector<BlockStatus> status;
  std::vector<uint64_t> offsets;  // valid where status is kOk
  absl::Duration expires_in;
};

struct AcquireResult {
  uint64_t lease_id = 0;  // 0 when nothing was leased
  std::vector<BlockStatus> status;
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> sizes;
  std::vector<uint32_t> crcs;
  absl::Duration expires_in;
};

struct EvictResult {
  std::vector<BlockStatus> status;
  uint64_t removed_blocks = 0;
};

// One committed block as an operator sees it.
struct BlockInfo {
  BlockId id;
  NamespaceId ns;
  BlockId parent;
  uint64_t size = 0;
  uint32_t crc = 0;
  uint32_t leases = 0;
  absl::Duration pinned_for;  // zero when not pinned
  absl::Duration idle;        // since the block was last published, looked up or fetched
};

struct HostTierStats {
  uint64_t capacity_bytes = 0;
  uint64_t allocated_bytes = 0;  // committed + reserved + doomed-but-leased
  uint64_t committed_bytes = 0;
  uint64_t reserved_bytes = 0;
  uint64_t blocks = 0;
  uint64_t open_reservations = 0;
  uint64_t open_leases = 0;
  uint64_t pinned_blocks = 0;
  uint64_t namespaces = 0;
  // Monotonic counters.
  uint64_t lookups = 0;
  uint64_t lookup_hit_blocks = 0;
  uint64_t lookup_miss_blocks = 0;
  uint64_t acquire_hit_blocks = 0;
  uint64_t acquire_miss_blocks = 0;
  uint64_t committed_total = 0;
  uint64_t dedup_total = 0;
  uint64_t crc_failures = 0;
  uint64_t evictions_lru = 0;
  uint64_t evictions_explicit = 0;
  uint64_t no_space = 0;
  uint64_t reservations_expired = 0;
  uint64_t leases_expired = 0;
};

class HostTier {
 public:
  // `base` must stay valid for the tier's lifetime; the tier never frees it.
  HostTier(uint8_t* base, uint64_t capacity, HostTierOptions options = {});
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  ReserveResult Reserve(const NamespaceId& ns, std::span<const ReserveItem> items);
  // `crcs` holds one CRC per kOk entry of the reservation, in order.
  absl::StatusOr<std::vector<BlockStatus>> Commit(uint64_t reservation_id,
                                                  std::span<const uint32_t> crcs);
  absl::Status Abort(uint64_t reservation_id);

  // Number of leading ids that are committed in `ns`.
  size_t Lookup(const NamespaceId& ns, std::span<const BlockId> ids);

  AcquireResult Acquire(const NamespaceId& ns, std::span<const BlockId> ids);
  absl::Status Release(uint64_t lease_id);

  EvictResult Evict(const NamespaceId& ns, std::span<const BlockId> ids, bool cascade, bool force);
  std::vector<BlockStatus> Pin(const NamespaceId& ns, std::span<const BlockId> ids,
                               absl::Duration ttl);
  std::vector<BlockStatus> Unpin(const NamespaceId& ns, std::span<const BlockId> ids);

  // A page of committed blocks of `ns` (every namespace when null), in a stable order while
  // they stay resident. `*cursor` starts at 0 and is 0 again after the last page.
  std::vector<BlockInfo> List(const NamespaceId* ns, size_t limit, uint64_t* cursor) const;
  // The committed blocks among `ids` (any namespace: an operator view).
  std::vector<BlockInfo> Inspect(std::span<const BlockId> ids) const;
  // Committed blocks and bytes per namespace (cheap: kept as blocks come and go).
  absl::flat_hash_map<NamespaceId, std::pair<uint64_t, uint64_t>> UsageByNamespace() const;

  // Ends expired reservations, leases and pins; call periodically.
  void ReclaimExpired();

  HostTierStats Stats() const;
  uint8_t* base() const { return base_; }
  uint64_t capacity() const { return allocator_.capacity(); }
  const HostTierOptions& options() const { return options_; }

 private:
  static constexpr uint32_t kNil = UINT32_MAX;
  enum class State : uint8_t { kFree, kReserved, kCommitted, kDoomed };

  struct Entry {
    BlockId id;
    BlockId parent;
    uint64_t offset = 0;
    uint64_t size = 0;
    uint32_t crc = 0;
    uint32_t ns = 0;
    uint32_t leases = 0;
    uint32_t lru_prev = kNil;
    uint32_t lru_next = kNil;
    State state = State::kFree;
    absl::Time pinned_until = absl::InfinitePast();
    absl::Time last_use = absl::InfinitePast();
  };
  struct Reservation {
    std::vector<uint32_t> slots;
    absl::Time expires;
    bool committing = false;
  };
  struct Lease {
    std::vector<uint32_t> slots;
    absl::Time expires;
  };

  uint32_t InternNamespace(const NamespaceId& ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  BlockInfo Describe(uint32_t slot, absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Slot of a committed block of `ns`, or kNil.
  uint32_t FindCommitted(uint32_t ns, const BlockId& id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  uint32_t NewSlot() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeSlot(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LruPushFront(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LruUnlink(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LruTouch(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Evictable(const Entry& e, absl::Time now) const;
  // Removes a committed block from the index; frees its extent now or when its leases end.
  void RemoveCommitted(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<uint64_t> AllocateEvicting(uint64_t size, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictToLowWatermark(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropReservation(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropLease(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t NextId() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  uint8_t* const base_;
  const HostTierOptions options_;

  mutable absl::Mutex mu_;
  ExtentAllocator allocator_ ABSL_GUARDED_BY(mu_);
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_slots_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<BlockId, uint32_t> index_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<NamespaceId, uint32_t> namespaces_ ABSL_GUARDED_BY(mu_);
  std::vector<NamespaceId> namespace_ids_ ABSL_GUARDED_BY(mu_);  // by interned index
  // Committed blocks and bytes per interned namespace, kept up to date on commit and removal.
  std::vector<std::pair<uint64_t, uint64_t>> namespace_usage_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Reservation> reservations_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  uint32_t lru_head_ ABSL_GUARDED_BY(mu_) = kNil;  // most recent
  uint32_t lru_tail_ ABSL_GUARDED_BY(mu_) = kNil;  // least recent
  uint64_t id_state_ ABSL_GUARDED_BY(mu_);
  mutable HostTierStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata
