// KV events in vLLM 0.32's wire format (vllm/distributed/kv_events.py), so KV-aware routers
// consume Strata's contents as they consume an engine's:
//
//   batch = msgpack [ts: float64, events: [event...], data_parallel_rank: nil]
//   event = msgpack map whose first key is "type" (the class name), then the class's fields in
//           declaration order: BlockStored {block_hashes, parent_block_hash, token_ids,
//           block_size, lora_id, medium, lora_name}, BlockRemoved {block_hashes, medium},
//           AllBlocksCleared {}.
//
// A block hash is the id's last 8 bytes as an unsigned big-endian integer (vLLM's default,
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), or the whole 32-byte id as binary.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "strata/block_id.h"

namespace strata::daemon {

struct KvEvent {
  enum Kind : uint8_t { kBlockStored, kBlockRemoved, kAllBlocksCleared } kind;
  std::vector<BlockId> block_hashes;
  std::optional<BlockId> parent;      // BlockStored: the parent of block_hashes[0], if any
  std::vector<uint32_t> token_ids;    // BlockStored: empty when the tokens are not known
  uint32_t block_size = 0;            // BlockStored
  std::string medium;                 // "GPU", "CPU", "STORAGE"; empty: nil
};

// vLLM's integer form of a block hash.
uint64_t IntBlockHash(const BlockId& id);

std::string EncodeKvEventBatch(double ts, std::span<const KvEvent> events, bool int_hashes);

}  // namespace strata::daemon
