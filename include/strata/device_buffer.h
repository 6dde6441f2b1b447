// Buffers of an engine's own device memory that it lends its node's stratad, so that fetched
// blocks are copied into them device to device from the daemon's GPU tier (Client::
// LendDeviceBuffer, Client::FetchToDevice; docs/gpu.md). A handle is a capability: whoever holds
// it can open the memory, so give it to nothing but the daemon.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace strata {

struct DeviceBufferHandle {
  std::string kind;    // "cuda-ipc", or "host-stand-in" (a daemon whose GPU tier is host memory)
  std::string handle;  // the CUDA IPC handle's bytes, or the stand-in's shared-memory name
  uint64_t offset = 0;  // where the lent range starts in the allocation the handle opens
  uint64_t bytes = 0;   // the lent range's length
};

// The handle of [device_ptr, device_ptr + bytes), which must lie in one cudaMalloc allocation of
// this process (a PyTorch tensor's storage is one). FailedPrecondition in a build without CUDA
// or on a machine without a device. The allocation must outlive the loan: return the loan
// before freeing the memory.
absl::StatusOr<DeviceBufferHandle> ExportCudaBuffer(const void* device_ptr, size_t bytes);

// Host memory standing in for a device buffer, for daemons whose GPU tier is host memory
// standing in for a device (config gpu.memory: host-stand-in): the same loans and fetches, on
// machines without a GPU. Shared memory under a random name, unlinked on destruction.
class StandInDeviceBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<StandInDeviceBuffer>> Create(size_t bytes);
  ~StandInDeviceBuffer();
  StandInDeviceBuffer(const StandInDeviceBuffer&) = delete;
  StandInDeviceBuffer& operator=(const StandInDeviceBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return bytes_; }
  const DeviceBufferHandle& handle() const { return handle_; }

 private:
  StandInDeviceBuffer(uint8_t* data, size_t bytes, DeviceBufferHandle handle)
      : data_(data), bytes_(bytes), handle_(std::move(handle)) {}
  uint8_t* const data_;
  const size_t bytes_;
  const DeviceBufferHandle handle_;
};

}  // namespace strata
