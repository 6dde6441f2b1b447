// Tier manager: where each block lives (host DRAM or NVMe), and which blocks move when.
//
// It holds metadata only. Every call that changes placement returns the moves a caller would
// carry out (copy host -> NVMe and free the host extent, read NVMe -> host, drop), so a replay
// of a trace counts the moves and hit rates of a policy mix without any block bytes. (stratad
// itself runs storage/tiered_store.h; this is the model the replay and the eviction tests use.)
// Tiers are exclusive: a block lives in exactly one tier.
//
// - Insert: a block committed to the host tier. Victims of the host policy are demoted to NVMe
//   if the admission rule admits them (else dropped); victims of the NVMe policy are dropped.
//   The incoming block is itself a candidate, so a policy may route it straight down.
// - Access: a request for a block. A host hit is recorded; an NVMe hit promotes the block to
//   host (evicting there as needed, which may demote other blocks into the space it left).
// - Remove: explicit eviction, optionally cascading to every block chained after it.
// - Pin / Unpin: a pinned block is never chosen by eviction (nor removed unless forced).
// - Watermarks: when a tier's used bytes pass high_watermark x capacity, it evicts down to
//   low_watermark x capacity. Used bytes never exceed capacity.
// - Transcoding (transcode_ratio > 0): a host victim that was never transcoded is not evicted
//   but re-encoded at a lower rate: it shrinks to transcode_ratio x its bytes and stays in host
//   memory, entering its policy again as a new block (a second life at lower fidelity), as
//   stratad does for namespaces with a cold codec (storage/host_tier.h). Its next eviction
//   demotes or drops it as usual. Hits on such blocks are counted apart (transcoded_hits).
//
// Thread-safe: one mutex guards the metadata.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/eviction/admission_policy.h"
#include "storage/eviction/eviction_policy.h"
#include "storage/tier.h"
#include "strata/block_id.h"

namespace strata {

struct TierOptions {
  uint64_t capacity_bytes = 0;  // 0 for NVMe: no NVMe tier (evicted host blocks are dropped)
  double high_watermark = 1.0;  // evict once used > high_watermark * capacity ...
  double low_watermark = 1.0;   // ... down to low_watermark * capacity
  std::string policy = "lru";   // see OnlineEvictionPolicyNames()
};

struct TierManagerOptions {
  TierOptions host;
  TierOptions nvme;
  std::string admission = "always";  // admission to NVMe; see AdmissionPolicyNames()
  // Ids of recently rejected blocks the admission rule remembers; 0: as many as NVMe holds
  // blocks of `typical_block_bytes`.
  uint64_t admission_ghost_blocks = 0;
  uint64_t typical_block_bytes = uint64_t{64} << 20;
  // Bytes a transcoded block keeps, as a fraction of its bytes (0: no transcoding); < 1.
  double transcode_ratio = 0;
};

// One placement change the caller must carry out. `to == kNone`: the block is dropped;
// `from == to == kHost`: it is transcoded in place, to `bytes`.
struct TierMove {
  BlockId id;
  Tier from = Tier::kNone;
  Tier to = Tier::kNone;
  uint64_t bytes = 0;
};

struct AccessResult {
  Tier found = Tier::kNone;  // where the block was when requested; kNone: miss
  std::vector<TierMove> moves;
};

struct RemoveResult {
  uint64_t removed_blocks = 0;
  uint64_t pinned_skipped = 0;
  std::vector<TierMove> moves;
};

struct TierCounters {
  uint64_t blocks = 0;
  uint64_t used_bytes = 0;
  uint64_t capacity_bytes = 0;
  uint64_t hits = 0;
  // Counted for blocks that stay in the tier (one routed straight down at insert is not).
  uint64_t bytes_written = 0;  // host: inserts + promotions; NVMe: demotions
  uint64_t bytes_read = 0;     // host: hits + demotion sources; NVMe: promotions
  uint64_t evictions = 0;      // victims chosen by this tier's policy (demoted or dropped)
};

struct TierManagerStats {
  TierCounters host;
  TierCounters nvme;
  uint64_t accesses = 0;
  uint64_t misses = 0;
  uint64_t inserts = 0;
  uint64_t demotions = 0;         // host victims written to NVMe
  uint64_t rejected = 0;          // host victims the admission rule did not let into NVMe
  uint64_t dropped = 0;           // blocks that left the cache by eviction (any tier)
  uint64_t removed_explicit = 0;  // Remove()
  uint64_t pinned_blocks = 0;
  uint64_t transcoded = 0;       // host victims transcoded instead of leaving
  uint64_t transcoded_hits = 0;  // hits (any tier) on blocks held transcoded
};

class TierManager {
 public:
  // Policies by name, from `options`.
  static absl::StatusOr<std::unique_ptr<TierManager>> Create(const TierManagerOptions& options);
  // Policies supplied by the caller (e.g. an offline policy in a replay). `nvme_policy` and
  // `admission` may be null when the NVMe capacity is 0.
  static absl::StatusOr<std::unique_ptr<TierManager>> Create(
      const TierManagerOptions& options, std::unique_ptr<EvictionPolicy> host_policy,
      std::unique_ptr<EvictionPolicy> nvme_policy, std::unique_ptr<AdmissionPolicy> admission);

