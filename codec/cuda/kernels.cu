// The CUDA side of the codec kernels: a device executor for the plans of kernel_math.h (one
// kernel per step) and the launchers of launch.h. All per-element math lives in kernel_math.h,
// shared with the host test; this file only maps plans onto grids.
#include <cuda_runtime.h>

#include "codec/cuda/kernel_math.h"
#include "codec/cuda/launch.h"

namespace strata::codec::cuda::internal {
namespace {

using math::kThreads;

template <class Op>
__global__ void __launch_bounds__(kThreads) ForEachKernel(Op op, uint64_t count) {
  const uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (i < count) op(i);
}

// One block per row: the row in shared memory, one barrier after each butterfly stage.
__global__ void HadamardKernel(float* x, uint32_t n, float scale) {
  extern __shared__ float v[];
  float* row = x + uint64_t{blockIdx.x} * n;
  for (uint32_t j = threadIdx.x; j < n; j += blockDim.x) v[j] = row[j];
  __syncthreads();
  for (uint32_t h = 1; h < n; h <<= 1) {
    math::HadamardStage(v, n, h, threadIdx.x, blockDim.x);
    __syncthreads();
  }
  for (uint32_t j = threadIdx.x; j < n; j += blockDim.x) row[j] = math::Mul(v[j], scale);
}

constexpr uint64_t kMaxBlocks = 0x7FFFFFFF;
constexpr uint32_t kMaxHadamardN = 8192;  // 32 KiB of shared memory per block

struct DeviceExec {
  cudaStream_t stream;
  cudaError_t err = cudaSuccess;

  template <class Op>
  void ForEach(uint64_t count, const Op& op) {
    if (err != cudaSuccess || count == 0) return;
    const uint64_t blocks = (count + kThreads - 1) / kThreads;
    if (blocks > kMaxBlocks) {
      err = cudaErrorInvalidValue;
      return;
    }
    ForEachKernel<Op><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(op, count);
    err = cudaGetLastError();
  }

  void Hadamard(float* x, uint64_t rows, uint32_t n, float scale) {
    if (err != cudaSuccess || rows == 0) return;
    if (rows > kMaxBlocks || n == 0 || n > kMaxHadamardN || (n & (n - 1)) != 0) {
      err = cudaErrorInvalidValue;
      return;
    }
    HadamardKernel<<<static_cast<unsigned>(rows), math::HadamardThreads(n), n * sizeof(float),
                     stream>>>(x, n, scale);
    err = cudaGetLastError();
  }
};

DeviceExec Exec(void* stream) { return DeviceExec{static_cast<cudaStream_t>(stream)}; }

}  // namespace

int LaunchGroupwiseEncode(const math::GroupwiseArgs& a, void* stream) {
  DeviceExec ex = Exec(stream);
  math::GroupwiseEncodePlan(ex, a);
  return static_cast<int>(ex.err);
}

int LaunchGroupwiseDecode(const math::GroupwiseArgs& a, void* stream) {
  DeviceExec ex = Exec(stream);
  math::GroupwiseDecodePlan(ex, a);
  return static_cast<int>(ex.err);
}

int LaunchHadamard(float* x, uint64_t rows, uint32_t n, float scale, void* stream) {
  DeviceExec ex = Exec(stream);
  ex.Hadamard(x, rows, n, scale);
  return static_cast<int>(ex.err);
}

int LaunchQuantEncode(const math::QuantArgs& a, void* stream) {
  DeviceExec ex = Exec(stream);
  math::QuantEncodePlan(ex, a);
  return static_cast<int>(ex.err);
}

int LaunchQuantDecode(const math::QuantArgs& a, void* stream) {
  DeviceExec ex = Exec(stream);
  math::QuantDecodePlan(ex, a);
  return static_cast<int>(ex.err);
}

}  // namespace strata::codec::cuda::internal
