// Deterministic test data: token sequences and random block contents from a seed.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "strata/block_id.h"
#include "strata/client.h"

namespace strata::testing {

// A small fp16 K/V namespace for tests that move blocks: `layers` layers, 2 KV heads of
// `head_dim`, 16 tokens per block.
inline NamespaceSpec SmallSpec(const std::string& model_id, uint32_t layers = 4,
                               uint32_t head_dim = 64) {
  NamespaceSpec s;
  s.model_id = model_id;
  s.model_revision = "r1";
  s.layout = KvLayout{layers, 2, head_dim, DType::kFloat16, 16, KvKind::kSeparateKV};
  return s;
}

// `n` token ids below a 128k vocabulary.
inline std::vector<uint32_t> Tokens(size_t n, uint32_t seed) {
  std::vector<uint32_t> t(n);
  std::mt19937 rng(seed);
  for (auto& x : t) x = rng() % 128000;
  return t;
}

// `count` blocks of `bytes` random bytes each.
inline std::vector<std::vector<uint8_t>> RandomBlocks(size_t count, size_t bytes, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint8_t>> blocks(count, std::vector<uint8_t>(bytes));
  for (auto& b : blocks)
    for (size_t i = 0; i < bytes; i += 8) {
      uint64_t v = rng();
      std::memcpy(b.data() + i, &v, std::min<size_t>(8, bytes - i));
    }
  return blocks;
}

// Views of `blocks` for Client::Publish.
inline std::vector<ConstBuffer> BufferViews(const std::vector<std::vector<uint8_t>>& blocks) {
  std::vector<ConstBuffer> v;
  for (const auto& b : blocks) v.push_back({b.data(), b.size()});
  return v;
}

}  // namespace strata::testing
