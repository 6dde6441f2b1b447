// UCX data plane: context, workers, endpoints, registered memory and batched one-sided RMA.
//
// The side that owns memory registers it once and hands out (address, packed rkey) through the
// control plane; the other side puts/gets straight between its own registered buffers and that
// memory. Block bytes never pass through gRPC.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/sanitizers.h"

// UCX's handle types, declared exactly as <ucp/api/ucp_def.h> declares them, so that users of
// this header do not compile against UCX; only transport/ucx.cc includes it.
typedef struct ucp_context* ucp_context_h;
typedef struct ucp_worker* ucp_worker_h;
typedef struct ucp_ep* ucp_ep_h;
typedef struct ucp_mem* ucp_mem_h;
typedef struct ucp_rkey* ucp_rkey_h;

namespace strata::transport {

class Endpoint;

// Memory registered with a context: either allocated by UCX (so same-node peers can map it
// directly) or caller-owned and only registered.
class MemoryRegion {
 public:
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  ucp_mem_h handle() const { return memh_; }
  bool Contains(const void* p, size_t n) const {
    auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(data_);
    return a >= b && a + n <= b + size_;
  }
  // The remote key a peer needs to access this region.
  absl::StatusOr<std::string> PackRkey() const;

 private:
  friend class Context;
  MemoryRegion(ucp_context_h ctx, ucp_mem_h memh, uint8_t* data, size_t size)
      : ctx_(ctx), memh_(memh), data_(data), size_(size) {}
  ucp_context_h ctx_;
  ucp_mem_h memh_;
  uint8_t* data_;
  size_t size_;
};

// What a context offers its peers.
struct ContextOptions {
  // Workers can sleep on an event fd (daemons); clients that only poll leave it false.
  bool wakeup = false;
  // Allocate never backs memory with a named POSIX shared-memory file. UCX's posix allocator
  // fills its /dev/shm file before unlinking it, so a process killed while a large allocation
  // faults in leaves that file behind (issue 14, finding 5); System V segments are marked for
  // removal at once and anonymous memory has no name. An explicit UCX_ALLOC_PRIO still wins.
  bool unnamed_allocations = false;
  // Peers may put/get this process's registered memory. Without it UCX installs no handlers for
  // the put/get messages it uses to emulate RMA where the transport has none (tcp): those
  // handlers write and read at whatever address the message names, so a daemon that hands out
  // no remote key must not have them (issue 14).
  bool rma = true;
  // UCX's tcp transport. Its receiver writes a peer's put request wherever the request says,
  // below UCP and whatever `rma` says, so a process that must not trust every host that reaches
  // its tcp port turns it off (UCX_TLS keeps its other transports; see TransportsWithoutTcp).
  bool tcp = true;
  // Several workers of this context run on different threads at once (the daemon's data-plane
  // workers, a cluster locator's own worker): UCX then guards what they share. A client's one
  // worker does not pay for it.
  bool workers_on_threads = false;
};

// The UCX_TLS value that keeps `ucx_tls` (the environment's value, null or empty when unset)
// without tcp. An error when nothing would be left, or for "all" in an inclusion list, which
// cannot be narrowed by name.
absl::StatusOr<std::string> TransportsWithoutTcp(const char* ucx_tls);

class Context : public std::enable_shared_from_this<Context> {
 public:
  static absl::StatusOr<std::shared_ptr<Context>> Create(const ContextOptions& options);
  static absl::StatusOr<std::shared_ptr<Context>> Create(bool wakeup) {
    ContextOptions o;
    o.wakeup = wakeup;
    return Create(o);
  }
  ~Context();

  ucp_context_h handle() const { return ctx_; }
  bool wakeup() const { return wakeup_; }
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Allocate(size_t bytes);
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* data, size_t bytes);

 private:
  Context(ucp_context_h ctx, bool wakeup) : ctx_(ctx), wakeup_(wakeup) {}
  ucp_context_h ctx_;
  bool wakeup_;
};

// One sided operation between a local buffer and remote memory.
struct RmaOp {
  enum Kind : uint8_t { kGet, kPut } kind;
  void* local;
  size_t length;
  uint64_t remote_address;
  ucp_mem_h local_memh = nullptr;  // optional: avoids UCX's registration-cache lookup
};

