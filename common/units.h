// Human-readable sizes ("64KiB", "1.5GiB", "4096") and durations ("30s", "250ms") for config
// files and flags.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata {

absl::StatusOr<uint64_t> ParseSize(std::string_view text);
std::string FormatSize(uint64_t bytes);
absl::StatusOr<absl::Duration> ParseDurationText(std::string_view text);

}  // namespace strata
