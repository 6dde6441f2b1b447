// The host-DRAM tier: committed blobs in one fixed arena, an index by BlockId, two-phase
// publish (Reserve, then Commit with CRC32C verification), read leases, pins with a TTL, and
// eviction between a high and a low watermark in the order of a pluggable EvictionPolicy
// (storage/eviction; "lru" by default).
//
// Write-back (options.write_back): a victim is not dropped but queued for a lower tier. It stays
// committed and readable until the owner of the lower tier, which drains the queue with
// TakeDemotions, calls FinishDemotion; only then does it leave this tier and its extent is
// freed. A reservation that finds no room waits (up to write_back_wait) for write-back to free
// space, then falls back to dropping victims (counted as pressure_drops).
//
// Transcoding (options.transcode): at the high watermark a victim of a namespace marked
// transcodable that was never transcoded is not evicted but handed to a transcoder
// (TakeTranscodes). It stays committed and readable meanwhile; FinishTranscode stores the
// smaller blob (the same block at a lower rate) in its place (a best-fit extent, or the front of
// its own), frees the rest, and the block enters the eviction order again. A block leased at
// that moment keeps its bytes.
//
// Invariants:
// - A block becomes visible only after Commit verified its bytes.
// - A leased block is never freed or overwritten; evicting it only hides it, and its extent is
//   freed when the last lease ends.
// - A pinned block (pin not expired) or a leased one is never chosen as a victim.
// - Reservations and leases expire, so a client that dies gives every byte back.
//
// Thread-safe: one mutex guards the metadata; CRC verification runs outside it.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "storage/eviction/eviction_policy.h"
#include "storage/extent_allocator.h"
#include "storage/tier.h"
#include "storage/watermarks.h"
#include "strata/block_id.h"
#include "strata/block_status.h"

