// Encoding a block that lies in device memory (library strata_codec_cuda, built only with CUDA):
// the CUDA kernels (device_codec.h) quantise each quant and groupwise section where the block
// lies, only their arrays come down to the host, and the codec's Encoder entropy-codes and frames
// them (codec.h, Encoder::EncodeFromSections). Raw, lossless and pca blocks are copied down and
// encoded on the CPU. The blob is the CPU Encoder's, byte for byte (tests/codec/cuda/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "codec/codec.h"

namespace strata::codec::cuda {

class DeviceEncoder {
 public:
  DeviceEncoder();
  ~DeviceEncoder();
  DeviceEncoder(const DeviceEncoder&) = delete;
  DeviceEncoder& operator=(const DeviceEncoder&) = delete;

  // Where pca mode finds its calibrations (as Encoder::set_calibrations).
  void set_calibrations(const CalibrationSet* set);
  // Encodes the block at `d_block`, device memory of `block_bytes` (the layout's BlockBytes()),
  // on the device it lives on; replaces *blob. The Encoder's errors (InvalidArgument for
  // non-finite input under a lossy mode). One call at a time per object.
  absl::Status Encode(const KvLayout& layout, const CodecParams& params, const void* d_block,
                      size_t block_bytes, std::vector<uint8_t>* blob);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::codec::cuda
