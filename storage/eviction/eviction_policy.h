// Eviction policies: which resident block of one tier leaves next.
//
// A policy tracks the blocks resident in one tier and nothing else: it never moves bytes and
// never decides where a victim goes (the TierManager does). Blocks are named by BlockId; a
// block's parent is the previous block of its chain (zero for a chain's first block), which
// prefix-aware policies use, since a chain's head is shared by more prompts than its tail.
//
// Contract for callers:
// - OnInsert for a block the policy does not track; a block inserted twice is treated as an
//   access.
// - OnAccess and OnRemove for untracked blocks are ignored.
// - PopVictim picks a victim, forgets it and returns it (nullopt when nothing is tracked).
//   OnRemove is for blocks that leave for another reason (explicit evict, promotion, pin), so
//   policies that remember their victims (ghost lists) do not remember those.
//
// Not thread-safe; the owner serializes calls.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "strata/block_id.h"

namespace strata {

class NextUseOracle;

// What the owner knows about a block when it enters a tier.
struct BlockMeta {
  BlockId parent;         // zero for a chain's first block (or unknown)
  uint32_t accesses = 1;  // requests for it since it entered the cache (any tier), >= 1
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  virtual std::string_view name() const = 0;
  virtual void OnInsert(const BlockId& id, const BlockMeta& meta) = 0;
  virtual void OnAccess(const BlockId& id) = 0;
  virtual void OnRemove(const BlockId& id) = 0;
  virtual std::optional<BlockId> PopVictim() = 0;
  // Number of blocks tracked.
  virtual size_t size() const = 0;
};

// Names accepted by MakeEvictionPolicy: "lru", "s3fifo", "prefix-lru", "prefix-freq",
// "prefix-adaptive". ("belady" needs an
// oracle of future accesses; build it with MakeBeladyPolicy.)
std::vector<std::string_view> OnlineEvictionPolicyNames();

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name);

}  // namespace strata
