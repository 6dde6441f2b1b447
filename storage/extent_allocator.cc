#include "storage/extent_allocator.h"

#include <cassert>

namespace strata {

ExtentAllocator::ExtentAllocator(uint64_t capacity, uint64_t alignment)
    : capacity_(capacity & ~(alignment - 1)), alignment_(alignment), free_bytes_(0) {
  assert((alignment & (alignment - 1)) == 0);
  if (capacity_ > 0) Insert(0, capacity_);
}

void ExtentAllocator::Insert(uint64_t offset, uint64_t size) {
  by_offset_.emplace(offset, size);
  by_size_.emplace(size, offset);
  free_bytes_ += size;
}

void ExtentAllocator::Erase(uint64_t offset, uint64_t size) {
  by_offset_.erase(offset);
  by_size_.erase({size, offset});
  free_bytes_ -= size;
}

std::optional<uint64_t> ExtentAllocator::Allocate(uint64_t size) {
  if (size == 0) return std::nullopt;
  size = RoundUp(size);
  auto it = by_size_.lower_bound({size, 0});
  if (it == by_size_.end()) return std::nullopt;
  auto [extent_size, offset] = *it;
  Erase(offset, extent_size);
  if (extent_size > size) Insert(offset + size, extent_size - size);
  return offset;
}

void ExtentAllocator::Free(uint64_t offset, uint64_t size) {
  size = RoundUp(size);
  // Coalesce with the free neighbours on both sides.
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.end() && next->first == offset + size) {
    uint64_t nsize = next->second;
    Erase(next->first, nsize);
    size += nsize;
  }
  auto prev = by_offset_.lower_bound(offset);
  if (prev != by_offset_.begin()) {
    --prev;
    if (prev->first + prev->second == offset) {
      uint64_t poff = prev->first, psize = prev->second;
      Erase(poff, psize);
      offset = poff;
      size += psize;
    }
  }
  Insert(offset, size);
}

uint64_t ExtentAllocator::largest_free_extent() const {
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

}  // namespace strata
