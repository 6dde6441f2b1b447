#include "storage/eviction/prefix_aware_policy.h"

#include <algorithm>

namespace strata {

uint32_t PrefixAwarePolicy::ChildCount(const BlockId& id) const {
  auto it = children_.find(id);
  return it == children_.end() ? 0 : it->second;
}

uint64_t PrefixAwarePolicy::Priority(uint32_t accesses) {
  const uint64_t tick = ++clock_;
  if (bonus_ <= 0.0) return tick;
  const uint32_t counted = std::clamp<uint32_t>(accesses, 1, options_.max_counted_accesses);
  const double bonus =
      bonus_ * static_cast<double>(nodes_.size()) * static_cast<double>(counted - 1);
  return tick + static_cast<uint64_t>(bonus);
}

void PrefixAwarePolicy::OnInsert(const BlockId& id, const BlockMeta& meta) {
  if (nodes_.contains(id)) {
    OnAccess(id);
    return;
  }
  if (options_.adaptive) {
    const double unit =
        options_.adapt_step / static_cast<double>(std::max<size_t>(nodes_.size(), 1));
    const double once = static_cast<double>(std::max<size_t>(ghost_once_.size(), 1));
    const double reused = static_cast<double>(std::max<size_t>(ghost_reused_.size(), 1));
    if (ghost_once_.Erase(id)) {
      bonus_ = std::max(0.0, bonus_ - unit * std::max(1.0, reused / once));
    } else if (ghost_reused_.Erase(id)) {
      bonus_ = std::min(options_.max_bonus, bonus_ + unit * std::max(1.0, once / reused));
    }
  }
  Node node;
  node.parent = (meta.parent == id) ? BlockId{} : meta.parent;
  node.accesses = std::max<uint32_t>(meta.accesses, 1);
  node.priority = Priority(node.accesses);
  if (!node.parent.IsZero()) {
    if (++children_[node.parent] == 1) {
      auto p = nodes_.find(node.parent);
      if (p != nodes_.end()) leaves_.erase({p->second.priority, node.parent});
    }
  }
  if (ChildCount(id) == 0) leaves_.insert({node.priority, id});
  nodes_.emplace(id, node);
}

void PrefixAwarePolicy::OnAccess(const BlockId& id) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  Node& node = it->second;
  const bool leaf = leaves_.erase({node.priority, id}) > 0;
  if (node.accesses < UINT32_MAX) ++node.accesses;
  node.priority = Priority(node.accesses);
  if (leaf) leaves_.insert({node.priority, id});
}

void PrefixAwarePolicy::Forget(const BlockId& id) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  const Node node = it->second;
  nodes_.erase(it);
  leaves_.erase({node.priority, id});
  if (node.parent.IsZero()) return;
  auto c = children_.find(node.parent);
  if (c == children_.end()) return;
  if (--c->second == 0) {
    children_.erase(c);
    auto p = nodes_.find(node.parent);
    if (p != nodes_.end()) leaves_.insert({p->second.priority, node.parent});
  }
}

void PrefixAwarePolicy::OnRemove(const BlockId& id) { Forget(id); }

std::optional<BlockId> PrefixAwarePolicy::PopVictim() {
  if (nodes_.empty()) return std::nullopt;
  BlockId victim;
  if (!leaves_.empty()) {
    victim = leaves_.begin()->second;
  } else {
    // Unreachable for real chains (they have no cycles); a forged parent cycle still gets an
    // answer rather than a stuck tier.
    victim = nodes_.begin()->first;
  }
  if (options_.adaptive) {
    const uint32_t accesses = nodes_.find(victim)->second.accesses;
    (accesses >= 2 ? ghost_reused_ : ghost_once_).Add(victim, std::max<size_t>(nodes_.size(), 1));
  }
  Forget(victim);
  return victim;
}

}  // namespace strata
