#include "storage/host_tier.h"

#include <sys/random.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <optional>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/crc_pieces.h"

namespace strata {

HostTier::HostTier(uint8_t* base, uint64_t capacity, HostTierOptions options)
    : base_(base), options_(std::move(options)), capacity_(capacity) {
  if (options_.zones.empty()) {
    zones_.push_back(Zone{0, ExtentAllocator(capacity, options_.alignment)});
  } else {
    for (const HostTierZone& z : options_.zones) {
      if (z.tenant.empty()) common_zone_ = static_cast<uint32_t>(zones_.size());
      zones_.push_back(Zone{z.begin, ExtentAllocator(z.size, options_.alignment)});
    }
  }
  stats_.capacity_bytes = capacity_;
  auto policy = MakeEvictionPolicy(options_.eviction_policy);
  policy_ = policy.ok() ? std::move(*policy) : std::move(*MakeEvictionPolicy("lru"));
}

uint64_t HostTier::NextId() {
  // Reservation and lease ids are bearer capabilities (Commit, Abort, Release and the push
  // fetch name nothing else), so they come from the kernel's CSPRNG: one id says nothing about
  // the next. A generator seeded once (splitmix64 was) is invertible from a single output.
  uint64_t z = 0;
  do {
    if (id_pool_used_ == id_pool_.size()) {
      // Refilled in batches: one syscall per 32 ids.
      uint8_t* out = reinterpret_cast<uint8_t*>(id_pool_.data());
      size_t want = sizeof(id_pool_), got = 0;
      while (got < want) {
        ssize_t n = getrandom(out + got, want - got, 0);
        // getrandom blocks until the pool is seeded and only fails on EINTR (or a pre-3.17
        // kernel, which this project does not support): never fall back to a weaker source.
        if (n < 0 && errno != EINTR) std::abort();
        if (n > 0) got += static_cast<size_t>(n);
      }
      id_pool_used_ = 0;
    }
    z = id_pool_[id_pool_used_];
    id_pool_[id_pool_used_++] = 0;  // a handed-out id does not linger in the pool
  } while (z == 0 || reservations_.contains(z) || leases_.contains(z));
  return z;
}

uint32_t HostTier::InternNamespace(const NamespaceId& ns) {
  auto [it, inserted] = namespaces_.try_emplace(ns, static_cast<uint32_t>(namespaces_.size()));
  if (inserted) {
    namespace_ids_.push_back(ns);
    namespace_usage_.emplace_back(0, 0);
    namespace_tenant_.push_back(kNil);
    namespace_transcodable_.push_back(false);
  }
  return it->second;
}

BlockInfo HostTier::Describe(uint32_t slot, absl::Time now) const {
  const Entry& e = entries_[slot];
  BlockInfo b;
  b.id = e.id;
  b.ns = namespace_ids_[e.ns];
  b.parent = e.parent;
  b.size = e.size;
  b.crc = e.crc;
  b.leases = e.leases;
  b.pinned_for = e.pinned_until > now ? e.pinned_until - now : absl::ZeroDuration();
  b.idle = e.last_use == absl::InfinitePast() ? absl::ZeroDuration() : now - e.last_use;
  return b;
}

std::vector<BlockInfo> HostTier::List(const NamespaceId* ns, size_t limit, uint64_t* cursor) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock();
  std::optional<uint32_t> want;
  if (ns) {
    auto it = namespaces_.find(*ns);
    if (it == namespaces_.end()) {
      *cursor = 0;
      return {};
    }
    want = it->second;
  }
  std::vector<BlockInfo> out;
  uint64_t slot = *cursor;
  for (; slot < entries_.size() && out.size() < limit; ++slot) {
    const Entry& e = entries_[slot];
    if (e.state == State::kCommitted && (!want || e.ns == *want))
      out.push_back(Describe(static_cast<uint32_t>(slot), now));
  }
  *cursor = slot < entries_.size() ? slot : 0;
  return out;
}

std::vector<BlockInfo> HostTier::Inspect(std::span<const BlockId> ids) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock();
  std::vector<BlockInfo> out;
  for (const BlockId& id : ids) {
    auto it = index_.find(id);
    if (it != index_.end() && entries_[it->second].state == State::kCommitted)
      out.push_back(Describe(it->second, now));
  }
  return out;
}