namespace strata {

// A committed block became visible in this tier, or left it (evicted, removed, cascaded).
struct BlockEvent {
  enum Kind : uint8_t { kStored, kRemoved } kind;
  BlockId id;
  NamespaceId ns{};
  BlockId parent{};  // zero for the first block of a chain
  // The tier whose copy came or went (the GPU tier's copies are kGpu; the node may still hold
  // the block in another tier: listeners check Holds).
  Tier tier = Tier::kHost;
};

// One part of a zoned arena (HostTierOptions::zones).
struct HostTierZone {
  std::string tenant;  // "": the common zone
  uint64_t begin = 0, size = 0;
};

struct HostTierOptions {
  uint64_t alignment = 256;
  double high_watermark = kDefaultHighWatermark;
  double low_watermark = kDefaultLowWatermark;
  absl::Duration reservation_timeout = absl::Seconds(30);
  absl::Duration lease_timeout = absl::Seconds(30);
  absl::Duration max_pin_ttl = absl::Hours(24);
  uint64_t max_block_bytes = uint64_t{1} << 30;
  // Commits of at least this many bytes verify their CRCs on two threads.
  uint64_t parallel_verify_bytes = 8 << 20;
  // Victim order: a name from OnlineEvictionPolicyNames() (unknown names fall back to "lru";
  // the daemon validates its config first).
  std::string eviction_policy = "lru";
  // Hand victims to a lower tier (TakeDemotions / FinishDemotion) instead of dropping them.
  bool write_back = false;
  // How long a reservation waits for write-back to free space before dropping victims.
  absl::Duration write_back_wait = absl::Seconds(2);
  // Per-tenant quotas (config limits.tenant_*), for namespaces charged to a tenant with
  // SetNamespaceTenant. One tenant's committed + reserved bytes stay within this fraction of the
  // capacity: at the bound, its Reserve first evicts its own least recently used blocks and
  // answers kNoSpace when that is not enough, so one tenant cannot flush the others. 1: none.
  double tenant_max_share = 1.0;
  // Bytes one tenant may hold in open reservations; more is kNoSpace (evicting cannot help).
  // 0: no bound.
  uint64_t tenant_max_reserved_bytes = 0;
  // The arena split into zones (storage/zoned_arena.h): a namespace's blocks go to the zone of
  // its tenant, or to the common zone ("") when it has none, and a full zone evicts only its
  // own blocks, so a tenant's clients can be given the memory of their zone and nothing else.
  // The zones tile [0, capacity) in order. Empty: one zone.
  std::vector<HostTierZone> zones;
  // Hand watermark victims of transcodable namespaces to a transcoder (see the top). At most
  // `max_transcoding` blocks are handed out at once; further victims leave as usual.
  bool transcode = false;
  size_t max_transcoding = 64;
  // How long a reservation that finds no room waits for transcodes to free it before it drops
  // victims (free space in pieces too small for it needs a whole extent freed, not only bytes).
  absl::Duration transcode_wait = absl::Seconds(1);
  // Time source; tests substitute a fake one.
  std::function<absl::Time()> clock = [] { return absl::Now(); };
};

// Told of every BlockEvent, with the tier's lock held: it must be cheap and must not call back
// into the tier (the cluster layer queues events for the directory).
using BlockEventHook = std::function<void(const BlockEvent&)>;

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

// Bytes of the arena a push fetch sends: [offset, offset + size).
struct ArenaExtent {
  uint64_t offset = 0, size = 0;
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

// A committed block on its way to a lower tier. Its bytes stay valid at base() + offset until
// FinishDemotion(handle, ...) is called.
struct DemotionItem {
  uint32_t handle = 0;
  BlockId id;
  NamespaceId ns;
  BlockId parent;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t crc = 0;
  uint32_t accesses = 1;  // requests while cached here, counting the publish
};

// A committed block handed to a transcoder. Its bytes stay valid at base() + offset until
// FinishTranscode(handle, ...) is called.
struct TranscodeItem {
  uint32_t handle = 0;
  BlockId id;
  NamespaceId ns;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t crc = 0;
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
  uint64_t evictions_lru = 0;    // victims that left the tier (dropped or written back)
  uint64_t demoted = 0;          // victims written back to a lower tier
  uint64_t pressure_drops = 0;   // write-back on, but victims dropped to make room at once
  uint64_t demoting_blocks = 0;  // gauge: queued or being written back
  uint64_t demoting_bytes = 0;
  uint64_t evictions_explicit = 0;
  uint64_t no_space = 0;
  uint64_t quota_evictions = 0;  // a tenant's own blocks evicted to keep it within its share
  uint64_t quota_no_space = 0;   // kNoSpace answers (in no_space) caused by a tenant quota
  uint64_t reservations_expired = 0;
  uint64_t leases_expired = 0;
  uint64_t transcoding_blocks = 0;      // gauge: handed to the transcoder, not finished
  uint64_t transcoded = 0;              // blocks rewritten smaller instead of evicted
  uint64_t transcoded_bytes_in = 0;     // their bytes before ...
  uint64_t transcoded_bytes_out = 0;    // ... and after
  uint64_t transcode_failures = 0;      // not smaller, or not transcodable: evicted after all
  uint64_t transcode_skipped = 0;       // leased when the blob came back: kept as it was
};

// How Commit learns that a block's bytes match its CRC32C.
enum class CommitCheck {
  kReread,  // the tier reads every committed byte again (the default: it saw none of them)
  // The writer took each CRC from the bytes as it wrote them into the arena, in the same pass;
  // the tier records the CRCs as given. Readers still check every block against its CRC.
  kWriterChecksummed,
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
                                                  std::span<const uint32_t> crcs,
                                                  CommitCheck check = CommitCheck::kReread);
  absl::Status Abort(uint64_t reservation_id);
  // Names again the one block of an open reservation (a spare, reserved under an id nobody
  // knows, for a block not yet named): kOk, it now holds `item` in `ns`, its extent cut to
  // item.size (Commit as usual); kExists (a committed block, touched as a Reserve would),
  // kInProgress (reserved by another publish) or kInvalid (bigger than the extent, empty, or
  // another namespace's id): the reservation is given back. Errors, reservation kept:
  // NotFound (unknown, expired), InvalidArgument (several blocks, or another namespace's),
  // FailedPrecondition (being written or committed).
  absl::StatusOr<BlockStatus> RenameReserved(uint64_t reservation_id, const NamespaceId& ns,
                                             const ReserveItem& item);
  // The reservation no longer expires: for an internal writer (a promotion from a lower tier)
  // that will commit or abort it, whose data may land after the usual timeout.
  absl::Status HoldReservation(uint64_t reservation_id);

