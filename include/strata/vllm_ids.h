// Block ids as vLLM names the blocks of its prefix cache (prefix_caching_hash_algo
// "sha256_cbor"), for namespaces with IdScheme::kVllm:
//
//   id[i] = SHA-256(CBOR([parent, [t0, t1, ...], extra_keys]))
//
// CBOR in canonical form (RFC 8949: shortest integer and length heads); parent is id[i-1], or
// for i = 0 vLLM's NONE_HASH, which is SHA-256(CBOR(seed string)) of the engine's
// PYTHONHASHSEED. extra_keys is null or the array vLLM builds for the block: the LoRA name on
// every block, then the request's cache salt on the first block only. Blocks that carry
// multimodal or prompt-embedding keys are named by the engine itself (publish them by id).
// tests/common/vllm_ids_test.cc pins these against ids computed by vLLM's own code.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "strata/digest.h"

namespace strata {

struct VllmHashInputs {
  // The engine's PYTHONHASHSEED: NONE_HASH derives from it. vLLM draws a random NONE_HASH when
  // the engine runs without one, and then no other process can reproduce its ids.
  std::string hash_seed = "0";
  std::string lora_name;   // empty: no LoRA
  std::string cache_salt;  // empty: no salt
};

// vLLM's NONE_HASH for `hash_seed`.
Digest VllmNoneHash(std::string_view hash_seed);

// One block's id given its parent and its array of extra keys (empty: null).
Digest VllmBlockHash(const Digest& parent, std::span<const uint32_t> block_tokens,
                     std::span<const std::string> extra_keys = {});

// Ids of every full block of `tokens`.
std::vector<Digest> ComputeVllmBlockIds(uint32_t tokens_per_block,
                                        std::span<const uint32_t> tokens,
                                        const VllmHashInputs& inputs);

}  // namespace strata
