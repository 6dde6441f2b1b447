// Internal to strata_codec_cuda: the kernel launchers of kernels.cu, called by device_codec.cc.
// Each enqueues a plan of kernel_math.h on `stream` (a cudaStream_t; nullptr = the default
// stream) and returns the cudaError_t of the launches as an int (0 = success). No CUDA types.
#pragma once

#include <cstdint>

#include "codec/cuda/kernel_math.h"

namespace strata::codec::cuda::internal {

int LaunchGroupwiseEncode(const math::GroupwiseArgs& a, void* stream);
int LaunchGroupwiseDecode(const math::GroupwiseArgs& a, void* stream);
int LaunchHadamard(float* x, uint64_t rows, uint32_t n, float scale, void* stream);
int LaunchQuantEncode(const math::QuantArgs& a, void* stream);
int LaunchQuantDecode(const math::QuantArgs& a, void* stream);

}  // namespace strata::codec::cuda::internal
