// The Calibrations gRPC service (proto/strata/v1/calibration.proto): clients and operators store,
// read and list a namespace's calibrations here; the daemon fills gaps from, and copies new
// artefacts to, the rest of its cluster (daemon/cluster/calibration_sync.h).
#pragma once

#include <atomic>
#include <optional>
#include <string_view>

#include "daemon/auth.h"
#include "daemon/calibrations/calibration_store.h"
#include "daemon/namespace_registry.h"
#include "strata/v1/calibration.grpc.pb.h"

namespace strata::daemon {

class Cluster;

class CalibrationService final : public v1::Calibrations::Service {
 public:
  // `auth` null: authentication off. `store`, `namespaces` and `auth` must outlive the service.
  CalibrationService(CalibrationStore* store, const NamespaceRegistry* namespaces,
                     const Authenticator* auth = nullptr)
      : store_(store), namespaces_(namespaces), auth_(auth) {}
  // The cluster layer, once it is up (null: this node answers alone).
  void set_cluster(Cluster* cluster) { cluster_.store(cluster); }

  grpc::Status Put(grpc::ServerContext* ctx, const v1::PutCalibrationRequest* req,
                   v1::PutCalibrationResponse* resp) override;
  grpc::Status Get(grpc::ServerContext* ctx, const v1::GetCalibrationRequest* req,
                   v1::GetCalibrationResponse* resp) override;
  grpc::Status List(grpc::ServerContext* ctx, const v1::ListCalibrationsRequest* req,
                    v1::ListCalibrationsResponse* resp) override;

 private:
  // The caller, and the namespace named by `raw`, which it may use: a tenant's credentials reach
  // the namespaces opened here under its tenant; admins, peers and (authentication off) anyone
  // reach any namespace, open here or not.
  grpc::Status Admit(const grpc::ServerContext* ctx, const std::string& raw, NamespaceId* ns,
                     Caller* caller) const;

  CalibrationStore* const store_;
  const NamespaceRegistry* const namespaces_;
  const Authenticator* const auth_;
  std::atomic<Cluster*> cluster_{nullptr};
};

// Whether `artefact` may be a calibration of `ns` as this node has the namespace open (`entry`;
// anything goes where it is not open here): its codec policy uses calibrations, the artefact is
// of its mode, and, once parsed, it fits its layout (`check`, for CalibrationStore::Put). Every
// way one is stored checks it: a client's Put, a peer's copy, an answer fetched from a peer.
absl::Status ArtefactFitsNamespace(const std::optional<NamespaceRegistry::Entry>& entry,
                                   const NamespaceId& ns, std::string_view artefact);
absl::Status CalibrationFitsNamespace(const std::optional<NamespaceRegistry::Entry>& entry,
                                      const NamespaceId& ns, const codec::Calibration& c);

// A record as the wire shows it; `current` says whether it is its namespace's newest here.
void FillCalibrationInfo(const CalibrationRecord& r, bool current, v1::CalibrationInfo* info);

}  // namespace strata::daemon
