#include "storage/host_block_store.h"

namespace strata {

size_t HostBlockStore::Lookup(const NamespaceId& ns, std::span<const BlockId> ids,
                              std::vector<Tier>* tiers) {
  const size_t n = host_->Lookup(ns, ids);
  if (tiers) tiers->assign(n, Tier::kHost);
  return n;
}

std::vector<BlockInfo> HostBlockStore::AllBlocks() const {
  std::vector<BlockInfo> blocks;
  uint64_t cursor = 0;
  do {
    auto page = host_->List(nullptr, 65536, &cursor);
    blocks.insert(blocks.end(), page.begin(), page.end());
  } while (cursor != 0);
  return blocks;
}

std::vector<BlockId> HostBlockStore::AllIds() const {
  std::vector<BlockId> ids;
  for (const BlockInfo& b : AllBlocks()) ids.push_back(b.id);
  return ids;
}

}  // namespace strata
