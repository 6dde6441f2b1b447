#include "daemon/cluster/calibration_sync.h"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "daemon/cluster/call_group.h"

namespace strata::daemon {
namespace {

std::vector<std::string> OtherAddresses(ClusterContext& ctx) {
  std::vector<std::string> out;
  auto ring = ctx.ring.Get();
  if (!ring) return out;
  for (const auto& n : ring->view.nodes)
    if (n.id != ctx.self.id && !n.address.empty() && out.size() < kCalibrationFanout)
      out.push_back(n.address);
  return out;
}

}  // namespace

absl::StatusOr<v1::GetCalibrationResponse> CalibrationSync::Fetch(const NamespaceId& ns,
                                                                  uint64_t id,
                                                                  absl::Time deadline) {
  // Shared with the callbacks, which may outlive this call (and the cluster) when it returns on
  // a first answer or at the deadline: they touch nothing else.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    size_t pending = 0;
    uint64_t failures = 0;
    std::optional<v1::GetCalibrationResponse> best;
  };
  auto state = std::make_shared<State>();
  const std::vector<std::string> peers = OtherAddresses(ctx_);
  state->pending = peers.size();
  struct Call {
    grpc::ClientContext ctx;
    v1::GetCalibrationRequest req;
    v1::GetCalibrationResponse resp;
  };
  std::vector<std::shared_ptr<Call>> calls;
  for (const std::string& address : peers) {
    auto call = std::make_shared<Call>();
    calls.push_back(call);
    call->ctx.set_deadline(absl::ToChronoTime(deadline));
    call->req.set_namespace_id(std::string(ns.AsBytes()));
    call->req.set_id(id);
    ctx_.peers.Get(address)->async()->GetCalibration(
        &call->ctx, &call->req, &call->resp,
        [state, call, id](grpc::Status s) {
          std::lock_guard<std::mutex> lock(state->mu);
          if (!s.ok() && s.error_code() != grpc::StatusCode::NOT_FOUND &&
              s.error_code() != grpc::StatusCode::CANCELLED)
            ++state->failures;
          const bool usable = s.ok() && (id == 0 || call->resp.info().id() == id);
          if (usable && (!state->best || state->best->info().version() < call->resp.info().version()))
            state->best = std::move(call->resp);
          --state->pending;
          state->cv.notify_all();
        });
  }
  std::unique_lock<std::mutex> lock(state->mu);
  // An id names one artefact: the first copy will do. The newest version needs every answer.
  state->cv.wait_until(lock, absl::ToChronoTime(deadline),
                       [&] { return state->pending == 0 || (id != 0 && state->best); });
  std::optional<v1::GetCalibrationResponse> best = std::move(state->best);
  state->best.reset();
  ctx_.counters.peer_failures.fetch_add(state->failures);  // those that answered in time
  state->failures = 0;
  lock.unlock();
  // The calls still running would each bring a whole artefact (up to 60 MiB) for nobody.
  for (const auto& call : calls) call->ctx.TryCancel();
  if (!best)
    return absl::NotFoundError(
        peers.empty() ? std::string("no other node in the cluster to ask")
                      : "none of the other nodes asked holds it");
  return *std::move(best);
}

uint32_t CalibrationSync::Push(const NamespaceId& ns, const std::string& artefact,
                               absl::Time deadline) {
  std::atomic<uint32_t> stored{0};
  CallGroup calls;
  for (const std::string& address : OtherAddresses(ctx_)) {
    struct Call {
      grpc::ClientContext ctx;
      v1::PutCalibrationRequest req;
      v1::PutCalibrationResponse resp;
    };
    auto call = std::make_shared<Call>();
    call->ctx.set_deadline(absl::ToChronoTime(deadline));
    // A peer that came up a moment ago may have its channel still waiting out a reconnect
    // backoff (this node tried it while it was down); fail-fast would skip it although it is up.
    // Waiting for the channel, within the same deadline, copies the calibration there too.
    call->ctx.set_wait_for_ready(true);
    call->req.set_namespace_id(std::string(ns.AsBytes()));
    call->req.set_artefact(artefact);
    calls.Add();
    ctx_.peers.Get(address)->async()->PutCalibration(
        &call->ctx, &call->req, &call->resp,
        [call, &stored, &calls, counters = &ctx_.counters](grpc::Status s) {
          // A refusal (the artefact does not fit the namespace there) is an answer, not a
          // failure of the peer.
          if (s.ok())
            stored.fetch_add(1);
          else if (s.error_code() != grpc::StatusCode::INVALID_ARGUMENT &&
                   s.error_code() != grpc::StatusCode::FAILED_PRECONDITION)
            counters->peer_failures.fetch_add(1);
          calls.Done();
        });
  }
  calls.Wait();
  return stored.load();
}

}  // namespace strata::daemon