  // Number of leading ids that are committed in `ns`. With `lower`, a block missing here counts
  // when lower(id) is true (a lower tier holds it; called under this tier's lock, so it must not
  // call back into it); `in_lower` then says, per counted block, which ones those were.
  size_t Lookup(const NamespaceId& ns, std::span<const BlockId> ids,
                const std::function<bool(const BlockId&)>& lower = nullptr,
                std::vector<bool>* in_lower = nullptr);

  AcquireResult Acquire(const NamespaceId& ns, std::span<const BlockId> ids);
  absl::Status Release(uint64_t lease_id);
  // Whether lease `lease_id` (unexpired) holds, for each extent, a block occupying exactly
  // [offset, offset + size). One lock for all of them (a push fetch checks every block it sends).
  bool LeaseCovers(uint64_t lease_id, std::span<const ArenaExtent> extents) const;

  // Holds for transfers the daemon runs itself on a client's behalf (push fetches, publishes
  // by message): while one is open, releasing, expiring or aborting the lease or reservation
  // only marks it, and its extents are freed when the last hold ends, so no byte is read from
  // or written into an extent that has meanwhile gone to another block (or tenant).
  // Read holds: as LeaseCovers, and then `holds` holds on the lease, each ended by its own
  // EndLeaseRead (a push holds once per block it sends, checked in one pass). False: none.
  bool BeginLeaseRead(uint64_t lease_id, std::span<const ArenaExtent> extents, uint32_t holds);
  void EndLeaseRead(uint64_t lease_id);
  // A write hold on one extent of an open reservation (exactly one of its blocks' extents).
  absl::Status BeginReservedWrite(uint64_t reservation_id, ArenaExtent extent);
  void EndReservedWrite(uint64_t reservation_id);
  // The extents of an open reservation's blocks, in commit order (empty: unknown).
  std::vector<ArenaExtent> ReservedExtents(uint64_t reservation_id) const;

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

  // Charges the blocks of `ns` to `tenant` for the tenant quotas (options.tenant_*); blocks
  // already held count from now on. The first tenant named for a namespace stays (a namespace
  // id derives from its tenant, so a second one cannot differ). Namespaces never named here
  // (internal writers only) are charged to no tenant and bounded only by the capacity.
  void SetNamespaceTenant(const NamespaceId& ns, std::string_view tenant);
  struct TenantUsage {
    uint64_t committed_bytes = 0;  // not counting blocks already queued for write-back
    uint64_t reserved_bytes = 0;
  };
  // Per tenant, cheap: kept as blocks come and go.
  absl::flat_hash_map<std::string, TenantUsage> UsageByTenant() const;

  // Replaces the change hook (null: none). Events from before the call are not replayed.
  void SetChangeHook(BlockEventHook hook);

  // Ends expired reservations, leases and pins; call periodically.
  void ReclaimExpired();

  // Write-back: up to `max` queued victims, waiting up to `wait` for one.
  std::vector<DemotionItem> TakeDemotions(size_t max, absl::Duration wait);
  // The block of `handle` leaves this tier (`stored_below`: it was written to the lower tier).
  // False when it had been evicted meanwhile: the caller should remove its lower copy.
  bool FinishDemotion(uint32_t handle, bool stored_below);
  // No more write-back: queued victims are dropped, waiting reservations fall back to dropping.
  void StopWriteBack();

