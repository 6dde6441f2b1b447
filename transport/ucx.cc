#include "transport/ucx.h"

#include <sched.h>
#include <sys/epoll.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace strata::transport {
namespace {

absl::Status UcsError(const char* what, ucs_status_t s) {
  return absl::UnavailableError(absl::StrCat("UCX ", what, ": ", ucs_status_string(s)));
}

}  // namespace

// ---------------------------------------------------------------------------- MemoryRegion

MemoryRegion::~MemoryRegion() { ucp_mem_unmap(ctx_, memh_); }

absl::StatusOr<std::string> MemoryRegion::PackRkey() const {
  void* buf = nullptr;
  size_t len = 0;
  ucs_status_t s = ucp_rkey_pack(ctx_, memh_, &buf, &len);
  if (s != UCS_OK) return UcsError("rkey_pack", s);
  std::string out(static_cast<char*>(buf), len);
  ucp_rkey_buffer_release(buf);
  return out;
}

// ---------------------------------------------------------------------------- Context

absl::StatusOr<std::string> TransportsWithoutTcp(const char* ucx_tls) {
  if (ucx_tls == nullptr || *ucx_tls == '\0') return std::string("^tcp");
  const absl::string_view tls(ucx_tls);
  const bool exclusion = tls.front() == '^';
  std::vector<std::string> kept;
  bool had_tcp = false;
  for (absl::string_view name : absl::StrSplit(tls.substr(exclusion ? 1 : 0), ',',
                                               absl::SkipEmpty())) {
    // "tcp:aux" names tcp too: the part before ':' is the transport.
    const absl::string_view transport = name.substr(0, name.find(':'));
    if (transport == "tcp") {
      had_tcp = true;
      if (!exclusion) continue;
    }
    if (!exclusion && transport == "all")
      return absl::InvalidArgumentError(
          "UCX_TLS=" + std::string(tls) +
          " includes tcp through 'all'; name the transports to use, or exclude tcp with ^tcp");
    kept.emplace_back(name);
  }
  if (exclusion) {
    if (!had_tcp) kept.emplace_back("tcp");
    return "^" + absl::StrJoin(kept, ",");
  }
  if (kept.empty())
    return absl::InvalidArgumentError("UCX_TLS=" + std::string(tls) +
                                      " leaves no transport once tcp is taken out");
  return absl::StrJoin(kept, ",");
}

absl::StatusOr<std::shared_ptr<Context>> Context::Create(const ContextOptions& options) {
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return UcsError("config_read", s);
  auto modify = [&](const char* name, const std::string& value) -> absl::Status {
    const ucs_status_t m = ucp_config_modify(config, name, value.c_str());
    if (m == UCS_OK) return absl::OkStatus();
    return UcsError(absl::StrCat("config_modify(", name, "=", value, ")").c_str(), m);
  };
  absl::Status modified;
  // UCX's default order without md:posix (and without md:*, which would bring it back).
  if (options.unnamed_allocations && std::getenv("UCX_ALLOC_PRIO") == nullptr)
    modified = modify("ALLOC_PRIO", "md:sysv,huge,thp,mmap,heap");
  const char* env_tls = std::getenv("UCX_TLS");
  if (modified.ok() && !options.tcp) {
    auto tls = TransportsWithoutTcp(env_tls);
    modified = tls.ok() ? modify("TLS", *tls) : tls.status();
  } else if (modified.ok() && env_tls != nullptr && *env_tls == '\0') {
    // An exported but empty UCX_TLS means "not chosen" to an operator; UCX would refuse it as
    // an empty list, so it gets UCX's default instead.
    modified = modify("TLS", "all");
  }
  if (!modified.ok()) {
    ucp_config_release(config);
    return modified;
  }
  const bool wakeup = options.wakeup, rma = options.rma;
  ucp_params_t params{};
  params.field_mask =
      UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features =
      (rma ? UCP_FEATURE_RMA : 0) | UCP_FEATURE_AM | (wakeup ? UCP_FEATURE_WAKEUP : 0);
  params.name = "strata";
  params.mt_workers_shared = options.workers_on_threads ? 1 : 0;
  ucp_context_h ctx = nullptr;
  s = ucp_init(&params, config, &ctx);
  ucp_config_release(config);
  if (s != UCS_OK) return UcsError("init", s);
  return std::shared_ptr<Context>(new Context(ctx, wakeup));
}

