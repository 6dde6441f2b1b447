#include "daemon/device/device_service.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/packed_ids.h"
#include "common/status_macros.h"
#include "daemon/request_checks.h"
#include "proto/grpc_status.h"
#include "spdlog/spdlog.h"

namespace strata::daemon {

grpc::Status DeviceService::Admit(const grpc::ServerContext* ctx, Caller* caller) const {
  if (auth_ && auth_->enabled()) {
    if (grpc::Status s = auth_->Check(ctx, Role::kTenant | Role::kAdmin, caller); !s.ok())
      return s;
  } else {
    caller->trusted = true;
  }
  if (gpu_ == nullptr)
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this daemon has no GPU tier (config gpu.capacity): fetch into host "
                        "memory instead");
  return grpc::Status::OK;
}

grpc::Status DeviceService::Lend(grpc::ServerContext* ctx, const v1::LendDeviceBufferRequest* req,
                                 v1::LendDeviceBufferResponse* resp) {
  Caller caller;
  if (grpc::Status s = Admit(ctx, &caller); !s.ok()) return s;
  // Idle loans are closed by the daemon's reclaim loop (CloseIdle), not here.
  auto opened =
      gpu_->memory().OpenPeerBuffer(req->kind(), req->handle(), req->offset(), req->bytes());
  if (!opened.ok()) return ToGrpcStatus(opened.status());
  auto id = loans_.Add(caller, std::move(*opened), absl::Now());
  if (!id.ok()) return ToGrpcStatus(id.status());
  resp->set_loan_id(*id);
  resp->set_memory_kind(std::string(gpu_->memory().kind()));
  resp->set_idle_expiry_ms(absl::ToInt64Milliseconds(loans_.limits().idle));
  return grpc::Status::OK;
}

grpc::Status DeviceService::FetchToDevice(grpc::ServerContext* ctx,
                                          const v1::FetchToDeviceRequest* req,
                                          v1::FetchToDeviceResponse* resp) {
  Caller caller;
  if (grpc::Status s = Admit(ctx, &caller); !s.ok()) return s;
  return FetchFor(caller, req, resp, /*device_only_max_bytes=*/0, nullptr);
}

grpc::Status DeviceService::FetchFor(const Caller& caller, const v1::FetchToDeviceRequest* req,
                                     v1::FetchToDeviceResponse* resp,
                                     uint64_t device_only_max_bytes, bool* declined) {
  auto scoped = CheckScoped(req->namespace_id(), req->ids(),
                            [this](const NamespaceId& id) { return namespaces_->Check(id); });
  if (!scoped.ok()) return ToGrpcStatus(scoped.status());
  if (!caller.trusted) {
    auto entry = namespaces_->Find(scoped->ns);
    if (!entry || !caller.MayUse(entry->tenant))
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          "the namespace belongs to another tenant than the token's");
  }
  if (static_cast<size_t>(req->offsets_size()) != scoped->ids.size())
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat(scoped->ids.size(), " ids but ", req->offsets_size(),
                                     " offsets: one offset in the lent buffer per block"));
  const absl::Time start = absl::Now();
  auto buffer = loans_.Use(req->loan_id(), caller, start);
  if (!buffer.ok()) return ToGrpcStatus(buffer.status());
  const std::vector<uint64_t> offsets(req->offsets().begin(), req->offsets().end());
  auto timed = [&](grpc::Status s) {
    resp->set_daemon_micros(absl::ToInt64Microseconds(absl::Now() - start));
    return s;
  };
  if (req->decode()) {
    auto entry = namespaces_->Find(scoped->ns);
    if (entry && entry->spec.codec_policy != kOpaqueCodecPolicy)
      return timed(DecodeToPeer(scoped->ns, scoped->ids, offsets,
                                entry->spec.layout.BlockBytes(), **buffer, resp));
  }
  auto copied = gpu_->CopyToPeer(scoped->ns, scoped->ids, offsets, **buffer, !req->no_promote(),
                                 device_only_max_bytes);
  if (!copied.ok()) return ToGrpcStatus(copied.status());
  if (declined) *declined = copied->declined;
  for (BlockStatus s : copied->status) resp->add_status(static_cast<v1::BlockStatus>(s));
  resp->mutable_sizes()->Add(copied->sizes.begin(), copied->sizes.end());
  resp->mutable_crc32c()->Add(copied->crcs.begin(), copied->crcs.end());
  for (Tier t : copied->sources)
    resp->add_source(t == Tier::kGpu ? v1::TIER_GPU
                     : t == Tier::kHost ? v1::TIER_HOST
                                        : v1::TIER_UNKNOWN);
  resp->set_bytes_copied(copied->bytes);
  return timed(grpc::Status::OK);
}

