// Device links over NCCL (see device_link.h); built only with CUDA and nccl.h. libnccl is
// opened at run time, so stratad starts (with device links off) where it is missing.
//
// Communicators are non-blocking (ncclConfig_t.blocking = 0): set-up and every send or
// receive are polled against the caller's deadline, and a link that misses it is aborted
// (ncclCommAbort), which is NCCL's way to get a stuck peer's work off the device.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "transport/device_link.h"

namespace strata::transport {
namespace {

struct NcclApi {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) get_async_error = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

// The library's entry points, looked up once; an error when it is not there.
absl::StatusOr<const NcclApi*> Api() {
  static std::once_flag once;
  static NcclApi api;
  static absl::Status status;
  std::call_once(once, [] {
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      status = absl::FailedPreconditionError(
          absl::StrCat("NCCL: libnccl.so.2 does not load: ", why ? why : "unknown reason"));
      return;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (fn == nullptr && status.ok())
        status = absl::FailedPreconditionError(absl::StrCat("NCCL: libnccl has no ", name));
    };
    sym(api.get_unique_id, "ncclGetUniqueId");
    sym(api.init_rank_config, "ncclCommInitRankConfig");
    sym(api.get_async_error, "ncclCommGetAsyncError");
    sym(api.abort, "ncclCommAbort");
    sym(api.destroy, "ncclCommDestroy");
    sym(api.send, "ncclSend");
    sym(api.recv, "ncclRecv");
    sym(api.group_start, "ncclGroupStart");
    sym(api.group_end, "ncclGroupEnd");
    sym(api.error_string, "ncclGetErrorString");
  });
  if (!status.ok()) return status;
  return &api;
}

absl::Status NcclError(const NcclApi& api, ncclResult_t r, const char* what) {
  return absl::UnavailableError(absl::StrCat("NCCL: ", what, ": ", api.error_string(r)));
}

// Polls the communicator until its pending work is accepted (not ncclInProgress); gives up at
// `deadline` or when `abort_asked` turns true.
absl::Status Settle(const NcclApi& api, ncclComm_t comm, absl::Time deadline, const char* what,
                    const std::atomic<bool>* abort_asked = nullptr) {
  for (;;) {
    if (abort_asked && abort_asked->load())
      return absl::UnavailableError(absl::StrCat("NCCL: ", what, ": aborted"));
    ncclResult_t state = ncclSuccess;
    if (ncclResult_t r = api.get_async_error(comm, &state); r != ncclSuccess)
      return NcclError(api, r, what);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclError(api, state, what);
    if (absl::Now() > deadline)
      return absl::DeadlineExceededError(absl::StrCat("NCCL: ", what, ": the other end is late"));
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// NCCL calls on one communicator must not run concurrently, and ncclCommAbort frees it: so the
// communicator is only touched under mu_. Abort from another thread while a transfer runs only
// raises a flag that the transfer's poll loop sees (within ~50 us), and the transfer aborts.
class NcclLink final : public DeviceLink {
 public:
  NcclLink(const NcclApi& api, int device, ncclComm_t comm, cudaStream_t stream, int rank)
      : api_(api), device_(device), comm_(comm), stream_(stream), rank_(rank) {}
  ~NcclLink() override {
    std::lock_guard<std::mutex> lock(mu_);
    cudaSetDevice(device_);
    if (!broken_) api_.destroy(comm_);  // an aborted communicator is gone already
    cudaStreamDestroy(stream_);
  }
  std::string_view kind() const override { return "nccl"; }
  int rank() const override { return rank_; }

  absl::Status Send(std::span<const DeviceRange> ranges, absl::Time deadline) override {
    return Run(ranges, deadline, true);
  }
  absl::Status Recv(std::span<const DeviceRange> ranges, absl::Time deadline) override {
    return Run(ranges, deadline, false);
  }
  void Abort() override {
    abort_asked_.store(true);
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (lock.owns_lock()) AbortLocked();  // else the running transfer sees the flag
  }

 private:
  void AbortLocked() {
    if (broken_) return;
    broken_ = true;
    api_.abort(comm_);
    cudaStreamSynchronize(stream_);  // whatever the kernels left, nothing writes after this
  }

  absl::Status Run(std::span<const DeviceRange> ranges, absl::Time deadline, bool send) {
    std::lock_guard<std::mutex> lock(mu_);
    if (abort_asked_.load()) AbortLocked();
    if (broken_) return absl::UnavailableError("NCCL link: broken (aborted)");
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      AbortLocked();
      return absl::InternalError(absl::StrCat("NCCL link: cudaSetDevice: ", cudaGetErrorString(e)));
    }
    const int peer = 1 - rank_;
    absl::Status st = absl::OkStatus();
    api_.group_start();
    for (const DeviceRange& r : ranges) {
      void* p = reinterpret_cast<void*>(r.address);
      const ncclResult_t e = send ? api_.send(p, r.size, ncclUint8, peer, comm_, stream_)
                                  : api_.recv(p, r.size, ncclUint8, peer, comm_, stream_);
      if (e != ncclSuccess && e != ncclInProgress) {
        st = NcclError(api_, e, send ? "ncclSend" : "ncclRecv");
        break;
      }
    }
    const ncclResult_t end = api_.group_end();
    if (st.ok() && end != ncclSuccess && end != ncclInProgress)
      st = NcclError(api_, end, "ncclGroupEnd");
    if (st.ok()) st = Settle(api_, comm_, deadline, send ? "send" : "receive", &abort_asked_);
    while (st.ok()) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) break;
      ncclResult_t state = ncclSuccess;
      api_.get_async_error(comm_, &state);
      if (q != cudaErrorNotReady) {
        st = absl::InternalError(absl::StrCat("NCCL link stream: ", cudaGetErrorString(q)));
      } else if (abort_asked_.load()) {
        st = absl::UnavailableError("NCCL link: aborted during the transfer");
      } else if (absl::Now() > deadline) {
        st = absl::DeadlineExceededError("NCCL link: the other end did not take its part in time");
      } else if (state != ncclSuccess && state != ncclInProgress) {
        st = NcclError(api_, state, "link");
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
    if (!st.ok()) AbortLocked();
    return st;
  }

  const NcclApi& api_;
  const int device_;
  const ncclComm_t comm_;
  const cudaStream_t stream_;
  const int rank_;
  std::mutex mu_;
  bool broken_ = false;  // guarded by mu_: the communicator was aborted (and freed)
  std::atomic<bool> abort_asked_{false};
};

class NcclLinkFactory final : public DeviceLinkFactory {
 public:
  NcclLinkFactory(const NcclApi& api, int device) : api_(api), device_(device) {}
  std::string_view kind() const override { return "nccl"; }

  absl::StatusOr<std::string> NewLinkId() override {
    ncclUniqueId id;
    cudaSetDevice(device_);
    if (ncclResult_t r = api_.get_unique_id(&id); r != ncclSuccess)
      return NcclError(api_, r, "ncclGetUniqueId");
    return std::string(id.internal, sizeof id.internal);
  }

  absl::StatusOr<std::unique_ptr<DeviceLink>> Connect(std::string_view link_id, int rank,
                                                      absl::Time deadline) override {
    if (link_id.size() != NCCL_UNIQUE_ID_BYTES || (rank != 0 && rank != 1))
      return absl::InvalidArgumentError("NCCL link: malformed link id or rank");
    ncclUniqueId id;
    std::memcpy(id.internal, link_id.data(), sizeof id.internal);
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess)
      return absl::FailedPreconditionError(
          absl::StrCat("NCCL link: cudaSetDevice: ", cudaGetErrorString(e)));
    cudaStream_t stream = nullptr;
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess)
      return absl::InternalError(absl::StrCat("NCCL link: stream: ", cudaGetErrorString(e)));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t r = api_.init_rank_config(&comm, 2, id, rank, &config);
    absl::Status st = (r == ncclSuccess || r == ncclInProgress)
                          ? Settle(api_, comm, deadline, "ncclCommInitRankConfig")
                          : NcclError(api_, r, "ncclCommInitRankConfig");
    if (!st.ok()) {
      if (comm != nullptr) api_.abort(comm);
      cudaStreamDestroy(stream);
      return st;
    }
    return std::unique_ptr<DeviceLink>(new NcclLink(api_, device_, comm, stream, rank));
  }

 private:
  const NcclApi& api_;
  const int device_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceLinkFactory>> NewNcclLinkFactory(int device) {
  auto api = Api();
  if (!api.ok()) return api.status();
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
    return absl::FailedPreconditionError(absl::StrCat(
        "NCCL links: CUDA device ", device, " is not usable: ", cudaGetErrorString(e)));
  return std::unique_ptr<DeviceLinkFactory>(new NcclLinkFactory(**api, device));
}

}  // namespace strata::transport
