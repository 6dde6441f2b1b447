// The Admin gRPC service (proto/strata/v1/admin.proto): what this node holds, for stratactl.
#pragma once

#include "daemon/namespace_registry.h"
#include "storage/host_tier.h"
#include "strata/v1/admin.grpc.pb.h"

namespace strata::daemon {

class AdminService final : public v1::Admin::Service {
 public:
  AdminService(const HostTier* tier, const NamespaceRegistry* namespaces)
      : tier_(tier), namespaces_(namespaces) {}

  grpc::Status ListNamespaces(grpc::ServerContext*, const v1::ListNamespacesRequest*,
                              v1::ListNamespacesResponse*) override;
  grpc::Status ListBlocks(grpc::ServerContext*, const v1::ListBlocksRequest*,
                          v1::ListBlocksResponse*) override;
  grpc::Status InspectBlocks(grpc::ServerContext*, const v1::InspectBlocksRequest*,
                             v1::InspectBlocksResponse*) override;

 private:
  const HostTier* tier_;
  const NamespaceRegistry* namespaces_;
};

}  // namespace strata::daemon
