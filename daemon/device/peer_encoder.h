// Blocks read out of buffers same-node engines lent (PublishFromDevice): an opaque namespace's
// bytes straight into their arena extent (ReadInto), a codec namespace's block encoded where it
// lies (ReadFrom): by the CUDA encoder's kernels (codec/cuda/device_encoder.h) where the buffer
// is device memory and this daemon is built with CUDA, else on the CPU after a copy down through
// the GPU tier's memory (a stand-in tier). Either way the blob is the CPU Encoder's.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "codec/codec.h"
#include "storage/gpu/device_memory.h"

namespace strata::daemon {

class PeerEncoder {
 public:
  PeerEncoder();
  ~PeerEncoder();

  // OutOfRange unless [offset, offset + bytes) lies inside the lent range.
  static absl::Status CheckRange(const PeerBuffer& peer, uint64_t offset, uint64_t bytes);
  // The `bytes` at `offset` of `peer` into `dst` as they are (an opaque namespace's block, read
  // straight into its extent).
  static absl::Status ReadInto(DeviceMemory& memory, PeerBuffer& peer, uint64_t offset,
                               uint64_t bytes, uint8_t* dst);
  // The `bytes` at `offset` of `peer` encoded as one block of `layout` with `codec`. OutOfRange when they leave the lent range; InvalidArgument for a block
  // the codec refuses (a non-finite value under a lossy mode, a size that is not the layout's).
  // *on_device: whether the codec's quantiser ran on the device. Thread-safe: CPU encodes run
  // in parallel (one encoder per calling thread), device encodes one at a time.
  absl::Status ReadFrom(DeviceMemory& memory, PeerBuffer& peer, uint64_t offset, uint64_t bytes,
                        const KvLayout& layout, const codec::CodecParams& codec,
                        std::vector<uint8_t>* stored, bool* on_device);

 private:
  struct Device;  // the CUDA encoder, in CUDA builds

  std::mutex mu_;  // the device encoder's
  std::unique_ptr<Device> device_;
};

}  // namespace strata::daemon
