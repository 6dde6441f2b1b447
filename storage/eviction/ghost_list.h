// A bounded FIFO set of block ids that recently left (ghost entries): S3-FIFO and admission use
// it to recognise a block that comes back soon after it was evicted or rejected.
#pragma once

#include <cstdint>
#include <deque>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "strata/block_id.h"

namespace strata {

class GhostList {
 public:
  // Adds `id` as the newest entry, then drops the oldest ones beyond `capacity`.
  void Add(const BlockId& id, size_t capacity);
  bool Contains(const BlockId& id) const { return live_.contains(id); }
  // Removes `id`; true when it was present.
  bool Erase(const BlockId& id) { return live_.erase(id) > 0; }
  size_t size() const { return live_.size(); }

 private:
  void Compact();

  // id -> sequence number of its newest entry in `fifo_`; older fifo entries are stale.
  absl::flat_hash_map<BlockId, uint64_t> live_;
  std::deque<std::pair<BlockId, uint64_t>> fifo_;
  uint64_t seq_ = 0;
};

}  // namespace strata
