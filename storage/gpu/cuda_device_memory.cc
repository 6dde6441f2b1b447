// DeviceMemory on a CUDA device (built only with CUDA; see storage/CMakeLists.txt).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_allocation_range.h"
#include "common/device_handles.h"
#include "storage/gpu/device_memory.h"
#include "storage/gpu/peer_copy_kernel.h"

namespace strata {
namespace {

absl::Status CudaError(cudaError_t err, const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(err), " (",
                                          cudaGetErrorString(err), ")"));
}

// An engine's allocation opened from its IPC handle; closed with the object.
class CudaPeerBuffer final : public PeerBuffer {
 public:
  CudaPeerBuffer(int device, uint8_t* opened, uint64_t offset, uint64_t bytes)
      : device_(device), opened_(opened), offset_(offset), bytes_(bytes) {}
  ~CudaPeerBuffer() override {
    cudaSetDevice(device_);
    cudaIpcCloseMemHandle(opened_);
  }
  uint64_t size() const override { return bytes_; }
  uint8_t* device_data() const override { return data(); }
  uint8_t* data() const { return opened_ + offset_; }

 private:
  const int device_;
  uint8_t* const opened_;
  const uint64_t offset_, bytes_;
};

class CudaDeviceMemory final : public DeviceMemory {
 public:
  CudaDeviceMemory(int device, uint8_t* pool, uint64_t capacity, cudaStream_t up,
                   cudaStream_t down, cudaStream_t peer)
      : device_(device), pool_(pool), capacity_(capacity), up_(up), down_(down),
        peer_stream_(peer) {}

  ~CudaDeviceMemory() override {
    cudaSetDevice(device_);
    for (auto [base, bytes] : registered_) cudaHostUnregister(base);
    cudaStreamDestroy(up_);
    cudaStreamDestroy(down_);
    cudaStreamDestroy(peer_stream_);
    cudaFree(pool_);
  }

  std::string_view kind() const override { return "cuda"; }
  uint64_t capacity() const override { return capacity_; }
  uint64_t device_address() const override { return reinterpret_cast<uintptr_t>(pool_); }