Context::~Context() { ucp_cleanup(ctx_); }

absl::StatusOr<std::unique_ptr<MemoryRegion>> Context::Allocate(size_t bytes) {
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS |
                 UCP_MEM_MAP_PARAM_FIELD_ADDRESS;
  p.address = nullptr;
  p.length = bytes;
  p.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h memh = nullptr;
  ucs_status_t s = ucp_mem_map(ctx_, &p, &memh);
  if (s != UCS_OK) return UcsError(absl::StrCat("mem_map(allocate ", bytes, ")").c_str(), s);
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  s = ucp_mem_query(memh, &attr);
  if (s != UCS_OK) {
    ucp_mem_unmap(ctx_, memh);
    return UcsError("mem_query", s);
  }
  return std::unique_ptr<MemoryRegion>(
      new MemoryRegion(ctx_, memh, static_cast<uint8_t*>(attr.address), attr.length));
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> Context::Register(void* data, size_t bytes) {
  ucp_mem_map_params_t p{};
  p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  p.address = data;
  p.length = bytes;
  ucp_mem_h memh = nullptr;
  ucs_status_t s = ucp_mem_map(ctx_, &p, &memh);
  if (s != UCS_OK) return UcsError("mem_map(register)", s);
  return std::unique_ptr<MemoryRegion>(
      new MemoryRegion(ctx_, memh, static_cast<uint8_t*>(data), bytes));
}

// ---------------------------------------------------------------------------- Worker

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(std::shared_ptr<Context> ctx) {
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucp_worker_h w = nullptr;
  ucs_status_t s = ucp_worker_create(ctx->handle(), &wp, &w);
  if (s != UCS_OK) return UcsError("worker_create", s);
  std::unique_ptr<Worker> worker(new Worker(std::move(ctx), w));
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  s = ucp_worker_get_address(w, &addr, &len);
  if (s != UCS_OK) return UcsError("worker_get_address", s);
  worker->address_.assign(reinterpret_cast<char*>(addr), len);
  ucp_worker_release_address(w, addr);
  return worker;
}

namespace {

ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data, size_t length,
                  const ucp_am_recv_param_t* param) {
  AmMessage m;
  m.header = {static_cast<const char*>(header), header_length};
  m.length = length;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) m.reply_ep = param->reply_ep;
  const auto& h = *static_cast<const Worker::InstalledAmHandler*>(arg);
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    m.rendezvous = true;
    if (!h.takes_rendezvous) {  // dropped: the handler expects eager messages
      if (h.on_drop) (*h.on_drop)(h.id, m, "rendezvous payload for an eager-only handler");
      return UCS_OK;
    }
    m.desc = data;
    // Kept: the handler receives (or discards) it later. Not kept: UCX drops it.
    return h.handle(m) ? UCS_INPROGRESS : UCS_OK;
  }
  m.data = {static_cast<const char*>(data), length};
  h.handle(m);
  return UCS_OK;
}

struct PendingReply {
  std::string header, data;
};

void OnReplySent(void* request, ucs_status_t, void* user_data) {
  delete static_cast<PendingReply*>(user_data);
  ucp_request_free(request);
}

// Sends an eager active message whose bytes this side owns until UCX is done with them.
ucs_status_t PostOwned(ucp_ep_h ep, uint16_t id, std::string header, std::string data,
                       uint32_t flags) {
  auto* pending = new PendingReply{std::move(header), std::move(data)};
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = OnReplySent;
  p.user_data = pending;
  p.flags = flags | UCP_AM_SEND_FLAG_EAGER;
  void* r = ucp_am_send_nbx(ep, id, pending->header.data(), pending->header.size(),
                            pending->data.data(), pending->data.size(), &p);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) return UCS_OK;  // completes in OnReplySent
  delete pending;
  return r == nullptr ? UCS_OK : UCS_PTR_STATUS(r);
}

struct ZeroCopySend {
  std::string header;
  Worker::Done on_done;
};

void OnZeroCopySent(void* request, ucs_status_t status, void* user_data) {
  auto* send = static_cast<ZeroCopySend*>(user_data);
  if (send->on_done) send->on_done(status == UCS_OK);
  delete send;
  ucp_request_free(request);
}

void OnRecvData(void*, ucs_status_t, size_t, void*) {}

