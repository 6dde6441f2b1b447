// Prefix-aware eviction: only blocks with no resident child in this tier (the leaves of the
// cached prefix tree) may leave. A chain's tail therefore always goes before its head: a head
// shared by many prompts stays while any continuation of it is cached, and a parent is never
// evicted from under a cached child (which a prefix lookup could no longer reach).
//
// Among leaves, the one with the lowest priority leaves first:
//   priority = tick of last access + frequency_bonus x tracked blocks x (min(accesses, cap) - 1)
// With frequency_bonus = 0 this is LRU over leaves ("prefix-lru"). With a bonus, a block that
// was requested again is kept as if it had been touched that many block-accesses later; scaling
// by the number of tracked blocks makes the bonus a fraction of the tier's turnover, so one
// setting fits small and large tiers ("prefix-freq").
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "storage/eviction/eviction_policy.h"
#include "storage/eviction/ghost_list.h"

namespace strata {

struct PrefixAwareOptions {
  double frequency_bonus = 0.0;
  uint32_t max_counted_accesses = 2;
  // Adapt frequency_bonus online, ARC-style: victims are remembered in two ghost lists (evicted
  // after one access / after more); a ghost hit on a one-access victim means recency deserved
  // more weight (bonus down), one on a reused victim means frequency did (bonus up).
  bool adaptive = false;
  double max_bonus = 4.0;
  double adapt_step = 0.5;  // per ghost hit, in units of 1 / tracked blocks
};

class PrefixAwarePolicy final : public EvictionPolicy {
 public:
  explicit PrefixAwarePolicy(PrefixAwareOptions options = {}, std::string_view name = "prefix-lru")
      : options_(options), bonus_(options.frequency_bonus), name_(name) {}

  std::string_view name() const override { return name_; }
  void OnInsert(const BlockId& id, const BlockMeta& meta) override;
  void OnAccess(const BlockId& id) override;
  void OnRemove(const BlockId& id) override;
  std::optional<BlockId> PopVictim() override;
  size_t size() const override { return nodes_.size(); }

  // For tests: number of tracked children of `id`; the current bonus.
  uint32_t ChildCount(const BlockId& id) const;
  double bonus() const { return bonus_; }

 private:
  struct Node {
    BlockId parent;  // zero: none
    uint64_t priority = 0;
    uint32_t accesses = 1;
  };
  using LeafKey = std::pair<uint64_t, BlockId>;

  uint64_t Priority(uint32_t accesses);
  void Forget(const BlockId& id);

  const PrefixAwareOptions options_;
  double bonus_ = 0.0;
  GhostList ghost_once_;
  GhostList ghost_reused_;
  const std::string name_;
  uint64_t clock_ = 0;
  absl::flat_hash_map<BlockId, Node> nodes_;
  // Tracked children per parent id (the parent itself may be untracked).
  absl::flat_hash_map<BlockId, uint32_t> children_;
  // Tracked blocks without tracked children, by priority.
  absl::btree_set<LeafKey> leaves_;
};

}  // namespace strata