  absl::Status RegisterHost(uint8_t* base, uint64_t bytes) override {
    std::lock_guard l(register_mu_);
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess)
      return CudaError(e, "cudaSetDevice");
    cudaError_t e = cudaHostRegister(base, bytes, cudaHostRegisterDefault);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {
      cudaGetLastError();  // clears the error state, so the next call does not report it
      return absl::OkStatus();
    }
    if (e != cudaSuccess) return CudaError(e, "cudaHostRegister of the host arena");
    registered_.push_back({base, bytes});
    return absl::OkStatus();
  }

  absl::Status ToDevice(std::span<const DeviceCopy> copies) override {
    return Run(copies, /*to_device=*/true);
  }
  absl::Status ToHost(std::span<const DeviceCopy> copies) override {
    return Run(copies, /*to_device=*/false);
  }

  absl::StatusOr<std::unique_ptr<PeerBuffer>> OpenPeerBuffer(std::string_view kind,
                                                             std::string_view handle,
                                                             uint64_t offset,
                                                             uint64_t bytes) override {
    if (kind != device_handles::kCudaIpc)
      return absl::InvalidArgumentError(
          absl::StrCat("this daemon's GPU tier opens cuda-ipc buffers, not ", std::string(kind),
                       " handles"));
    if (handle.size() != sizeof(cudaIpcMemHandle_t) ||
        handle.size() != device_handles::kCudaIpcHandleBytes)
      return absl::InvalidArgumentError(absl::StrCat("a cuda-ipc handle has ",
                                                     sizeof(cudaIpcMemHandle_t),
                                                     " bytes, not ", handle.size()));
    if (bytes == 0) return absl::InvalidArgumentError("a lent buffer of 0 bytes");
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof h);
    std::lock_guard l(peer_mu_);
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess)
      return CudaError(e, "cudaSetDevice");
    void* opened = nullptr;
    if (cudaError_t e = cudaIpcOpenMemHandle(&opened, h, cudaIpcMemLazyEnablePeerAccess);
        e != cudaSuccess) {
      cudaGetLastError();
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot open the lent buffer's IPC handle: ", cudaGetErrorName(e), " (",
          cudaGetErrorString(e), "); it must come from a live allocation of another process"));
    }
    cuda_driver::AllocationRange range;
    const bool found = cuda_driver::FindAllocation(opened, &range);
    if (!found || range.base != reinterpret_cast<uintptr_t>(opened) || offset > range.bytes ||
        bytes > range.bytes - offset) {
      cudaIpcCloseMemHandle(opened);
      return absl::InvalidArgumentError(absl::StrCat(
          "the lent range of ", bytes, " bytes at ", offset, " leaves the allocation of ",
          range.bytes, " bytes", found ? "" : " (the driver does not know it)"));
    }
    return std::unique_ptr<PeerBuffer>(
        new CudaPeerBuffer(device_, static_cast<uint8_t*>(opened), offset, bytes));
  }

  absl::Status ToPeer(PeerBuffer& peer, std::span<const PeerCopy> copies) override {
    if (absl::Status s = CheckPeerCopies(copies, capacity_, peer.size()); !s.ok()) return s;
    std::lock_guard l(peer_mu_);
    return ToPeerLocked(peer, copies);
  }

  absl::Status TryToPeer(PeerBuffer& peer, std::span<const PeerCopy> copies) override {
    if (absl::Status s = CheckPeerCopies(copies, capacity_, peer.size()); !s.ok()) return s;
    std::unique_lock l(peer_mu_, std::try_to_lock);
    if (!l.owns_lock())
      return absl::UnavailableError("other copies into lent buffers are under way");
    return ToPeerLocked(peer, copies);
  }

  absl::Status FromPeer(PeerBuffer& peer, std::span<const PeerRead> reads) override {
    if (absl::Status s = CheckPeerReads(reads, peer.size()); !s.ok()) return s;
    const uint8_t* src = static_cast<CudaPeerBuffer&>(peer).data();
    std::lock_guard l(peer_mu_);
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess)
      return CudaError(e, "cudaSetDevice");
    for (const PeerRead& r : reads) {
      if (cudaError_t e = cudaMemcpyAsync(r.host, src + r.peer_offset, r.size,
                                          cudaMemcpyDeviceToHost, peer_stream_);
          e != cudaSuccess) {
        cudaStreamSynchronize(peer_stream_);
        return CudaError(e, "cudaMemcpyAsync out of a lent buffer");
      }
    }
    if (cudaError_t e = cudaStreamSynchronize(peer_stream_); e != cudaSuccess)
      return CudaError(e, "cudaStreamSynchronize");
    return absl::OkStatus();
  }

 private:
  // ToPeer's copies, with peer_mu_ held.
  absl::Status ToPeerLocked(PeerBuffer& peer, std::span<const PeerCopy> copies) {
    uint8_t* dst = static_cast<CudaPeerBuffer&>(peer).data();
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess)
      return CudaError(e, "cudaSetDevice");
    if (cudaError_t e = EnqueueToPeer(dst, copies); e != cudaSuccess) {
      cudaStreamSynchronize(peer_stream_);  // nothing of this batch may still run after we return
      return CudaError(e, "copying into a lent buffer");
    }
    if (cudaError_t e = cudaStreamSynchronize(peer_stream_); e != cudaSuccess)
      return CudaError(e, "cudaStreamSynchronize");
    return absl::OkStatus();
  }

  // Enqueues the copies from the device pool as gather kernels (kMaxSpansPerLaunch spans
  // each) and the ones from host memory one by one, all on the peer stream.
  cudaError_t EnqueueToPeer(uint8_t* dst, std::span<const PeerCopy> copies) {
    spans_.clear();
    for (const PeerCopy& c : copies) {
      if (c.host) {
        if (cudaError_t e = cudaMemcpyAsync(dst + c.peer_offset, c.host, c.size,
                                            cudaMemcpyHostToDevice, peer_stream_);
            e != cudaSuccess)
          return e;
        continue;
      }
      spans_.push_back({pool_ + c.device_offset, dst + c.peer_offset, c.size});
    }
    for (size_t at = 0; at < spans_.size(); at += gpu_copies::kMaxSpansPerLaunch) {
      const size_t n = std::min(gpu_copies::kMaxSpansPerLaunch, spans_.size() - at);
      if (int e = gpu_copies::LaunchGatherCopy(spans_.data() + at, n, peer_stream_); e != 0)
        return static_cast<cudaError_t>(e);
    }
    return cudaSuccess;
  }

  // One stream per direction, so promotions and demotions overlap on the two copy engines; a
  // batch is enqueued whole and waited for once.
  absl::Status Run(std::span<const DeviceCopy> copies, bool to_device) {
    if (absl::Status s = CheckDeviceCopies(copies, capacity_); !s.ok()) return s;
    std::lock_guard l(to_device ? up_mu_ : down_mu_);
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess)
      return CudaError(e, "cudaSetDevice");
    cudaStream_t stream = to_device ? up_ : down_;
    for (const DeviceCopy& c : copies) {
      uint8_t* dev = pool_ + c.device_offset;
      cudaError_t e =
          to_device ? cudaMemcpyAsync(dev, c.host, c.size, cudaMemcpyHostToDevice, stream)
                    : cudaMemcpyAsync(c.host, dev, c.size, cudaMemcpyDeviceToHost, stream);
      if (e != cudaSuccess) {
        cudaStreamSynchronize(stream);  // nothing of this batch may still run after we return
        return CudaError(e, "cudaMemcpyAsync");
      }
    }
    if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess)
      return CudaError(e, "cudaStreamSynchronize");
    return absl::OkStatus();
  }

  const int device_;
  uint8_t* const pool_;
  const uint64_t capacity_;
  cudaStream_t up_, down_;
  cudaStream_t peer_stream_;  // copies into lent buffers, beside promotions and demotions
  std::mutex up_mu_, down_mu_, register_mu_, peer_mu_;
  std::vector<std::pair<uint8_t*, uint64_t>> registered_;
  std::vector<gpu_copies::CopySpan> spans_;  // EnqueueToPeer's, kept between calls (peer_mu_)
};

}  // namespace

