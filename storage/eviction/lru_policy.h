// Least recently used: the block touched longest ago leaves first.
#pragma once

#include <list>

#include "absl/container/flat_hash_map.h"
#include "storage/eviction/eviction_policy.h"

namespace strata {

class LruPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }
  void OnInsert(const BlockId& id, const BlockMeta& meta) override;
  void OnAccess(const BlockId& id) override;
  void OnRemove(const BlockId& id) override;
  std::optional<BlockId> PopVictim() override;
  size_t size() const override { return index_.size(); }

 private:
  std::list<BlockId> order_;  // front: most recent
  absl::flat_hash_map<BlockId, std::list<BlockId>::iterator> index_;
};

}  // namespace strata