absl::flat_hash_map<NamespaceId, std::pair<uint64_t, uint64_t>> HostTier::UsageByNamespace() const {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<NamespaceId, std::pair<uint64_t, uint64_t>> out;
  for (size_t i = 0; i < namespace_ids_.size(); ++i)
    if (namespace_usage_[i].first > 0) out[namespace_ids_[i]] = namespace_usage_[i];
  return out;
}

uint32_t HostTier::FindCommitted(uint32_t ns, const BlockId& id) const {
  auto it = index_.find(id);
  if (it == index_.end()) return kNil;
  const Entry& e = entries_[it->second];
  if (e.state != State::kCommitted || e.ns != ns) return kNil;
  return it->second;
}

uint32_t HostTier::NewSlot() {
  if (!free_slots_.empty()) {
    uint32_t s = free_slots_.back();
    free_slots_.pop_back();
    return s;
  }
  entries_.emplace_back();
  return static_cast<uint32_t>(entries_.size() - 1);
}

void HostTier::FreeSlot(uint32_t slot) {
  Entry& e = entries_[slot];
  Zone& z = zones_[ZoneAt(e.offset)];
  z.allocator.Free(e.offset - z.begin, e.size);
  e = Entry{};
  free_slots_.push_back(slot);
}

void HostTier::Touch(uint32_t slot) {
  Entry& e = entries_[slot];
  e.last_use = options_.clock();
  ++e.accesses;
  policy_->OnAccess(e.id);
  if (e.in_tenant_lru) {  // most recently used: to the tail of its tenant's list
    UnlinkTenantLru(slot);
    LinkTenantLru(slot);
  }
}

uint32_t HostTier::NextVictim(absl::Time now, std::vector<uint32_t>& skipped) {
  while (auto id = policy_->PopVictim()) {
    auto it = index_.find(*id);
    if (it == index_.end()) continue;
    const Entry& e = entries_[it->second];
    if (e.state != State::kCommitted || e.demoting) continue;
    if (!Evictable(e, now)) {
      skipped.push_back(it->second);
      continue;
    }
    return it->second;
  }
  return kNil;
}

void HostTier::RestoreSkipped(const std::vector<uint32_t>& skipped) {
  for (uint32_t slot : skipped) {
    const Entry& e = entries_[slot];
    if (e.state == State::kCommitted && !e.demoting)
      policy_->OnInsert(e.id, BlockMeta{e.parent, std::max<uint32_t>(e.accesses, 1)});
  }
}

void HostTier::EvictVictim(uint32_t slot) {
  Entry& e = entries_[slot];
  if (options_.write_back && !write_back_stopped_) {
    e.demoting = true;
    // On its way out: no longer a quota victim nor counted against its tenant's share.
    UnlinkTenantLru(slot);
    if (uint32_t t = TenantOf(e); t != kNil) tenants_[t].demoting += e.size;
    ++e.leases;  // the write-back reads the extent: it must not be freed meanwhile
    demoting_bytes_ += e.size;
    zones_[ZoneAt(e.offset)].demoting += e.size;
    ++demoting_blocks_;
    demotion_queue_.push_back(slot);
    return;
  }
  if (options_.write_back) ++stats_.pressure_drops;
  RemoveCommitted(slot);
  ++stats_.evictions_lru;
}

bool HostTier::FinishDemotionLocked(uint32_t slot, bool stored_below) {
  Entry& e = entries_[slot];
  demoting_bytes_ -= e.size;
  zones_[ZoneAt(e.offset)].demoting -= e.size;
  --demoting_blocks_;
  ++demotions_finished_;
  if (uint32_t t = TenantOf(e); t != kNil && e.state == State::kCommitted)
    tenants_[t].demoting -= e.size;  // RemoveCommitted below takes it out of `committed`
  e.demoting = false;
  --e.leases;
  if (e.state == State::kCommitted) {
    RemoveCommitted(slot);  // frees now, or at the last client Release
    ++stats_.evictions_lru;
    if (stored_below) ++stats_.demoted;
    return true;
  }
  // Evicted explicitly while queued or being written: only the write-back held it.
  if (e.leases == 0 && e.state == State::kDoomed) FreeSlot(slot);
  return false;
}