// An active message as its handler sees it: valid only during the call, except that a
// rendezvous message's `desc` stays valid when the handler returns true (it then hands it to
// Worker::AmRecvData, or frees it with Worker::AmDiscard).
struct AmMessage {
  std::string_view header;
  std::string_view data;        // empty for a rendezvous message
  ucp_ep_h reply_ep = nullptr;  // set when the sender asked for replies
  bool rendezvous = false;      // the payload still sits at the sender: see `desc`
  void* desc = nullptr;
  size_t length = 0;  // payload bytes (both kinds)
};
// Handles eager messages; a rendezvous message for such a handler is dropped by the worker.
using AmHandler = std::function<void(const AmMessage&)>;
// Handles both kinds; returns true to keep a rendezvous descriptor (eager: result ignored).
using AmRendezvousHandler = std::function<bool(const AmMessage&)>;
// Told about each message the worker drops itself (a rendezvous message for an eager-only
// handler, an id nobody handles): `id` is kUnknownAmId when UCX does not say which.
using AmDropHandler = std::function<void(uint16_t id, const AmMessage&, std::string_view why)>;
inline constexpr uint16_t kUnknownAmId = 0xffff;

class Worker {
 public:
  static absl::StatusOr<std::unique_ptr<Worker>> Create(std::shared_ptr<Context> ctx);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  ucp_worker_h handle() const { return worker_; }
  const std::string& address() const { return address_; }
  // Names of the transports this worker's context enabled, e.g. "tcp,posix,cma".
  std::string TransportSummary() const;

  // kDetect asks UCX to report a dead peer (failing requests instead of hanging them) and falls
  // back to kIgnore when no transport can: in UCX 1.13 posix/sysv shared memory cannot, and
  // asking for it removes them from the endpoint, leaving a same-node peer on tcp. kIgnore keeps
  // shared memory; the caller's deadlines then detect a dead peer. Asking for it also costs tcp
  // its zero-copy rendezvous: UCX 1.13 then moves large messages as 8 KiB fragments copied on
  // arrival (half the bandwidth). kWatch keeps both: the endpoint asks for nothing, and a
  // second, idle endpoint to the same peer, on a worker of its own, asks for detection and
  // marks this one failed when the peer dies (kIgnore where no transport can detect). Not used
  // over RDMA: untested there, and UCX may treat a transport error it was not asked to handle
  // as fatal.
  enum class PeerFailure { kDetect, kIgnore, kWatch };
  absl::StatusOr<std::unique_ptr<Endpoint>> Connect(
      std::string_view remote_address, PeerFailure peer_failure = PeerFailure::kDetect);

  unsigned Progress();

  // Active messages: small request/reply exchanges beside RMA (a lookup that skips the gRPC
  // stack). `handler` runs on whichever thread progresses this worker, so it must be quick and
  // must not block. Install handlers before peers send.
  absl::Status SetAmHandler(uint16_t id, AmHandler handler);
  // For messages whose payload may be large enough for rendezvous (a pushed block).
  absl::Status SetAmRendezvousHandler(uint16_t id, AmRendezvousHandler handler);
  // Every message the worker drops goes to `on_drop` (it runs on the progressing thread), and
  // every id without a handler gets one that drops its messages there, so that a peer sending
  // unknown ids costs a counter, not a UCX warning per message. Call before the others.
  absl::Status SetAmDropHandler(AmDropHandler on_drop);
  // What the UCX callback sees (internal).
  struct InstalledAmHandler {
    AmRendezvousHandler handle;
    bool takes_rendezvous = false;
    uint16_t id = kUnknownAmId;
    const AmDropHandler* on_drop = nullptr;
  };
  // Sends a reply from inside a handler; completes in the background (no wait).
  void AmReply(ucp_ep_h reply_ep, uint16_t id, std::string header, std::string data);
  // Sends [data, data+length) without copying it (registered memory `memh` when known); the
  // bytes must stay untouched until the send completes, which happens in the background.
  // Large payloads go by rendezvous: the receiver pulls them into its own buffer.
  // `eager` forces the eager protocol (no rendezvous round trip; the receiver copies).
  // `on_done` (optional) runs once UCX no longer reads the bytes, with whether the send
  // completed; it runs on the progressing thread, or inside this call when the send finished
  // (or failed) at once.
  using Done = std::function<void(bool ok)>;
  void AmSendZeroCopy(ucp_ep_h ep, uint16_t id, std::string header, const void* data, size_t length,
                      ucp_mem_h memh, bool eager = false, Done on_done = nullptr);
  // Receives a kept rendezvous payload into `dest`; the returned request completes when the
  // bytes have landed (check with RequestState, free with RequestFree). nullptr: done already.
  absl::StatusOr<void*> AmRecvData(void* desc, void* dest, size_t length, ucp_mem_h memh);
  // The same, reporting completion to `on_done` instead (on the progressing thread, or inside
  // this call); the request is freed here. `on_done` runs exactly once. May be called from
  // inside the message's handler, which then returns false (UCX owns the descriptor).
  void AmRecvDataThen(void* desc, void* dest, size_t length, ucp_mem_h memh, Done on_done);
  void AmDiscard(void* desc);
  // 1: completed, 0: in progress, -1: failed.
  static int RequestState(void* request);
  static void RequestFree(void* request);
  void RequestCancel(void* request);
  // Sleeps until the worker has events or `timeout` passes (needs a wakeup context). False:
  // events were pending already, so it did not sleep (progress them first).
  bool WaitForEvents(absl::Duration timeout);
  // For a thread that waits on this worker for its call's events (a client's transfer or
  // exchange): Progress(); once nothing has happened for the wait spin since `*idle_since`
  // (which it keeps up to date), also a sched_yield; and once the yield window has passed too,
  // a sleep on the worker's event fd until the next event (at most 1 ms at a time, never past
  // `until`). Waiting threads that outnumber the cores then leave the CPU to whoever must
  // produce the event: the daemon, or the other clients. Without a wakeup context it never
  // sleeps; with an infinite spin (the default) it only polls.
  using Clock = std::chrono::steady_clock;
  // `may_sleep` false: the caller's own transfers are in flight, which move only as fast as the
  // worker is progressed (tcp pushes a message's next bytes when polled): it yields instead of
  // sleeping, until nothing has happened for kInFlightPoll.
  unsigned ProgressWaiting(Clock::time_point* idle_since, absl::Time until,
                           bool may_sleep = true);
  static constexpr std::chrono::milliseconds kInFlightPoll{10};
  void SetWaitSpin(absl::Duration spin, absl::Duration yield = absl::ZeroDuration()) {
    wait_spin_ = absl::ToChronoNanoseconds(spin);
    wait_yield_ = absl::ToChronoNanoseconds(yield);
  }
  void Signal();

