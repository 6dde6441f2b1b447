// The memory of the GPU tier, as the tier sees it: one pool of `capacity()` bytes addressed by
// offset, and batched copies between the pool and host memory. Like LevelDB's Env, this is the
// seam that keeps the tier's bookkeeping testable everywhere: CudaDeviceMemory owns device
// memory on a GPU node; HostStandInMemory puts ordinary host memory in its place (and can be told
// to fail copies), so the GPU tier's reserve/commit, leases, pins, eviction, demotion and
// promotion run on every machine.
//
// No CUDA type appears here: a device address is a plain integer and errors are absl::Status.
// Thread-safe: copies may be issued from any thread; each call returns when its copies are done.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata {

// `size` bytes between the pool at `device_offset` and host memory at `host`.
struct DeviceCopy {
  uint64_t device_offset = 0;
  uint8_t* host = nullptr;
  uint64_t size = 0;
};

// Device memory of another process on the node that it lent the daemon (common/device_handles.h):
// an engine's own buffer, which fetched blocks are copied into device-to-device. Open as long as
// the object lives.
class PeerBuffer {
 public:
  virtual ~PeerBuffer() = default;
  virtual uint64_t size() const = 0;
  // The lent range in this process's device address space, for kernels that write it directly
  // (the CUDA decoder); null where it is no device memory (the stand-in).
  virtual uint8_t* device_data() const { return nullptr; }
};

// `size` bytes into a peer buffer at `peer_offset`, from the pool at `device_offset` or, when
// `host` is set, from host memory there (a block the pool does not hold).
struct PeerCopy {
  uint64_t peer_offset = 0;
  uint64_t device_offset = 0;
  const uint8_t* host = nullptr;
  uint64_t size = 0;
};

// `size` bytes out of a peer buffer at `peer_offset` into host memory at `host`.
struct PeerRead {
  uint64_t peer_offset = 0;
  uint8_t* host = nullptr;
  uint64_t size = 0;
};

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;

  // "cuda" or "host-stand-in": what operators see in stats and logs.
  virtual std::string_view kind() const = 0;
  virtual uint64_t capacity() const = 0;
  // The pool's address in the device's address space, for consumers on the device (CUDA IPC
  // exports, NCCL): offsets the tier hands out are relative to it.
  virtual uint64_t device_address() const = 0;

  // Host memory that copies go to and come from (the host arena), registered once so copies
  // to and from it run asynchronously at full speed. Copies from unregistered host memory work
  // too, staged by the runtime.
  virtual absl::Status RegisterHost(uint8_t* base, uint64_t bytes) = 0;

  // Every copy of the batch is done (or the call failed) when these return. A failed batch may
  // have written part of its destinations: the caller treats all of them as unwritten.
  virtual absl::Status ToDevice(std::span<const DeviceCopy> copies) = 0;
  virtual absl::Status ToHost(std::span<const DeviceCopy> copies) = 0;

  // Opens the range [offset, offset + bytes) of memory another process lent by a handle of
  // `kind` (common/device_handles.h). InvalidArgument for a handle of another kind than this
  // memory's, a malformed one or a range outside what the handle opens; FailedPrecondition
  // when it names memory that is gone.
  virtual absl::StatusOr<std::unique_ptr<PeerBuffer>> OpenPeerBuffer(std::string_view kind,
                                                                     std::string_view handle,
                                                                     uint64_t offset,
                                                                     uint64_t bytes) = 0;
  // Every copy of the batch is done (or the call failed) when this returns. `peer` must come
  // from this memory's OpenPeerBuffer.
  virtual absl::Status ToPeer(PeerBuffer& peer, std::span<const PeerCopy> copies) = 0;
  // ToPeer, or Unavailable (nothing copied) at once where it would first wait for other copies
  // into lent buffers to finish: for callers that must not block (a progress thread).
  virtual absl::Status TryToPeer(PeerBuffer& peer, std::span<const PeerCopy> copies) {
    return ToPeer(peer, copies);
  }
  // The other way (blocks an engine publishes from its device memory): done or failed when it
  // returns; a failed batch leaves its destinations unknown.
  virtual absl::Status FromPeer(PeerBuffer& peer, std::span<const PeerRead> reads) = 0;
};

// Checks the copies of a batch against a pool of `capacity` bytes (shared by implementations).
absl::Status CheckDeviceCopies(std::span<const DeviceCopy> copies, uint64_t capacity);

// Checks the copies of a batch against the pool and the peer buffer (shared by implementations).
absl::Status CheckPeerCopies(std::span<const PeerCopy> copies, uint64_t capacity,
                             uint64_t peer_size);

// Checks the reads of a batch against the peer buffer (shared by implementations).
absl::Status CheckPeerReads(std::span<const PeerRead> reads, uint64_t peer_size);

struct HostStandInOptions {
  // Called before each copy (to_device: direction); a non-OK answer fails the batch there, as a
  // device error would. Tests use it to break the device under the tier.
  std::function<absl::Status(bool to_device, const DeviceCopy&)> fault;
};

// Host memory standing in for device memory: same contract, memcpy for copies.
class HostStandInMemory final : public DeviceMemory {
 public:
  static absl::StatusOr<std::unique_ptr<HostStandInMemory>> Create(uint64_t capacity,
                                                                   HostStandInOptions options = {});
  ~HostStandInMemory() override;

  std::string_view kind() const override { return "host-stand-in"; }
  uint64_t capacity() const override { return capacity_; }
  uint64_t device_address() const override { return reinterpret_cast<uintptr_t>(pool_); }
  absl::Status RegisterHost(uint8_t*, uint64_t) override { return absl::OkStatus(); }
  absl::Status ToDevice(std::span<const DeviceCopy> copies) override;
  absl::Status ToHost(std::span<const DeviceCopy> copies) override;
  // Handles of kind host-stand-in: shared-memory objects the client library creates.
  absl::StatusOr<std::unique_ptr<PeerBuffer>> OpenPeerBuffer(std::string_view kind,
                                                             std::string_view handle,
                                                             uint64_t offset,
                                                             uint64_t bytes) override;
  absl::Status ToPeer(PeerBuffer& peer, std::span<const PeerCopy> copies) override;
  absl::Status FromPeer(PeerBuffer& peer, std::span<const PeerRead> reads) override;

  // The pool's bytes, for tests that damage "device" memory behind the tier's back.
  uint8_t* pool() const { return pool_; }

 private:
  HostStandInMemory(uint8_t* pool, uint64_t capacity, HostStandInOptions options)
      : pool_(pool), capacity_(capacity), options_(std::move(options)) {}
  uint8_t* const pool_;
  const uint64_t capacity_;
  const HostStandInOptions options_;
};

// Device memory on CUDA device `device`: a cudaMalloc pool of `capacity` bytes and a stream of
// its own for copies. FailedPrecondition (with the runtime's reason) when this build has no CUDA
// or no device is visible; ResourceExhausted when the device has less free memory than asked.
absl::StatusOr<std::unique_ptr<DeviceMemory>> OpenCudaDeviceMemory(int device, uint64_t capacity);

// Whether OpenCudaDeviceMemory can work here: OK, or why not (no CUDA in this build, no driver,
// no device). Device tests skip with this reason.
absl::Status CudaDeviceAvailable();

}  // namespace strata
