#include "daemon/device/peer_decoder.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#if STRATA_DAEMON_CUDA
#include "codec/cuda/device_decoder.h"
#endif

namespace strata::daemon {

#if STRATA_DAEMON_CUDA
struct PeerDecoder::Device {
  codec::cuda::DeviceDecoder decoder;
};
bool PeerDecoder::OnDevice() { return true; }
#else
struct PeerDecoder::Device {};
bool PeerDecoder::OnDevice() { return false; }
#endif

PeerDecoder::PeerDecoder(const CalibrationStore* calibrations)
    : calibrations_(calibrations), device_(std::make_unique<Device>()) {
  const codec::CalibrationSet* set = calibrations ? &calibrations->parsed() : &no_calibrations_;
  cpu_.set_calibrations(set);
#if STRATA_DAEMON_CUDA
  device_->decoder.set_calibrations(set);
#endif
}

PeerDecoder::~PeerDecoder() = default;

absl::StatusOr<std::shared_ptr<const codec::Calibration>> PeerDecoder::CalibrationOf(
    const NamespaceId& ns, std::span<const uint8_t> blob) {
  STRATA_ASSIGN_OR_RETURN(codec::BlobInfo info, codec::InspectBlob(blob));
  const uint64_t id = info.params.calibration_id;
  if (!codec::UsesCalibration(info.params.mode) || id == 0) return nullptr;
  if (calibrations_ == nullptr)
    return absl::NotFoundError("this daemon keeps no calibrations to decode pca or xl blobs with");
  return calibrations_->Parsed(ns, id);
}

absl::Status PeerDecoder::DecodeInto(const NamespaceId& ns, std::span<const uint8_t> blob,
                                     DeviceMemory& memory, PeerBuffer& peer, uint64_t offset,
                                     uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (offset > peer.size() || bytes > peer.size() - offset)
    return absl::OutOfRangeError("the decoded block does not fit where its offset puts it");
  // Held until the blob is decoded: the store's cache keeps what somebody holds.
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<const codec::Calibration> calibration,
                          CalibrationOf(ns, blob));
#if STRATA_DAEMON_CUDA
  if (uint8_t* dst = peer.device_data())
    return device_->decoder.Decode(blob, dst + offset, bytes);
#endif
  host_.resize(bytes);
  STRATA_RETURN_IF_ERROR(cpu_.Decode(blob, host_));
  PeerCopy c;
  c.peer_offset = offset;
  c.host = host_.data();
  c.size = bytes;
  return memory.ToPeer(peer, {&c, 1});
}

}  // namespace strata::daemon