std::vector<DemotionItem> HostTier::TakeDemotions(size_t max, absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !demotion_queue_.empty() || write_back_stopped_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
  std::vector<DemotionItem> out;
  while (!demotion_queue_.empty() && out.size() < max) {
    uint32_t slot = demotion_queue_.front();
    demotion_queue_.pop_front();
    const Entry& e = entries_[slot];
    if (e.state != State::kCommitted) {  // evicted while queued
      FinishDemotionLocked(slot, false);
      continue;
    }
    DemotionItem d;
    d.handle = slot;
    d.id = e.id;
    d.ns = namespace_ids_[e.ns];
    d.parent = e.parent;
    d.offset = e.offset;
    d.size = e.size;
    d.crc = e.crc;
    d.accesses = std::max<uint32_t>(e.accesses, 1);
    out.push_back(d);
  }
  return out;
}

bool HostTier::FinishDemotion(uint32_t handle, bool stored_below) {
  absl::MutexLock lock(&mu_);
  return FinishDemotionLocked(handle, stored_below);
}

void HostTier::StopWriteBack() {
  absl::MutexLock lock(&mu_);
  write_back_stopped_ = true;
  while (!demotion_queue_.empty()) {
    uint32_t slot = demotion_queue_.front();
    demotion_queue_.pop_front();
    FinishDemotionLocked(slot, false);
  }
}

bool HostTier::Evictable(const Entry& e, absl::Time now) const {
  return e.state == State::kCommitted && e.leases == 0 && e.pinned_until <= now;
}

void HostTier::RemoveCommitted(uint32_t slot) {
  Entry& e = entries_[slot];
  if (on_change_) on_change_({BlockEvent::kRemoved, e.id, namespace_ids_[e.ns], e.parent});
  policy_->OnRemove(e.id);
  index_.erase(e.id);
  stats_.committed_bytes -= e.size;
  --stats_.blocks;
  --namespace_usage_[e.ns].first;
  namespace_usage_[e.ns].second -= e.size;
  if (uint32_t t = TenantOf(e); t != kNil) {
    tenants_[t].committed -= e.size;
    if (e.demoting) tenants_[t].demoting -= e.size;
    UnlinkTenantLru(slot);
  }
  if (e.leases > 0) {
    e.state = State::kDoomed;  // readers keep their bytes; freed at the last Release
  } else {
    FreeSlot(slot);
  }
}

std::optional<uint64_t> HostTier::AllocateEvicting(uint32_t zone, uint64_t size, absl::Time now) {
  if (auto off = AllocateIn(zone, size)) return off;
  if (options_.write_back) {
    // Queue victims until as many bytes as the request are on their way down, and wait for the
    // write-back to free them. Free space can be fragmented: retry after every completion.
    const absl::Time deadline = absl::Now() + options_.write_back_wait;
    while (!write_back_stopped_) {
      std::vector<uint32_t> skipped;
      while (zones_[zone].demoting < size) {
        uint32_t v = NextVictimIn(zone, now, skipped);
        if (v == kNil) break;
        EvictVictim(v);
      }
      RestoreSkipped(skipped);
      if (zones_[zone].demoting == 0) break;
      const uint64_t seen = demotions_finished_;
      auto progressed = [this, seen]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return demotions_finished_ != seen || write_back_stopped_;
      };
      bool moved = mu_.AwaitWithDeadline(absl::Condition(&progressed), deadline);
      if (auto off = AllocateIn(zone, size)) return off;
      if (!moved) break;
    }
  }
  if (options_.transcode) {
    if (auto off = TranscodeForRoom(zone, size, now)) return off;
  }
  // Drop victims until the request fits (stops at the first allocation that succeeds).
  std::vector<uint32_t> skipped;
  std::optional<uint64_t> off;
  while (!off) {
    uint32_t v = NextVictimIn(zone, now, skipped);
    if (v == kNil) break;
    if (options_.write_back) ++stats_.pressure_drops;
    RemoveCommitted(v);
    ++stats_.evictions_lru;
    off = AllocateIn(zone, size);
  }
  RestoreSkipped(skipped);
  return off;
}

void HostTier::EvictToLowWatermark(absl::Time now) {
  const double cap = static_cast<double>(capacity_);
  // Blocks being written back still hold their bytes but are already on their way out.
  // So are the bytes blocks being transcoded are expected to give back.
  auto used = [this] {
    return static_cast<double>(AllocatedBytes() - demoting_bytes_ -
                               std::min(transcode_savings_, AllocatedBytes() - demoting_bytes_));
  };
  if (used() <= options_.high_watermark * cap) return;
  const double target = options_.low_watermark * cap;
  std::vector<uint32_t> skipped;
  while (used() > target) {
    uint32_t v = NextVictim(now, skipped);
    if (v == kNil) break;
    if (!QueueTranscode(v)) EvictVictim(v);
  }
  RestoreSkipped(skipped);
}