 private:
  Worker(std::shared_ptr<Context> ctx, ucp_worker_h w) : ctx_(std::move(ctx)), worker_(w) {}
  absl::Status InstallAmHandler(uint16_t id, std::unique_ptr<InstalledAmHandler> h);
  std::shared_ptr<Context> ctx_;
  ucp_worker_h worker_;
  std::string address_;
  int epoll_fd_ = -1;
  std::chrono::nanoseconds wait_spin_ = std::chrono::nanoseconds::max();
  std::chrono::nanoseconds wait_yield_{0};
  std::map<uint16_t, std::unique_ptr<InstalledAmHandler>> am_handlers_;
  std::unique_ptr<AmDropHandler> on_drop_;
  std::unique_ptr<InstalledAmHandler> unknown_ids_;  // shared by every id without a handler
  // Holds the watching endpoints of PeerFailure::kWatch, progressed every 64th Progress. A
  // worker of its own: in UCX 1.13 two endpoints of one worker to a peer that is not progressing
  // yet (one closed by its deadline meanwhile) could crash the peer's tcp transport.
  std::unique_ptr<Worker> watch_worker_;
  unsigned progress_calls_ = 0;
};

// Progresses a worker on a thread that sleeps when there is nothing to do, so an idle daemon
// costs no CPU on a 2-core machine.
class ProgressThread {
 public:
  // `busy_poll`: how long the thread keeps polling after the last event before it sleeps on
  // the worker's event fd. A wake-up costs tens of microseconds on a VM, more than a small
  // request's whole round trip; requests that come in bursts (an engine's per-layer fetches)
  // then find the thread awake. Zero: sleep as soon as there is nothing to do.
  explicit ProgressThread(Worker* worker, absl::Duration busy_poll = absl::ZeroDuration());
  ~ProgressThread();  // stops and joins
  void Stop();

  // For ThreadSanitizer only (a no-op in other builds). Bytes UCX writes into registered memory
  // on this thread for a peer (a software put over tcp, or shared memory without a mapped
  // arena) reach another thread's reader ordered only through the peer process: the peer sees
  // UCX acknowledge the write, then asks the reader (e.g. a gRPC Commit) to look. TSan cannot
  // follow that chain and reports a race. Called by such a reader before it reads: returns once
  // the progress call running now (if any) has returned, with every call up to it ordered
  // before the caller as TSan sees it. Waiting for the running call, not only the last finished
  // one, matters: the acknowledgement may leave before the call that wrote the bytes returns.
  void OrderAfterProgress();

  // The progress thread the caller runs on (a handler's), or null on any other thread.
  static ProgressThread* Current();

