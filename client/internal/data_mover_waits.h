// The waits DataMover's publish routes share (client/data_mover.cc, data_mover_staged.cc):
// what the active-message handlers fill in while the publishing thread progresses the worker.
#pragma once

#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/data_mover.h"

namespace strata::client {

// A wait on the data plane that found its endpoint failed: UCX or the endpoint's watch saw the
// daemon go (transport::Worker::PeerFailure). What was in flight will not come.
inline absl::Status DaemonWentAway(const char* during) {
  return absl::UnavailableError(
      absl::StrCat("the data-plane connection to stratad failed during ", during,
                   " (the daemon died or its node went away)"));
}

// A publish by message in progress; see common/am_wire.h.
struct DataMover::PublishWait {
  uint64_t request_id = 0;
  std::vector<uint8_t> acked;  // per block: a daemon that acknowledges one twice is refused
  // Per block, where the daemon takes the CRC (kStagedCrcByDaemon): filled from its
  // acknowledgement, which must then carry one. Null: no such block.
  std::vector<uint32_t>* crcs_from_acks = nullptr;
  std::vector<uint8_t> crc_by_daemon;
  // The blocks of a staged publish, whose acknowledged bytes are counted (empty: not counted).
  std::span<const BlockMove> blocks;
  uint64_t acked_bytes = 0;
  size_t done = 0;
  absl::Status error;
};

struct DataMover::ExchangeWait {
  uint64_t request_id = 0;
  uint16_t reply_am = 0;
  bool done = false;
  Reply reply;
  std::function<void(const Reply&)> on_reply;  // runs in the handler, once the reply is in
};

}  // namespace strata::client
