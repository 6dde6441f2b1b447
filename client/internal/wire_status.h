// Status codes that travel as integers (the active messages of common/am_wire.h, the error_code
// of a streamed LookupResponse): absl's canonical codes, which gRPC's share.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace strata::client {

// A code from the wire; one this build does not know becomes kUnknown rather than an
// out-of-range enum value.
inline absl::StatusCode StatusCodeFromWire(uint32_t code) {
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated))
    return absl::StatusCode::kUnknown;
  return static_cast<absl::StatusCode>(code);
}

inline bool IsOkOnWire(uint32_t code) {
  return code == static_cast<uint32_t>(absl::StatusCode::kOk);
}

}  // namespace strata::client