ReserveResult HostTier::Reserve(const NamespaceId& ns_id, std::span<const ReserveItem> items) {
  ReserveResult r;
  r.status.resize(items.size(), BlockStatus::kInvalid);
  r.offsets.resize(items.size(), 0);
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock();
  const uint32_t ns = InternNamespace(ns_id);
  Reservation res;
  // The status of an id the index already has (false where it has not).
  auto known = [&](size_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const auto found = index_.find(items[i].id);
    if (found == index_.end()) return false;
    Entry& e = entries_[found->second];
    if (e.ns != ns) return true;  // kInvalid: ids are namespace-seeded, this one is not ours
    if (e.state == State::kCommitted) {
      r.status[i] = BlockStatus::kExists;
      Touch(found->second);
      ++stats_.dedup_total;
    } else {
      r.status[i] = BlockStatus::kInProgress;
    }
    return true;
  };
  for (size_t i = 0; i < items.size(); ++i) {
    const ReserveItem& it = items[i];
    if (it.size == 0 || it.size > options_.max_block_bytes || it.size > capacity_)
      continue;  // kInvalid
    if (known(i)) continue;
    if (const uint32_t t = namespace_tenant_[ns]; t != kNil && !MakeTenantRoom(t, it.size, now)) {
      r.status[i] = BlockStatus::kNoSpace;
      ++stats_.no_space;
      ++stats_.quota_no_space;
      continue;
    }
    auto offset = AllocateEvicting(ZoneOf(ns), it.size, now);
    if (!offset) {
      r.status[i] = BlockStatus::kNoSpace;
      ++stats_.no_space;
      continue;
    }
    // Waiting for room (write-back, transcoding) releases mu_: another caller may have reserved
    // the same id meanwhile (two engines publishing one prefix, two fetches promoting one NVMe
    // block), and a client's first open may have set the namespace's tenant.
    if (known(i)) {
      Zone& z = zones_[ZoneAt(*offset)];
      z.allocator.Free(*offset - z.begin, it.size);
      continue;
    }
    const uint32_t tenant = namespace_tenant_[ns];
    uint32_t slot = NewSlot();
    Entry& e = entries_[slot];
    e.id = it.id;
    e.parent = it.parent;
    e.offset = *offset;
    e.size = it.size;
    e.ns = ns;
    e.state = State::kReserved;
    index_.emplace(it.id, slot);
    stats_.reserved_bytes += it.size;
    if (tenant != kNil) tenants_[tenant].reserved += it.size;
    res.slots.push_back(slot);
    r.status[i] = BlockStatus::kOk;
    r.offsets[i] = *offset;
  }
  if (!res.slots.empty()) {
    res.expires = now + options_.reservation_timeout;
    r.reservation_id = NextId();
    r.expires_in = options_.reservation_timeout;
    reservations_.emplace(r.reservation_id, std::move(res));
  }
  EvictToLowWatermark(now);
  return r;
}

// Reads the arena without the lock: the extents belong to this reservation alone.
void HostTier::VerifyCrcs(std::span<const CommitExtent> checks, std::span<const uint32_t> crcs,
                          std::span<BlockStatus> out) const {
  // A large commit is split into pieces checked on two threads (CRCs of pieces combine), since
  // re-reading every published byte is the daemon's largest share of a publish.
  constexpr uint64_t kPiece = 2 << 20;
  const std::vector<CrcPiece> pieces = SplitIntoCrcPieces(
      checks.size(), [&](size_t i) { return checks[i].size; }, kPiece);
  uint64_t total = 0;
  for (const CommitExtent& c : checks) total += c.size;
  std::vector<uint32_t> piece_crcs(pieces.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < pieces.size();)
      piece_crcs[k] =
          Crc32c(base_ + checks[pieces[k].block].offset + pieces[k].offset, pieces[k].len);
  };
  if (total >= options_.parallel_verify_bytes && pieces.size() > 1) {
    std::thread helper(work);
    work();
    helper.join();
  } else {
    work();
  }
  const std::vector<uint32_t> block_crc = CombineCrcPieces(pieces, piece_crcs, checks.size());
  for (size_t i = 0; i < checks.size(); ++i)
    if (block_crc[i] != crcs[i]) out[i] = BlockStatus::kCrcMismatch;
}

