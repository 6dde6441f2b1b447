// NvmeTier's I/O engines (internal to storage/nvme_*): io_uring, and the pread/pwrite thread
// pool that takes over where io_uring cannot be set up. An engine carries out a batch of ops,
// each a contiguous aligned range of one file; NvmeTier splits requests into ops and serializes
// batches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/nvme_tier.h"

namespace strata {

// One device operation: a contiguous aligned range of one file, either straight to/from the
// caller's memory (`direct`) or through a staging buffer with a copy of `copy_len` bytes.
struct NvmeTier::Op {
  size_t req = 0;
  int fd = -1;
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t len = 0;
  std::byte* direct = nullptr;
  const std::byte* src = nullptr;  // staged write: caller bytes
  std::byte* dst = nullptr;        // staged read: caller destination
  uint64_t copy_len = 0;
};

// The I/O engine. Run() carries out every op and stores, per op, the bytes moved (== len) or
// a negative errno.
struct NvmeTier::Impl {
  virtual ~Impl() = default;
  virtual void Run(std::vector<Op>& ops, bool is_write, std::vector<int64_t>& results) = 0;
};

namespace nvme_internal {

std::string Errno(int err);

// What the io_uring engine found when it set up the opening thread's ring.
struct UringSetup {
  bool fixed_bufs = false;   // the staging buffers are registered
  unsigned setup_flags = 0;  // IORING_SETUP_* the ring was created with
};

// `fds`: the tier's files, registered with each ring. `taskrun_flags`, `shared`: see
// NvmeTierOptions::io_uring_taskrun_flags and shared_ring. Fails where io_uring cannot be set up.
absl::StatusOr<std::unique_ptr<NvmeTier::Impl>> CreateUringEngine(
    uint32_t queue_depth, uint32_t staging_buffers, uint64_t staging_buffer_bytes,
    const std::vector<int>& fds, bool taskrun_flags, bool shared, UringSetup* setup);

// RESOURCE_EXHAUSTED when its staging buffers cannot be mapped.
absl::StatusOr<std::unique_ptr<NvmeTier::Impl>> CreateThreadPoolEngine(
    uint32_t threads, uint32_t queue_depth, uint64_t staging_buffer_bytes);

}  // namespace nvme_internal
}  // namespace strata
