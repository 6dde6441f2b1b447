// stratad's log output: text for people, or one JSON object per line for log pipelines.
#pragma once

#include <string>

namespace strata::daemon {

// `level`: trace, debug, info, warn, error. `format`: text or json.
void ConfigureLogging(const std::string& level, const std::string& format);

}  // namespace strata::daemon