void OnRecvDataThen(void* request, ucs_status_t status, size_t, void* user_data) {
  auto* done = static_cast<Worker::Done*>(user_data);
  (*done)(status == UCS_OK);
  delete done;
  ucp_request_free(request);
}

struct AsyncSend {
  std::string header;
};

void OnAsyncSent(void*, ucs_status_t, void* user_data) {
  delete static_cast<AsyncSend*>(user_data);  // the caller polls and frees the request
}

}  // namespace

void Worker::AmSendZeroCopy(ucp_ep_h ep, uint16_t id, std::string header, const void* data,
                            size_t length, ucp_mem_h memh, bool eager, Done on_done) {
  if (ep == nullptr) {
    if (on_done) on_done(false);
    return;
  }
  auto* send = new ZeroCopySend{std::move(header), std::move(on_done)};
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  if (memh) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = memh;
  }
  if (eager) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
  }
  p.cb.send = OnZeroCopySent;
  p.user_data = send;
  void* r = ucp_am_send_nbx(ep, id, send->header.data(), send->header.size(), data, length, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    if (send->on_done) send->on_done(r == nullptr);
    delete send;
  }
}

void Worker::AmRecvDataThen(void* desc, void* dest, size_t length, ucp_mem_h memh,
                            Done on_done) {
  auto* done = new Done(std::move(on_done));
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = OnRecvDataThen;
  p.user_data = done;
  if (memh) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = memh;
  }
  void* r = ucp_am_recv_data_nbx(worker_, desc, dest, length, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    (*done)(r == nullptr);
    delete done;
  }
}

absl::StatusOr<void*> Worker::AmRecvData(void* desc, void* dest, size_t length, ucp_mem_h memh) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
  p.cb.recv_am = OnRecvData;
  if (memh) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = memh;
  }
  void* r = ucp_am_recv_data_nbx(worker_, desc, dest, length, &p);
  if (UCS_PTR_IS_ERR(r)) return UcsError("am_recv_data", UCS_PTR_STATUS(r));
  return r;
}

int Worker::RequestState(void* request) {
  ucs_status_t s = ucp_request_check_status(request);
  if (s == UCS_INPROGRESS) return 0;
  return s == UCS_OK ? 1 : -1;
}

absl::Status Worker::SetAmHandler(uint16_t id, AmHandler handler) {
  auto h = std::make_unique<InstalledAmHandler>();
  h->handle = [handler = std::move(handler)](const AmMessage& m) {
    handler(m);
    return false;
  };
  return InstallAmHandler(id, std::move(h));
}

absl::Status Worker::SetAmRendezvousHandler(uint16_t id, AmRendezvousHandler handler) {
  auto h = std::make_unique<InstalledAmHandler>();
  h->handle = std::move(handler);
  h->takes_rendezvous = true;
  return InstallAmHandler(id, std::move(h));
}

namespace {
// Routes active messages of `id` to OnAm with `arg` (an InstalledAmHandler).
absl::Status SetRecvHandler(ucp_worker_h worker, uint16_t id, void* arg) {
  ucp_am_handler_param_t p{};
  p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                 UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  p.id = id;
  p.cb = OnAm;
  p.arg = arg;
  p.flags = UCP_AM_FLAG_WHOLE_MSG;
  ucs_status_t s = ucp_worker_set_am_recv_handler(worker, &p);
  return s == UCS_OK ? absl::OkStatus() : UcsError("set_am_recv_handler", s);
}
}  // namespace

absl::Status Worker::SetAmDropHandler(AmDropHandler on_drop) {
  on_drop_ = std::make_unique<AmDropHandler>(std::move(on_drop));
  unknown_ids_ = std::make_unique<InstalledAmHandler>();
  unknown_ids_->on_drop = on_drop_.get();
  unknown_ids_->handle = [drop = on_drop_.get()](const AmMessage& m) {
    (*drop)(kUnknownAmId, m, "no handler for this active message id");
    return false;
  };
  // UCX keeps one small entry per id up to the largest registered, so all 65536 cost ~1.5 MiB.
  for (uint32_t id = 0; id <= 0xffff; ++id) {
    if (am_handlers_.contains(static_cast<uint16_t>(id))) continue;
    STRATA_RETURN_IF_ERROR(SetRecvHandler(worker_, static_cast<uint16_t>(id), unknown_ids_.get()));
  }
  return absl::OkStatus();
}

