#include "storage/eviction/belady_policy.h"

namespace strata {

void BeladyPolicy::OnInsert(const BlockId& id, const BlockMeta& /*meta*/) { OnAccess(id); }

void BeladyPolicy::OnAccess(const BlockId& id) {
  const uint64_t next = oracle_->NextUse(id);
  auto [it, inserted] = next_.try_emplace(id, next);
  if (!inserted) {
    by_next_.erase({it->second, id});
    it->second = next;
  }
  by_next_.insert({next, id});
}

void BeladyPolicy::OnRemove(const BlockId& id) {
  auto it = next_.find(id);
  if (it == next_.end()) return;
  by_next_.erase({it->second, id});
  next_.erase(it);
}

std::optional<BlockId> BeladyPolicy::PopVictim() {
  if (by_next_.empty()) return std::nullopt;
  auto last = std::prev(by_next_.end());
  BlockId victim = last->second;
  by_next_.erase(last);
  next_.erase(victim);
  return victim;
}

std::unique_ptr<EvictionPolicy> MakeBeladyPolicy(const NextUseOracle* oracle) {
  return std::make_unique<BeladyPolicy>(oracle);
}

}  // namespace strata
