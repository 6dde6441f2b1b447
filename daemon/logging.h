// stratad's log output: text for people, or one JSON object per line for log pipelines; and the
// two guards every line caused by a client needs (issue 14, finding 5): its strings escaped, so a
// tenant named "x\n2025-01-01 ... error ..." cannot forge a line, and its rate bounded, so a
// client cannot fill the disk through the log.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::daemon {

// `level`: trace, debug, info, warn, error. `format`: text or json.
void ConfigureLogging(const std::string& level, const std::string& format);

// `text` from a client or a peer, fit for one log line: backslash, control characters (newlines
// included), DEL and bytes >= 0x80 become \\, \n, \xHH...; more than `max_bytes` input bytes are
// cut and the cut is said ("...(+N bytes)").
std::string LogSafe(std::string_view text, size_t max_bytes = 128);

// At most `burst` lines per `period_ms` for one kind of line; what it refuses is counted and
// reported by the next line it allows. Lock-free; one instance per call site.
class LogRateLimiter {
 public:
  explicit LogRateLimiter(uint32_t burst = 10, int64_t period_ms = 1000)
      : burst_(burst), period_ms_(period_ms) {}
  // True when a line may be written now; `*suppressed` gets the lines refused since the last
  // allowed one.
  bool Allow(uint64_t* suppressed);

 private:
  const uint32_t burst_;
  const int64_t period_ms_;
  std::atomic<int64_t> window_start_ms_{0};
  std::atomic<uint32_t> in_window_{0};
  std::atomic<uint64_t> suppressed_{0};
};

// ", N similar lines suppressed" when `suppressed` > 0, else "".
std::string SuppressedNote(uint64_t suppressed);

}  // namespace strata::daemon