  // Transcoding (options.transcode). Whether victims of `ns` go to the transcoder.
  void SetNamespaceTranscodable(const NamespaceId& ns, bool transcodable);
  // Up to `max` blocks to transcode, waiting up to `wait` for one.
  std::vector<TranscodeItem> TakeTranscodes(size_t max, absl::Duration wait);
  // The block of `handle` as `blob` (CRC32C `crc`): true when it replaced the block. An empty
  // `blob` (it could not be transcoded) or one that saves no space evicts the block as its
  // watermark pass meant to (counted in transcode_failures). False also when it was evicted or
  // leased meanwhile (a leased one keeps its bytes and may be chosen again).
  bool FinishTranscode(uint32_t handle, std::span<const uint8_t> blob, uint32_t crc);
  // No more transcoding: blocks waiting for the transcoder go back to the eviction order, and
  // TakeTranscodes returns at once.
  void StopTranscoding();

  HostTierStats Stats() const;
  uint8_t* base() const { return base_; }
  uint64_t capacity() const { return capacity_; }
  const HostTierOptions& options() const { return options_; }

 private:
  struct CommitExtent {
    uint32_t slot;
    uint64_t offset, size;
  };
  void VerifyCrcs(std::span<const CommitExtent> checks, std::span<const uint32_t> crcs,
                  std::span<BlockStatus> out) const;

  static constexpr uint32_t kNil = UINT32_MAX;
  enum class State : uint8_t { kFree, kReserved, kCommitted, kDoomed };

  struct Entry {
    BlockId id;
    BlockId parent;
    uint64_t offset = 0;
    uint64_t size = 0;
    uint32_t crc = 0;
    uint32_t ns = 0;
    uint32_t leases = 0;    // read leases, plus one while being written back
    uint32_t accesses = 0;  // requests since commit, counting the publish
    bool demoting = false;
    bool transcoding = false;  // handed to the transcoder (which holds one lease)
    bool transcoded = false;   // tried once: never handed out again
    bool in_tenant_lru = false;  // linked into its tenant's LRU list (tprev/tnext)
    uint32_t tprev = kNil, tnext = kNil;
    State state = State::kFree;
    absl::Time pinned_until = absl::InfinitePast();
    absl::Time last_use = absl::InfinitePast();
  };
  struct Reservation {
    std::vector<uint32_t> slots;
    absl::Time expires;
    bool committing = false;
    uint32_t writers = 0;  // open write holds
    bool dropped = false;  // aborted or expired while written: freed by the last EndReservedWrite
  };
  struct Lease {
    std::vector<uint32_t> slots;
    absl::Time expires;
    uint32_t readers = 0;  // open read holds
    bool dropped = false;  // released or expired while read: freed by the last EndLeaseRead
  };
  // A tenant's bytes, and its committed blocks not being written back in least recently used
  // order (an intrusive list through Entry::tprev/tnext): the victims of its own quota, found
  // without scanning other tenants' blocks.
  struct Tenant {
    std::string name;
    uint64_t committed = 0, reserved = 0;
    uint64_t demoting = 0;  // committed bytes queued for write-back: already on their way out
    uint32_t head = kNil, tail = kNil;
    uint32_t zone = 0;  // where its namespaces' blocks go
  };
  // A range of the arena with its own allocator (one zone unless options.zones says more).
  struct Zone {
    uint64_t begin;
    ExtentAllocator allocator;
    uint32_t tenant = kNil;  // the tenant placed here, once interned
    uint64_t demoting = 0;   // bytes of its blocks queued for or being written back
  };