absl::Status Worker::InstallAmHandler(uint16_t id, std::unique_ptr<InstalledAmHandler> h) {
  h->id = id;
  h->on_drop = on_drop_.get();
  STRATA_RETURN_IF_ERROR(SetRecvHandler(worker_, id, h.get()));
  am_handlers_[id] = std::move(h);
  return absl::OkStatus();
}

void Worker::AmReply(ucp_ep_h reply_ep, uint16_t id, std::string header, std::string data) {
  if (reply_ep == nullptr) return;
  (void)PostOwned(reply_ep, id, std::move(header), std::move(data), 0);  // a lost reply times out
}

Worker::~Worker() {
  if (epoll_fd_ >= 0) close(epoll_fd_);
  ucp_worker_destroy(worker_);
}

std::string Worker::TransportSummary() const {
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_NAME;
  ucp_worker_query(worker_, &attr);
  // UCX 1.13 does not list transports through the API; UCX_TLS (or "auto") is what the operator
  // asked for, and `ucx_info -e` shows what was chosen.
  const char* tls = getenv("UCX_TLS");
  return tls ? tls : "auto";
}

bool Worker::WaitForEvents(absl::Duration timeout) {
  if (epoll_fd_ < 0) {
    int efd = -1;
    if (ucp_worker_get_efd(worker_, &efd) != UCS_OK) {
      usleep(static_cast<useconds_t>(absl::ToInt64Microseconds(timeout)));
      return true;
    }
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = efd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, efd, &ev);
  }
  if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) return false;  // events already pending
  epoll_event ev{};
  epoll_wait(epoll_fd_, &ev, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
  return true;
}

uint64_t TcpReceiveSegmentBytes() {
  constexpr uint64_t kUcxDefault = 64 << 10;
  const char* env = std::getenv("UCX_TCP_RX_SEG_SIZE");
  if (env == nullptr) return kUcxDefault;
  std::string_view v(env);
  uint64_t n = 0;
  size_t i = 0;
  for (; i < v.size() && std::isdigit(static_cast<unsigned char>(v[i])) && n < (1ull << 40); ++i)
    n = n * 10 + static_cast<uint64_t>(v[i] - '0');
  if (i == 0) return kUcxDefault;
  if (i < v.size()) {
    switch (std::tolower(static_cast<unsigned char>(v[i]))) {
      case 'k': n <<= 10; ++i; break;
      case 'm': n <<= 20; ++i; break;
      case 'g': n <<= 30; ++i; break;
      default: break;
    }
  }
  if (i < v.size() && std::tolower(static_cast<unsigned char>(v[i])) == 'b') ++i;
  return i == v.size() && n > 0 ? n : kUcxDefault;
}

bool Endpoint::MessagesOverTcp() const {
  char* text = nullptr;
  size_t length = 0;
  FILE* out = open_memstream(&text, &length);
  if (out == nullptr) return false;
  ucp_ep_print_info(ep_, out);
  std::fclose(out);
  // A lane reads "lane[0]:  1:tcp/lo.0 md[1]  -> md[1]/tcp/sysdev[255] am am_bw#0 keepalive":
  // its transport after the resource index, its roles after the arrow.
  bool tcp = false, found = false;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text, length), '\n')) {
    const size_t lane = line.find("lane[");
    const size_t arrow = line.find("->");
    if (lane == absl::string_view::npos || arrow == absl::string_view::npos) continue;
    const std::vector<absl::string_view> roles =
        absl::StrSplit(line.substr(arrow), ' ', absl::SkipEmpty());
    if (std::find(roles.begin(), roles.end(), "am") == roles.end()) continue;
    const std::vector<absl::string_view> words =
        absl::StrSplit(line.substr(lane, arrow - lane), ' ', absl::SkipEmpty());
    if (words.size() < 2) continue;
    const absl::string_view resource = words[1];  // "1:tcp/lo.0"
    const size_t colon = resource.find(':'), slash = resource.find('/');
    if (colon == absl::string_view::npos || slash == absl::string_view::npos || slash < colon)
      continue;
    found = true;
    tcp = resource.substr(colon + 1, slash - colon - 1) == "tcp";
    break;
  }
  std::free(text);
  return found && tcp;
}

