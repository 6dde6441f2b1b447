#include "codec/cuda/device_encoder.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codec/cuda/device_codec.h"
#include "codec/cuda/kernel_math.h"
#include "common/status_macros.h"

namespace strata::codec::cuda {
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(absl::StrCat("cuda encode: ", what, ": ", cudaGetErrorName(e), " (",
                                          cudaGetErrorString(e), ")"));
}

// Where each array of one section lies in the packed device buffer (8-byte aligned).
struct Packing {
  size_t mu16, a16, steps16, syms, count, idx, vals, total = 0;
  size_t Take(size_t bytes) {
    const size_t at = (total + 7) & ~size_t{7};
    total = at + bytes;
    return at;
  }
};

}  // namespace

struct DeviceEncoder::Impl {
  Encoder cpu;
  QuantKernels quant;
  DeviceBuffer arrays;               // one section's outputs, packed for one download
  std::vector<uint8_t> host_arrays;  // the same, on the host
  std::vector<uint8_t> host_block;   // modes encoded on the CPU

  absl::Status Reserve(size_t bytes) {
    if (arrays.size() >= bytes) return absl::OkStatus();
    arrays = DeviceBuffer();
    auto b = DeviceBuffer::Allocate(std::max<size_t>(bytes, 1 << 20));
    if (!b.ok()) return b.status();
    arrays = std::move(*b);
    return absl::OkStatus();
  }

  absl::Status Groupwise(const uint8_t* d_block, const SectionHandoff& h, SectionArrays* out) {
    const size_t values = size_t{h.tokens} * h.heads * h.head_dim;
    const size_t bytes = GroupwisePayloadBytes(values, h.bits, h.group);
    STRATA_RETURN_IF_ERROR(Reserve(bytes));
    STRATA_RETURN_IF_ERROR(GroupwiseEncode(d_block + h.out_offset, h.dtype, values, h.bits,
                                           h.group, arrays.as<uint8_t>()));
    out->payload.resize(bytes);
    return arrays.Download(out->payload.data(), bytes);  // waits for the kernels
  }

  absl::Status Quant(const uint8_t* d_block, const SectionHandoff& h, SectionArrays* out) {
    const QuantSection s = QuantSection::Of(h, h.key_outliers);
    STRATA_RETURN_IF_ERROR(s.Validate());
    const size_t C = s.channels(), n = s.values(), eb = DTypeBytes(s.dtype);
    const size_t slots = h.key_outliers ? size_t{s.heads} * s.outliers_per_head() : 0;
    Packing p;
    p.mu16 = p.Take(C * 2);
    p.a16 = p.Take(C);
    p.steps16 = p.Take(s.steps() * 2);
    p.syms = p.Take(n * 2);
    p.count = p.Take(h.key_outliers ? size_t{s.heads} * 2 : 0);
    p.idx = p.Take(slots * 2);
    p.vals = p.Take(size_t{s.tokens} * slots * eb);
    STRATA_RETURN_IF_ERROR(Reserve(p.total));
    uint8_t* dev = arrays.as<uint8_t>();
    QuantArrays arr;
    arr.mu16 = reinterpret_cast<uint16_t*>(dev + p.mu16);
    arr.a16 = dev + p.a16;
    arr.steps16 = reinterpret_cast<uint16_t*>(dev + p.steps16);
    arr.syms = reinterpret_cast<uint16_t*>(dev + p.syms);
    if (h.key_outliers) {
      arr.outlier_count = reinterpret_cast<uint16_t*>(dev + p.count);
      arr.outlier_idx = reinterpret_cast<uint16_t*>(dev + p.idx);
      arr.outlier_vals = dev + p.vals;
    }
    STRATA_RETURN_IF_ERROR(quant.Encode(d_block + h.out_offset, s, arr));  // synchronises
    host_arrays.resize(p.total);
    STRATA_RETURN_IF_ERROR(arrays.Download(host_arrays.data(), p.total));
    const uint8_t* host = host_arrays.data();
    auto take16 = [&](std::vector<uint16_t>& v, size_t at, size_t count) {
      v.resize(count);
      std::memcpy(v.data(), host + at, count * 2);
    };
    take16(out->mu16, p.mu16, C);
    if (h.token_delta) out->a16.assign(host + p.a16, host + p.a16 + C);
    take16(out->steps16, p.steps16, s.steps());
    take16(out->syms, p.syms, n);
    if (h.key_outliers) {
      math::QuantArgs a;
      a.T = s.tokens;
      a.heads = s.heads;
      a.per_head = s.outliers_per_head();
      a.dtype = static_cast<uint8_t>(s.dtype);
      out->outlier_idx.resize(slots);
      out->outlier_vals.resize(size_t{s.tokens} * slots * eb);
      const uint32_t nout = math::GatherOutliers(
          a, reinterpret_cast<const uint16_t*>(host + p.count),
          reinterpret_cast<const uint16_t*>(host + p.idx), host + p.vals, out->outlier_idx.data(),
          out->outlier_vals.data());
      out->outlier_idx.resize(nout);
      out->outlier_vals.resize(size_t{s.tokens} * nout * eb);
    }
    return absl::OkStatus();
  }
};

DeviceEncoder::DeviceEncoder() : impl_(std::make_unique<Impl>()) {}
DeviceEncoder::~DeviceEncoder() = default;

void DeviceEncoder::set_calibrations(const CalibrationSet* set) {
  impl_->cpu.set_calibrations(set);
}

absl::Status DeviceEncoder::Encode(const KvLayout& layout, const CodecParams& params,
                                   const void* d_block, size_t block_bytes,
                                   std::vector<uint8_t>* blob) {
  STRATA_RETURN_IF_ERROR(params.Validate(layout));
  if (block_bytes != layout.BlockBytes())
    return absl::InvalidArgumentError(absl::StrCat("cuda encode: block has ", block_bytes,
                                                   " bytes, layout needs ",
                                                   layout.BlockBytes()));
  cudaPointerAttributes attrs{};
  if (cudaError_t e = cudaPointerGetAttributes(&attrs, d_block); e != cudaSuccess) {
    cudaGetLastError();
    return CudaError(e, "cudaPointerGetAttributes");
  }
  if (attrs.type != cudaMemoryTypeDevice)
    return absl::InvalidArgumentError("cuda encode: the block is not in device memory");
  if (cudaError_t e = cudaSetDevice(attrs.device); e != cudaSuccess)
    return CudaError(e, "cudaSetDevice");
  Impl& m = *impl_;
  if (params.mode != Mode::kQuant && params.mode != Mode::kGroupwise) {
    m.host_block.resize(block_bytes);
    if (cudaError_t e = cudaMemcpy(m.host_block.data(), d_block, block_bytes,
                                   cudaMemcpyDeviceToHost);
        e != cudaSuccess)
      return CudaError(e, "cudaMemcpy");
    return m.cpu.Encode(layout, params, m.host_block, blob);
  }
  const auto* block = static_cast<const uint8_t*>(d_block);
  return m.cpu.EncodeFromSections(
      layout, params,
      [&](const SectionHandoff& h, SectionArrays* out) {
        return h.kind == SectionHandoff::Kind::kGroupwise ? m.Groupwise(block, h, out)
                                                          : m.Quant(block, h, out);
      },
      blob);
}

}  // namespace strata::codec::cuda
