#include "client/internal/logging.h"

#include <cstdio>

namespace strata::client {

void Log(const LogSink& sink, LogLevel level, std::string_view message) {
  if (sink) {
    sink(level, message);
    return;
  }
  if (level < LogLevel::kWarning) return;
  std::fprintf(stderr, "libstrata: %.*s\n", static_cast<int>(message.size()), message.data());
}

}  // namespace strata::client