absl::StatusOr<std::unique_ptr<Endpoint>> Worker::Connect(std::string_view remote_address,
                                                          PeerFailure peer_failure) {
  if (peer_failure == PeerFailure::kWatch) {
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Endpoint> ep,
                            Connect(remote_address, PeerFailure::kIgnore));
    if (!watch_worker_) {
      auto made = Worker::Create(ctx_);
      if (!made.ok()) return ep;  // deadlines alone, as with kIgnore
      watch_worker_ = std::move(*made);
    }
    auto watch = watch_worker_->Connect(remote_address, PeerFailure::kDetect);
    // No transport that detects reaches the peer: deadlines alone, as with kIgnore.
    if (watch.ok() && (*watch)->peer_failure_detection_) ep->watch_ = std::move(*watch);
    return ep;
  }
  ucs_status_t s = UCS_OK;
  const auto modes = peer_failure == PeerFailure::kDetect
                         ? std::array{UCP_ERR_HANDLING_MODE_PEER, UCP_ERR_HANDLING_MODE_NONE}
                         : std::array{UCP_ERR_HANDLING_MODE_NONE, UCP_ERR_HANDLING_MODE_NONE};
  for (ucp_err_handling_mode_t mode : modes) {
    std::unique_ptr<Endpoint> ep(new Endpoint(this, nullptr));
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.address = reinterpret_cast<const ucp_address_t*>(remote_address.data());
    p.err_mode = mode;
    if (mode == UCP_ERR_HANDLING_MODE_PEER) {
      p.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
      p.err_handler.cb = [](void* arg, ucp_ep_h ep, ucs_status_t status) {
        Endpoint::OnError(arg, ep, status);
      };
      p.err_handler.arg = ep.get();
    }
    s = ucp_ep_create(worker_, &p, &ep->ep_);
    if (s == UCS_OK) {
      ep->peer_failure_detection_ = mode == UCP_ERR_HANDLING_MODE_PEER;
      return ep;
    }
  }
  return UcsError("ep_create", s);
}

// ---------------------------------------------------------------------------- ProgressThread

namespace {
thread_local ProgressThread* t_current_progress = nullptr;
}  // namespace

ProgressThread* ProgressThread::Current() { return t_current_progress; }

ProgressThread::ProgressThread(Worker* worker, absl::Duration busy_poll) : worker_(worker) {
  thread_ = std::thread([this, busy_poll] {
    t_current_progress = this;
    const auto window = absl::ToChronoNanoseconds(busy_poll);
    auto last_event = std::chrono::steady_clock::now();
    while (!stop_.load(std::memory_order_relaxed)) {
      const unsigned events = worker_->Progress();
#if STRATA_TSAN
      passes_.fetch_add(1, std::memory_order_release);
#endif
      if (events != 0) {
        last_event = std::chrono::steady_clock::now();
        continue;
      }
      if (!sleep_when_idle_ && std::chrono::steady_clock::now() - last_event < window) {
        // Polls between yields: clients waiting on this daemon's answers (more of them than
        // cores, on a small node) get the core at once, and with none the yield returns at once.
        sched_yield();
        continue;
      }
      // Woken, or events were pending: poll a while before sleeping (unless asked to sleep
      // and it has not yet).
      if (worker_->WaitForEvents(absl::Milliseconds(100))) sleep_when_idle_ = false;
      last_event = std::chrono::steady_clock::now();
    }
  });
  id_ = thread_.get_id();
}

ProgressThread::~ProgressThread() { Stop(); }

void ProgressThread::OrderAfterProgress() {
#if STRATA_TSAN
  if (std::this_thread::get_id() == id_) return;  // this thread's own writes are in order
  const uint64_t seen = passes_.load(std::memory_order_acquire);
  // The signal wakes a thread asleep on the worker's event fd, whose next call then returns.
  while (passes_.load(std::memory_order_acquire) == seen && !stop_.load()) {
    worker_->Signal();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
#endif
}

void ProgressThread::Stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  worker_->Signal();
  thread_.join();
}

// ---------------------------------------------------------------------------- Endpoint

void Endpoint::OnError(void* arg, ucp_ep_h, int status) {
  auto* self = static_cast<Endpoint*>(arg);
  self->error_ = status;
  self->failed_ = true;
}

