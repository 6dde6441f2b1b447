// Per-block outcome of a batched call. Numbers match strata.v1.BlockStatus on the wire.
#pragma once

#include <cstdint>
#include <string_view>

namespace strata {

enum class BlockStatus : uint8_t {
  kOk = 0,
  kNotFound = 1,
  kExists = 2,
  kInProgress = 3,
  kNoSpace = 4,
  kCrcMismatch = 5,
  kPinned = 6,
  kInvalid = 7,
  kExpired = 8,
  // Fetch: the blob arrived intact but names a calibration (codec mode pca) that neither this
  // client nor any daemon it reached holds; nothing was written to the buffer.
  kUnknownCalibration = 9,
};

constexpr std::string_view BlockStatusName(BlockStatus s) {
  switch (s) {
    case BlockStatus::kOk: return "ok";
    case BlockStatus::kNotFound: return "not_found";
    case BlockStatus::kExists: return "exists";
    case BlockStatus::kInProgress: return "in_progress";
    case BlockStatus::kNoSpace: return "no_space";
    case BlockStatus::kCrcMismatch: return "crc_mismatch";
    case BlockStatus::kPinned: return "pinned";
    case BlockStatus::kInvalid: return "invalid";
    case BlockStatus::kExpired: return "expired";
    case BlockStatus::kUnknownCalibration: return "unknown_calibration";
  }
  return "unknown";
}

}  // namespace strata
