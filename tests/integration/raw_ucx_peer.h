// A hostile UCX peer for tests: sends arbitrary active messages (any id, header, payload, eager or
// rendezvous, asking for a reply endpoint or not) to a worker address and closes its endpoint
// whenever the test says, with none of the checks transport::Endpoint makes.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "transport/ucx.h"

namespace strata::testing {

class RawUcxPeer {
 public:
  RawUcxPeer() {
    auto ctx = transport::Context::Create(/*wakeup=*/false);
    if (!ctx.ok()) return;
    ctx_ = *ctx;
    auto worker = transport::Worker::Create(ctx_);
    if (!worker.ok()) return;
    worker_ = std::move(*worker);
    // Replies (lookup, locate, pushed blocks) are counted and dropped.
    for (uint16_t id = 0; id < 64; ++id) {
      (void)worker_->SetAmRendezvousHandler(id, [this, id](const transport::AmMessage& m) {
        ++replies_;
        std::lock_guard<std::mutex> lock(reply_mu_);
        last_reply_[id] = {std::string(m.header), std::string(m.data)};
        if (all_replies_[id].size() < kKeptReplies) all_replies_[id].push_back(last_reply_[id]);
        return false;  // a rendezvous payload is left to UCX, which drops it
      });
    }
  }
  ~RawUcxPeer() { Close(); }

  bool ok() const { return worker_ != nullptr; }
  int replies() const { return replies_.load(); }
  // The header and data of the last reply with AM id `id` (empty when none came).
  std::pair<std::string, std::string> last_reply(uint16_t id) {
    std::lock_guard<std::mutex> lock(reply_mu_);
    return last_reply_[id];
  }

  // The header and data of every reply with AM id `id`, in arrival order (the first
  // kKeptReplies).
  static constexpr size_t kKeptReplies = 1024;
  std::vector<std::pair<std::string, std::string>> replies(uint16_t id) {
    std::lock_guard<std::mutex> lock(reply_mu_);
    return all_replies_[id];
  }

  // Connects (closing any endpoint it has). Peer-failure detection by default, where the
  // daemon's transports offer it (an authenticating daemon's shared memory does not): the daemon
  // is a separate process that may die under test. Without it UCX may pick shared-memory
  // transports (as libstrata's same-node clients do), which cannot detect a dead peer.
  bool Connect(std::string_view worker_address, bool detect_peer_failure = true) {
    if (detect_peer_failure && ConnectOnce(worker_address, true)) return true;
    return ConnectOnce(worker_address, false);
  }

  bool ConnectOnce(std::string_view worker_address, bool detect_peer_failure) {
    Close();
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
    p.err_mode = detect_peer_failure ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    p.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t) {
      static_cast<RawUcxPeer*>(arg)->failed_ = true;
    };
    p.err_handler.arg = this;
    failed_ = false;
    return ucp_ep_create(worker_->handle(), &p, &ep_) == UCS_OK;
  }

  enum Flags : uint32_t {
    kReply = UCP_AM_SEND_FLAG_REPLY,
    kEager = UCP_AM_SEND_FLAG_EAGER,
    kRndv = UCP_AM_SEND_FLAG_RNDV,
  };
  // Sends one message and progresses until UCX is done with it (or `wait` passes); false when
  // the send failed or did not complete.
  bool Send(uint16_t id, std::string_view header, std::string_view data, uint32_t flags,
            std::chrono::milliseconds wait = std::chrono::milliseconds(2000)) {
    if (ep_ == nullptr) return false;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = flags;
    return Wait(ucp_am_send_nbx(ep_, id, header.data(), header.size(), data.data(), data.size(),
                                &p),
                wait);
  }

  // Progresses for `d` (collecting replies).
  void Progress(std::chrono::milliseconds d) {
    const auto stop = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < stop) ucp_worker_progress(worker_->handle());
  }

  // Closes the endpoint at once, as a process that dies would: nothing more is read from it.
  void Close() {
    if (ep_ == nullptr) return;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* r = ucp_ep_close_nbx(ep_, &p);
    ep_ = nullptr;
    if (r == nullptr || UCS_PTR_IS_ERR(r)) return;
    const auto stop = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (ucp_request_check_status(r) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < stop)
      ucp_worker_progress(worker_->handle());
    ucp_request_free(r);
  }

  bool failed() const { return failed_.load(); }

  // A one-sided get (or put) of [local, local+length) at `remote` through the endpoint, with
  // `packed_rkey` (empty: a key this peer packs for its own memory, i.e. a forged one). True
  // when UCX reports it done within `wait`, flush included.
  bool Rma(bool put, void* local, size_t length, uint64_t remote, std::string packed_rkey = {},
           std::chrono::milliseconds wait = std::chrono::milliseconds(3000)) {
    if (ep_ == nullptr) return false;
    if (packed_rkey.empty()) {
      auto own = ctx_->Register(local, length);
      if (!own.ok()) return false;
      auto packed = (*own)->PackRkey();
      if (!packed.ok()) return false;
      packed_rkey = *packed;
      forged_.push_back(std::move(*own));
    }
    ucp_rkey_h rkey = nullptr;
    if (ucp_ep_rkey_unpack(ep_, packed_rkey.data(), &rkey) != UCS_OK) return false;
    ucp_request_param_t p{};
    void* r = put ? ucp_put_nbx(ep_, local, length, remote, rkey, &p)
                  : ucp_get_nbx(ep_, local, length, remote, rkey, &p);
    bool ok = !UCS_PTR_IS_ERR(r) && Wait(r, wait);
    if (ok) {
      ucp_request_param_t fp{};
      ok = Wait(ucp_ep_flush_nbx(ep_, &fp), wait);
    }
    ucp_rkey_destroy(rkey);
    return ok;
  }

 private:
  // Progresses until `r` completes (true when it succeeded) or `wait` passes (cancelled then).
  bool Wait(void* r, std::chrono::milliseconds wait) {
    if (r == nullptr) return true;
    if (UCS_PTR_IS_ERR(r)) return false;
    const auto stop = std::chrono::steady_clock::now() + wait;
    ucs_status_t s;
    while ((s = ucp_request_check_status(r)) == UCS_INPROGRESS &&
           std::chrono::steady_clock::now() < stop)
      ucp_worker_progress(worker_->handle());
    if (s == UCS_INPROGRESS) ucp_request_cancel(worker_->handle(), r);
    ucp_request_free(r);
    return s == UCS_OK;
  }

  std::shared_ptr<transport::Context> ctx_;
  std::vector<std::unique_ptr<transport::MemoryRegion>> forged_;
  std::unique_ptr<transport::Worker> worker_;
  ucp_ep_h ep_ = nullptr;
  std::atomic<bool> failed_{false};
  std::atomic<int> replies_{0};
  std::mutex reply_mu_;
  std::map<uint16_t, std::pair<std::string, std::string>> last_reply_;
  std::map<uint16_t, std::vector<std::pair<std::string, std::string>>> all_replies_;
};

}  // namespace strata::testing
