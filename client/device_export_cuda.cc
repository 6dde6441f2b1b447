// ExportCudaBuffer with the CUDA runtime (built only with CUDA; see client/CMakeLists.txt).
#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/cuda_allocation_range.h"
#include "common/device_handles.h"
#include "strata/device_buffer.h"

namespace strata {
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

}  // namespace

absl::StatusOr<DeviceBufferHandle> ExportCudaBuffer(const void* device_ptr, size_t bytes) {
  if (device_ptr == nullptr || bytes == 0)
    return absl::InvalidArgumentError("an empty device buffer cannot be lent");
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0)
    return e != cudaSuccess ? CudaError(e, "no usable CUDA device")
                            : absl::FailedPreconditionError("no CUDA device is visible");
  cudaPointerAttributes attrs{};
  if (cudaError_t e = cudaPointerGetAttributes(&attrs, device_ptr); e != cudaSuccess) {
    cudaGetLastError();
    return CudaError(e, "cudaPointerGetAttributes");
  }
  if (attrs.type != cudaMemoryTypeDevice)
    return absl::InvalidArgumentError("the buffer is not device memory (cudaMalloc)");
  const auto ptr = reinterpret_cast<uint64_t>(device_ptr);
  cuda_driver::AllocationRange range;
  if (!cuda_driver::FindAllocation(device_ptr, &range))
    return absl::InvalidArgumentError("the buffer lies in no allocation the CUDA driver knows");
  const uint64_t base = range.base, allocation = range.bytes;
  if (ptr - base + bytes > allocation)
    return absl::InvalidArgumentError(absl::StrCat("the buffer of ", bytes, " bytes at offset ",
                                                   ptr - base, " leaves its allocation of ",
                                                   allocation, " bytes"));
  cudaIpcMemHandle_t h;
  if (cudaError_t e = cudaIpcGetMemHandle(&h, const_cast<void*>(device_ptr)); e != cudaSuccess) {
    cudaGetLastError();
    return CudaError(e, "cudaIpcGetMemHandle (memory from cudaMallocAsync pools or VMM cannot "
                        "be exported this way)");
  }
  static_assert(sizeof h == device_handles::kCudaIpcHandleBytes);
  DeviceBufferHandle out;
  out.kind = std::string(device_handles::kCudaIpc);
  out.handle.assign(reinterpret_cast<const char*>(&h), sizeof h);
  out.offset = ptr - base;
  out.bytes = bytes;
  return out;
}

}  // namespace strata