grpc::Status DeviceService::DecodeToPeer(const NamespaceId& ns, const std::vector<BlockId>& ids,
                                         const std::vector<uint64_t>& offsets,
                                         uint64_t block_bytes, PeerBuffer& peer,
                                         v1::FetchToDeviceResponse* resp) {
  // The blobs are read from host memory (which also stages device-only and NVMe-only blocks):
  // the entropy decoding runs on the CPU whichever way the rest goes.
  AcquireResult lease = gpu_->Acquire(ns, ids);
  // Decodes queue behind each other (one decoder): a read hold keeps the leased extents this
  // lease's even past its expiry, so no byte of a block that replaced one is decoded as it.
  std::vector<ArenaExtent> extents;
  for (size_t i = 0; i < ids.size(); ++i)
    if (lease.status[i] == BlockStatus::kOk) extents.push_back({lease.offsets[i], lease.sizes[i]});
  const bool held = lease.lease_id != 0 && gpu_->BeginLeaseRead(lease.lease_id, extents, 1);
  uint64_t written = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    BlockStatus st = lease.status[i];
    if (st == BlockStatus::kOk && !held) st = BlockStatus::kNotFound;  // the lease ended at once
    uint64_t size = 0;
    if (st == BlockStatus::kOk) {
      const std::span<const uint8_t> blob(gpu_->arena_base() + lease.offsets[i], lease.sizes[i]);
      absl::Status d = decoder_.DecodeInto(ns, blob, gpu_->memory(), peer, offsets[i], block_bytes);
      if (d.ok()) {
        size = block_bytes;
        written += size;
      } else {
        st = absl::IsNotFound(d) ? BlockStatus::kUnknownCalibration : BlockStatus::kInvalid;
        spdlog::warn("decoding block {} into a lent buffer: {}", ids[i].ShortHex(),
                     std::string(d.message()));
      }
    }
    resp->add_status(static_cast<v1::BlockStatus>(st));
    resp->add_sizes(size);
    resp->add_crc32c(st == BlockStatus::kOk ? lease.crcs[i] : 0);
    resp->add_source(st == BlockStatus::kOk ? v1::TIER_HOST : v1::TIER_UNKNOWN);
  }
  if (held) gpu_->EndLeaseRead(lease.lease_id);
  if (lease.lease_id != 0) (void)gpu_->Release(lease.lease_id);
  resp->set_bytes_copied(written);
  return grpc::Status::OK;
}

namespace {

// Blocks read out of a lent buffer are published in batches of about this many bytes, so a
// large publish holds a bounded amount of host memory.
constexpr uint64_t kPublishBatchBytes = 64 << 20;

}  // namespace