absl::StatusOr<std::vector<BlockStatus>> HostTier::Commit(uint64_t reservation_id,
                                                          std::span<const uint32_t> crcs,
                                                          CommitCheck check) {
  std::vector<CommitExtent> checks;
  {
    absl::MutexLock lock(&mu_);
    auto it = reservations_.find(reservation_id);
    if (it == reservations_.end())
      return absl::NotFoundError(absl::StrCat(
          "reservation ", reservation_id, " is unknown (expired, aborted or already committed)"));
    Reservation& res = it->second;
    if (res.dropped)
      return absl::NotFoundError(absl::StrCat(
          "reservation ", reservation_id, " is unknown (expired, aborted or already committed)"));
    if (res.writers > 0)
      return absl::FailedPreconditionError(absl::StrCat(
          "blocks of reservation ", reservation_id, " are still being written"));
    if (res.committing)
      return absl::FailedPreconditionError(
          absl::StrCat("reservation ", reservation_id, " is already being committed"));
    if (crcs.size() != res.slots.size())
      return absl::InvalidArgumentError(absl::StrCat("reservation ", reservation_id, " holds ",
                                                     res.slots.size(), " blocks but commit has ",
                                                     crcs.size(), " CRCs"));
    res.committing = true;  // shields the extents from ReclaimExpired while we verify
    for (uint32_t s : res.slots) checks.push_back({s, entries_[s].offset, entries_[s].size});
  }
  std::vector<BlockStatus> out(checks.size(), BlockStatus::kOk);
  if (check == CommitCheck::kReread) VerifyCrcs(checks, crcs, out);

  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock();
  for (size_t i = 0; i < checks.size(); ++i) {
    uint32_t slot = checks[i].slot;
    Entry& e = entries_[slot];
    stats_.reserved_bytes -= e.size;
    const uint32_t t = TenantOf(e);
    if (t != kNil) tenants_[t].reserved -= e.size;
    if (out[i] == BlockStatus::kOk) {
      e.state = State::kCommitted;
      e.crc = crcs[i];
      e.last_use = now;
      e.accesses = 1;
      stats_.committed_bytes += e.size;
      ++stats_.blocks;
      ++namespace_usage_[e.ns].first;
      namespace_usage_[e.ns].second += e.size;
      ++stats_.committed_total;
      policy_->OnInsert(e.id, BlockMeta{e.parent, 1});
      if (t != kNil) {
        tenants_[t].committed += e.size;
        LinkTenantLru(slot);
      }
      if (on_change_) on_change_({BlockEvent::kStored, e.id, namespace_ids_[e.ns], e.parent});
    } else {
      ++stats_.crc_failures;
      index_.erase(e.id);
      FreeSlot(slot);
    }
  }
  reservations_.erase(reservation_id);
  EvictToLowWatermark(now);
  return out;
}

void HostTier::DropReservation(uint64_t id) {
  auto it = reservations_.find(id);
  if (it == reservations_.end()) return;
  if (it->second.writers > 0) {  // EndReservedWrite finishes the job
    it->second.dropped = true;
    return;
  }
  for (uint32_t slot : it->second.slots) {
    Entry& e = entries_[slot];
    stats_.reserved_bytes -= e.size;
    if (uint32_t t = TenantOf(e); t != kNil) tenants_[t].reserved -= e.size;
    index_.erase(e.id);
    FreeSlot(slot);
  }
  reservations_.erase(it);
}

absl::Status HostTier::HoldReservation(uint64_t reservation_id) {
  absl::MutexLock lock(&mu_);
  auto it = reservations_.find(reservation_id);
  if (it == reservations_.end())
    return absl::NotFoundError(absl::StrCat("reservation ", reservation_id, " is unknown"));
  it->second.expires = absl::InfiniteFuture();
  return absl::OkStatus();
}

