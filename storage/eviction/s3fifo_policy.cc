#include "storage/eviction/s3fifo_policy.h"

#include <algorithm>

namespace strata {

void S3FifoPolicy::OnInsert(const BlockId& id, const BlockMeta& /*meta*/) {
  if (nodes_.contains(id)) {
    OnAccess(id);
    return;
  }
  Node node;
  if (ghost_.Erase(id)) {
    main_.push_front(id);
    node.pos = main_.begin();
    node.main = true;
  } else {
    small_.push_front(id);
    node.pos = small_.begin();
  }
  nodes_.emplace(id, node);
}

void S3FifoPolicy::OnAccess(const BlockId& id) {
  auto it = nodes_.find(id);
  if (it != nodes_.end() && it->second.freq < kMaxFreq) ++it->second.freq;
}

void S3FifoPolicy::OnRemove(const BlockId& id) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  (it->second.main ? main_ : small_).erase(it->second.pos);
  nodes_.erase(it);
}

bool S3FifoPolicy::InMain(const BlockId& id) const {
  auto it = nodes_.find(id);
  return it != nodes_.end() && it->second.main;
}

std::optional<BlockId> S3FifoPolicy::PopVictim() {
  // Terminates: every pass over main lowers some count, and small only shrinks.
  while (!nodes_.empty()) {
    const double small_limit = small_fraction_ * static_cast<double>(nodes_.size());
    if (!small_.empty() && (static_cast<double>(small_.size()) >= small_limit || main_.empty())) {
      BlockId id = small_.back();
      small_.pop_back();
      Node& node = nodes_[id];
      if (node.freq > 0) {
        // Accessed while on probation: keep it, in main.
        main_.push_front(id);
        node.pos = main_.begin();
        node.main = true;
        node.freq = 0;
        continue;
      }
      nodes_.erase(id);
      // The ghost remembers about as many ids as the tier holds blocks.
      ghost_.Add(id, std::max<size_t>(nodes_.size(), 1));
      return id;
    }
    BlockId id = main_.back();
    Node& node = nodes_[id];
    if (node.freq > 0) {
      --node.freq;
      main_.splice(main_.begin(), main_, node.pos);
      continue;
    }
    main_.pop_back();
    nodes_.erase(id);
    return id;
  }
  return std::nullopt;
}

}  // namespace strata
