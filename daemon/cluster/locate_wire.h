// The data of a peer locate reply sent as an active message (am_wire::kPeerLocateReplyAm): a
// table of node ids, then the holders of each asked id as (node index, tier) pairs. The layout
// is documented in common/am_wire.h; the header carries the node-table size.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "placement/directory.h"
#include "strata/v1/cache.pb.h"

namespace strata::daemon {

using Holders = std::vector<std::vector<placement::Location>>;

// At most 255 holders per id and 65535-byte node ids travel; `*nodes` gets the table size.
std::string EncodeLocateReply(const Holders& holders, uint32_t* nodes);
// Whether `data` parses as a reply for `ids` asked ids with a `nodes`-entry table; only then
// calls visit(k, node, tier) for each holder of asked id k (node indexes outside the table are
// skipped). A lookup merges straight from the reply, with nothing allocated per id.
using HolderVisitor = std::function<void(size_t k, std::string_view node, int tier)>;
bool VisitLocateReply(std::string_view data, uint32_t nodes, size_t ids,
                      const HolderVisitor& visit);
// The same, collected: the holders of each asked id, or nullopt when `data` does not parse.
std::optional<Holders> DecodeLocateReply(std::string_view data, uint32_t nodes, size_t ids);

// A strata.v1.Tier off the wire as a directory tier (anything unknown is kUnknown).
inline placement::LocationTier LocationTierOf(int proto_tier) {
  switch (proto_tier) {
    case v1::TIER_GPU: return placement::LocationTier::kGpu;
    case v1::TIER_HOST: return placement::LocationTier::kHost;
    case v1::TIER_NVME: return placement::LocationTier::kNvme;
    default: return placement::LocationTier::kUnknown;
  }
}

}  // namespace strata::daemon