  TierManager(const TierManager&) = delete;
  TierManager& operator=(const TierManager&) = delete;

  // Records a block committed to the host tier (`parent` zero for a chain's first block). A
  // block already resident is an access. ResourceExhausted when it cannot fit (larger than the
  // host tier, or everything else pinned); then nothing changed.
  absl::StatusOr<std::vector<TierMove>> Insert(const BlockId& id, const BlockId& parent,
                                               uint64_t bytes);
  AccessResult Access(const BlockId& id);
  // Where `id` lives; no side effects.
  Tier Locate(const BlockId& id) const;
  RemoveResult Remove(std::span<const BlockId> ids, bool cascade, bool force = false);
  absl::Status Pin(const BlockId& id);
  absl::Status Unpin(const BlockId& id);
  // Applies the watermarks of both tiers now (a background pass).
  std::vector<TierMove> Reclaim();

  TierManagerStats Stats() const;

 private:
  struct Entry {
    BlockId parent;
    uint64_t bytes = 0;
    uint32_t accesses = 0;  // requests while in the current tier
    uint32_t pins = 0;
    Tier tier = Tier::kNone;
    bool transcoded = false;
  };
  struct TierState {
    TierOptions options;
    std::unique_ptr<EvictionPolicy> policy;
    TierCounters counters;
    uint64_t pinned_bytes = 0;
  };
  // The block a Place() call is placing, and where its bytes physically are meanwhile.
  struct Placing {
    BlockId id;
    Tier tier = Tier::kNone;
    Tier from = Tier::kNone;
  };

  TierManager(const TierManagerOptions& options, std::unique_ptr<EvictionPolicy> host_policy,
              std::unique_ptr<EvictionPolicy> nvme_policy,
              std::unique_ptr<AdmissionPolicy> admission);

  TierState& state(Tier t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return t == Tier::kHost ? host_ : nvme_;
  }
  // Whether a block of `bytes` can be placed in `tier` (evicting every unpinned block).
  bool Fits(Tier tier, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts a known, unplaced block into `tier` (the caller checked Fits), evicting as needed. Its
  // bytes are in tier `from`; when it stays and `from` differs, the move is appended after the
  // moves that made room. The block itself may be chosen as a victim and move on at once.
  void Place(const BlockId& id, Tier tier, Tier from, std::vector<TierMove>& moves)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Handles a victim popped from `tier`'s policy: demote or drop.
  void EvictVictim(const BlockId& id, Tier tier, std::vector<TierMove>& moves)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyWatermark(Tier tier, std::vector<TierMove>& moves) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `id` out of its tier's accounting (not out of the index).
  void Unplace(const BlockId& id, Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Erase(const BlockId& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  TierState host_ ABSL_GUARDED_BY(mu_);
  TierState nvme_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<AdmissionPolicy> admission_ ABSL_GUARDED_BY(mu_);
  double transcode_ratio_ = 0;
  absl::flat_hash_map<BlockId, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // Resident children per parent id (for cascade).
  absl::flat_hash_map<BlockId, absl::InlinedVector<BlockId, 2>> children_ ABSL_GUARDED_BY(mu_);
  TierManagerStats stats_ ABSL_GUARDED_BY(mu_);
  Placing placing_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata
