// The Admin gRPC service (proto/strata/v1/admin.proto): what this node holds, for stratactl.
#pragma once

#include <atomic>

#include "daemon/auth.h"
#include "daemon/namespace_registry.h"
#include "storage/block_store.h"
#include "strata/v1/admin.grpc.pb.h"

namespace strata::daemon {

class Cluster;

class AdminService final : public v1::Admin::Service {
 public:
  // `auth` null: authentication off; otherwise only admin tokens are served.
  AdminService(const BlockStore* store, const NamespaceRegistry* namespaces,
               const Authenticator* auth = nullptr)
      : store_(store), namespaces_(namespaces), auth_(auth) {}

  grpc::Status ListNamespaces(grpc::ServerContext*, const v1::ListNamespacesRequest*,
                              v1::ListNamespacesResponse*) override;
  grpc::Status ListBlocks(grpc::ServerContext*, const v1::ListBlocksRequest*,
                          v1::ListBlocksResponse*) override;
  grpc::Status InspectBlocks(grpc::ServerContext*, const v1::InspectBlocksRequest*,
                             v1::InspectBlocksResponse*) override;
  grpc::Status Drain(grpc::ServerContext*, const v1::DrainRequest*, v1::DrainResponse*) override;
  grpc::Status ListNodes(grpc::ServerContext*, const v1::ListNodesRequest*,
                         v1::ListNodesResponse*) override;

  void set_cluster(Cluster* cluster) { cluster_.store(cluster); }

 private:
  // Every handler's first step: listings name every tenant's namespaces and blocks.
  grpc::Status Admit(const grpc::ServerContext* ctx) const {
    Caller caller;
    return auth_ ? auth_->Check(ctx, static_cast<RoleSet>(Role::kAdmin), &caller)
                 : grpc::Status::OK;
  }

  std::atomic<Cluster*> cluster_{nullptr};
  const BlockStore* const store_;
  const NamespaceRegistry* namespaces_;
  const Authenticator* const auth_;
};

}  // namespace strata::daemon
