// The directory entries a node owns: BlockId -> the nodes holding that block, and in which tier.
//
// Entries are soft state. A holder announces its blocks to each block's owners and refreshes
// them before `expires`; an entry nobody refreshes disappears, so a holder that died without a
// word (and was never seen leaving) stops being advertised after one TTL. A departure seen in
// membership removes the node's entries at once (RemoveNode).
//
// Memory per entry is what the simulator reports as "directory bytes per entry"; keep it small:
// node ids are interned to 16-bit indexes and expiry is kept in seconds. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "strata/block_id.h"

namespace strata::placement {

// Numbers match strata.v1.Tier.
enum class LocationTier : uint8_t { kUnknown = 0, kGpu = 1, kHost = 2, kNvme = 3 };

struct Location {
  std::string node;
  LocationTier tier = LocationTier::kUnknown;
};

class Directory {
 public:
  Directory();
  ~Directory();
  Directory(const Directory&) = delete;
  Directory& operator=(const Directory&) = delete;

  // Records that `node` holds `ids[i]` in `tiers[i]` (one tier for all when tiers has size 1)
  // until `expires`. Re-announcing refreshes the expiry and updates the tier. `node` holds at
  // most `max_per_node` entries: ids beyond that are refused (refreshes still pass), so one
  // announcer cannot grow the directory without end. Returns how many ids were refused.
  size_t Announce(std::string_view node, std::span<const BlockId> ids,
                  std::span<const LocationTier> tiers, absl::Time expires,
                  size_t max_per_node = SIZE_MAX);
  // Entries `node` holds now.
  size_t entries_of(std::string_view node) const;
  void Withdraw(std::string_view node, std::span<const BlockId> ids);
  // Drops every entry of `node` (it left the cluster). Returns how many were dropped.
  size_t RemoveNode(std::string_view node);
  // Holders of each id that have not expired at `now`, in announcement order.
  std::vector<std::vector<Location>> Locate(std::span<const BlockId> ids, absl::Time now) const;
  // Drops holders whose expiry is before `now`; returns how many (id, node) pairs went.
  size_t Expire(absl::Time now);
  // Drops every entry for which `keep(id)` is false (entries this node no longer owns after a
  // membership change). Returns how many ids went.
  size_t Retain(const std::function<bool(const BlockId&)>& keep);

  size_t ids() const;           // distinct block ids with at least one holder
  size_t holders() const;       // (id, node) pairs
  size_t memory_bytes() const;  // estimate of the heap this directory uses

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace strata::placement
