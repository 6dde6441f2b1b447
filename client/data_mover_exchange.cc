// Requests and replies on the data-plane endpoint: the control calls stratad answers on its
// progress thread (Lookup, Acquire, Reserve, Commit, ... by message; common/am_wire.h), one at
// a time per endpoint, each waited for with its own deadline.
#include <chrono>
#include <future>

#include "client/data_mover.h"
#include "client/internal/data_mover_waits.h"
#include "common/am_wire.h"
#include "common/status_macros.h"

namespace strata::client {

// ucx_mu_ held. Posts `follow_up` behind what the endpoint carries already, its reply awaited in
// `reply` (installed as exchange_wait_).
absl::Status DataMover::PostFollowUp(FollowUp* follow_up, ExchangeWait* reply) {
  if (follow_up->header.size() < 8)
    return absl::InvalidArgumentError("a request header starts with its id");
  reply->request_id = next_request_id_++;
  reply->reply_am = follow_up->reply_am;
  am_wire::PutU64(follow_up->header.data(), reply->request_id);
  exchange_wait_ = reply;
  return ep_->AmPost(follow_up->request_am, std::move(follow_up->header),
                     std::move(follow_up->data));
}

// Without map_mu_: Exchange asks for it (through its probe) while holding ucx_mu_.
uint64_t DataMover::instance_id() const { return instance_id_.load(); }

absl::StatusOr<DataMover::Reply> DataMover::Exchange(uint16_t request_am, std::string header,
                                                     std::string data, uint16_t reply_am,
                                                     absl::Duration timeout,
                                                     const std::function<bool()>& answering) {
  if (header.size() < 8) return absl::InvalidArgumentError("a request header starts with its id");
  // The probe (a gRPC call) runs on its own thread while this one goes on progressing the
  // worker, so a reply that comes meanwhile ends the wait; declared before the lock, a probe
  // still running when the reply came is waited for only once ucx_mu_ is free again.
  std::future<bool> probe;
  std::lock_guard<std::mutex> lock(ucx_mu_);
  // ep_ changes only under ucx_mu_ (and map_mu_), so reading it here needs no more.
  if (!ep_ || ep_->failed()) return absl::FailedPreconditionError("no working data-plane endpoint");
  const absl::Time deadline = absl::Now() + timeout;
  ExchangeWait wait;
  wait.request_id = next_request_id_++;
  wait.reply_am = reply_am;
  am_wire::PutU64(header.data(), wait.request_id);
  exchange_wait_ = &wait;
  // Posted, not sent with a deadline: a send that outlives its deadline would have to close the
  // endpoint (the bytes are the caller's), and a daemon that stalls for a moment must cost a
  // lookup its fast path, not every other user of the endpoint their connection. The posted
  // request owns its bytes until UCX is done with them.
  absl::Status sent = ep_->AmPost(request_am, std::move(header), std::move(data));
  unsigned spins = 0;
  auto idle_since = transport::Worker::Clock::now();
  absl::Time probe_at = answering ? absl::Now() + kProbeAfter : absl::InfiniteFuture();
  bool gone = false;
  while (sent.ok() && !wait.done) {
    worker_->ProgressWaiting(&idle_since, deadline);
    if (ep_->failed() && !wait.done) {
      gone = true;
      break;
    }
    if ((++spins & 63) != 0) continue;
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    if (now >= probe_at) {
      probe_at = absl::InfiniteFuture();
      probe = std::async(std::launch::async, answering);
    }
    if (probe.valid() && probe.wait_for(std::chrono::seconds(0)) == std::future_status::ready &&
        (gone = !probe.get()))
      break;
  }
  exchange_wait_ = nullptr;
  STRATA_RETURN_IF_ERROR(sent);
  if (gone && !wait.done)
    return absl::UnavailableError("the stratad that was sent the request is gone");
  if (!wait.done) return absl::DeadlineExceededError("no reply to the active message in time");
  return std::move(wait.reply);
}

absl::Status DataMover::Post(uint16_t am, std::string header, std::string data) {
  std::lock_guard<std::mutex> lock(ucx_mu_);
  if (!ep_ || ep_->failed()) return absl::FailedPreconditionError("no working data-plane endpoint");
  STRATA_RETURN_IF_ERROR(ep_->AmPost(am, std::move(header), std::move(data)));
  worker_->Progress();  // starts the send; later progress (any transfer, any exchange) ends it
  return absl::OkStatus();
}

void DataMover::OnExchangeReply(uint16_t reply_am, const transport::AmMessage& m) {
  if (!exchange_wait_ || exchange_wait_->reply_am != reply_am || m.header.size() < 8 ||
      am_wire::GetU64(m.header.data()) != exchange_wait_->request_id || exchange_wait_->done)
    return;  // a late reply to an exchange that already gave up, or a second one
  exchange_wait_->reply.header.assign(m.header);
  exchange_wait_->reply.data.assign(m.data);
  exchange_wait_->done = true;
  if (exchange_wait_->on_reply) exchange_wait_->on_reply(exchange_wait_->reply);
}

}  // namespace strata::client