absl::StatusOr<BlockStatus> HostTier::RenameReserved(uint64_t reservation_id,
                                                     const NamespaceId& ns_id,
                                                     const ReserveItem& item) {
  absl::MutexLock lock(&mu_);
  auto it = reservations_.find(reservation_id);
  if (it == reservations_.end() || it->second.dropped ||
      it->second.expires <= options_.clock())
    return absl::NotFoundError(absl::StrCat("reservation ", reservation_id,
                                            " is unknown (expired, aborted or committed)"));
  Reservation& res = it->second;
  if (res.writers > 0 || res.committing)
    return absl::FailedPreconditionError(absl::StrCat(
        "reservation ", reservation_id, " is being written or committed: it cannot be renamed"));
  if (res.slots.size() != 1)
    return absl::InvalidArgumentError(absl::StrCat("reservation ", reservation_id, " holds ",
                                                   res.slots.size(),
                                                   " blocks; only a one-block one is renamed"));
  const uint32_t slot = res.slots[0];
  Entry& e = entries_[slot];
  if (auto ns = namespaces_.find(ns_id); ns == namespaces_.end() || ns->second != e.ns)
    return absl::InvalidArgumentError(
        absl::StrCat("reservation ", reservation_id, " is in another namespace"));
  BlockStatus answer = BlockStatus::kOk;
  if (item.size == 0 || item.size > e.size) {
    answer = BlockStatus::kInvalid;
  } else if (auto found = index_.find(item.id); found != index_.end() && found->second != slot) {
    const Entry& held = entries_[found->second];
    if (held.ns != e.ns) {
      answer = BlockStatus::kInvalid;  // ids are namespace-seeded: not one of this namespace's
    } else if (held.state == State::kCommitted) {
      answer = BlockStatus::kExists;
      Touch(found->second);
      ++stats_.dedup_total;
    } else {
      answer = BlockStatus::kInProgress;
    }
  }
  if (answer != BlockStatus::kOk) {
    DropReservation(reservation_id);  // the block needs no room: the spare goes back
    return answer;
  }
  index_.erase(e.id);
  e.id = item.id;
  e.parent = item.parent;
  index_.emplace(item.id, slot);
  // The extent's tail past the block goes back now, not at commit.
  Zone& z = zones_[ZoneAt(e.offset)];
  const uint64_t had = z.allocator.RoundUp(e.size), keep = z.allocator.RoundUp(item.size);
  if (keep < had) z.allocator.Free(e.offset - z.begin + keep, had - keep);
  const uint64_t freed = e.size - item.size;
  stats_.reserved_bytes -= freed;
  if (uint32_t t = TenantOf(e); t != kNil) tenants_[t].reserved -= freed;
  e.size = item.size;
  return BlockStatus::kOk;
}

absl::Status HostTier::Abort(uint64_t reservation_id) {
  absl::MutexLock lock(&mu_);
  auto it = reservations_.find(reservation_id);
  if (it == reservations_.end())
    return absl::NotFoundError(absl::StrCat("reservation ", reservation_id, " is unknown"));
  if (it->second.committing)
    return absl::FailedPreconditionError(
        absl::StrCat("reservation ", reservation_id, " is being committed"));
  if (it->second.dropped)
    return absl::NotFoundError(absl::StrCat("reservation ", reservation_id, " is unknown"));
  DropReservation(reservation_id);
  return absl::OkStatus();
}

absl::Status HostTier::BeginReservedWrite(uint64_t reservation_id, ArenaExtent extent) {
  absl::MutexLock lock(&mu_);
  auto it = reservations_.find(reservation_id);
  if (it == reservations_.end() || it->second.dropped ||
      it->second.expires <= options_.clock())
    return absl::NotFoundError(absl::StrCat("reservation ", reservation_id, " is unknown"));
  Reservation& res = it->second;
  if (res.committing)
    return absl::FailedPreconditionError(
        absl::StrCat("reservation ", reservation_id, " is being committed"));
  for (uint32_t slot : res.slots) {
    if (entries_[slot].offset == extent.offset && entries_[slot].size == extent.size) {
      ++res.writers;
      return absl::OkStatus();
    }
  }
  return absl::PermissionDeniedError(
      absl::StrCat("reservation ", reservation_id, " holds no block at that extent"));
}

void HostTier::EndReservedWrite(uint64_t reservation_id) {
  absl::MutexLock lock(&mu_);
  auto it = reservations_.find(reservation_id);
  if (it == reservations_.end() || it->second.writers == 0) return;
  if (--it->second.writers == 0 && it->second.dropped) DropReservation(reservation_id);
}

std::vector<ArenaExtent> HostTier::ReservedExtents(uint64_t reservation_id) const {
  absl::MutexLock lock(&mu_);
  std::vector<ArenaExtent> out;
  auto it = reservations_.find(reservation_id);
  if (it == reservations_.end() || it->second.dropped) return out;
  for (uint32_t slot : it->second.slots) out.push_back({entries_[slot].offset, entries_[slot].size});
  return out;
}

