// Belady's offline optimum (MIN): the block whose next access lies furthest in the future
// leaves first. It needs the future, so only a replay of a known trace can use it, as the upper
// bound that online policies are measured against. The replay tells the oracle, before each
// access, when the accessed block will be accessed next; the policy reads the oracle whenever a
// block is inserted or accessed (a block's next use only changes when it is accessed).
//
// Offered the incoming block as a candidate too (the TierManager inserts, then evicts), MIN
// with bypass is optimal for uniform block sizes.
#pragma once

#include <cstdint>
#include <limits>
#include <utility>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "storage/eviction/eviction_policy.h"

namespace strata {

class NextUseOracle {
 public:
  static constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

  void Set(const BlockId& id, uint64_t next_use) { next_[id] = next_use; }
  uint64_t NextUse(const BlockId& id) const {
    auto it = next_.find(id);
    return it == next_.end() ? kNever : it->second;
  }

 private:
  absl::flat_hash_map<BlockId, uint64_t> next_;
};

class BeladyPolicy final : public EvictionPolicy {
 public:
  // `oracle` must outlive the policy.
  explicit BeladyPolicy(const NextUseOracle* oracle) : oracle_(oracle) {}

  std::string_view name() const override { return "belady"; }
  void OnInsert(const BlockId& id, const BlockMeta& meta) override;
  void OnAccess(const BlockId& id) override;
  void OnRemove(const BlockId& id) override;
  std::optional<BlockId> PopVictim() override;
  size_t size() const override { return next_.size(); }

 private:
  const NextUseOracle* const oracle_;
  absl::flat_hash_map<BlockId, uint64_t> next_;
  absl::btree_set<std::pair<uint64_t, BlockId>> by_next_;
};

std::unique_ptr<EvictionPolicy> MakeBeladyPolicy(const NextUseOracle* oracle);

}  // namespace strata
