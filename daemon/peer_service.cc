#include "daemon/peer_service.h"

#include "daemon/request_checks.h"
#include "proto/grpc_status.h"

namespace strata::daemon {
namespace {

grpc::Status NotUp() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "this daemon's cluster layer is not up yet");
}

}  // namespace

grpc::Status PeerService::Announce(grpc::ServerContext*, const v1::AnnounceRequest* req,
                                   v1::AnnounceResponse*) {
  auto ids = CheckAnnounce(*req);
  if (!ids.ok()) return ToGrpcStatus(ids.status());
  Cluster* c = cluster_.load();
  if (!c) return NotUp();
  c->announcer().HandleAnnounce(*req, *ids);
  return grpc::Status::OK;
}

grpc::Status PeerService::Locate(grpc::ServerContext*, const v1::PeerLocateRequest* req,
                                 v1::PeerLocateResponse* resp) {
  auto ids = CheckPeerLocate(*req);
  if (!ids.ok()) return ToGrpcStatus(ids.status());
  Cluster* c = cluster_.load();
  if (!c) return NotUp();
  c->locator().HandleLocate(*ids, resp);
  return grpc::Status::OK;
}

grpc::Status PeerService::Pull(grpc::ServerContext* ctx, const v1::PullRequest* req,
                               v1::PullResponse* resp) {
  auto order = CheckPull(*req);
  if (!order.ok()) return ToGrpcStatus(order.status());
  Cluster* c = cluster_.load();
  if (!c) return NotUp();
  auto deadline = absl::FromChrono(ctx->deadline());
  for (BlockStatus s :
       c->puller().Pull(order->spec, req->tenant(), req->replicas(), order->ids, order->parents,
                        req->source_node(), req->source_address(), deadline))
    resp->add_status(static_cast<v1::BlockStatus>(s));
  return grpc::Status::OK;
}

}  // namespace strata::daemon
