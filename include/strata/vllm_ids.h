// Block ids as vLLM 0.32 names the blocks of its prefix cache, for namespaces whose id scheme is
// IdScheme::kVllm (prefix_caching_hash_algo "sha256", vLLM's default) or kVllmCbor
// ("sha256_cbor"):
//
//   id[i] = SHA-256(serialize((parent, tuple(block tokens), extra_keys)))
//
// serialize is pickle protocol 5 for "sha256" and canonical CBOR for "sha256_cbor". parent is
// id[i-1], or for i = 0 vLLM's NONE_HASH = SHA-256(serialize(seed)), where seed is the engine's
// PYTHONHASHSEED, or "vllm-none-hash" when that is unset. extra_keys is None, or a tuple of the
// keys vLLM adds: ("lora", name, path) on every block of a LoRA request, then
// ("cache_salt", salt) on the first block only. Blocks that carry multimodal or prompt-embedding
// keys are named by the engine itself (publish them by id).
// python/tests (test_vllm_ids.py, and test_vllm_engine_ids.py with vLLM's own code) pin these.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "strata/block_id.h"

namespace strata {

// vLLM's seed when PYTHONHASHSEED is unset.
inline constexpr std::string_view kVllmDefaultHashSeed = "vllm-none-hash";

struct VllmHashInputs {
  IdScheme scheme = IdScheme::kVllm;  // kVllm or kVllmCbor
  std::string hash_seed{kVllmDefaultHashSeed};
  std::string lora_name;  // empty: no LoRA
  std::string lora_path;
  std::string cache_salt;  // empty: no salt
};

// NONE_HASH for the scheme and seed.
Digest VllmNoneHash(IdScheme scheme, std::string_view hash_seed);

// Ids of every full block of `tokens`.
std::vector<Digest> ComputeVllmBlockIds(uint32_t tokens_per_block,
                                        std::span<const uint32_t> tokens,
                                        const VllmHashInputs& inputs);

}  // namespace strata
