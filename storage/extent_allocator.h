// Best-fit allocator of variable-size extents inside a fixed range [0, capacity).
//
// Its bookkeeping lives outside the managed memory on purpose: the host arena is writable by
// remote clients over RMA, so nothing the allocator trusts may sit inside it. Free extents are
// kept twice (by offset, for coalescing; by size, for best fit) in B-trees, so an allocation or
// free costs O(log free-extents) and no per-block heap object.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"

namespace strata {

class ExtentAllocator {
 public:
  // Every extent starts and ends on a multiple of `alignment` (a power of two).
  ExtentAllocator(uint64_t capacity, uint64_t alignment);

  // Offset of a new extent of at least `size` bytes, or nullopt when no free extent fits.
  std::optional<uint64_t> Allocate(uint64_t size);
  // Returns an extent obtained from Allocate(size) with the same size.
  void Free(uint64_t offset, uint64_t size);

  uint64_t RoundUp(uint64_t size) const { return (size + alignment_ - 1) & ~(alignment_ - 1); }
  uint64_t capacity() const { return capacity_; }
  uint64_t free_bytes() const { return free_bytes_; }
  uint64_t allocated_bytes() const { return capacity_ - free_bytes_; }
  uint64_t largest_free_extent() const;
  size_t free_extent_count() const { return by_offset_.size(); }

 private:
  void Insert(uint64_t offset, uint64_t size);
  void Erase(uint64_t offset, uint64_t size);

  uint64_t capacity_;
  uint64_t alignment_;
  uint64_t free_bytes_;
  absl::btree_map<uint64_t, uint64_t> by_offset_;           // offset -> size
  absl::btree_set<std::pair<uint64_t, uint64_t>> by_size_;  // (size, offset)
};

}  // namespace strata
