#include <cuda_runtime.h>

#include <algorithm>

#include "storage/gpu/peer_copy_kernel.h"

namespace strata::gpu_copies {
namespace {

constexpr unsigned kThreads = 256;
// Bytes one block copies before the grid runs out of blocks (16-byte vectors, four each).
constexpr uint64_t kBytesPerBlock = uint64_t{kThreads} * 16 * 4;
constexpr unsigned kMaxBlocksPerSpan = 2048;

struct Spans {
  CopySpan span[kMaxSpansPerLaunch];
};

// blockIdx.y picks the span; the blocks along x share it, 16 bytes per thread per step where
// both ends are 16-byte aligned, single bytes otherwise.
__global__ void __launch_bounds__(kThreads) GatherCopyKernel(const __grid_constant__ Spans spans) {
  const CopySpan s = spans.span[blockIdx.y];
  const auto* src = static_cast<const uint8_t*>(s.src);
  auto* dst = static_cast<uint8_t*>(s.dst);
  const uint64_t first = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  uint64_t tail = 0;
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0) {
    const uint64_t vectors = s.bytes / 16;
    const auto* from = reinterpret_cast<const uint4*>(src);
    auto* to = reinterpret_cast<uint4*>(dst);
    for (uint64_t i = first; i < vectors; i += stride) to[i] = from[i];
    tail = vectors * 16;
  }
  for (uint64_t i = tail + first; i < s.bytes; i += stride) dst[i] = src[i];
}

}  // namespace

int LaunchGatherCopy(const CopySpan* spans, size_t count, void* stream) {
  if (count == 0) return 0;
  if (count > kMaxSpansPerLaunch) return static_cast<int>(cudaErrorInvalidValue);
  Spans params{};
  uint64_t largest = 0;
  for (size_t i = 0; i < count; ++i) {
    params.span[i] = spans[i];
    largest = std::max(largest, spans[i].bytes);
  }
  const auto per_span = static_cast<unsigned>(std::clamp<uint64_t>(
      (largest + kBytesPerBlock - 1) / kBytesPerBlock, 1, kMaxBlocksPerSpan));
  GatherCopyKernel<<<dim3(per_span, static_cast<unsigned>(count)), kThreads, 0,
                     static_cast<cudaStream_t>(stream)>>>(params);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace strata::gpu_copies
