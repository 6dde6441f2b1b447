#include "storage/eviction/ghost_list.h"

namespace strata {

void GhostList::Add(const BlockId& id, size_t capacity) {
  if (capacity == 0) return;
  const uint64_t seq = ++seq_;
  live_[id] = seq;
  fifo_.emplace_back(id, seq);
  while (live_.size() > capacity && !fifo_.empty()) {
    auto [old, old_seq] = fifo_.front();
    fifo_.pop_front();
    auto it = live_.find(old);
    if (it != live_.end() && it->second == old_seq) live_.erase(it);
  }
  if (fifo_.size() > 2 * live_.size() + 64) Compact();
}

void GhostList::Compact() {
  std::deque<std::pair<BlockId, uint64_t>> kept;
  for (const auto& [id, seq] : fifo_) {
    auto it = live_.find(id);
    if (it != live_.end() && it->second == seq) kept.emplace_back(id, seq);
  }
  fifo_.swap(kept);
}

}  // namespace strata