size_t HostTier::Lookup(const NamespaceId& ns_id, std::span<const BlockId> ids,
                        const std::function<bool(const BlockId&)>& lower,
                        std::vector<bool>* in_lower) {
  absl::MutexLock lock(&mu_);
  ++stats_.lookups;
  auto ns_it = namespaces_.find(ns_id);
  size_t n = 0;
  if (in_lower) in_lower->clear();
  for (; n < ids.size(); ++n) {
    uint32_t slot = ns_it == namespaces_.end() ? kNil : FindCommitted(ns_it->second, ids[n]);
    if (slot != kNil) {
      Touch(slot);
      if (in_lower) in_lower->push_back(false);
    } else if (lower && lower(ids[n])) {
      if (in_lower) in_lower->push_back(true);
    } else {
      break;
    }
  }
  stats_.lookup_hit_blocks += n;
  stats_.lookup_miss_blocks += ids.size() - n;
  return n;
}

AcquireResult HostTier::Acquire(const NamespaceId& ns_id, std::span<const BlockId> ids) {
  AcquireResult r;
  r.status.assign(ids.size(), BlockStatus::kNotFound);
  r.offsets.assign(ids.size(), 0);
  r.sizes.assign(ids.size(), 0);
  r.crcs.assign(ids.size(), 0);
  absl::MutexLock lock(&mu_);
  auto ns_it = namespaces_.find(ns_id);
  Lease lease;
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t slot = ns_it == namespaces_.end() ? kNil : FindCommitted(ns_it->second, ids[i]);
    if (slot == kNil) {
      ++stats_.acquire_miss_blocks;
      continue;
    }
    Entry& e = entries_[slot];
    ++e.leases;
    Touch(slot);
    lease.slots.push_back(slot);
    r.status[i] = BlockStatus::kOk;
    r.offsets[i] = e.offset;
    r.sizes[i] = e.size;
    r.crcs[i] = e.crc;
    ++stats_.acquire_hit_blocks;
  }
  if (!lease.slots.empty()) {
    lease.expires = options_.clock() + options_.lease_timeout;
    r.lease_id = NextId();
    r.expires_in = options_.lease_timeout;
    leases_.emplace(r.lease_id, std::move(lease));
  }
  return r;
}

void HostTier::DropLease(uint64_t id) {
  auto it = leases_.find(id);
  if (it == leases_.end()) return;
  if (it->second.readers > 0) {  // EndLeaseRead finishes the job
    it->second.dropped = true;
    return;
  }
  for (uint32_t slot : it->second.slots) {
    Entry& e = entries_[slot];
    if (--e.leases == 0 && e.state == State::kDoomed) FreeSlot(slot);
  }
  leases_.erase(it);
}

void HostTier::SetChangeHook(BlockEventHook hook) {
  absl::MutexLock lock(&mu_);
  on_change_ = std::move(hook);
}

bool HostTier::BeginLeaseRead(uint64_t lease_id, std::span<const ArenaExtent> extents,
                              uint32_t holds) {
  absl::MutexLock lock(&mu_);
  if (!LeaseCoversLocked(lease_id, extents)) return false;
  leases_.find(lease_id)->second.readers += holds;
  return true;
}

void HostTier::EndLeaseRead(uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.readers == 0) return;
  if (--it->second.readers == 0 && it->second.dropped) DropLease(lease_id);
}

bool HostTier::LeaseCovers(uint64_t lease_id, std::span<const ArenaExtent> extents) const {
  absl::ReaderMutexLock lock(&mu_);
  return LeaseCoversLocked(lease_id, extents);
}

bool HostTier::LeaseCoversLocked(uint64_t lease_id, std::span<const ArenaExtent> extents) const {
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.dropped || it->second.expires <= options_.clock())
    return false;
  absl::flat_hash_set<std::pair<uint64_t, uint64_t>> held;
  for (uint32_t slot : it->second.slots) held.insert({entries_[slot].offset, entries_[slot].size});
  for (const ArenaExtent& e : extents)
    if (!held.contains({e.offset, e.size})) return false;
  return true;
}

absl::Status HostTier::Release(uint64_t lease_id) {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || it->second.dropped)
    return absl::NotFoundError(absl::StrCat("lease ", lease_id, " is unknown or expired"));
  DropLease(lease_id);
  return absl::OkStatus();
}

