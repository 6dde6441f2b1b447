// The Admin gRPC service (proto/strata/v1/admin.proto): what this node holds, for stratactl.
#pragma once

#include <atomic>

#include "daemon/namespace_registry.h"
#include "storage/block_store.h"
#include "strata/v1/admin.grpc.pb.h"

namespace strata::daemon {

class Cluster;

class AdminService final : public v1::Admin::Service {
 public:
  AdminService(const BlockStore* store, const NamespaceRegistry* namespaces)
      : store_(store), namespaces_(namespaces) {}

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
  std::atomic<Cluster*> cluster_{nullptr};
  const BlockStore* const store_;
  const NamespaceRegistry* namespaces_;
};

}  // namespace strata::daemon
