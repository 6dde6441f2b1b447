// Rendezvous (highest-random-weight) hashing: which nodes own a block's directory entry, and
// where its replicas go.
//
// Every node scores every key; a key's owners are the R nodes with the highest scores. Adding
// a node moves only the keys it now wins (about 1/N of them); removing one moves only the keys
// it owned. Scores depend on nothing but (key, node id), so every daemon and the simulator agree
// without talking to each other.
//
//   node hash = first 8 bytes (little-endian) of SHA-256("strata-node-v1\0" || node id)
//   key       = first 8 bytes (little-endian) of the BlockId (already a uniform hash)
//   score     = Mix64(key XOR node hash), Mix64 being the 64-bit finalizer below.
//
// Ties (equal scores) break by node id, so the order is total.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/block_id.h"

namespace strata::placement {

// Bijective 64-bit mixer (multiply-xorshift finalizer); cheap enough to score 1,000 nodes per
// key in a simulator and simple enough to vectorize.
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

uint64_t NodeHash(std::string_view node_id);
uint64_t KeyOf(const BlockId& id);

inline uint64_t Score(uint64_t key, uint64_t node_hash) { return Mix64(key ^ node_hash); }

// An immutable set of nodes to rank against. Build one per membership view and share it.
class Rendezvous {
 public:
  explicit Rendezvous(std::vector<std::string> node_ids);

  size_t size() const { return ids_.size(); }
  const std::string& node(size_t index) const { return ids_[index]; }
  // Index of `node_id`, or -1.
  int IndexOf(std::string_view node_id) const;

  // Indexes of the top min(r, size()) nodes for `key`, best first.
  void TopR(uint64_t key, size_t r, std::vector<uint32_t>* out) const;
  std::vector<uint32_t> TopR(const BlockId& id, size_t r) const;
  // Every node, best first (a replica or drain target walks down this list).
  std::vector<uint32_t> Rank(const BlockId& id) const;

 private:
  bool Better(uint64_t score_a, uint32_t a, uint64_t score_b, uint32_t b) const;

  std::vector<std::string> ids_;  // sorted
  std::vector<uint64_t> hashes_;  // by index, padded to a multiple of the scoring chunk
};

}  // namespace strata::placement
