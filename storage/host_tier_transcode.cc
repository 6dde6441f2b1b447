// HostTier: cold blocks rewritten at a lower rate instead of evicted (options.transcode).
#include <algorithm>
#include <cstring>

#include "storage/host_tier.h"

namespace strata {

void HostTier::SetNamespaceTranscodable(const NamespaceId& ns, bool transcodable) {
  absl::MutexLock lock(&mu_);
  namespace_transcodable_[InternNamespace(ns)] = transcodable;
}

uint64_t HostTier::ExpectedSaving(uint64_t size) const {
  return static_cast<uint64_t>(static_cast<double>(size) * (1.0 - transcode_ratio_));
}

bool HostTier::QueueTranscode(uint32_t slot) {
  Entry& e = entries_[slot];
  if (!options_.transcode || transcode_stopped_ || e.transcoded || e.transcoding ||
      !namespace_transcodable_[e.ns] || transcoding_blocks_ >= options_.max_transcoding) {
    return false;
  }
  e.transcoding = true;
  ++e.leases;  // the transcoder reads the extent: it must not be freed meanwhile
  transcode_savings_ += ExpectedSaving(e.size);
  ++transcoding_blocks_;
  transcode_queue_.push_back(slot);
  return true;
}

void HostTier::EndTranscode(Entry& e) {
  // The ratio may have moved since the block was handed out: the sum restarts from zero.
  transcode_savings_ -= std::min(transcode_savings_, ExpectedSaving(e.size));
  if (--transcoding_blocks_ == 0) transcode_savings_ = 0;
  ++transcodes_finished_;
  e.transcoding = false;
  --e.leases;
}

std::vector<TranscodeItem> HostTier::TakeTranscodes(size_t max, absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !transcode_queue_.empty() || transcode_stopped_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
  std::vector<TranscodeItem> out;
  while (!transcode_queue_.empty() && out.size() < max) {
    const uint32_t slot = transcode_queue_.front();
    transcode_queue_.pop_front();
    Entry& e = entries_[slot];
    if (e.state != State::kCommitted) {  // evicted while queued: only the queue held it
      EndTranscode(e);
      if (e.leases == 0 && e.state == State::kDoomed) FreeSlot(slot);
      continue;
    }
    out.push_back({slot, e.id, namespace_ids_[e.ns], e.offset, e.size, e.crc});
  }
  return out;
}

bool HostTier::FinishTranscode(uint32_t handle, std::span<const uint8_t> blob, uint32_t crc) {
  absl::MutexLock lock(&mu_);
  Entry& e = entries_[handle];
  EndTranscode(e);
  if (e.state != State::kCommitted) {  // evicted meanwhile
    if (e.leases == 0 && e.state == State::kDoomed) FreeSlot(handle);
    return false;
  }
  Zone& z = zones_[ZoneAt(e.offset)];
  const uint64_t had = z.allocator.RoundUp(e.size);
  const uint64_t keep = z.allocator.RoundUp(blob.size());
  const BlockMeta meta{e.parent, std::max<uint32_t>(e.accesses, 1)};
  if (blob.empty() || keep >= had) {
    ++stats_.transcode_failures;
    e.transcoded = true;  // not again: its next eviction is final
    if (e.pinned_until > options_.clock() || e.leases > 0) {
      // Pinned (Pin answered kOk) or leased while it was with the transcoder: it stays, as an
      // eviction pass would have left it.
      policy_->OnInsert(e.id, meta);
      return false;
    }
    EvictVictim(handle);
    return false;
  }
  if (e.leases > 0) {
    // A reader holds the old bytes: they stay, and the block may be chosen again later.
    ++stats_.transcode_skipped;
    policy_->OnInsert(e.id, meta);
    return false;
  }
  // No lease and the tier's lock held: nobody reads these bytes while they change. The blob
  // goes where best fit puts it (often a hole another transcoded block left), so the whole old
  // extent comes free in one piece for a block of the usual size; freeing only its tail would
  // leave holes too small for one. In place when nothing else fits.
  const uint32_t zone = ZoneAt(e.offset);
  if (auto moved = AllocateIn(zone, blob.size())) {
    std::memcpy(base_ + *moved, blob.data(), blob.size());
    z.allocator.Free(e.offset - z.begin, had);
    e.offset = *moved;
  } else {
    std::memcpy(base_ + e.offset, blob.data(), blob.size());
    z.allocator.Free(e.offset - z.begin + keep, had - keep);
  }
  const uint64_t freed = e.size - blob.size();
  stats_.committed_bytes -= freed;
  namespace_usage_[e.ns].second -= freed;
  if (uint32_t t = TenantOf(e); t != kNil) tenants_[t].committed -= freed;
  ++stats_.transcoded;
  stats_.transcoded_bytes_in += e.size;
  stats_.transcoded_bytes_out += blob.size();
  transcode_ratio_ = 0.8 * transcode_ratio_ +
                     0.2 * static_cast<double>(blob.size()) / static_cast<double>(e.size);
  e.size = blob.size();
  e.crc = crc;
  e.transcoded = true;
  policy_->OnInsert(e.id, meta);  // a second life, at the lower rate
  return true;
}

std::optional<uint64_t> HostTier::TranscodeForRoom(uint32_t zone, uint64_t size,
                                                    absl::Time now) {
  const absl::Time deadline = absl::Now() + options_.transcode_wait;
  while (!transcode_stopped_) {
    // Victims are handed out only while none are in flight: those still coming may free the
    // room, and popping further would drop blocks (transcoded ones cannot go again).
    if (transcoding_blocks_ == 0) {
      // A transcoded block leaves its whole extent free (its blob moves to a hole of its size),
      // so the victims handed out must hold `size` bytes between them.
      std::vector<uint32_t> skipped;
      uint64_t coming = 0;
      while (coming < size) {
        const uint32_t v = NextVictimIn(zone, now, skipped);
        if (v == kNil) break;
        if (QueueTranscode(v)) {
          coming += entries_[v].size;
          continue;
        }
        RemoveCommitted(v);  // not transcodable (or not again): dropped as without transcoding
        ++stats_.evictions_lru;
        if (options_.write_back) ++stats_.pressure_drops;
        if (auto off = AllocateIn(zone, size)) {
          RestoreSkipped(skipped);
          return off;
        }
      }
      RestoreSkipped(skipped);
      if (transcoding_blocks_ == 0) return std::nullopt;
    }
    const uint64_t seen = transcodes_finished_;
    auto progressed = [this, seen]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return transcodes_finished_ != seen || transcode_stopped_;
    };
    const bool moved = mu_.AwaitWithDeadline(absl::Condition(&progressed), deadline);
    if (auto off = AllocateIn(zone, size)) return off;
    if (!moved) return std::nullopt;
  }
  return std::nullopt;
}

void HostTier::StopTranscoding() {
  absl::MutexLock lock(&mu_);
  transcode_stopped_ = true;
  while (!transcode_queue_.empty()) {
    const uint32_t slot = transcode_queue_.front();
    transcode_queue_.pop_front();
    Entry& e = entries_[slot];
    EndTranscode(e);
    if (e.state == State::kCommitted) {
      policy_->OnInsert(e.id, BlockMeta{e.parent, std::max<uint32_t>(e.accesses, 1)});
    } else if (e.leases == 0 && e.state == State::kDoomed) {
      FreeSlot(slot);
    }
  }
}

}  // namespace strata
