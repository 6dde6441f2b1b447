#include "daemon/calibrations/calibration_service.h"

#include <algorithm>
#include <span>

#include "absl/strings/str_cat.h"
#include "codec/calibration.h"
#include "codec/codec.h"
#include "common/status_macros.h"
#include "daemon/cluster/cluster.h"
#include "proto/grpc_status.h"
#include "spdlog/spdlog.h"

namespace strata::daemon {
namespace {

// Peer calls within the caller's deadline and the cluster's peer timeout.
absl::Time PeerDeadline(const grpc::ServerContext* ctx, const Cluster& c) {
  return std::min(absl::FromChrono(ctx->deadline()), absl::Now() + c.peer_timeout());
}

// When the namespace is open here, it must use calibrations (checked before the artefact is
// even parsed) and the calibration must fit its layout.
absl::Status TakesCalibrations(const std::optional<NamespaceRegistry::Entry>& entry,
                               const NamespaceId& ns) {
  if (!entry) return absl::OkStatus();
  auto params = codec::ParseCodecSpec(entry->spec.codec_policy);
  if (!params.ok() || !codec::UsesCalibration(params->mode))
    return absl::FailedPreconditionError(
        absl::StrCat("namespace ", ns.ShortHex(), " has codec policy '", entry->spec.codec_policy,
                     "', which uses no calibration (only pca and xl modes do)"));
  return absl::OkStatus();
}

// The artefact is of the namespace's mode (read from its magic, before it is parsed).
absl::Status OfItsMode(const std::optional<NamespaceRegistry::Entry>& entry, const NamespaceId& ns,
                       std::string_view artefact_mode) {
  if (!entry || artefact_mode.empty()) return absl::OkStatus();  // the parser says what is wrong
  auto params = codec::ParseCodecSpec(entry->spec.codec_policy);
  if (params.ok() && codec::ModeName(params->mode) != artefact_mode)
    return absl::InvalidArgumentError(absl::StrCat(
        "namespace ", ns.ShortHex(), " codes blocks with mode ",
        std::string(codec::ModeName(params->mode)), "; the calibration is for mode ",
        std::string(artefact_mode)));
  return absl::OkStatus();
}

absl::Status FitsLayout(const std::optional<NamespaceRegistry::Entry>& entry,
                        const NamespaceId& ns, const codec::Calibration& calibration) {
  if (!entry) return absl::OkStatus();
  if (auto s = calibration.Matches(entry->spec.layout); !s.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("the calibration does not fit namespace ", ns.ShortHex(), ": ", s.message()));
  return absl::OkStatus();
}

}  // namespace

absl::Status ArtefactFitsNamespace(const std::optional<NamespaceRegistry::Entry>& entry,
                                   const NamespaceId& ns, std::string_view artefact) {
  STRATA_RETURN_IF_ERROR(TakesCalibrations(entry, ns));
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(artefact.data()),
                                       artefact.size());
  return OfItsMode(entry, ns, codec::CalibrationModeOf(bytes));
}

absl::Status CalibrationFitsNamespace(const std::optional<NamespaceRegistry::Entry>& entry,
                                      const NamespaceId& ns, const codec::Calibration& c) {
  return FitsLayout(entry, ns, c);
}

void FillCalibrationInfo(const CalibrationRecord& r, bool current, v1::CalibrationInfo* info) {
  info->set_id(r.id);
  info->set_version(r.version);
  info->set_bytes(r.artefact ? r.artefact->size() : 0);
  info->set_num_layers(r.num_layers);
  info->set_num_kv_heads(r.num_kv_heads);
  info->set_head_dim(r.head_dim);
  info->set_target_bits(r.target_bits);
  info->set_sample_bits(r.sample_bits);
  info->set_rope_theta(r.rope_theta);
  info->set_added_unix_ms(absl::ToUnixMillis(r.added));
  info->set_namespace_id(std::string(r.ns.AsBytes()));
  info->set_current(current);
  info->set_codec_mode(r.mode);
  info->set_step(r.step);
}

grpc::Status CalibrationService::Admit(const grpc::ServerContext* ctx, const std::string& raw,
                                       NamespaceId* ns, Caller* caller) const {
  if (auth_ && auth_->enabled()) {
    if (grpc::Status s = auth_->Check(ctx, kAnyRole, caller); !s.ok()) return s;
  } else {
    caller->trusted = true;
  }
  auto id = Digest::FromBytes(raw);
  if (!id.ok())
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("namespace_id must be 32 bytes, got ", raw.size()));
  *ns = *id;
  if (caller->trusted || caller->role != Role::kTenant) return grpc::Status::OK;
  if (auto s = namespaces_->Check(*ns); !s.ok()) return ToGrpcStatus(s);
  auto entry = namespaces_->Find(*ns);
  if (!entry || !caller->MayUse(entry->tenant))
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "the namespace belongs to another tenant than the token's");
  return grpc::Status::OK;
}

