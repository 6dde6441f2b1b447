// Reads a Mooncake-style request trace: one JSON object per line, whose "hash_ids" array holds
// the request's prefix block hashes (equal ids = the same prefix block). Other fields are
// skipped. A small strict parser: any line that is not a JSON object with an array of
// non-negative integers under "hash_ids" is an error naming the line.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::replay {

struct TraceRequest {
  std::vector<uint64_t> hash_ids;
};

// Parses one line (without its newline).
absl::StatusOr<TraceRequest> ParseTraceLine(std::string_view line);

// Reads up to `max_requests` requests (0: all); blank lines are skipped.
absl::StatusOr<std::vector<TraceRequest>> ReadTrace(const std::string& path,
                                                    size_t max_requests = 0);

}  // namespace strata::replay