grpc::Status DeviceService::PublishFromDevice(grpc::ServerContext* ctx,
                                              const v1::PublishFromDeviceRequest* req,
                                              v1::PublishFromDeviceResponse* resp) {
  Caller caller;
  if (grpc::Status s = Admit(ctx, &caller); !s.ok()) return s;
  if (!publisher_)
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this daemon does not publish from device memory");
  auto scoped = CheckScoped(req->namespace_id(), req->ids(),
                            [this](const NamespaceId& id) { return namespaces_->Check(id); });
  if (!scoped.ok()) return ToGrpcStatus(scoped.status());
  auto entry = namespaces_->Find(scoped->ns);
  if (!entry) return grpc::Status(grpc::StatusCode::NOT_FOUND, "namespace is not open");
  if (!caller.trusted && !caller.MayUse(entry->tenant))
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "the namespace belongs to another tenant than the token's");
  const std::vector<BlockId>& ids = scoped->ids;
  auto parents = UnpackIds(req->parents(), "parents", ids.size());
  if (!parents.ok()) return ToGrpcStatus(parents.status());
  if (static_cast<size_t>(req->offsets_size()) != ids.size() ||
      static_cast<size_t>(req->sizes_size()) != ids.size() ||
      (!parents->empty() && parents->size() != ids.size()))
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat(ids.size(), " ids, ", parents->size(), " parents, ",
                                     req->offsets_size(), " offsets and ", req->sizes_size(),
                                     " sizes: one offset and size (and parent, if any) per id"));
  std::optional<codec::CodecParams> params;
  if (entry->spec.codec_policy != kOpaqueCodecPolicy) {
    auto parsed = codec::ParseCodecSpec(entry->spec.codec_policy);
    if (!parsed.ok()) return ToGrpcStatus(parsed.status());
    if (codec::UsesCalibration(parsed->mode))
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "a calibrated (pca or xl) namespace's blocks are published from host "
                          "memory, where the client library encodes them with the namespace's "
                          "calibration");
    params = *parsed;
  }
  auto buffer = loans_.Use(req->loan_id(), caller, absl::Now());
  if (!buffer.ok()) return ToGrpcStatus(buffer.status());
  const absl::Time deadline = absl::FromChrono(ctx->deadline());
  std::vector<BlockStatus> status(ids.size(), BlockStatus::kInvalid);
  std::vector<uint64_t> stored_bytes(ids.size(), 0);
  uint64_t bytes_read = 0;
  bool on_device = false;
  // One batch: the blocks checked (opaque) or encoded (codec) so far, published together.
  // Opaque blocks are read straight into their extents, and only those Reserve grants.
  std::vector<size_t> batch;
  std::vector<BlockId> batch_ids, batch_parents;
  std::vector<uint64_t> batch_sizes;
  std::vector<std::vector<uint8_t>> blobs;  // codec: the encoded blocks of the batch
  uint64_t batch_bytes = 0;
  PeerBuffer& peer = **buffer;
  const MadeBlockWriter write = [&](size_t k, uint8_t* dst) -> absl::StatusOr<uint32_t> {
    if (params) return CopyWithCrc32c(dst, blobs[k].data(), blobs[k].size());
    const uint64_t size = batch_sizes[k];
    STRATA_RETURN_IF_ERROR(PeerEncoder::ReadInto(
        gpu_->memory(), peer, req->offsets(static_cast<int>(batch[k])), size, dst));
    bytes_read += size;
    gpu_->NotePeerReads(1, size, 0);
    return Crc32c(dst, size);
  };
  auto flush = [&]() -> grpc::Status {
    if (batch.empty()) return grpc::Status::OK;
    std::vector<BlockStatus> got;
    if (grpc::Status s = publisher_(caller, scoped->ns, batch_ids, batch_parents, batch_sizes,
                                    write, deadline, &got);
        !s.ok())
      return s;
    for (size_t k = 0; k < batch.size() && k < got.size(); ++k) {
      status[batch[k]] = got[k];
      if (got[k] == BlockStatus::kOk) stored_bytes[batch[k]] = batch_sizes[k];
    }
    batch.clear();
    batch_ids.clear();
    batch_parents.clear();
    batch_sizes.clear();
    blobs.clear();
    batch_bytes = 0;
    return grpc::Status::OK;
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    if (absl::Now() > deadline)  // what was published before stays
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          absl::StrCat("the deadline passed after ", i, " of ", ids.size(),
                                       " blocks were read"));
    const uint64_t offset = req->offsets(static_cast<int>(i));
    const uint64_t size = req->sizes(static_cast<int>(i));
    absl::Status r = size == 0 ? absl::InvalidArgumentError("a block of 0 bytes")
                               : PeerEncoder::CheckRange(peer, offset, size);
    std::vector<uint8_t> stored;
    bool here = false;
    if (r.ok() && params) {
      r = encoder_.ReadFrom(gpu_->memory(), peer, offset, size, entry->spec.layout, *params,
                            &stored, &here);
      if (r.ok()) {
        bytes_read += size;
        gpu_->NotePeerReads(1, size, here ? 1 : 0);
      }
    }
    if (!r.ok()) {
      // A block that is not there or not encodable is refused alone; a device that fails
      // fails the call (what was published before it stays).
      if (!absl::IsInvalidArgument(r) && !absl::IsOutOfRange(r)) return ToGrpcStatus(r);
      spdlog::warn("publishing block {} from a lent buffer: {}", ids[i].ShortHex(),
                   std::string(r.message()));
      continue;
    }
    on_device |= here;
    batch.push_back(i);
    batch_ids.push_back(ids[i]);
    if (!parents->empty()) batch_parents.push_back((*parents)[i]);
    batch_sizes.push_back(params ? stored.size() : size);
    batch_bytes += batch_sizes.back();
    if (params) blobs.push_back(std::move(stored));
    if (batch_bytes >= kPublishBatchBytes)
      if (grpc::Status s = flush(); !s.ok()) return s;
  }
  if (grpc::Status s = flush(); !s.ok()) return s;
  for (BlockStatus st : status) resp->add_status(static_cast<v1::BlockStatus>(st));
  resp->mutable_stored_bytes()->Add(stored_bytes.begin(), stored_bytes.end());
  resp->set_bytes_read(bytes_read);
  resp->set_encoded_on_device(on_device);
  return grpc::Status::OK;
}

grpc::Status DeviceService::Return(grpc::ServerContext* ctx,
                                   const v1::ReturnDeviceBufferRequest* req,
                                   v1::ReturnDeviceBufferResponse*) {
  Caller caller;
  if (grpc::Status s = Admit(ctx, &caller); !s.ok()) return s;
  return ToGrpcStatus(loans_.Return(req->loan_id(), caller));
}

}  // namespace strata::daemon
