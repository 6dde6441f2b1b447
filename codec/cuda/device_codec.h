// CUDA kernels for the codec's transforms, on device memory (library strata_codec_cuda, built
// only when CMake finds nvcc; see docs/codec.md, "CUDA kernels"). This header has no CUDA types:
// device pointers are plain pointers, a stream is a cudaStream_t passed as void* (nullptr = the
// default stream), errors are absl::Status.
//
// What runs here, with the CPU codec's bytes (the same bits on the same input):
//   - group-wise intN (mode `intN-gG`): encode to the section payload of codec/groupwise.cc
//     (u8 bits, u16 group, fp16 scale[], fp16 zero[], codes bit-packed LSB first) and decode;
//   - the orthonormal Walsh-Hadamard transform of rows (head vectors), forward and inverse;
//   - the quant mode's quantiser along the KIVI axes (keys: a step per channel; values: a step
//     per token and channel group), Hadamard and closed-loop token prediction included: encode
//     to the section's side arrays (centres, predictor weights, steps) and symbols, decode from
//     them, with the keys' outlier channels (`:ol`: picked, kept and zeroed on the device as the
//     CPU does, restored by the decoder). The rANS coding of the symbols, the payload framing
//     and the blob stay on the CPU (codec/quant.cc, codec/rans.h).
//
// Calls enqueue on the stream and return without waiting unless they say otherwise; buffers
// must stay alive until the stream has run them. Tensors must be aligned to their element size.
// Arguments are checked on the host. Work is per section: one call handles one layer's K or V.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codec/codec.h"
#include "strata/kv_layout.h"

namespace strata::codec::cuda {

// OK when the CUDA runtime sees at least one device; FailedPrecondition with the runtime's
// reason otherwise (no driver, no device, ...). The answer of the first call is kept.
absl::Status DeviceAvailable();

// Waits for everything enqueued on `stream`.
absl::Status Synchronize(void* stream = nullptr);

// An owned device allocation (cudaMalloc / cudaFree).
class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return bytes_; }
  // Synchronous copies of `bytes` at `offset` into / out of the buffer.
  absl::Status Upload(const void* host, size_t bytes, size_t offset = 0);
  absl::Status Download(void* host, size_t bytes, size_t offset = 0) const;

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// ---- Group-wise intN ----------------------------------------------------------------------------

// Bytes of the section payload of `values` values at `bits` (2..8) in groups of `group`.
size_t GroupwisePayloadBytes(size_t values, uint8_t bits, uint16_t group);

// d_in: `values` values of `dtype` (fp16, bf16, fp32). d_payload: GroupwisePayloadBytes bytes,
// written whole (the CPU's bytes for finite input).
absl::Status GroupwiseEncode(const void* d_in, DType dtype, size_t values, uint8_t bits,
                             uint16_t group, uint8_t* d_payload, void* stream = nullptr);

// The inverse: d_payload holds payload_bytes bytes (checked against bits and group, which the
// caller reads from the payload's first 3 bytes on the host); d_out receives `values` values.
absl::Status GroupwiseDecode(const uint8_t* d_payload, size_t payload_bytes, DType dtype,
                             size_t values, uint8_t bits, uint16_t group, void* d_out,
                             void* stream = nullptr);

// ---- Hadamard -----------------------------------------------------------------------------------

// In place on `rows` rows of n floats, n a power of two up to 8192: x <- H x / sqrt(n), with the
// CPU's butterflies in the CPU's order (the same bits as the CPU codec). Self-inverse, so
// InverseHadamardRows is the same transform.
absl::Status HadamardRows(float* d_x, size_t rows, uint32_t n, void* stream = nullptr);
absl::Status InverseHadamardRows(float* d_x, size_t rows, uint32_t n, void* stream = nullptr);

// ---- Quant mode ---------------------------------------------------------------------------------

// One section: one layer's K (is_key, a step per channel) or V (a step per token and group of
// `group` channels) tensor, [tokens][heads][head_dim] of dtype.
struct QuantSection {
  uint32_t tokens = 0;
  uint32_t heads = 0;
  uint32_t head_dim = 0;
  DType dtype = DType::kFloat16;
  bool is_key = true;
  uint8_t bits = 4;         // 2..8
  uint16_t group = 64;      // values only; clamped to the channels, as the CPU does
  bool hadamard = false;    // rotate each head vector (head_dim a power of two, <= 8192)
  bool token_delta = true;  // closed-loop prediction from the previous token
  bool key_outliers = false;  // keys only: keep the outlier channels exactly (`:ol`)

  size_t channels() const { return size_t{heads} * head_dim; }
  // Outlier channels a head may keep: max(1, head_dim / 16).
  uint32_t outliers_per_head() const { return head_dim / 16 > 0 ? head_dim / 16 : 1; }
  size_t values() const { return size_t{tokens} * channels(); }
  // The section a codec hands over or asks for (codec.h); `outliers`: whether it keeps them.
  static QuantSection Of(const SectionHandoff& h, bool outliers);
  // Entries of the steps array: channels (keys) or tokens * ceil(channels / group) (values).
  size_t steps() const;
  absl::Status Validate() const;
};

// Device arrays of one quant section, the fields of its payload (codec/quant.cc) before rANS.
struct QuantArrays {
  uint16_t* mu16 = nullptr;     // [channels] fp16 centres
  uint8_t* a16 = nullptr;       // [channels] predictor weights in 1/16 (0 without token delta)
  uint16_t* steps16 = nullptr;  // [steps()] fp16 steps
  uint16_t* syms = nullptr;     // [values()] symbols in [0, 4 << bits), token-major
  // Keys under `:ol`. Encode: outlier_count [heads] (channels each head keeps), outlier_idx
  // [heads * outliers_per_head()] (ascending per head), outlier_vals [tokens * heads *
  // outliers_per_head()] input elements (token, head, slot). Decode: the payload's `nout`
  // ascending channels and their [tokens * nout] elements.
  uint16_t* outlier_count = nullptr;
  uint16_t* outlier_idx = nullptr;
  uint8_t* outlier_vals = nullptr;
  uint32_t nout = 0;
};

// Quantiser with its device scratch (a float copy of the section, per-channel centres and
// weights); grows as needed. One per thread or stream.
class QuantKernels {
 public:
  QuantKernels();
  ~QuantKernels();
  QuantKernels(const QuantKernels&) = delete;
  QuantKernels& operator=(const QuantKernels&) = delete;

  // d_in: the section's values; fills every array of `out`. Synchronises with the stream at the
  // end to report NaN or infinite input as InvalidArgument (the CPU encoder's answer; the
  // arrays are then meaningless).
  absl::Status Encode(const void* d_in, const QuantSection& s, const QuantArrays& out,
                      void* stream = nullptr);
  // From the arrays (a16 unused without token delta) to the section's values in s.dtype at
  // d_out. The arrays are not validated (a16 <= 16, symbols below 4 << bits): check payloads
  // on the host, as codec/quant.cc does, before uploading them.
  absl::Status Decode(const QuantArrays& in, const QuantSection& s, void* d_out,
                      void* stream = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::codec::cuda
