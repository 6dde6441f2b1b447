// Block ids on the wire: N ids as N x 32 raw bytes back to back, the form of every `ids` field
// of the protos and of the active messages (common/am_wire.h).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "strata/block_id.h"

namespace strata {

std::string PackIds(std::span<const BlockId> ids);

// The ids packed in `packed`; InvalidArgument naming `field` unless it is a multiple of 32 bytes
// holding at most `max_ids` ids.
absl::StatusOr<std::vector<BlockId>> UnpackIds(std::string_view packed, std::string_view field,
                                               size_t max_ids);

}  // namespace strata
