// Decoding a blob into device memory (library strata_codec_cuda, built only with CUDA): the
// codec's Decoder undoes the entropy coding on the CPU and hands each quant and groupwise section
// over (codec.h, DecodeOptions::device_sections); the CUDA kernels (device_codec.h) rebuild those
// sections from the arrays straight into device memory. Raw, lossless and pca sections are
// decoded on the CPU and copied up. The bytes are the CPU Decoder's (tests/codec/cuda/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "codec/codec.h"

namespace strata::codec::cuda {

class DeviceDecoder {
 public:
  DeviceDecoder();
  ~DeviceDecoder();
  DeviceDecoder(const DeviceDecoder&) = delete;
  DeviceDecoder& operator=(const DeviceDecoder&) = delete;

  // Where pca blobs' calibrations are looked up (as Decoder::set_calibrations).
  void set_calibrations(const CalibrationSet* set);
  // Decodes `blob` (host memory) into `d_out`, device memory of exactly the blob's layout
  // BlockBytes() (`out_bytes`), on the device d_out lives on; returns when the bytes are there.
  // The Decoder's errors for a bad blob (nothing of d_out is then known to be written).
  // One call at a time per object.
  absl::Status Decode(std::span<const uint8_t> blob, void* d_out, size_t out_bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::codec::cuda