absl::Status CudaDeviceAvailable() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess)
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device: ", cudaGetErrorString(e)));
  if (n == 0) return absl::FailedPreconditionError("no CUDA device is visible");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceMemory>> OpenCudaDeviceMemory(int device, uint64_t capacity) {
  if (absl::Status s = CudaDeviceAvailable(); !s.ok()) return s;
  int n = 0;
  cudaGetDeviceCount(&n);
  if (device < 0 || device >= n)
    return absl::InvalidArgumentError(
        absl::StrCat("gpu.device ", device, " does not exist (", n, " visible)"));
  if (capacity == 0) return absl::InvalidArgumentError("a GPU tier of 0 bytes");
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
    return CudaError(e, "cudaSetDevice");
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes); e != cudaSuccess)
    return CudaError(e, "cudaMemGetInfo");
  if (capacity > free_bytes)
    return absl::ResourceExhaustedError(
        absl::StrCat("gpu.capacity ", capacity, " bytes exceeds the ", free_bytes,
                     " bytes free on device ", device, " (of ", total_bytes, ")"));
  void* pool = nullptr;
  if (cudaError_t e = cudaMalloc(&pool, capacity); e != cudaSuccess)
    return CudaError(e, "cudaMalloc of the GPU tier");
  cudaStream_t up = nullptr, down = nullptr, peer = nullptr;
  cudaError_t e1 = cudaStreamCreateWithFlags(&up, cudaStreamNonBlocking);
  cudaError_t e2 = cudaStreamCreateWithFlags(&down, cudaStreamNonBlocking);
  cudaError_t e3 = cudaStreamCreateWithFlags(&peer, cudaStreamNonBlocking);
  if (e1 != cudaSuccess || e2 != cudaSuccess || e3 != cudaSuccess) {
    for (cudaStream_t s : {up, down, peer})
      if (s) cudaStreamDestroy(s);
    cudaFree(pool);
    return CudaError(e1 != cudaSuccess ? e1 : e2 != cudaSuccess ? e2 : e3, "cudaStreamCreate");
  }
  return std::unique_ptr<DeviceMemory>(
      new CudaDeviceMemory(device, static_cast<uint8_t*>(pool), capacity, up, down, peer));
}

}  // namespace strata
