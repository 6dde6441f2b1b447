// S3-FIFO (Yang et al., SOSP'23): a small probationary FIFO (10% of the blocks), a main FIFO
// with lazy promotion (2-bit access counts, reinsertion instead of reordering), and a ghost FIFO
// of ids recently evicted from the small queue (as many as the tier holds blocks). New blocks enter
// the small queue; a block accessed while there moves to main when it reaches the queue's end,
// others leave quickly (one- hit wonders); a block whose id is in the ghost list enters main
// directly.
#pragma once

#include <list>

#include "absl/container/flat_hash_map.h"
#include "storage/eviction/eviction_policy.h"
#include "storage/eviction/ghost_list.h"

namespace strata {

class S3FifoPolicy final : public EvictionPolicy {
 public:
  // `small_fraction`: share of tracked blocks the small queue may hold before it is evicted from.
  explicit S3FifoPolicy(double small_fraction = 0.1) : small_fraction_(small_fraction) {}

  std::string_view name() const override { return "s3fifo"; }
  void OnInsert(const BlockId& id, const BlockMeta& meta) override;
  void OnAccess(const BlockId& id) override;
  void OnRemove(const BlockId& id) override;
  std::optional<BlockId> PopVictim() override;
  size_t size() const override { return nodes_.size(); }

  // For tests: whether `id` is in the main queue / the ghost list.
  bool InMain(const BlockId& id) const;
  bool InGhost(const BlockId& id) const { return ghost_.Contains(id); }

 private:
  static constexpr uint8_t kMaxFreq = 3;
  struct Node {
    std::list<BlockId>::iterator pos;
    uint8_t freq = 0;
    bool main = false;
  };

  const double small_fraction_;
  std::list<BlockId> small_;  // front: newest
  std::list<BlockId> main_;   // front: newest
  absl::flat_hash_map<BlockId, Node> nodes_;
  GhostList ghost_;
};

}  // namespace strata
