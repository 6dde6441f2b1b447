#include "client/calibrations.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/blob.h"
#include "common/status_macros.h"

namespace strata::client {

CalibrationCache::CalibrationCache(ControlChannel* control, uint64_t max_bytes,
                                   absl::Duration refresh)
    : control_(control),
      refresh_(refresh),
      stub_(v1::Calibrations::NewStub(control->channel())),
      set_(max_bytes) {}

absl::StatusOr<std::shared_ptr<const codec::Calibration>> CalibrationCache::Fetch(
    const NamespaceId& ns, uint64_t id) {
  v1::GetCalibrationRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_id(id);
  v1::GetCalibrationResponse resp;
  STRATA_RETURN_IF_ERROR(control_->NsRpc("Calibrations.Get", ns, [&](grpc::ClientContext* c) {
    return stub_->Get(c, req, &resp);
  }));
  const std::string& bytes = resp.artefact();
  auto parsed =
      codec::Calibration::Parse({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
  if (!parsed.ok())
    return absl::DataLossError(
        absl::StrCat("the daemon's calibration does not parse: ", parsed.status().message()));
  if (id != 0 && parsed->Id() != id)
    return absl::DataLossError(absl::StrCat("asked for calibration ",
                                            codec::CalibrationIdString(id), ", got ",
                                            codec::CalibrationIdString(parsed->Id())));
  fetches_.fetch_add(1, std::memory_order_relaxed);
  // What the set holds under the id (another thread's copy, if it got there first): the pin.
  return set_.Insert(std::make_shared<const codec::Calibration>(std::move(*parsed)));
}

absl::StatusOr<std::shared_ptr<const codec::Calibration>> CalibrationCache::ForEncoding(
    const NamespaceId& ns, uint64_t id) {
  if (id != 0) {
    if (auto held = set_.Find(id)) return held;
    return Fetch(ns, id);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = current_.find(ns);
    if (it != current_.end() && absl::Now() - it->second.checked < refresh_)
      if (auto held = set_.Find(it->second.id)) return held;
  }
  auto fetched = Fetch(ns, 0);
  if (!fetched.ok()) {
    if (absl::IsNotFound(fetched.status()))
      return absl::FailedPreconditionError(absl::StrCat(
          "namespace ", ns.ShortHex(),
          " codes blocks with a calibration (codec policy pca or xl) but has none yet: calibrate "
          "it (Client::Calibrate, or stratactl calibration put) before publishing (",
          fetched.status().message(), ")"));
    return fetched.status();
  }
  std::lock_guard<std::mutex> lock(mu_);
  current_[ns] = {(*fetched)->Id(), absl::Now()};
  return fetched;
}

std::vector<std::shared_ptr<const codec::Calibration>> CalibrationCache::Ensure(
    const NamespaceId& ns, std::span<const uint64_t> ids) {
  std::vector<std::shared_ptr<const codec::Calibration>> held;
  for (uint64_t id : ids) {
    if (id == 0) continue;
    std::shared_ptr<const codec::Calibration> c = set_.Find(id);
    if (!c) {
      auto fetched = Fetch(ns, id);
      if (fetched.ok()) c = *std::move(fetched);
    }
    if (c) held.push_back(std::move(c));
  }
  return held;
}

absl::StatusOr<v1::PutCalibrationResponse> CalibrationCache::Put(const NamespaceId& ns,
                                                                 std::string artefact) {
  v1::PutCalibrationRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_artefact(std::move(artefact));
  v1::PutCalibrationResponse resp;
  STRATA_RETURN_IF_ERROR(control_->NsRpc("Calibrations.Put", ns, [&](grpc::ClientContext* c) {
    return stub_->Put(c, req, &resp);
  }));
  // This client codes its next blobs with whatever is current now.
  std::lock_guard<std::mutex> lock(mu_);
  current_.erase(ns);
  return resp;
}

absl::StatusOr<v1::ListCalibrationsResponse> CalibrationCache::List(const NamespaceId& ns) {
  v1::ListCalibrationsRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  v1::ListCalibrationsResponse resp;
  STRATA_RETURN_IF_ERROR(control_->NsRpc("Calibrations.List", ns, [&](grpc::ClientContext* c) {
    return stub_->List(c, req, &resp);
  }));
  return resp;
}

uint64_t BlobCalibrationId(std::span<const uint8_t> blob) {
  if (blob.size() < codec::kHeaderBytes) return 0;
  uint32_t magic;
  std::memcpy(&magic, blob.data(), sizeof magic);
  if (magic != codec::kBlobMagic || !codec::ModeNamesCalibration(blob[8])) return 0;
  uint64_t id;
  std::memcpy(&id, blob.data() + 56, sizeof id);
  return id;
}

}  // namespace strata::client
