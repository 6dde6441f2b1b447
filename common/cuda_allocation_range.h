// The bounds of the CUDA allocation a device address lies in (the driver's cuMemGetAddressRange),
// for the sources built with CUDA that export or open IPC handles (client/device_export_cuda.cc,
// storage/gpu/cuda_device_memory.cc). The driver function is looked up at run time: the binaries
// link the static runtime only and must start on machines without a driver. Include only from
// sources compiled with the CUDA runtime's headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace strata::cuda_driver {

struct AllocationRange {
  uint64_t base = 0;
  uint64_t bytes = 0;
};

// False when the driver lacks the function or does not know `ptr`.
inline bool FindAllocation(const void* ptr, AllocationRange* out) {
  using Fn = int (*)(unsigned long long* base, size_t* size, unsigned long long ptr);
  static Fn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return static_cast<Fn>(nullptr);
    return reinterpret_cast<Fn>(f);
  }();
  unsigned long long base = 0;
  size_t bytes = 0;
  if (fn == nullptr || fn(&base, &bytes, reinterpret_cast<uintptr_t>(ptr)) != 0) return false;
  out->base = base;
  out->bytes = bytes;
  return true;
}

}  // namespace strata::cuda_driver