grpc::Status CalibrationService::Put(grpc::ServerContext* ctx,
                                     const v1::PutCalibrationRequest* req,
                                     v1::PutCalibrationResponse* resp) {
  NamespaceId ns;
  Caller caller;
  if (grpc::Status s = Admit(ctx, req->namespace_id(), &ns, &caller); !s.ok()) return s;
  const auto entry = namespaces_->Find(ns);
  if (auto s = ArtefactFitsNamespace(entry, ns, req->artefact()); !s.ok()) return ToGrpcStatus(s);
  auto stored = store_->Put(ns, req->artefact(), [&](const codec::Calibration& c) {
    return CalibrationFitsNamespace(entry, ns, c);
  });
  if (!stored.ok()) return ToGrpcStatus(stored.status());
  FillCalibrationInfo(*stored, store_->IsCurrent(ns, stored->id), resp->mutable_info());
  spdlog::info("calibration {} v{} stored for namespace {} ({} bytes)",
               codec::CalibrationIdString(stored->id), stored->version, ns.ShortHex(),
               stored->artefact->size());
  if (Cluster* c = cluster_.load())
    resp->set_replicated_to(c->calibrations().Push(ns, *stored->artefact, PeerDeadline(ctx, *c)));
  return grpc::Status::OK;
}

grpc::Status CalibrationService::Get(grpc::ServerContext* ctx,
                                     const v1::GetCalibrationRequest* req,
                                     v1::GetCalibrationResponse* resp) {
  NamespaceId ns;
  Caller caller;
  if (grpc::Status s = Admit(ctx, req->namespace_id(), &ns, &caller); !s.ok()) return s;
  auto found = store_->Get(ns, req->id());
  if (found.ok()) {
    FillCalibrationInfo(*found, store_->IsCurrent(ns, found->id), resp->mutable_info());
    resp->set_artefact(*found->artefact);
    return grpc::Status::OK;
  }
  Cluster* c = cluster_.load();
  if (!c) return ToGrpcStatus(found.status());
  const auto entry = namespaces_->Find(ns);
  // A namespace without calibrations has none to fetch (nor a use for up to 60 MiB of one).
  if (!TakesCalibrations(entry, ns).ok()) return ToGrpcStatus(found.status());
  auto fetched = c->calibrations().Fetch(ns, req->id(), PeerDeadline(ctx, *c));
  if (!fetched.ok())
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat(found.status().message(), "; ", fetched.status().message()));
  // A peer's answer is checked (parsed, and against the id asked for) and kept, so the next
  // reader finds it here.
  const uint64_t asked = req->id();
  if (auto s = ArtefactFitsNamespace(entry, ns, fetched->artefact()); !s.ok())
    return ToGrpcStatus(absl::DataLossError(
        absl::StrCat("another node's answer is unusable: ", s.message())));
  auto kept = store_->Put(ns, fetched->artefact(), [&](const codec::Calibration& c) {
    if (asked != 0 && c.Id() != asked)
      return absl::DataLossError(
          "another node answered with a calibration other than the one asked for");
    return CalibrationFitsNamespace(entry, ns, c);
  });
  if (absl::IsDataLoss(kept.status()) || absl::IsInvalidArgument(kept.status()))
    return ToGrpcStatus(absl::DataLossError(
        absl::StrCat("another node's answer is unusable: ", kept.status().message())));
  if (kept.ok()) {
    FillCalibrationInfo(*kept, store_->IsCurrent(ns, kept->id), resp->mutable_info());
  } else {
    // Valid, but not storable here (a version this node holds under another id, or the
    // limits): served as the other node described it.
    spdlog::warn("calibration {} of namespace {} from another node not kept here: {}",
                 codec::CalibrationIdString(fetched->info().id()), ns.ShortHex(),
                 std::string(kept.status().message()));
    *resp->mutable_info() = fetched->info();
    resp->mutable_info()->set_current(false);
  }
  resp->set_artefact(fetched->artefact());
  return grpc::Status::OK;
}

grpc::Status CalibrationService::List(grpc::ServerContext* ctx,
                                      const v1::ListCalibrationsRequest* req,
                                      v1::ListCalibrationsResponse* resp) {
  std::optional<NamespaceId> only;
  Caller caller;
  if (req->namespace_id().empty()) {
    if (auth_ && auth_->enabled()) {
      if (grpc::Status s = auth_->Check(ctx, static_cast<RoleSet>(Role::kAdmin), &caller); !s.ok())
        return s;
    }
  } else {
    NamespaceId ns;
    if (grpc::Status s = Admit(ctx, req->namespace_id(), &ns, &caller); !s.ok()) return s;
    only = ns;
  }
  auto records = store_->List(only);
  for (size_t i = 0; i < records.size(); ++i) {
    // Records come by namespace, then version: the last of each namespace is its current one.
    const bool current = i + 1 == records.size() || records[i + 1].ns != records[i].ns;
    FillCalibrationInfo(records[i], current, resp->add_calibrations());
  }
  return grpc::Status::OK;
}

}  // namespace strata::daemon
