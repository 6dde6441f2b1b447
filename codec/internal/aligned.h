// Storage on cache-line boundaries for the AMX kernels' operands (codec/pca_amx.cc) and the
// buffers the AVX-512 loops read and write 64 bytes at a time. A tile row or a zmm vector is 64
// bytes; from a buffer that is only 16-byte aligned, as std::vector's often is, each one
// straddles two lines and touches twice the lines it needs.
#ifndef STRATA_CODEC_INTERNAL_ALIGNED_H_
#define STRATA_CODEC_INTERNAL_ALIGNED_H_

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace strata::codec::internal {

inline constexpr size_t kCacheLine = 64;

template <typename T>
struct CacheAlignedAllocator {
  using value_type = T;
  CacheAlignedAllocator() = default;
  template <typename U>
  CacheAlignedAllocator(const CacheAlignedAllocator<U>&) {}  // NOLINT: rebinding
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t{kCacheLine}));
  }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t{kCacheLine}); }
  template <typename U>
  bool operator==(const CacheAlignedAllocator<U>&) const {
    return true;
  }
};

template <typename T>
using CacheAlignedVector = std::vector<T, CacheAlignedAllocator<T>>;

// p rounded up to the next cache line (scratch that is over-allocated by a line).
template <typename T>
T* AlignToCacheLine(T* p) {
  return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(p) + kCacheLine - 1) &
                              ~uintptr_t{kCacheLine - 1});
}

}  // namespace strata::codec::internal

#endif  // STRATA_CODEC_INTERNAL_ALIGNED_H_
