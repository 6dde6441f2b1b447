// The node record as etcd stores it: one JSON object
// {"id","address","host_capacity","nvme_capacity","version"}.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "placement/membership.h"

namespace strata::placement::internal {

std::string EncodeNodeRecord(const NodeRecord& record);
absl::StatusOr<NodeRecord> DecodeNodeRecord(std::string_view json);

}  // namespace strata::placement::internal
