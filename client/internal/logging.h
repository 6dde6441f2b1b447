// Where libstrata's diagnostics go: the caller's LogSink (ClientOptions::log), else stderr.
#pragma once

#include <string_view>

#include "strata/client.h"

namespace strata::client {

// Without a sink, warnings and errors go to stderr (prefixed "libstrata: ") and the rest is
// dropped: a library must not fill an engine's log with chatter it did not ask for.
void Log(const LogSink& sink, LogLevel level, std::string_view message);

}  // namespace strata::client
