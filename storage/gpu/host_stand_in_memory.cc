#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "storage/gpu/device_memory.h"

namespace strata {

absl::Status CheckDeviceCopies(std::span<const DeviceCopy> copies, uint64_t capacity) {
  for (const DeviceCopy& c : copies) {
    if (c.device_offset > capacity || c.size > capacity - c.device_offset)
      return absl::OutOfRangeError(absl::StrCat("device copy of ", c.size, " bytes at offset ",
                                                c.device_offset, " leaves the pool of ",
                                                capacity, " bytes"));
    if (c.host == nullptr && c.size != 0)
      return absl::InvalidArgumentError("device copy with no host buffer");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HostStandInMemory>> HostStandInMemory::Create(
    uint64_t capacity, HostStandInOptions options) {
  if (capacity == 0) return absl::InvalidArgumentError("device memory of 0 bytes");
  void* pool = std::aligned_alloc(4096, (capacity + 4095) / 4096 * 4096);
  if (pool == nullptr)
    return absl::ResourceExhaustedError(
        absl::StrCat("no host memory for a stand-in device pool of ", capacity, " bytes"));
  return std::unique_ptr<HostStandInMemory>(
      new HostStandInMemory(static_cast<uint8_t*>(pool), capacity, std::move(options)));
}

HostStandInMemory::~HostStandInMemory() { std::free(pool_); }

absl::Status HostStandInMemory::ToDevice(std::span<const DeviceCopy> copies) {
  if (absl::Status s = CheckDeviceCopies(copies, capacity_); !s.ok()) return s;
  for (const DeviceCopy& c : copies) {
    if (options_.fault) {
      if (absl::Status s = options_.fault(true, c); !s.ok()) return s;
    }
    std::memcpy(pool_ + c.device_offset, c.host, c.size);
  }
  return absl::OkStatus();
}

absl::Status HostStandInMemory::ToHost(std::span<const DeviceCopy> copies) {
  if (absl::Status s = CheckDeviceCopies(copies, capacity_); !s.ok()) return s;
  for (const DeviceCopy& c : copies) {
    if (options_.fault) {
      if (absl::Status s = options_.fault(false, c); !s.ok()) return s;
    }
    std::memcpy(c.host, pool_ + c.device_offset, c.size);
  }
  return absl::OkStatus();
}

}  // namespace strata
