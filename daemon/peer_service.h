// The Peer gRPC service (proto/strata/v1/peer.proto): what other daemons ask of this one.
#pragma once

#include <atomic>

#include "daemon/auth.h"
#include "daemon/calibrations/calibration_store.h"
#include "daemon/cluster/cluster.h"
#include "daemon/namespace_registry.h"
#include "strata/v1/peer.grpc.pb.h"

namespace strata::daemon {

class PeerService final : public v1::Peer::Service {
 public:
  // `auth` null: authentication off; otherwise only peer tokens are served. `namespaces`: those
  // open here, against which a copied calibration is checked as a client's is (null: none).
  explicit PeerService(const Authenticator* auth = nullptr,
                       const NamespaceRegistry* namespaces = nullptr)
      : auth_(auth), namespaces_(namespaces) {}
  // Calls are refused (UNAVAILABLE) until the cluster layer is set.
  void set_cluster(Cluster* cluster) { cluster_.store(cluster); }
  // Where GetCalibration and PutCalibration look; they answer UNAVAILABLE until it is set.
  void set_calibrations(CalibrationStore* store) { calibrations_.store(store); }

  grpc::Status Announce(grpc::ServerContext*, const v1::AnnounceRequest* req,
                        v1::AnnounceResponse*) override;
  grpc::Status Locate(grpc::ServerContext*, const v1::PeerLocateRequest* req,
                      v1::PeerLocateResponse* resp) override;
  grpc::Status Pull(grpc::ServerContext* ctx, const v1::PullRequest* req,
                    v1::PullResponse* resp) override;
  grpc::Status GetCalibration(grpc::ServerContext* ctx, const v1::GetCalibrationRequest* req,
                              v1::GetCalibrationResponse* resp) override;
  grpc::Status PutCalibration(grpc::ServerContext* ctx, const v1::PutCalibrationRequest* req,
                              v1::PutCalibrationResponse* resp) override;
  // Device links between GPU tiers (daemon/cluster/device_transfers.h).
  grpc::Status JoinDeviceLink(grpc::ServerContext* ctx, const v1::JoinDeviceLinkRequest* req,
                              v1::JoinDeviceLinkResponse* resp) override;
  grpc::Status PrepareDeviceSend(grpc::ServerContext* ctx,
                                 const v1::PrepareDeviceSendRequest* req,
                                 v1::PrepareDeviceSendResponse* resp) override;
  grpc::Status RunDeviceTransfer(grpc::ServerContext* ctx,
                                 const v1::RunDeviceTransferRequest* req,
                                 v1::RunDeviceTransferResponse* resp) override;

 private:
  // Every handler's first step: announcements and pulls change what this node stores.
  grpc::Status Admit(const grpc::ServerContext* ctx) const {
    Caller caller;
    return auth_ ? auth_->Check(ctx, static_cast<RoleSet>(Role::kPeer), &caller) : grpc::Status::OK;
  }

  std::atomic<Cluster*> cluster_{nullptr};
  std::atomic<CalibrationStore*> calibrations_{nullptr};
  const Authenticator* const auth_;
  const NamespaceRegistry* const namespaces_;
};

}  // namespace strata::daemon
