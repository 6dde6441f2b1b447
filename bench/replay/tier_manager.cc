#include "bench/replay/tier_manager.h"

#include <algorithm>
#include <deque>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/strings.h"

namespace strata {
namespace {

absl::Status ValidateTier(std::string_view name, const TierOptions& t) {
  if (!(t.low_watermark > 0.0 && t.low_watermark <= t.high_watermark && t.high_watermark <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(AsAbsl(name),
                     ": watermarks must satisfy 0 < low_watermark <= high_watermark <= 1 (got low=",
                     t.low_watermark, ", high=", t.high_watermark, ")"));
  }
  return absl::OkStatus();
}

uint64_t Threshold(uint64_t capacity, double fraction) {
  if (fraction >= 1.0) return capacity;
  return static_cast<uint64_t>(static_cast<long double>(capacity) * fraction);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TierManager>> TierManager::Create(
    const TierManagerOptions& options) {
  STRATA_ASSIGN_OR_RETURN(auto host_policy, MakeEvictionPolicy(options.host.policy));
  std::unique_ptr<EvictionPolicy> nvme_policy;
  std::unique_ptr<AdmissionPolicy> admission;
  if (options.nvme.capacity_bytes > 0) {
    STRATA_ASSIGN_OR_RETURN(nvme_policy, MakeEvictionPolicy(options.nvme.policy));
    uint64_t ghost = options.admission_ghost_blocks;
    if (ghost == 0) {
      ghost = std::max<uint64_t>(
          1, options.nvme.capacity_bytes / std::max<uint64_t>(1, options.typical_block_bytes));
    }
    STRATA_ASSIGN_OR_RETURN(admission, MakeAdmissionPolicy(options.admission, ghost));
  }
  return Create(options, std::move(host_policy), std::move(nvme_policy), std::move(admission));
}

absl::StatusOr<std::unique_ptr<TierManager>> TierManager::Create(
    const TierManagerOptions& options, std::unique_ptr<EvictionPolicy> host_policy,
    std::unique_ptr<EvictionPolicy> nvme_policy, std::unique_ptr<AdmissionPolicy> admission) {
  if (options.host.capacity_bytes == 0) {
    return absl::InvalidArgumentError("host tier: capacity_bytes must be > 0");
  }
  STRATA_RETURN_IF_ERROR(ValidateTier("host tier", options.host));
  STRATA_RETURN_IF_ERROR(ValidateTier("nvme tier", options.nvme));
  if (host_policy == nullptr) return absl::InvalidArgumentError("host tier: no eviction policy");
  if (!(options.transcode_ratio >= 0 && options.transcode_ratio < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("transcode_ratio must be in [0, 1) (got ", options.transcode_ratio, ")"));
  }
  if (options.nvme.capacity_bytes > 0 && (nvme_policy == nullptr || admission == nullptr)) {
    return absl::InvalidArgumentError("nvme tier: needs an eviction policy and an admission rule");
  }
  return std::unique_ptr<TierManager>(new TierManager(
      options, std::move(host_policy), std::move(nvme_policy), std::move(admission)));
}

TierManager::TierManager(const TierManagerOptions& options,
                         std::unique_ptr<EvictionPolicy> host_policy,
                         std::unique_ptr<EvictionPolicy> nvme_policy,
                         std::unique_ptr<AdmissionPolicy> admission) {
  host_.options = options.host;
  host_.policy = std::move(host_policy);
  host_.counters.capacity_bytes = options.host.capacity_bytes;
  nvme_.options = options.nvme;
  nvme_.policy = std::move(nvme_policy);
  nvme_.counters.capacity_bytes = options.nvme.capacity_bytes;
  admission_ = std::move(admission);
  transcode_ratio_ = options.transcode_ratio;
}

bool TierManager::Fits(Tier tier, uint64_t bytes) {
  TierState& s = state(tier);
  if (s.policy == nullptr) return false;
  return bytes <= s.options.capacity_bytes && s.pinned_bytes <= s.options.capacity_bytes - bytes;
}

void TierManager::Place(const BlockId& id, Tier tier, Tier from, std::vector<TierMove>& moves) {
  TierState& s = state(tier);
  Entry& e = entries_.find(id)->second;
  const uint64_t bytes = e.bytes;
  e.tier = tier;
  s.counters.used_bytes += bytes;
  ++s.counters.blocks;
  if (e.pins > 0) {
    s.pinned_bytes += bytes;
  } else {
    s.policy->OnInsert(id, BlockMeta{e.parent, e.accesses});
  }
  // `e` may be erased from here on.
  const Placing saved = placing_;
  placing_ = Placing{id, tier, from};
  while (s.counters.used_bytes > s.options.capacity_bytes) {
    std::optional<BlockId> victim = s.policy->PopVictim();
    if (!victim.has_value()) break;  // unreachable: the caller checked Fits
    EvictVictim(*victim, tier, moves);
  }
  ApplyWatermark(tier, moves);
  placing_ = saved;
  auto it = entries_.find(id);
  if (it != entries_.end() && it->second.tier == tier) {
    s.counters.bytes_written += bytes;
    if (from != tier) moves.push_back({id, from, tier, bytes});
  }
}

void TierManager::EvictVictim(const BlockId& id, Tier tier, std::vector<TierMove>& moves) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  const bool incoming = placing_.id == id && placing_.tier == tier;
  const Tier from = incoming ? placing_.from : tier;
  if (tier == Tier::kHost && transcode_ratio_ > 0 && !e.transcoded && !incoming) {
    // Read, re-encoded smaller, and back at once: a new block to its policy.
    Unplace(id, e);
    host_.counters.bytes_read += e.bytes;
    e.bytes = std::max<uint64_t>(
        1, static_cast<uint64_t>(static_cast<double>(e.bytes) * transcode_ratio_));
    e.transcoded = true;
    e.tier = Tier::kHost;
    host_.counters.used_bytes += e.bytes;
    host_.counters.bytes_written += e.bytes;
    ++host_.counters.blocks;
    host_.policy->OnInsert(id, BlockMeta{e.parent, e.accesses});  // victims are never pinned
    ++stats_.transcoded;
    moves.push_back({id, Tier::kHost, Tier::kHost, e.bytes});
    return;
  }
  ++state(tier).counters.evictions;
  Unplace(id, e);
  if (tier == Tier::kHost && nvme_.policy != nullptr && Fits(Tier::kNvme, e.bytes)) {
    if (admission_->Admit(id, e.accesses)) {
      ++stats_.demotions;
      host_.counters.bytes_read += e.bytes;
      Place(id, Tier::kNvme, from, moves);
      return;
    }
    ++stats_.rejected;
  }
  moves.push_back({id, from, Tier::kNone, e.bytes});
  ++stats_.dropped;
  Erase(id);
}

void TierManager::ApplyWatermark(Tier tier, std::vector<TierMove>& moves) {
  TierState& s = state(tier);
  if (s.policy == nullptr) return;
  if (s.counters.used_bytes <= Threshold(s.options.capacity_bytes, s.options.high_watermark)) {
    return;
  }
  const uint64_t low = Threshold(s.options.capacity_bytes, s.options.low_watermark);
  while (s.counters.used_bytes > low) {
    std::optional<BlockId> victim = s.policy->PopVictim();
    if (!victim.has_value()) break;  // the rest is pinned
    EvictVictim(*victim, tier, moves);
  }
}

void TierManager::Unplace(const BlockId& id, Entry& e) {
  TierState& s = state(e.tier);
  s.counters.used_bytes -= e.bytes;
  --s.counters.blocks;
  if (e.pins > 0) {
    s.pinned_bytes -= e.bytes;
  } else {
    s.policy->OnRemove(id);
  }
  e.tier = Tier::kNone;
}

void TierManager::Erase(const BlockId& id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  if (it->second.pins > 0) --stats_.pinned_blocks;
  const BlockId parent = it->second.parent;
  entries_.erase(it);
  if (parent.IsZero()) return;
  auto c = children_.find(parent);
  if (c == children_.end()) return;
  auto& kids = c->second;
  auto k = std::find(kids.begin(), kids.end(), id);
  if (k != kids.end()) {
    *k = kids.back();
    kids.pop_back();
  }
  if (kids.empty()) children_.erase(c);
}

absl::StatusOr<std::vector<TierMove>> TierManager::Insert(const BlockId& id, const BlockId& parent,
                                                          uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("Insert: a block has > 0 bytes");
  absl::MutexLock lock(&mu_);
  std::vector<TierMove> moves;
  auto it = entries_.find(id);
  if (it != entries_.end()) {
    if (it->second.pins == 0) state(it->second.tier).policy->OnAccess(id);
    return moves;
  }
  if (!Fits(Tier::kHost, bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host tier: no room for a block of ", bytes, " bytes (capacity ",
                     host_.options.capacity_bytes, ", pinned ", host_.pinned_bytes, ")"));
  }
  Entry e;
  e.parent = (parent == id) ? BlockId{} : parent;
  e.bytes = bytes;
  e.accesses = 1;
  entries_.emplace(id, e);
  if (!e.parent.IsZero()) children_[e.parent].push_back(id);
  ++stats_.inserts;
  Place(id, Tier::kHost, Tier::kHost, moves);
  return moves;
}

AccessResult TierManager::Access(const BlockId& id) {
  absl::MutexLock lock(&mu_);
  AccessResult result;
  ++stats_.accesses;
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    ++stats_.misses;
    return result;
  }
  Entry& e = it->second;
  if (e.accesses < UINT32_MAX) ++e.accesses;
  result.found = e.tier;
  TierState& s = state(e.tier);
  ++s.counters.hits;
  if (e.transcoded) ++stats_.transcoded_hits;
  s.counters.bytes_read += e.bytes;
  if (e.tier == Tier::kHost || !Fits(Tier::kHost, e.bytes)) {
    // Served where it is (a block the host cannot take is staged through a transient buffer).
    if (e.pins == 0) s.policy->OnAccess(id);
    return result;
  }
  Unplace(id, e);
  result.moves.push_back({id, Tier::kNvme, Tier::kHost, e.bytes});
  Place(id, Tier::kHost, Tier::kHost, result.moves);
  return result;
}

Tier TierManager::Locate(const BlockId& id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  return it == entries_.end() ? Tier::kNone : it->second.tier;
}

RemoveResult TierManager::Remove(std::span<const BlockId> ids, bool cascade, bool force) {
  absl::MutexLock lock(&mu_);
  RemoveResult result;
  // Collect first: erasing changes children_.
  std::vector<BlockId> doomed;
  absl::flat_hash_map<BlockId, bool> seen;
  std::deque<BlockId> queue(ids.begin(), ids.end());
  while (!queue.empty()) {
    BlockId id = queue.front();
    queue.pop_front();
    if (!seen.emplace(id, true).second) continue;
    if (entries_.contains(id)) doomed.push_back(id);
    if (!cascade) continue;
    auto c = children_.find(id);
    if (c != children_.end()) queue.insert(queue.end(), c->second.begin(), c->second.end());
  }
  for (const BlockId& id : doomed) {
    auto it = entries_.find(id);
    Entry& e = it->second;
    if (e.pins > 0 && !force) {
      ++result.pinned_skipped;
      continue;
    }
    const Tier tier = e.tier;
    const uint64_t bytes = e.bytes;
    Unplace(id, e);
    Erase(id);
    result.moves.push_back({id, tier, Tier::kNone, bytes});
    ++result.removed_blocks;
    ++stats_.removed_explicit;
  }
  return result;
}

absl::Status TierManager::Pin(const BlockId& id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return absl::NotFoundError("Pin: block not resident");
  Entry& e = it->second;
  if (e.pins++ == 0) {
    TierState& s = state(e.tier);
    s.policy->OnRemove(id);
    s.pinned_bytes += e.bytes;
    ++stats_.pinned_blocks;
  }
  return absl::OkStatus();
}

absl::Status TierManager::Unpin(const BlockId& id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return absl::NotFoundError("Unpin: block not resident");
  Entry& e = it->second;
  if (e.pins == 0) return absl::FailedPreconditionError("Unpin: block is not pinned");
  if (--e.pins == 0) {
    TierState& s = state(e.tier);
    s.pinned_bytes -= e.bytes;
    s.policy->OnInsert(id, BlockMeta{e.parent, e.accesses});
    --stats_.pinned_blocks;
  }
  return absl::OkStatus();
}

std::vector<TierMove> TierManager::Reclaim() {
  absl::MutexLock lock(&mu_);
  std::vector<TierMove> moves;
  ApplyWatermark(Tier::kHost, moves);
  ApplyWatermark(Tier::kNvme, moves);
  return moves;
}

TierManagerStats TierManager::Stats() const {
  absl::MutexLock lock(&mu_);
  TierManagerStats out = stats_;
  out.host = host_.counters;
  out.nvme = nvme_.counters;
  return out;
}

}  // namespace strata
