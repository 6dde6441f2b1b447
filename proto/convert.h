// Conversions between the wire messages and the vocabulary types of common/.
#pragma once

#include <vector>

#include "strata/block_id.h"
#include "strata/block_status.h"
#include "strata/v1/cache.pb.h"

namespace strata {

v1::NamespaceSpecProto ToProto(const NamespaceSpec& spec);
NamespaceSpec FromProto(const v1::NamespaceSpecProto& proto);

// The per-block statuses of a response (a repeated BlockStatus field).
template <typename Repeated>
std::vector<BlockStatus> BlockStatuses(const Repeated& r) {
  std::vector<BlockStatus> out;
  out.reserve(r.size());
  for (int s : r) out.push_back(static_cast<BlockStatus>(s));
  return out;
}

}  // namespace strata
