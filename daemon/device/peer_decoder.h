// Blocks of a codec namespace decoded into buffers same-node engines lent (FetchToDevice with
// `decode`): on the device by the CUDA decoder (codec/cuda/device_decoder.h) where the buffer is
// device memory and this daemon is built with CUDA, else on the CPU and copied in through the
// GPU tier's memory (a stand-in tier). pca blobs find their calibration in the daemon's store.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "codec/calibration.h"
#include "codec/codec.h"
#include "daemon/calibrations/calibration_store.h"
#include "storage/gpu/device_memory.h"

namespace strata::daemon {

class PeerDecoder {
 public:
  // `calibrations` may be null (pca blobs are then refused); it must outlive the decoder.
  explicit PeerDecoder(const CalibrationStore* calibrations);
  ~PeerDecoder();

  // Decodes `blob` of namespace `ns` into `peer` at `offset`, `bytes` (the layout's block bytes)
  // long. DataLoss for a blob that does not decode; NotFound for an unknown calibration.
  // Thread-safe (decodes run one at a time).
  absl::Status DecodeInto(const NamespaceId& ns, std::span<const uint8_t> blob,
                          DeviceMemory& memory, PeerBuffer& peer, uint64_t offset,
                          uint64_t bytes);
  // Whether decodes into device memory run on the device here (a CUDA build).
  static bool OnDevice();

 private:
  // The calibration `blob` names, parsed (null for a blob that names none).
  absl::StatusOr<std::shared_ptr<const codec::Calibration>> CalibrationOf(
      const NamespaceId& ns, std::span<const uint8_t> blob);
  struct Device;  // the CUDA decoder, in CUDA builds

  const CalibrationStore* const calibrations_;
  const codec::CalibrationSet no_calibrations_;  // the decoders' set without a store
  std::mutex mu_;
  codec::Decoder cpu_;
  std::vector<uint8_t> host_;
  std::unique_ptr<Device> device_;
};

}  // namespace strata::daemon
