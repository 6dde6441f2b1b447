// OpenCudaDeviceMemory in a build without CUDA (STRATA_WITH_CUDA off or no nvcc found).
#include "storage/gpu/device_memory.h"

namespace strata {

absl::Status CudaDeviceAvailable() {
  return absl::FailedPreconditionError(
      "this stratad was built without CUDA (STRATA_WITH_CUDA=OFF or no nvcc at build time)");
}

absl::StatusOr<std::unique_ptr<DeviceMemory>> OpenCudaDeviceMemory(int, uint64_t) {
  return CudaDeviceAvailable();
}

}  // namespace strata
