#include "storage/eviction/lru_policy.h"

namespace strata {

void LruPolicy::OnInsert(const BlockId& id, const BlockMeta& /*meta*/) {
  auto it = index_.find(id);
  if (it != index_.end()) {
    order_.splice(order_.begin(), order_, it->second);
    return;
  }
  order_.push_front(id);
  index_.emplace(id, order_.begin());
}

void LruPolicy::OnAccess(const BlockId& id) {
  auto it = index_.find(id);
  if (it != index_.end()) order_.splice(order_.begin(), order_, it->second);
}

void LruPolicy::OnRemove(const BlockId& id) {
  auto it = index_.find(id);
  if (it == index_.end()) return;
  order_.erase(it->second);
  index_.erase(it);
}

std::optional<BlockId> LruPolicy::PopVictim() {
  if (order_.empty()) return std::nullopt;
  BlockId victim = order_.back();
  order_.pop_back();
  index_.erase(victim);
  return victim;
}

}  // namespace strata
