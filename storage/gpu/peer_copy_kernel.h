// Internal to the CUDA device memory (cuda_device_memory.cc): one kernel that copies many
// device spans at once. A fetch of many small blocks into an engine's buffer is bound by the
// runtime's cost per cudaMemcpyAsync (microseconds each), not by the bytes; one launch for
// all of them is not. No CUDA types here.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::gpu_copies {

struct CopySpan {
  const void* src;  // device memory
  void* dst;        // device memory (this device, or opened from another process's handle)
  uint64_t bytes;
};

// Spans one launch takes (they travel as the kernel's parameters).
inline constexpr size_t kMaxSpansPerLaunch = 256;

// Enqueues one kernel on `stream` (a cudaStream_t) that copies every span, at most
// kMaxSpansPerLaunch of them; returns the launch's cudaError_t as an int (0: enqueued).
int LaunchGatherCopy(const CopySpan* spans, size_t count, void* stream);

}  // namespace strata::gpu_copies
