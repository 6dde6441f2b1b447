#include "daemon/device/peer_encoder.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#if STRATA_DAEMON_CUDA
#include "codec/cuda/device_encoder.h"
#endif

namespace strata::daemon {

#if STRATA_DAEMON_CUDA
struct PeerEncoder::Device {
  codec::cuda::DeviceEncoder encoder;
};
#else
struct PeerEncoder::Device {};
#endif

PeerEncoder::PeerEncoder() : device_(std::make_unique<Device>()) {}
PeerEncoder::~PeerEncoder() = default;

absl::Status PeerEncoder::CheckRange(const PeerBuffer& peer, uint64_t offset, uint64_t bytes) {
  if (offset > peer.size() || bytes > peer.size() - offset)
    return absl::OutOfRangeError(absl::StrCat("a block of ", bytes, " bytes at offset ", offset,
                                              " leaves the lent buffer of ", peer.size(),
                                              " bytes"));
  return absl::OkStatus();
}

absl::Status PeerEncoder::ReadInto(DeviceMemory& memory, PeerBuffer& peer, uint64_t offset,
                                   uint64_t bytes, uint8_t* dst) {
  STRATA_RETURN_IF_ERROR(CheckRange(peer, offset, bytes));
  PeerRead r;
  r.peer_offset = offset;
  r.host = dst;
  r.size = bytes;
  return memory.FromPeer(peer, {&r, 1});
}

absl::Status PeerEncoder::ReadFrom(DeviceMemory& memory, PeerBuffer& peer, uint64_t offset,
                                   uint64_t bytes, const KvLayout& layout,
                                   const codec::CodecParams& codec,
                                   std::vector<uint8_t>* stored, bool* on_device) {
  *on_device = false;
  STRATA_RETURN_IF_ERROR(CheckRange(peer, offset, bytes));
  if (bytes != layout.BlockBytes())
    return absl::InvalidArgumentError(absl::StrCat("a block of ", bytes, " bytes; the namespace's "
                                                   "layout has ",
                                                   layout.BlockBytes()));
#if STRATA_DAEMON_CUDA
  if (const uint8_t* src = peer.device_data()) {
    std::lock_guard<std::mutex> lock(mu_);  // one device encoder (its device scratch) per daemon
    *on_device = codec.mode == codec::Mode::kQuant || codec.mode == codec::Mode::kGroupwise;
    return device_->encoder.Encode(layout, codec, src + offset, bytes, stored);
  }
#endif
  // CPU encodes run on the calling thread with its own encoder, so one caller's large publish
  // does not hold up another's.
  thread_local codec::Encoder cpu;
  thread_local std::vector<uint8_t> host_block;
  host_block.resize(bytes);
  STRATA_RETURN_IF_ERROR(ReadInto(memory, peer, offset, bytes, host_block.data()));
  return cpu.Encode(layout, codec, host_block, stored);
}

}  // namespace strata::daemon
