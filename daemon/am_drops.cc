#include "daemon/am_drops.h"

#include <spdlog/spdlog.h>

#include <chrono>

namespace strata::daemon {

void AmDrops::Note(uint16_t id, const transport::AmMessage& m, std::string_view why) {
  const uint64_t total = total_.fetch_add(1, std::memory_order_relaxed) + 1;
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count();
  int64_t next = next_log_ms_.load(std::memory_order_relaxed);
  if (now_ms < next || !next_log_ms_.compare_exchange_strong(next, now_ms + 1000)) {
    unlogged_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const uint64_t unlogged = unlogged_.exchange(0, std::memory_order_relaxed);
  spdlog::warn(
      "dropped a malformed active message (id {}, header {} B, payload {} B{}{}): {}; {} dropped "
      "so far, {} not logged since the last report",
      id, m.header.size(), m.length, m.rendezvous ? ", rendezvous" : "",
      m.reply_ep ? "" : ", no reply endpoint", why, total, unlogged);
}

}  // namespace strata::daemon
