#include "daemon/peer_service.h"

#include "absl/strings/str_cat.h"
#include "daemon/calibrations/calibration_service.h"
#include "daemon/cluster/cluster.h"
#include "daemon/logging.h"
#include "daemon/request_checks.h"
#include "proto/grpc_status.h"

namespace strata::daemon {
namespace {

grpc::Status NotUp() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "this daemon's cluster layer is not up yet");
}

// The cluster's device transfers, or why there are none.
grpc::Status DeviceTransfersOf(Cluster* c, DeviceTransfers** out) {
  if (!c) return NotUp();
  *out = c->device_transfers();
  if (*out == nullptr)
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this node has no device links (no GPU tier, or no NCCL)");
  return grpc::Status::OK;
}

}  // namespace

grpc::Status PeerService::Announce(grpc::ServerContext* ctx, const v1::AnnounceRequest* req,
                                   v1::AnnounceResponse*) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return s;
  auto ids = CheckAnnounce(*req);
  if (!ids.ok()) return ToGrpcStatus(ids.status());
  Cluster* c = cluster_.load();
  if (!c) return NotUp();
  // Directory entries name the node that holds the blocks, and lookups send fetches there: an
  // entry for a node outside the cluster view would point readers at an address nobody vouched
  // for (and fill the directory under made-up names). Withdrawals are let through: they only
  // remove entries, and a node that just left may still withdraw its own.
  if (!req->withdraw() && c->View().Find(req->node_id()) == nullptr)
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("Announce: node_id '", LogSafe(req->node_id()),
                                     "' is not a member of this node's cluster view"));
  c->announcer().HandleAnnounce(*req, *ids);
  return grpc::Status::OK;
}

grpc::Status PeerService::Locate(grpc::ServerContext* ctx, const v1::PeerLocateRequest* req,
                                 v1::PeerLocateResponse* resp) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return s;
  auto ids = CheckPeerLocate(*req);
  if (!ids.ok()) return ToGrpcStatus(ids.status());
  Cluster* c = cluster_.load();
  if (!c) return NotUp();
  c->locator().HandleLocate(*ids, resp);
  return grpc::Status::OK;
}

grpc::Status PeerService::Pull(grpc::ServerContext* ctx, const v1::PullRequest* req,
                               v1::PullResponse* resp) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return s;
  Cluster* c = cluster_.load();
  if (!c) return NotUp();
  // The pull makes this daemon dial the source: only a node of its own cluster view, at the
  // address the view has for it, so a caller cannot point it at an arbitrary HOST:PORT.
  {
    auto view = c->View();
    const placement::NodeRecord* source = view.Find(req->source_node());
    if (source == nullptr || source->address != req->source_address() || source->id == c->self().id)
      return grpc::Status(
          grpc::StatusCode::PERMISSION_DENIED,
          absl::StrCat("Pull source '", req->source_node(), "' at ", req->source_address(),
                       " is not another node of this cluster view"));
  }
  auto order = CheckPull(*req);
  if (!order.ok()) return ToGrpcStatus(order.status());
  auto deadline = absl::FromChrono(ctx->deadline());
  for (BlockStatus s :
       c->puller().Pull(order->spec, req->tenant(), req->replicas(), order->ids, order->parents,
                        req->source_node(), req->source_address(), deadline,
                        req->to_device()       ? PullInto::kDevice
                        : req->device_if_any() ? PullInto::kDeviceIfAny
                                               : PullInto::kHost))
    resp->add_status(static_cast<v1::BlockStatus>(s));
  return grpc::Status::OK;
}

// Another daemon's client needs a calibration this node may hold: this node's copy only (no
// further asking, so requests never travel in circles).
grpc::Status PeerService::GetCalibration(grpc::ServerContext* ctx,
                                         const v1::GetCalibrationRequest* req,
                                         v1::GetCalibrationResponse* resp) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return s;
  CalibrationStore* store = calibrations_.load();
  if (!store) return NotUp();
  auto ns = Digest::FromBytes(req->namespace_id());
  if (!ns.ok()) return ToGrpcStatus(absl::InvalidArgumentError("namespace_id must be 32 bytes"));
  auto found = store->Get(*ns, req->id());
  if (!found.ok()) return ToGrpcStatus(found.status());
  FillCalibrationInfo(*found, store->IsCurrent(*ns, found->id), resp->mutable_info());
  resp->set_artefact(*found->artefact);
  return grpc::Status::OK;
}

// A copy of what a client stored on another daemon; checked as the client's own Put is.
grpc::Status PeerService::PutCalibration(grpc::ServerContext* ctx,
                                         const v1::PutCalibrationRequest* req,
                                         v1::PutCalibrationResponse* resp) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return s;
  CalibrationStore* store = calibrations_.load();
  if (!store) return NotUp();
  auto ns = Digest::FromBytes(req->namespace_id());
  if (!ns.ok()) return ToGrpcStatus(absl::InvalidArgumentError("namespace_id must be 32 bytes"));
  std::optional<NamespaceRegistry::Entry> entry;
  if (namespaces_) entry = namespaces_->Find(*ns);
  if (auto s = ArtefactFitsNamespace(entry, *ns, req->artefact()); !s.ok())
    return ToGrpcStatus(s);
  auto stored = store->Put(*ns, req->artefact(), [&](const codec::Calibration& c) {
    return CalibrationFitsNamespace(entry, *ns, c);
  });
  if (!stored.ok()) return ToGrpcStatus(stored.status());
  FillCalibrationInfo(*stored, false, resp->mutable_info());
  return grpc::Status::OK;
}

grpc::Status PeerService::JoinDeviceLink(grpc::ServerContext* ctx,
                                         const v1::JoinDeviceLinkRequest* req,
                                         v1::JoinDeviceLinkResponse*) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return s;
  DeviceTransfers* d = nullptr;
  if (grpc::Status s = DeviceTransfersOf(cluster_.load(), &d); !s.ok()) return s;
  return ToGrpcStatus(d->Join(*req));
}

grpc::Status PeerService::PrepareDeviceSend(grpc::ServerContext* ctx,
                                            const v1::PrepareDeviceSendRequest* req,
                                            v1::PrepareDeviceSendResponse* resp) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return s;
  DeviceTransfers* d = nullptr;
  if (grpc::Status s = DeviceTransfersOf(cluster_.load(), &d); !s.ok()) return s;
  return ToGrpcStatus(d->PrepareSend(*req, resp));
}

grpc::Status PeerService::RunDeviceTransfer(grpc::ServerContext* ctx,
                                            const v1::RunDeviceTransferRequest* req,
                                            v1::RunDeviceTransferResponse* resp) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return s;
  DeviceTransfers* d = nullptr;
  if (grpc::Status s = DeviceTransfersOf(cluster_.load(), &d); !s.ok()) return s;
  auto bytes = d->Run(*req, absl::FromChrono(ctx->deadline()));
  if (!bytes.ok()) return ToGrpcStatus(bytes.status());
  resp->set_bytes(*bytes);
  return grpc::Status::OK;
}

}  // namespace strata::daemon
