// The DeviceCopies gRPC service (proto/strata/v1/device.proto): same-node engines lend this
// daemon buffers of their own device memory and have blocks copied into them from the GPU tier
// (device to device) or host memory, or published out of them. The tenant rules of the Cache
// service apply: a caller fetches from and publishes into namespaces of its tenant only, with
// loans of its tenant.
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "daemon/auth.h"
#include "daemon/calibrations/calibration_store.h"
#include "daemon/device/device_loans.h"
#include "daemon/device/peer_decoder.h"
#include "daemon/device/peer_encoder.h"
#include "daemon/namespace_registry.h"
#include "storage/gpu/gpu_tiered_store.h"
#include "strata/v1/device.grpc.pb.h"
#include "transport/ucx.h"

namespace strata::daemon {

// Writes block i of a publish into `dst` (its reserved extent, as many bytes as the publish gave
// it) and returns their CRC32C.
using MadeBlockWriter = std::function<absl::StatusOr<uint32_t>(size_t i, uint8_t* dst)>;
// Publishes blocks the daemon reads out of a lent buffer (or encoded from one) as `caller`
// publishing them would (Reserve, write, Commit: replicas, announcements and events included);
// `write` is called only for the blocks Reserve grants. One status per block
// (CacheService::PublishMade).
using MadeBlockPublisher = std::function<grpc::Status(
    const Caller& caller, const NamespaceId& ns, std::span<const BlockId> ids,
    std::span<const BlockId> parents, std::span<const uint64_t> sizes,
    const MadeBlockWriter& write, absl::Time deadline, std::vector<BlockStatus>* status)>;

class DeviceService final : public v1::DeviceCopies::Service {
 public:
  // `gpu` null: this daemon has no GPU tier and refuses every call with the reason. `auth` null:
  // authentication off. `calibrations` (may be null) decodes pca blobs. All must outlive the
  // service.
  DeviceService(GpuTieredStore* gpu, const NamespaceRegistry* namespaces,
                const Authenticator* auth, const CalibrationStore* calibrations = nullptr,
                DeviceLoans::Limits limits = {})
      : gpu_(gpu), namespaces_(namespaces), auth_(auth), loans_(limits), decoder_(calibrations) {}

  grpc::Status Lend(grpc::ServerContext* ctx, const v1::LendDeviceBufferRequest* req,
                    v1::LendDeviceBufferResponse* resp) override;
  grpc::Status FetchToDevice(grpc::ServerContext* ctx, const v1::FetchToDeviceRequest* req,
                             v1::FetchToDeviceResponse* resp) override;
  grpc::Status PublishFromDevice(grpc::ServerContext* ctx,
                                 const v1::PublishFromDeviceRequest* req,
                                 v1::PublishFromDeviceResponse* resp) override;
  grpc::Status Return(grpc::ServerContext* ctx, const v1::ReturnDeviceBufferRequest* req,
                      v1::ReturnDeviceBufferResponse* resp) override;

  // Where PublishFromDevice's blocks go; without one it refuses with the reason. Set before
  // the server starts.
  void set_publisher(MadeBlockPublisher publisher) { publisher_ = std::move(publisher); }

  // A FetchToDevice as an active message (am_wire::kDeviceFetchAm), answered on the data-plane
  // worker's progress thread when the device alone serves it (else the reply sends the caller
  // to the gRPC call), with the checks of the gRPC call; the caller is the ticket's.
  void HandleAmFetch(const transport::AmMessage& m, transport::Worker* worker);
  // Who an active message's ticket stands for (CacheService::CallerOfTicket); set before the
  // data plane serves messages. Without one every message is sent to gRPC.
  void set_ticket_callers(std::function<std::optional<Caller>(std::string_view)> find) {
    caller_of_ticket_ = std::move(find);
  }

  // Closes loans left unused past the idle limit (the daemon's reclaim loop calls it).
  size_t CloseIdle(absl::Time now) { return loans_.CloseIdle(now); }
  size_t open_loans() const { return loans_.size(); }

 private:
  // The caller (tenant or admin role), once this daemon is known to have a GPU tier.
  grpc::Status Admit(const grpc::ServerContext* ctx, Caller* caller) const;
  // FetchToDevice for an admitted caller; `device_only_max_bytes` and `declined` as for
  // GpuTieredStore::CopyToPeer (0 and null: any tier).
  grpc::Status FetchFor(const Caller& caller, const v1::FetchToDeviceRequest* req,
                        v1::FetchToDeviceResponse* resp, uint64_t device_only_max_bytes,
                        bool* declined);
  // FetchToDevice with `decode` in a namespace with a codec: each block decoded into the buffer.
  grpc::Status DecodeToPeer(const NamespaceId& ns, const std::vector<BlockId>& ids,
                            const std::vector<uint64_t>& offsets, uint64_t block_bytes,
                            PeerBuffer& peer, v1::FetchToDeviceResponse* resp);

  GpuTieredStore* const gpu_;
  const NamespaceRegistry* const namespaces_;
  const Authenticator* const auth_;
  DeviceLoans loans_;
  PeerDecoder decoder_;
  PeerEncoder encoder_;
  MadeBlockPublisher publisher_;
  std::function<std::optional<Caller>(std::string_view)> caller_of_ticket_;
};

}  // namespace strata::daemon
