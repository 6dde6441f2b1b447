// Active messages stratad drops because they are malformed or unexpected (a buggy or hostile
// peer on the data plane): counted, and logged at most once a second so that a flood of them
// cannot flood the log.
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

#include "transport/ucx.h"

namespace strata::daemon {

class AmDrops {
 public:
  // Counts one dropped (or refused) message with AM id `id`; logs it unless a report went out
  // within the last second, in which case the next report says how many were not logged.
  void Note(uint16_t id, const transport::AmMessage& m, std::string_view why);
  uint64_t total() const { return total_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> total_{0};
  std::atomic<uint64_t> unlogged_{0};
  std::atomic<int64_t> next_log_ms_{0};
};

}  // namespace strata::daemon