absl::Status Endpoint::SetRemoteKey(std::string_view packed_rkey) {
  if (failed()) return UcsError("endpoint", static_cast<ucs_status_t>(error()));
  if (rkey_) ucp_rkey_destroy(rkey_);
  rkey_ = nullptr;
  ucs_status_t s = ucp_ep_rkey_unpack(ep_, packed_rkey.data(), &rkey_);
  if (s != UCS_OK) return UcsError("rkey_unpack", s);
  return absl::OkStatus();
}

void* Endpoint::MapRemote(uint64_t remote_address) const {
  if (rkey_ == nullptr || failed() || ep_ == nullptr) return nullptr;
  void* local = nullptr;
  if (ucp_rkey_ptr(rkey_, remote_address, &local) != UCS_OK) return nullptr;
  return local;
}

absl::Status Endpoint::Wait(void* request, absl::Time deadline, const char* what) {
  if (request == nullptr) return absl::OkStatus();
  if (UCS_PTR_IS_ERR(request)) return UcsError(what, UCS_PTR_STATUS(request));
  ucs_status_t s;
  unsigned spins = 0;
  auto idle_since = Worker::Clock::now();
  while ((s = ucp_request_check_status(request)) == UCS_INPROGRESS) {
    worker_->ProgressWaiting(&idle_since, deadline, /*may_sleep=*/false);
    if ((++spins & 255) == 0 && absl::Now() >= deadline) {
      ucp_request_free(request);  // released by UCX once the forced close completes it
      ForceClose();
      return absl::DeadlineExceededError(absl::StrCat("UCX ", what, " did not complete in time"));
    }
    if (watch_ && watch_->failed_) {  // UCX fails the request itself where it detects
      ucp_request_free(request);
      ForceClose();
      return UcsError(what, static_cast<ucs_status_t>(error()));
    }
  }
  ucp_request_free(request);
  if (s != UCS_OK) {
    failed_ = true;
    return UcsError(what, s);
  }
  return absl::OkStatus();
}

absl::Status Endpoint::Transfer(std::span<const RmaOp> ops, absl::Time deadline) {
  if (failed() || ep_ == nullptr)
    return absl::UnavailableError(absl::StrCat(
        "UCX endpoint is closed: ", ucs_status_string(static_cast<ucs_status_t>(error()))));
  if (!rkey_) return absl::FailedPreconditionError("no remote key set on the endpoint");
  std::vector<void*> pending;
  pending.reserve(ops.size());
  absl::Status first_error;
  for (const RmaOp& op : ops) {
    ucp_request_param_t p{};
    if (op.local_memh) {
      p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
      p.memh = op.local_memh;
    }
    void* r = op.kind == RmaOp::kGet
                  ? ucp_get_nbx(ep_, op.local, op.length, op.remote_address, rkey_, &p)
                  : ucp_put_nbx(ep_, op.local, op.length, op.remote_address, rkey_, &p);
    if (UCS_PTR_IS_ERR(r)) {
      first_error = UcsError(op.kind == RmaOp::kGet ? "get" : "put", UCS_PTR_STATUS(r));
      break;
    }
    if (r != nullptr) pending.push_back(r);
  }
  // Completion of a put request only frees the source buffer; the flush guarantees the bytes
  // reached the peer's memory, which Commit relies on.
  ucp_request_param_t fp{};
  absl::Status flushed = Wait(ucp_ep_flush_nbx(ep_, &fp), deadline, "flush");
  for (void* r : pending) {
    absl::Status s = Wait(r, deadline, "rma");
    if (first_error.ok()) first_error = s;
  }
  if (first_error.ok()) first_error = flushed;
  if (first_error.ok() && failed())
    first_error = UcsError("peer", static_cast<ucs_status_t>(error()));
  return first_error;
}

absl::Status Endpoint::AmSend(uint16_t id, std::string_view header, std::string_view data,
                              absl::Time deadline) {
  if (failed() || ep_ == nullptr)
    return absl::UnavailableError(absl::StrCat(
        "UCX endpoint is closed: ", ucs_status_string(static_cast<ucs_status_t>(error()))));
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
  return Wait(ucp_am_send_nbx(ep_, id, header.data(), header.size(), data.data(), data.size(), &p),
              deadline, "am_send");
}