EvictResult HostTier::Evict(const NamespaceId& ns_id, std::span<const BlockId> ids, bool cascade,
                            bool force) {
  EvictResult r;
  r.status.assign(ids.size(), BlockStatus::kNotFound);
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock();
  auto ns_it = namespaces_.find(ns_id);
  if (ns_it == namespaces_.end()) return r;
  const uint32_t ns = ns_it->second;
  auto pinned = [&](const Entry& e) { return !force && e.pinned_until > now; };

  std::vector<BlockId> roots;
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t slot = FindCommitted(ns, ids[i]);
    if (slot == kNil) continue;
    if (pinned(entries_[slot])) {
      r.status[i] = BlockStatus::kPinned;
      continue;
    }
    r.status[i] = BlockStatus::kOk;
    roots.push_back(ids[i]);
  }
  if (cascade && !roots.empty()) {
    // Cascades are rare admin operations; one scan for the parent->children edges beats keeping
    // a second index on every publish.
    absl::flat_hash_map<BlockId, std::vector<uint32_t>> children;
    for (uint32_t s = 0; s < entries_.size(); ++s) {
      const Entry& e = entries_[s];
      if (e.state == State::kCommitted && e.ns == ns && !e.parent.IsZero())
        children[e.parent].push_back(s);
    }
    absl::flat_hash_set<BlockId> seen(roots.begin(), roots.end());
    for (size_t i = 0; i < roots.size(); ++i) {
      auto it = children.find(roots[i]);
      if (it == children.end()) continue;
      for (uint32_t s : it->second)
        if (!pinned(entries_[s]) && seen.insert(entries_[s].id).second)
          roots.push_back(entries_[s].id);
    }
  }
  for (const BlockId& id : roots) {
    uint32_t slot = FindCommitted(ns, id);
    if (slot == kNil) continue;
    RemoveCommitted(slot);
    ++stats_.evictions_explicit;
    ++r.removed_blocks;
  }
  return r;
}

std::vector<BlockStatus> HostTier::Pin(const NamespaceId& ns_id, std::span<const BlockId> ids,
                                       absl::Duration ttl) {
  std::vector<BlockStatus> out(ids.size(), BlockStatus::kNotFound);
  absl::MutexLock lock(&mu_);
  auto ns_it = namespaces_.find(ns_id);
  if (ns_it == namespaces_.end()) return out;
  const absl::Time until = options_.clock() + std::min(ttl, options_.max_pin_ttl);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t slot = FindCommitted(ns_it->second, ids[i]);
    if (slot == kNil) continue;
    entries_[slot].pinned_until = std::max(entries_[slot].pinned_until, until);
    out[i] = BlockStatus::kOk;
  }
  return out;
}

std::vector<BlockStatus> HostTier::Unpin(const NamespaceId& ns_id, std::span<const BlockId> ids) {
  std::vector<BlockStatus> out(ids.size(), BlockStatus::kNotFound);
  absl::MutexLock lock(&mu_);
  auto ns_it = namespaces_.find(ns_id);
  if (ns_it == namespaces_.end()) return out;
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t slot = FindCommitted(ns_it->second, ids[i]);
    if (slot == kNil) continue;
    entries_[slot].pinned_until = absl::InfinitePast();
    out[i] = BlockStatus::kOk;
  }
  return out;
}

void HostTier::ReclaimExpired() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock();
  std::vector<uint64_t> expired;
  for (const auto& [id, res] : reservations_)
    if (!res.committing && !res.dropped && res.expires <= now) expired.push_back(id);
  for (uint64_t id : expired) DropReservation(id);
  stats_.reservations_expired += expired.size();
  expired.clear();
  for (const auto& [id, lease] : leases_)
    if (!lease.dropped && lease.expires <= now) expired.push_back(id);
  for (uint64_t id : expired) DropLease(id);
  stats_.leases_expired += expired.size();
}

HostTierStats HostTier::Stats() const {
  absl::MutexLock lock(&mu_);
  HostTierStats s = stats_;
  const absl::Time now = options_.clock();
  s.allocated_bytes = AllocatedBytes();
  s.open_reservations = reservations_.size();
  s.open_leases = leases_.size();
  s.namespaces = namespaces_.size();
  s.demoting_blocks = demoting_blocks_;
  s.demoting_bytes = demoting_bytes_;
  s.transcoding_blocks = transcoding_blocks_;
  s.pinned_blocks = 0;
  for (const Entry& e : entries_)
    if (e.state == State::kCommitted && e.pinned_until > now) ++s.pinned_blocks;
  return s;
}

}  // namespace strata