  uint32_t InternNamespace(const NamespaceId& ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  BlockInfo Describe(uint32_t slot, absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Slot of a committed block of `ns`, or kNil.
  uint32_t FindCommitted(uint32_t ns, const BlockId& id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  uint32_t NewSlot() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeSlot(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Touch(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Evictable(const Entry& e, absl::Time now) const;
  // Tenant of a slot's namespace, or kNil.
  uint32_t TenantOf(const Entry& e) const ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return namespace_tenant_[e.ns];
  }
  void LinkTenantLru(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnlinkTenantLru(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `size` more bytes keep tenant `t` within its quotas, evicting its own least recently
  // used blocks to stay within its share.
  bool MakeTenantRoom(uint32_t t, uint64_t size, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The policy's next evictable victim, or kNil. Blocks it passes over (leased, pinned) are
  // collected in `skipped` and must go back with RestoreSkipped after the pass.
  uint32_t NextVictim(absl::Time now, std::vector<uint32_t>& skipped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RestoreSkipped(const std::vector<uint32_t>& skipped) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the victim, or queues it for write-back.
  void EvictVictim(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands a watermark victim to the transcoder instead, where it qualifies; false otherwise.
  bool QueueTranscode(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The bytes a handed-out block is expected to give back (from the ratios seen so far).
  uint64_t ExpectedSaving(uint64_t size) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void EndTranscode(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A reservation found no room: victims of transcodable namespaces go to the transcoder, the
  // others are dropped, and it waits (up to options.transcode_wait) until `size` bytes fit.
  std::optional<uint64_t> TranscodeForRoom(uint32_t zone, uint64_t size, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FinishDemotionLocked(uint32_t slot, bool stored_below) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a committed block from the index; frees its extent now or when its leases end.
  void RemoveCommitted(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<uint64_t> AllocateEvicting(uint32_t zone, uint64_t size, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Zones: the one holding `offset`; the one for a namespace's blocks; an extent of `zone`
  // (an arena offset); the next victim whose eviction frees space in `zone` (as NextVictim).
  uint32_t ZoneAt(uint64_t offset) const;
  uint32_t ZoneOf(uint32_t ns) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::optional<uint64_t> AllocateIn(uint32_t zone, uint64_t size)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t NextVictimIn(uint32_t zone, absl::Time now, std::vector<uint32_t>& skipped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t AllocatedBytes() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void EvictToLowWatermark(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropReservation(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropLease(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool LeaseCoversLocked(uint64_t lease_id, std::span<const ArenaExtent> extents) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  uint64_t NextId() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  uint8_t* const base_;
  const HostTierOptions options_;

  mutable absl::Mutex mu_;
  const uint64_t capacity_;
  std::vector<Zone> zones_ ABSL_GUARDED_BY(mu_);
  uint32_t common_zone_ = 0;  // fixed after construction
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_slots_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<BlockId, uint32_t> index_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<NamespaceId, uint32_t> namespaces_ ABSL_GUARDED_BY(mu_);
  std::vector<NamespaceId> namespace_ids_ ABSL_GUARDED_BY(mu_);  // by interned index
  // Committed blocks and bytes per interned namespace, kept up to date on commit and removal.
  std::vector<std::pair<uint64_t, uint64_t>> namespace_usage_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> namespace_tenant_ ABSL_GUARDED_BY(mu_);  // by interned index; kNil: none
  absl::flat_hash_map<std::string, uint32_t> tenant_index_ ABSL_GUARDED_BY(mu_);
  std::vector<Tenant> tenants_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Reservation> reservations_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<EvictionPolicy> policy_ ABSL_GUARDED_BY(mu_);
  BlockEventHook on_change_ ABSL_GUARDED_BY(mu_);
  std::deque<uint32_t> demotion_queue_ ABSL_GUARDED_BY(mu_);
  uint64_t demoting_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t demoting_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t demotions_finished_ ABSL_GUARDED_BY(mu_) = 0;
  bool write_back_stopped_ ABSL_GUARDED_BY(mu_) = false;
  // Transcoding: transcodable namespaces (by interned index), blocks waiting for the
  // transcoder, the bytes handed-out blocks are expected to free, and the blob-size ratio
  // transcoding has achieved (a moving average; the first guess is one half).
  std::vector<bool> namespace_transcodable_ ABSL_GUARDED_BY(mu_);
  std::deque<uint32_t> transcode_queue_ ABSL_GUARDED_BY(mu_);
  uint64_t transcode_savings_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t transcoding_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t transcodes_finished_ ABSL_GUARDED_BY(mu_) = 0;
  double transcode_ratio_ ABSL_GUARDED_BY(mu_) = 0.5;
  bool transcode_stopped_ ABSL_GUARDED_BY(mu_) = false;
  // Unused random ids from the last getrandom() call (NextId).
  std::array<uint64_t, 32> id_pool_ ABSL_GUARDED_BY(mu_){};
  size_t id_pool_used_ ABSL_GUARDED_BY(mu_) = 32;
  mutable HostTierStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata
