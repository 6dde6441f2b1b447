// The Cache gRPC service (proto/strata/v1/cache.proto) over the host tier.
#pragma once

#include <atomic>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/namespace_registry.h"
#include "storage/host_tier.h"
#include "strata/v1/cache.grpc.pb.h"

namespace strata::daemon {

// What a client needs to reach the arena over UCX.
struct DataPlaneInfo {
  std::string node_id;
  std::string worker_address;
  uint64_t arena_base = 0;
  uint64_t arena_bytes = 0;
  std::string arena_rkey;
  std::string transports;
  bool huge_pages = false;
};

class CacheService final : public v1::Cache::Service {
 public:
  CacheService(HostTier* tier, NamespaceRegistry* namespaces, DataPlaneInfo data_plane);

  grpc::Status Connect(grpc::ServerContext*, const v1::ConnectRequest*,
                       v1::ConnectResponse*) override;
  grpc::Status OpenNamespace(grpc::ServerContext*, const v1::OpenNamespaceRequest*,
                             v1::OpenNamespaceResponse*) override;
  grpc::Status Lookup(grpc::ServerContext*, const v1::LookupRequest*,
                      v1::LookupResponse*) override;
  grpc::Status Reserve(grpc::ServerContext*, const v1::ReserveRequest*,
                       v1::ReserveResponse*) override;
  grpc::Status Commit(grpc::ServerContext*, const v1::CommitRequest*,
                      v1::CommitResponse*) override;
  grpc::Status Abort(grpc::ServerContext*, const v1::AbortRequest*, v1::AbortResponse*) override;
  grpc::Status Acquire(grpc::ServerContext*, const v1::AcquireRequest*,
                       v1::AcquireResponse*) override;
  grpc::Status Release(grpc::ServerContext*, const v1::ReleaseRequest*,
                       v1::ReleaseResponse*) override;
  grpc::Status Evict(grpc::ServerContext*, const v1::EvictRequest*, v1::EvictResponse*) override;
  grpc::Status Pin(grpc::ServerContext*, const v1::PinRequest*, v1::PinResponse*) override;
  grpc::Status Unpin(grpc::ServerContext*, const v1::UnpinRequest*,
                     v1::UnpinResponse*) override;
  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest*,
                     v1::StatsResponse*) override;

  // Refuses new calls from now on and waits up to `grace` for in-flight ones; true if they all
  // finished.
  bool Drain(absl::Duration grace);

 private:
  // Admits a call unless draining, and counts it while it runs.
  class CallScope {
   public:
    explicit CallScope(CacheService* s);
    ~CallScope();
    bool admitted() const { return admitted_; }
    grpc::Status refusal() const;

   private:
    CacheService* service_;
    bool admitted_;
  };

  HostTier* tier_;
  NamespaceRegistry* namespaces_;
  const DataPlaneInfo data_plane_;
  const absl::Time started_ = absl::Now();
  absl::Mutex drain_mu_;
  bool draining_ ABSL_GUARDED_BY(drain_mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(drain_mu_) = 0;
};

}  // namespace strata::daemon
