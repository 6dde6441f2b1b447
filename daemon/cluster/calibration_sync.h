// Calibrations across the cluster (docs/codec.md, "Calibrations"): a daemon copies each artefact
// its clients store to the other nodes, and asks them for one it lacks when a client needs it.
// Both are best effort within a deadline; whatever answers is checked against the id asked for
// (and parsed) by the caller before it is used.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/cluster/context.h"
#include "strata/block_id.h"
#include "strata/v1/calibration.pb.h"

namespace strata::daemon {

// At most this many other nodes are asked or sent a copy.
inline constexpr size_t kCalibrationFanout = 64;

class CalibrationSync {
 public:
  explicit CalibrationSync(ClusterContext& ctx) : ctx_(ctx) {}

  // Asks the other nodes of the current view, in parallel, for calibration `id` of `ns` (0: the
  // newest version any of them holds). Returns the first answer for an id, or the answer with
  // the highest version for 0; NOT_FOUND when no node reached has it by `deadline`.
  absl::StatusOr<v1::GetCalibrationResponse> Fetch(const NamespaceId& ns, uint64_t id,
                                                   absl::Time deadline);
  // Sends `artefact` to the other nodes of the current view; how many stored it by `deadline`.
  uint32_t Push(const NamespaceId& ns, const std::string& artefact, absl::Time deadline);

 private:
  ClusterContext& ctx_;
};

}  // namespace strata::daemon
