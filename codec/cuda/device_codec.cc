#include "codec/cuda/device_codec.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codec/cuda/kernel_math.h"
#include "codec/cuda/launch.h"
#include "common/status_macros.h"

namespace strata::codec::cuda {
namespace {

static_assert(math::kF16 == static_cast<uint8_t>(DType::kFloat16));
static_assert(math::kBF16 == static_cast<uint8_t>(DType::kBFloat16));
static_assert(math::kF32 == static_cast<uint8_t>(DType::kFloat32));

absl::Status CudaStatus(int err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const auto e = static_cast<cudaError_t>(err);
  return absl::InternalError(
      absl::StrCat("cuda: ", what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

absl::Status CheckDType(DType dt) {
  if (dt == DType::kFloat16 || dt == DType::kBFloat16 || dt == DType::kFloat32)
    return absl::OkStatus();
  return absl::InvalidArgumentError("cuda codec: dtype must be fp16, bf16 or fp32");
}

bool PowerOfTwo(uint32_t n) { return n != 0 && (n & (n - 1)) == 0; }
constexpr uint32_t kMaxHadamardN = 8192;

using math::HadamardScale;

}  // namespace

absl::Status DeviceAvailable() {
  static const absl::Status status = [] {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
      return absl::FailedPreconditionError(
          absl::StrCat("no usable CUDA device: cudaGetDeviceCount: ", cudaGetErrorName(e), " (",
                       cudaGetErrorString(e), ")"));
    if (count == 0) return absl::FailedPreconditionError("no CUDA device (cudaGetDeviceCount = 0)");
    return absl::OkStatus();
  }();
  return status;
}

absl::Status Synchronize(void* stream) {
  return CudaStatus(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
                    "cudaStreamSynchronize");
}

// ---- DeviceBuffer ---------------------------------------------------------------------------

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    if (e == cudaErrorMemoryAllocation)
      return absl::ResourceExhaustedError(absl::StrCat("cuda: cudaMalloc(", bytes, ") failed"));
    return CudaStatus(e, "cudaMalloc");
  }
  b.ptr_ = p;
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

absl::Status DeviceBuffer::Upload(const void* host, size_t bytes, size_t offset) {
  if (offset > bytes_ || bytes > bytes_ - offset)
    return absl::OutOfRangeError("cuda: upload past the end of the device buffer");
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(
      cudaMemcpy(static_cast<uint8_t*>(ptr_) + offset, host, bytes, cudaMemcpyHostToDevice),
      "cudaMemcpy to device");
}

absl::Status DeviceBuffer::Download(void* host, size_t bytes, size_t offset) const {
  if (offset > bytes_ || bytes > bytes_ - offset)
    return absl::OutOfRangeError("cuda: download past the end of the device buffer");
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(
      cudaMemcpy(host, static_cast<const uint8_t*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost),
      "cudaMemcpy to host");
}

// ---- Group-wise -----------------------------------------------------------------------------

size_t GroupwisePayloadBytes(size_t values, uint8_t bits, uint16_t group) {
  return group == 0 ? 0 : math::GroupwisePayloadBytes(values, bits, group);
}

namespace {

absl::Status CheckGroupwise(DType dtype, size_t values, uint8_t bits, uint16_t group) {
  STRATA_RETURN_IF_ERROR(CheckDType(dtype));
  if (bits < 2 || bits > 8) return absl::InvalidArgumentError("cuda codec: bits must be 2..8");
  if (group == 0) return absl::InvalidArgumentError("cuda codec: group must be > 0");
  if (values == 0) return absl::InvalidArgumentError("cuda codec: no values");
  return absl::OkStatus();
}

math::GroupwiseArgs GroupwiseArgsOf(DType dtype, size_t values, uint8_t bits, uint16_t group) {
  math::GroupwiseArgs a;
  a.dtype = static_cast<uint8_t>(dtype);
  a.n = values;
  a.bits = bits;
  a.group = group;
  return a;
}

}  // namespace

absl::Status GroupwiseEncode(const void* d_in, DType dtype, size_t values, uint8_t bits,
                             uint16_t group, uint8_t* d_payload, void* stream) {
  STRATA_RETURN_IF_ERROR(CheckGroupwise(dtype, values, bits, group));
  math::GroupwiseArgs a = GroupwiseArgsOf(dtype, values, bits, group);
  a.in = d_in;
  a.payload = d_payload;
  return CudaStatus(internal::LaunchGroupwiseEncode(a, stream), "groupwise encode");
}

absl::Status GroupwiseDecode(const uint8_t* d_payload, size_t payload_bytes, DType dtype,
                             size_t values, uint8_t bits, uint16_t group, void* d_out,
                             void* stream) {
  STRATA_RETURN_IF_ERROR(CheckGroupwise(dtype, values, bits, group));
  if (payload_bytes != GroupwisePayloadBytes(values, bits, group))
    return absl::DataLossError(absl::StrCat("cuda groupwise decode: payload of ", payload_bytes,
                                            " bytes, expected ",
                                            GroupwisePayloadBytes(values, bits, group)));
  math::GroupwiseArgs a = GroupwiseArgsOf(dtype, values, bits, group);
  a.cpayload = d_payload;
  a.out = d_out;
  return CudaStatus(internal::LaunchGroupwiseDecode(a, stream), "groupwise decode");
}

// ---- Hadamard -------------------------------------------------------------------------------

absl::Status HadamardRows(float* d_x, size_t rows, uint32_t n, void* stream) {
  if (!PowerOfTwo(n) || n > kMaxHadamardN)
    return absl::InvalidArgumentError("cuda Hadamard: n must be a power of two up to 8192");
  return CudaStatus(internal::LaunchHadamard(d_x, rows, n, HadamardScale(n), stream), "Hadamard");
}

absl::Status InverseHadamardRows(float* d_x, size_t rows, uint32_t n, void* stream) {
  return HadamardRows(d_x, rows, n, stream);
}

// ---- Quant ----------------------------------------------------------------------------------

namespace {
size_t EffectiveGroup(const QuantSection& s) {
  const size_t C = s.channels();
  return s.is_key ? C : (s.group < C ? s.group : C);
}
}  // namespace

size_t QuantSection::steps() const {
  if (is_key) return channels();
  const size_t g = EffectiveGroup(*this);
  return g == 0 ? 0 : size_t{tokens} * ((channels() + g - 1) / g);
}

QuantSection QuantSection::Of(const SectionHandoff& h, bool outliers) {
  QuantSection s;
  s.tokens = h.tokens;
  s.heads = h.heads;
  s.head_dim = h.head_dim;
  s.dtype = h.dtype;
  s.is_key = h.is_key;
  s.bits = h.bits;
  s.group = h.group;  // 0 for keys, which take a step per channel
  s.hadamard = h.hadamard;
  s.token_delta = h.token_delta;
  s.key_outliers = outliers;
  return s;
}

absl::Status QuantSection::Validate() const {
  STRATA_RETURN_IF_ERROR(CheckDType(dtype));
  if (tokens == 0 || heads == 0 || head_dim == 0)
    return absl::InvalidArgumentError("cuda quant: empty section");
  if (channels() > 65535) return absl::InvalidArgumentError("cuda quant: too many channels");
  if (bits < 2 || bits > 8) return absl::InvalidArgumentError("cuda quant: bits must be 2..8");
  if (!is_key && group == 0) return absl::InvalidArgumentError("cuda quant: group must be > 0");
  if (hadamard && (!PowerOfTwo(head_dim) || head_dim > kMaxHadamardN))
    return absl::InvalidArgumentError(
        "cuda quant: Hadamard needs a power-of-two head_dim up to 8192");
  if (values() > (uint64_t{1} << 40)) return absl::InvalidArgumentError("cuda quant: too large");
  return absl::OkStatus();
}

struct QuantKernels::Impl {
  DeviceBuffer f, mu, a, flag, ms, head_scratch;

  absl::Status Reserve(const QuantSection& s) {
    if (f.size() < s.values() * sizeof(float)) {
      f = DeviceBuffer();
      auto b = DeviceBuffer::Allocate(s.values() * sizeof(float));
      if (!b.ok()) return b.status();
      f = std::move(*b);
    }
    if (mu.size() < s.channels() * sizeof(float)) {
      mu = DeviceBuffer();
      a = DeviceBuffer();
      auto b1 = DeviceBuffer::Allocate(s.channels() * sizeof(float));
      if (!b1.ok()) return b1.status();
      auto b2 = DeviceBuffer::Allocate(s.channels() * sizeof(float));
      if (!b2.ok()) return b2.status();
      mu = std::move(*b1);
      a = std::move(*b2);
    }
    if (s.key_outliers && s.is_key && ms.size() < s.channels() * sizeof(float)) {
      ms = DeviceBuffer();
      head_scratch = DeviceBuffer();
      auto b1 = DeviceBuffer::Allocate(s.channels() * sizeof(float));
      if (!b1.ok()) return b1.status();
      auto b2 = DeviceBuffer::Allocate(s.channels() * sizeof(float));
      if (!b2.ok()) return b2.status();
      ms = std::move(*b1);
      head_scratch = std::move(*b2);
    }
    if (flag.size() == 0) {
      auto b = DeviceBuffer::Allocate(sizeof(uint32_t));
      if (!b.ok()) return b.status();
      flag = std::move(*b);
    }
    return absl::OkStatus();
  }

  math::QuantArgs Args(const QuantSection& s, const QuantArrays& arr) {
    math::QuantArgs q;
    q.T = s.tokens;
    q.C = static_cast<uint32_t>(s.channels());
    q.heads = s.heads;
    q.head_dim = s.head_dim;
    q.bits = s.bits;
    q.group = static_cast<uint32_t>(EffectiveGroup(s));
    q.key_axis = s.is_key;
    q.token_delta = s.token_delta;
    q.hadamard = s.hadamard;
    q.hadamard_scale = s.hadamard ? HadamardScale(s.head_dim) : 1.0f;
    q.dtype = static_cast<uint8_t>(s.dtype);
    q.f = f.as<float>();
    q.mu = mu.as<float>();
    q.a = a.as<float>();
    q.nonfinite = flag.as<uint32_t>();
    q.mu16 = arr.mu16;
    q.a16 = arr.a16;
    q.steps16 = arr.steps16;
    q.syms = arr.syms;
    q.outliers = s.key_outliers && s.is_key;
    q.per_head = s.outliers_per_head();
    q.ms = ms.as<float>();
    q.head_scratch = head_scratch.as<float>();
    q.out_count = arr.outlier_count;
    q.out_idx = arr.outlier_idx;
    q.out_vals = arr.outlier_vals;
    q.nout = s.key_outliers && s.is_key ? arr.nout : 0;
    return q;
  }
};

QuantKernels::QuantKernels() : impl_(std::make_unique<Impl>()) {}
QuantKernels::~QuantKernels() = default;

absl::Status QuantKernels::Encode(const void* d_in, const QuantSection& s, const QuantArrays& out,
                                  void* stream) {
  STRATA_RETURN_IF_ERROR(s.Validate());
  if (!d_in || !out.mu16 || !out.a16 || !out.steps16 || !out.syms)
    return absl::InvalidArgumentError("cuda quant encode: null array");
  if (s.key_outliers && s.is_key && (!out.outlier_count || !out.outlier_idx || !out.outlier_vals))
    return absl::InvalidArgumentError("cuda quant encode: null outlier array");
  STRATA_RETURN_IF_ERROR(impl_->Reserve(s));
  math::QuantArgs q = impl_->Args(s, out);
  q.in = d_in;
  const auto cs = static_cast<cudaStream_t>(stream);
  STRATA_RETURN_IF_ERROR(
      CudaStatus(cudaMemsetAsync(q.nonfinite, 0, sizeof(uint32_t), cs), "cudaMemsetAsync"));
  STRATA_RETURN_IF_ERROR(CudaStatus(internal::LaunchQuantEncode(q, stream), "quant encode"));
  // Pageable host memory: the copy returns once the value is on the host.
  uint32_t nonfinite = 0;
  STRATA_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(&nonfinite, q.nonfinite, sizeof(nonfinite), cudaMemcpyDeviceToHost, cs),
      "cudaMemcpyAsync"));
  STRATA_RETURN_IF_ERROR(Synchronize(stream));
  if (nonfinite)
    return absl::InvalidArgumentError("codec: quant mode needs finite values (use lossless)");
  return absl::OkStatus();
}

absl::Status QuantKernels::Decode(const QuantArrays& in, const QuantSection& s, void* d_out,
                                  void* stream) {
  STRATA_RETURN_IF_ERROR(s.Validate());
  if (!d_out || !in.mu16 || (s.token_delta && !in.a16) || !in.steps16 || !in.syms)
    return absl::InvalidArgumentError("cuda quant decode: null array");
  if (s.key_outliers && s.is_key && in.nout > 0) {
    if (!in.outlier_idx || !in.outlier_vals)
      return absl::InvalidArgumentError("cuda quant decode: null outlier array");
    if (in.nout > s.channels())
      return absl::InvalidArgumentError("cuda quant decode: more outliers than channels");
  }
  STRATA_RETURN_IF_ERROR(impl_->Reserve(s));
  math::QuantArgs q = impl_->Args(s, in);
  q.out = d_out;
  return CudaStatus(internal::LaunchQuantDecode(q, stream), "quant decode");
}

}  // namespace strata::codec::cuda
