#include "codec/cuda/device_decoder.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/cuda/device_codec.h"
#include "common/status_macros.h"

namespace strata::codec::cuda {
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(absl::StrCat("cuda decode: ", what, ": ", cudaGetErrorName(e), " (",
                                          cudaGetErrorString(e), ")"));
}

// Appends `bytes` at an 8-byte aligned place of `host`; its offset.
size_t Stage(std::vector<uint8_t>& host, const void* data, size_t bytes) {
  const size_t at = (host.size() + 7) & ~size_t{7};
  host.resize(at + bytes);
  if (bytes) std::memcpy(host.data() + at, data, bytes);
  return at;
}

}  // namespace

struct DeviceDecoder::Impl {
  Decoder cpu;
  QuantKernels quant;
  std::vector<uint8_t> host_block;  // what the CPU decodes itself
  std::vector<uint8_t> staged;      // one section's arrays, packed for one upload
  DeviceBuffer arrays;

  absl::Status Upload() {
    if (arrays.size() < staged.size()) {
      arrays = DeviceBuffer();
      auto b = DeviceBuffer::Allocate(std::max<size_t>(staged.size(), 1 << 20));
      if (!b.ok()) return b.status();
      arrays = std::move(*b);
    }
    return arrays.Upload(staged.data(), staged.size());
  }

  absl::Status Section(const SectionHandoff& h, uint8_t* d_out) {
    staged.clear();
    uint8_t* dev = arrays.as<uint8_t>();
    if (h.kind == SectionHandoff::Kind::kGroupwise) {
      const size_t at = Stage(staged, h.payload.data(), h.payload.size());
      STRATA_RETURN_IF_ERROR(Upload());
      dev = arrays.as<uint8_t>();
      const size_t values = size_t{h.tokens} * h.heads * h.head_dim;
      STRATA_RETURN_IF_ERROR(GroupwiseDecode(dev + at, h.payload.size(), h.dtype, values, h.bits,
                                             h.group, d_out + h.out_offset));
      return Synchronize();
    }
    const size_t mu = Stage(staged, h.mu16.data(), h.mu16.size_bytes());
    const size_t a = Stage(staged, h.a16.data(), h.a16.size_bytes());
    const size_t st = Stage(staged, h.steps16.data(), h.steps16.size_bytes());
    const size_t sy = Stage(staged, h.syms.data(), h.syms.size_bytes());
    const size_t oi = Stage(staged, h.outlier_idx.data(), h.outlier_idx.size_bytes());
    const size_t ov = Stage(staged, h.outlier_vals.data(), h.outlier_vals.size_bytes());
    STRATA_RETURN_IF_ERROR(Upload());
    dev = arrays.as<uint8_t>();
    const QuantSection s = QuantSection::Of(h, !h.outlier_idx.empty());
    QuantArrays in;
    in.mu16 = reinterpret_cast<uint16_t*>(dev + mu);
    in.a16 = h.token_delta ? dev + a : nullptr;
    in.steps16 = reinterpret_cast<uint16_t*>(dev + st);
    in.syms = reinterpret_cast<uint16_t*>(dev + sy);
    in.outlier_idx = reinterpret_cast<uint16_t*>(dev + oi);
    in.outlier_vals = dev + ov;
    in.nout = static_cast<uint32_t>(h.outlier_idx.size());
    STRATA_RETURN_IF_ERROR(quant.Decode(in, s, d_out + h.out_offset));
    return Synchronize();  // the staging is reused by the next section
  }
};

DeviceDecoder::DeviceDecoder() : impl_(std::make_unique<Impl>()) {}
DeviceDecoder::~DeviceDecoder() = default;

void DeviceDecoder::set_calibrations(const CalibrationSet* set) {
  impl_->cpu.set_calibrations(set);
}

absl::Status DeviceDecoder::Decode(std::span<const uint8_t> blob, void* d_out, size_t out_bytes) {
  STRATA_ASSIGN_OR_RETURN(BlobInfo info, InspectBlob(blob));
  if (out_bytes != info.layout.BlockBytes())
    return absl::InvalidArgumentError(absl::StrCat("cuda decode: output holds ", out_bytes,
                                                   " bytes, the blob decodes to ",
                                                   info.layout.BlockBytes()));
  cudaPointerAttributes attrs{};
  if (cudaError_t e = cudaPointerGetAttributes(&attrs, d_out); e != cudaSuccess) {
    cudaGetLastError();
    return CudaError(e, "cudaPointerGetAttributes");
  }
  if (attrs.type != cudaMemoryTypeDevice)
    return absl::InvalidArgumentError("cuda decode: the output is not device memory");
  if (cudaError_t e = cudaSetDevice(attrs.device); e != cudaSuccess)
    return CudaError(e, "cudaSetDevice");
  auto* out = static_cast<uint8_t*>(d_out);
  Impl& m = *impl_;
  m.host_block.resize(out_bytes);
  std::vector<std::pair<size_t, size_t>> on_device;  // sections the kernels wrote
  DecodeOptions opts;
  opts.device_sections = [&](const SectionHandoff& h) {
    on_device.push_back({h.out_offset, h.out_bytes});
    return m.Section(h, out);
  };
  STRATA_RETURN_IF_ERROR(m.cpu.Decode(blob, m.host_block, opts));
  // The rest of the block, decoded on the CPU: copied up between the kernels' sections.
  std::sort(on_device.begin(), on_device.end());
  size_t at = 0;
  auto copy_up = [&](size_t end) -> absl::Status {
    if (end > at) {
      if (cudaError_t e = cudaMemcpy(out + at, m.host_block.data() + at, end - at,
                                     cudaMemcpyHostToDevice);
          e != cudaSuccess)
        return CudaError(e, "cudaMemcpy");
    }
    return absl::OkStatus();
  };
  for (const auto& [offset, bytes] : on_device) {
    STRATA_RETURN_IF_ERROR(copy_up(offset));
    at = std::max(at, offset + bytes);
  }
  return copy_up(out_bytes);
}

}  // namespace strata::codec::cuda
