#include "daemon/peer_service.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/packed_ids.h"
#include "proto/convert.h"
#include "proto/grpc_status.h"

namespace strata::daemon {
namespace {

constexpr size_t kMaxIds = 1 << 16;

// Packed ids, or an error naming the field.
grpc::Status Unpack(const std::string& packed, const char* field, std::vector<BlockId>* out) {
  auto ids = UnpackIds(packed, field, kMaxIds);
  if (!ids.ok()) return ToGrpcStatus(ids.status());
  *out = std::move(*ids);
  return grpc::Status::OK;
}

grpc::Status NotUp() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "this daemon's cluster layer is not up yet");
}

}  // namespace

grpc::Status PeerService::Announce(grpc::ServerContext* ctx, const v1::AnnounceRequest* req,
                                   v1::AnnounceResponse*) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return s;
  std::vector<BlockId> ids;
  if (auto s = Unpack(req->ids(), "ids", &ids); !s.ok()) return s;
  if (req->node_id().empty())
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "Announce needs node_id");
  Cluster* c = cluster_.load();
  if (!c) return NotUp();
  c->announcer().HandleAnnounce(*req, ids);
  return grpc::Status::OK;
}

grpc::Status PeerService::Locate(grpc::ServerContext* ctx, const v1::PeerLocateRequest* req,
                                 v1::PeerLocateResponse* resp) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return s;
  std::vector<BlockId> ids;
  if (auto s = Unpack(req->ids(), "ids", &ids); !s.ok()) return s;
  Cluster* c = cluster_.load();
  if (!c) return NotUp();
  c->locator().HandleLocate(ids, resp);
  return grpc::Status::OK;
}

grpc::Status PeerService::Pull(grpc::ServerContext* ctx, const v1::PullRequest* req,
                               v1::PullResponse* resp) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return s;
  std::vector<BlockId> ids, parents;
  if (auto s = Unpack(req->ids(), "ids", &ids); !s.ok()) return s;
  if (auto s = Unpack(req->parent_ids(), "parent_ids", &parents); !s.ok()) return s;
  if (!parents.empty() && parents.size() != ids.size())
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "parent_ids must be empty or match ids one for one");
  if (req->source_address().empty())
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "Pull needs source_address");
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
  NamespaceSpec spec = FromProto(req->spec());
  if (absl::Status s = spec.Validate(); !s.ok())
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat("spec: ", s.message()));
  auto deadline = absl::FromChrono(ctx->deadline());
  for (BlockStatus s : c->puller().Pull(spec, req->tenant(), req->replicas(), ids, parents,
                                        req->source_node(), req->source_address(), deadline))
    resp->add_status(static_cast<v1::BlockStatus>(s));
  return grpc::Status::OK;
}

}  // namespace strata::daemon
