// The Peer gRPC service (proto/strata/v1/peer.proto): what other daemons ask of this one.
#pragma once

#include <atomic>

#include "daemon/cluster/cluster.h"
#include "strata/v1/peer.grpc.pb.h"

namespace strata::daemon {

class PeerService final : public v1::Peer::Service {
 public:
  PeerService() = default;
  // Calls are refused (UNAVAILABLE) until the cluster layer is set.
  void set_cluster(Cluster* cluster) { cluster_.store(cluster); }

  grpc::Status Announce(grpc::ServerContext*, const v1::AnnounceRequest* req,
                        v1::AnnounceResponse*) override;
  grpc::Status Locate(grpc::ServerContext*, const v1::PeerLocateRequest* req,
                      v1::PeerLocateResponse* resp) override;
  grpc::Status Pull(grpc::ServerContext* ctx, const v1::PullRequest* req,
                    v1::PullResponse* resp) override;

 private:
  std::atomic<Cluster*> cluster_{nullptr};
};

}  // namespace strata::daemon
