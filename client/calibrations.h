// The calibrations (codec modes pca and xl) a client encodes and decodes a namespace's blobs
// with: asked of its daemon (which asks the rest of the cluster when it lacks one), checked
// against the id asked for, and kept while they fit the client's budget
// (ClientOptions::calibration_cache_bytes; the least recently used beyond it are asked again
// when a blob names them). The namespace's current calibration, the one new
// blobs are coded with, is asked again after `refresh`, so a recalibration reaches every client
// within that time; blobs of any earlier version still decode.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/control_channel.h"
#include "codec/calibration.h"
#include "strata/v1/calibration.grpc.pb.h"

namespace strata::client {

class CalibrationCache {
 public:
  CalibrationCache(ControlChannel* control, uint64_t max_bytes,
                   absl::Duration refresh = absl::Seconds(10));

  // What the Encoder and Decoder look calibrations up in.
  const codec::CalibrationSet& set() const { return set_; }

  // The calibration new blobs of `ns` are coded with: `id` when the namespace's codec policy
  // names one, else the namespace's current one. FAILED_PRECONDITION (saying how to calibrate)
  // when the namespace has none.
  absl::StatusOr<std::shared_ptr<const codec::Calibration>> ForEncoding(const NamespaceId& ns,
                                                                        uint64_t id);
  // Asks the daemon for every id of `ids` not held yet. Those it cannot get stay out of set():
  // their blobs then decode to kUnknownCalibration. Returns the ones held: keeping them keeps
  // them in set() (the budget evicts only calibrations nobody holds) until the blobs decode.
  std::vector<std::shared_ptr<const codec::Calibration>> Ensure(const NamespaceId& ns,
                                                                std::span<const uint64_t> ids);

  absl::StatusOr<v1::PutCalibrationResponse> Put(const NamespaceId& ns, std::string artefact);
  // Artefacts asked of the daemon and parsed (set() says what is held).
  uint64_t fetches() const { return fetches_.load(std::memory_order_relaxed); }
  absl::StatusOr<v1::ListCalibrationsResponse> List(const NamespaceId& ns);

 private:
  // One artefact from the daemon, parsed and checked against `id` (0: whatever is current).
  absl::StatusOr<std::shared_ptr<const codec::Calibration>> Fetch(const NamespaceId& ns,
                                                                  uint64_t id);

  ControlChannel* const control_;
  const absl::Duration refresh_;
  std::unique_ptr<v1::Calibrations::Stub> stub_;
  codec::CalibrationSet set_;
  std::atomic<uint64_t> fetches_{0};
  struct Current {
    uint64_t id = 0;
    absl::Time checked;
  };
  std::mutex mu_;
  absl::flat_hash_map<NamespaceId, Current> current_;  // guarded by mu_
};

// The calibration id a blob names (pca and xl blobs), read from its header without checking the
// rest; 0 for anything else.
uint64_t BlobCalibrationId(std::span<const uint8_t> blob);

}  // namespace strata::client