  // From a handler on this thread, when the peer it answered will be busy a while before its
  // next request: the next pass that finds nothing to do sleeps at once, skipping the busy-poll
  // window. On a small VM the scheduler packs this thread and the peer onto one core, and the
  // poll, once it holds the core, keeps it for a whole time slice (~110 us here), yield or not:
  // the peer's next copy waited that long.
  void SleepWhenIdle() { sleep_when_idle_ = true; }

 private:
  Worker* worker_;
  bool sleep_when_idle_ = false;  // this thread's only
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::thread::id id_;  // thread_'s, kept apart: Stop's join changes thread_ under readers
#if STRATA_TSAN
  std::atomic<uint64_t> passes_{0};  // progress calls returned (release: what they wrote)
#endif
};

// The size of UCX's tcp receive segments: UCX_TCP_RX_SEG_SIZE from the environment (UCX's
// memory units: 65536, 64K, 64kb, 1M), or UCX's default of 64 KiB when unset or unreadable. A
// setting in a ucx.conf file is not seen. An active message up to about this size reaches the
// receiver in one segment, which UCX hands to its handler without assembling fragments.
uint64_t TcpReceiveSegmentBytes();

class Endpoint {
 public:
  ~Endpoint();  // closes gracefully within a short deadline, forcibly after
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // Makes `packed_rkey` usable for RMA to the peer's memory through this endpoint.
  absl::Status SetRemoteKey(std::string_view packed_rkey);

  // Posts every op, then flushes; returns when all completed remotely, on the first error, or at
  // `deadline` (after which the endpoint is closed and every later call fails).
  absl::Status Transfer(std::span<const RmaOp> ops, absl::Time deadline);

  // Sends an active message, eagerly (the receiver gets it whole), asking for a reply endpoint;
  // returns once UCX has sent it or at `deadline`.
  absl::Status AmSend(uint16_t id, std::string_view header, std::string_view data,
                      absl::Time deadline);

  // Posts an active message (eager, asking for a reply endpoint) without waiting: the bytes are
  // copied and freed once UCX is done with them. Replies arrive through the worker's handlers.
  absl::Status AmPost(uint16_t id, std::string header, std::string data);

  // Sends [data, data+length) as an active message asking for a reply endpoint, without copying
  // it (rendezvous when large: the receiver pulls it). Returns the request to poll with
  // Worker::RequestState and free with Worker::RequestFree, or nullptr when it completed at
  // once; the bytes must stay untouched until then. `eager`: never rendezvous, so the receiver
  // has the whole message in its handler and handles it before any later message.
  absl::StatusOr<void*> AmSendAsync(uint16_t id, std::string header, const void* data,
                                    size_t length, ucp_mem_h memh, bool eager = false);

  // A local pointer to the peer's memory at `remote_address` when a shared-memory transport maps
  // it into this process (same node), else nullptr. Loads and stores through it replace RMA.
  // It stays valid until this Endpoint is destroyed, also after the endpoint failed or was
  // aborted (the mapping belongs to the remote key, which only the destructor releases).
  void* MapRemote(uint64_t remote_address) const;

  // Also true once the watching endpoint (PeerFailure::kWatch) saw the peer die.
  bool failed() const { return failed_.load() || (watch_ && watch_->failed_.load()); }
  // Closes the endpoint at once; outstanding requests on it complete with an error.
  void Abort() { ForceClose(); }
  // Whether a dead peer is reported on this endpoint, by UCX or by its watch (false on
  // shared-memory-only transports).
  bool peer_failure_detection() const { return peer_failure_detection_ || watch_ != nullptr; }
  // Whether this endpoint's active messages travel over tcp. UCX 1.13 names an endpoint's
  // transports only in its printed configuration (ucp_ep_print_info), which this reads; false
  // when that cannot be read.
  bool MessagesOverTcp() const;

 private:
  friend class Worker;
  Endpoint(Worker* worker, ucp_ep_h ep) : worker_(worker), ep_(ep) {}
  absl::Status Wait(void* request, absl::Time deadline, const char* what);
  void ForceClose();
  // `status` is a ucs_status_t.
  static void OnError(void* arg, ucp_ep_h ep, int status);
  // The ucs_status_t of the first failure seen here or by the watch (UCS_OK = 0).
  int error() const { return error_ != 0 || !watch_ ? error_ : watch_->error_; }

  Worker* worker_;
  ucp_ep_h ep_;
  ucp_rkey_h rkey_ = nullptr;
  std::atomic<bool> failed_{false};
  bool peer_failure_detection_ = false;
  int error_ = 0;  // the ucs_status_t of the first failure (UCS_OK = 0)
  std::unique_ptr<Endpoint> watch_;  // PeerFailure::kWatch: carries nothing, reports death
};

}  // namespace strata::transport
