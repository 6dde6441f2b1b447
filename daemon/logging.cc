#include "daemon/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"

namespace strata::daemon {
namespace {

// The message, escaped for a JSON string (spdlog's %v is raw).
class JsonEscapedMessage : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    static const char* kHex = "0123456789abcdef";
    for (char c : msg.payload) {
      switch (c) {
        case '"': dest.append(std::string_view("\\\"")); break;
        case '\\': dest.append(std::string_view("\\\\")); break;
        case '\n': dest.append(std::string_view("\\n")); break;
        case '\t': dest.append(std::string_view("\\t")); break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            const char esc[6] = {'\\', 'u', '0', '0', kHex[(c >> 4) & 0xf], kHex[c & 0xf]};
            dest.append(esc, esc + 6);
          } else {
            dest.push_back(c);
          }
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonEscapedMessage>();
  }
};

}  // namespace

std::string LogSafe(std::string_view text, size_t max_bytes) {
  static const char* kHex = "0123456789abcdef";
  const std::string_view kept = text.substr(0, max_bytes);
  std::string out;
  out.reserve(kept.size() + 8);
  for (char ch : kept) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c >= 0x7f) {
      const char esc[4] = {'\\', 'x', kHex[c >> 4], kHex[c & 0xf]};
      out.append(esc, 4);
    } else {
      out.push_back(ch);
    }
  }
  if (text.size() > kept.size())
    absl::StrAppend(&out, "...(+", text.size() - kept.size(), " bytes)");
  return out;
}

bool LogRateLimiter::Allow(uint64_t* suppressed) {
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t start = window_start_ms_.load(std::memory_order_relaxed);
  if (now - start >= period_ms_ &&
      window_start_ms_.compare_exchange_strong(start, now, std::memory_order_relaxed))
    in_window_.store(0, std::memory_order_relaxed);
  if (in_window_.fetch_add(1, std::memory_order_relaxed) >= burst_) {
    suppressed_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  *suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
  return true;
}

std::string SuppressedNote(uint64_t suppressed) {
  return suppressed == 0 ? std::string()
                         : absl::StrCat(" (", suppressed, " similar lines suppressed)");
}

void ConfigureLogging(const std::string& level, const std::string& format) {
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::flush_on(spdlog::level::info);
  if (format == "json") {
    auto f = std::make_unique<spdlog::pattern_formatter>();
    f->add_flag<JsonEscapedMessage>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%e","level":"%l","pid":%P,"msg":"%*"})");
    spdlog::set_formatter(std::move(f));
  } else {
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ stratad[%P] %v");
  }
}

}  // namespace strata::daemon
