// ExportCudaBuffer in a build without CUDA.
#include "strata/device_buffer.h"

namespace strata {

absl::StatusOr<DeviceBufferHandle> ExportCudaBuffer(const void*, size_t) {
  return absl::FailedPreconditionError(
      "this libstrata was built without CUDA: it cannot export device buffers (rebuild with "
      "STRATA_WITH_CUDA=ON)");
}

}  // namespace strata
