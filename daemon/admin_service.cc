#include "daemon/admin_service.h"

#include "absl/strings/str_cat.h"
#include "daemon/cluster/cluster.h"
#include "daemon/request_checks.h"
#include "proto/convert.h"
#include "proto/grpc_status.h"

namespace strata::daemon {
namespace {

void ToProto(const BlockInfo& b, v1::BlockInfo* out) {
  out->set_id(std::string(b.id.AsBytes()));
  out->set_namespace_id(std::string(b.ns.AsBytes()));
  out->set_tier(v1::TIER_HOST);
  out->set_size_bytes(b.size);
  out->set_crc32c(b.crc);
  if (!b.parent.IsZero()) out->set_parent_id(std::string(b.parent.AsBytes()));
  out->set_pinned_for_ms(absl::ToInt64Milliseconds(b.pinned_for));
  out->set_leases(b.leases);
  out->set_idle_ms(absl::ToInt64Milliseconds(b.idle));
}

}  // namespace

grpc::Status AdminService::ListNamespaces(grpc::ServerContext* ctx,
                                          const v1::ListNamespacesRequest*,
                                          v1::ListNamespacesResponse* resp) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return s;
  auto usage = store_->UsageByNamespace();
  for (const auto& e : namespaces_->List()) {
    auto* n = resp->add_namespaces();
    n->set_namespace_id(std::string(e.id.AsBytes()));
    n->set_tenant(e.tenant);
    *n->mutable_spec() = strata::ToProto(e.spec);
    if (auto it = usage.find(e.id); it != usage.end()) {
      n->set_blocks(it->second.first);
      n->set_bytes(it->second.second);
    }
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::ListBlocks(grpc::ServerContext* ctx, const v1::ListBlocksRequest* req,
                                      v1::ListBlocksResponse* resp) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return s;
  auto query =
      CheckListBlocks(*req, [this](const NamespaceId& id) { return namespaces_->Check(id); });
  if (!query.ok()) return ToGrpcStatus(query.status());
  uint64_t cursor = query->cursor;
  for (const BlockInfo& b : store_->List(query->ns ? &*query->ns : nullptr, query->page, &cursor))
    ToProto(b, resp->add_blocks());
  resp->set_next_page_token(cursor);
  return grpc::Status::OK;
}

grpc::Status AdminService::InspectBlocks(grpc::ServerContext* ctx,
                                         const v1::InspectBlocksRequest* req,
                                         v1::InspectBlocksResponse* resp) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return s;
  auto ids = CheckInspectBlocks(*req);
  if (!ids.ok()) return ToGrpcStatus(ids.status());
  for (const BlockInfo& b : store_->Inspect(*ids)) ToProto(b, resp->add_blocks());
  return grpc::Status::OK;
}

grpc::Status AdminService::Drain(grpc::ServerContext* ctx, const v1::DrainRequest*,
                                 v1::DrainResponse* resp) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return s;
  Cluster* c = cluster_.load();
  if (!c) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the cluster layer is not up yet");
  if (c->size() <= 1)
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this node is alone in its cluster: there is nowhere to drain to");
  auto r = c->Drain(absl::FromChrono(ctx->deadline()));
  resp->set_blocks(r.blocks);
  resp->set_moved(r.moved);
  resp->set_failed(r.failed);
  for (auto& t : r.targets) resp->add_targets(t);
  return grpc::Status::OK;
}

grpc::Status AdminService::ListNodes(grpc::ServerContext* ctx, const v1::ListNodesRequest*,
                                     v1::ListNodesResponse* resp) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return s;
  Cluster* c = cluster_.load();
  if (!c) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the cluster layer is not up yet");
  std::string detail;
  resp->set_healthy(c->healthy(&detail));
  resp->set_detail(detail);
  resp->set_membership(c->membership_kind());
  auto view = c->View();
  resp->set_epoch(view.epoch);
  for (const auto& n : view.nodes) {
    auto* out = resp->add_nodes();
    out->set_id(n.id);
    out->set_address(n.address);
    out->set_host_capacity(n.host_capacity);
    out->set_nvme_capacity(n.nvme_capacity);
    out->set_version(n.version);
    out->set_self(n.id == c->self().id);
  }
  resp->set_directory_ids(c->directory().ids());
  resp->set_directory_bytes(c->directory().memory_bytes());
  return grpc::Status::OK;
}

}  // namespace strata::daemon