absl::Status Endpoint::AmPost(uint16_t id, std::string header, std::string data) {
  if (failed() || ep_ == nullptr)
    return absl::UnavailableError(absl::StrCat(
        "UCX endpoint is closed: ", ucs_status_string(static_cast<ucs_status_t>(error()))));
  ucs_status_t st = PostOwned(ep_, id, std::move(header), std::move(data), UCP_AM_SEND_FLAG_REPLY);
  return st == UCS_OK ? absl::OkStatus() : UcsError("am_send", st);
}

absl::StatusOr<void*> Endpoint::AmSendAsync(uint16_t id, std::string header, const void* data,
                                            size_t length, ucp_mem_h memh, bool eager) {
  if (failed() || ep_ == nullptr)
    return absl::UnavailableError(absl::StrCat(
        "UCX endpoint is closed: ", ucs_status_string(static_cast<ucs_status_t>(error()))));
  auto* send = new AsyncSend{std::move(header)};
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = OnAsyncSent;
  p.user_data = send;
  p.flags = UCP_AM_SEND_FLAG_REPLY | (eager ? UCP_AM_SEND_FLAG_EAGER : 0);
  if (memh) {
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = memh;
  }
  void* r = ucp_am_send_nbx(ep_, id, send->header.data(), send->header.size(), data, length, &p);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    delete send;
    if (r != nullptr) return UcsError("am_send", UCS_PTR_STATUS(r));
    return nullptr;
  }
  return r;
}

void Endpoint::ForceClose() {
  failed_ = true;
  if (ep_ == nullptr) return;
  // The remote key stays until the destructor: on shared memory it holds the mapping MapRemote
  // handed out, which other threads may be copying through right now.
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* r = ucp_ep_close_nbx(ep_, &p);
  ep_ = nullptr;
  if (r == nullptr || UCS_PTR_IS_ERR(r)) return;
  absl::Time stop = absl::Now() + absl::Seconds(2);
  while (ucp_request_check_status(r) == UCS_INPROGRESS && absl::Now() < stop) worker_->Progress();
  ucp_request_free(r);
}

Endpoint::~Endpoint() {
  if (failed() || ep_ == nullptr) {
    ForceClose();
    if (rkey_) ucp_rkey_destroy(rkey_);  // a released key needs no endpoint
    return;
  }
  if (rkey_) {
    ucp_rkey_destroy(rkey_);
    rkey_ = nullptr;
  }
  ucp_request_param_t p{};
  void* r = ucp_ep_close_nbx(ep_, &p);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
    absl::Time stop = absl::Now() + absl::Milliseconds(500);
    while (ucp_request_check_status(r) == UCS_INPROGRESS && absl::Now() < stop) worker_->Progress();
    // A peer that never answers leaves the close pending; UCX releases it on completion.
    ucp_request_free(r);
  }
  ep_ = nullptr;
}

unsigned Worker::Progress() {
  // The watch worker only ever reports a death: a poll now and then finds it soon enough.
  if (watch_worker_ && (++progress_calls_ & 63) == 0) watch_worker_->Progress();
  return ucp_worker_progress(worker_);
}

unsigned Worker::ProgressWaiting(Clock::time_point* idle_since, absl::Time until,
                                 bool may_sleep) {
  const unsigned events = Progress();
  const Clock::time_point now = Clock::now();
  if (events != 0) {
    *idle_since = now;
    return events;
  }
  const auto idle = now - *idle_since;
  if (idle < wait_spin_) return 0;
  // Then polls between yields: a thread that must produce the event (the daemon's progress
  // thread, another client) gets this core at once if it waits for one, and if none does the
  // yield returns at once. The caller's own transfers keep it polling, unless they have not
  // moved for kInFlightPoll (a stalled peer: the rest of the wait is spent asleep).
  if (idle - wait_spin_ < wait_yield_ || !ctx_->wakeup() || (!may_sleep && idle < kInFlightPoll)) {
    sched_yield();
    return 0;
  }
  const absl::Duration left = until - absl::Now();
  // epoll counts whole milliseconds: shorter waits poll, as before the spin ran out.
  if (left >= absl::Milliseconds(1)) WaitForEvents(absl::Milliseconds(1));
  return 0;
}
void Worker::AmDiscard(void* desc) { ucp_am_data_release(worker_, desc); }
void Worker::RequestFree(void* request) { ucp_request_free(request); }
void Worker::RequestCancel(void* request) { ucp_request_cancel(worker_, request); }
void Worker::Signal() { ucp_worker_signal(worker_); }

}  // namespace strata::transport
