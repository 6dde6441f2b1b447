#include "client/block_calls.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/packed_ids.h"
#include "common/strings.h"
#include "common/status_macros.h"
#include "proto/convert.h"

namespace strata::client {
namespace {

std::string TierName(v1::Tier tier) {
  switch (tier) {
    case v1::TIER_HOST: return "host";
    case v1::TIER_NVME: return "nvme";
    case v1::TIER_GPU: return "gpu";
    default: return "unknown";
  }
}

}  // namespace

absl::Status CheckStatusCount(const char* name, int statuses, size_t ids) {
  if (statuses == static_cast<int>(ids)) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(name, " answered ", statuses, " statuses for ", ids, " ids"));
}

absl::StatusOr<NodeStatus> ReadNodeStatus(v1::Cache::Stub& stub, const CallRunner& run) {
  v1::StatsRequest req;
  v1::StatsResponse r;
  STRATA_RETURN_IF_ERROR(
      run("Stats", [&](grpc::ClientContext* c) { return stub.Stats(c, req, &r); }));
  NodeStatus s;
  s.node_id = r.node_id();
  s.version = r.version();
  s.uptime_ms = r.uptime_ms();
  s.transport = r.transport();
  for (const auto& t : r.tiers())
    s.tiers.push_back(
        {TierName(t.tier()), t.capacity_bytes(), t.used_bytes(), t.blocks(), t.reserved_bytes()});
  std::stable_partition(s.tiers.begin(), s.tiers.end(),
                        [](const TierUsage& t) { return t.tier == "host"; });
  s.open_reservations = r.open_reservations();
  s.open_leases = r.open_leases();
  s.pinned_blocks = r.pinned_blocks();
  s.namespaces = r.namespaces();
  s.counters.insert(r.counters().begin(), r.counters().end());
  return s;
}

absl::StatusOr<std::vector<BlockStatus>> PinBlocks(v1::Cache::Stub& stub, const CallRunner& run,
                                                   const NamespaceId& ns,
                                                   std::span<const BlockId> ids,
                                                   absl::Duration ttl) {
  v1::PinRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_ids(PackIds(ids));
  req.set_ttl_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(ttl)));
  v1::PinResponse resp;
  STRATA_RETURN_IF_ERROR(
      run("Pin", [&](grpc::ClientContext* c) { return stub.Pin(c, req, &resp); }));
  STRATA_RETURN_IF_ERROR(CheckStatusCount("Pin", resp.status_size(), ids.size()));
  return BlockStatuses(resp.status());
}

absl::StatusOr<std::vector<BlockStatus>> UnpinBlocks(v1::Cache::Stub& stub, const CallRunner& run,
                                                     const NamespaceId& ns,
                                                     std::span<const BlockId> ids) {
  v1::UnpinRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_ids(PackIds(ids));
  v1::UnpinResponse resp;
  STRATA_RETURN_IF_ERROR(
      run("Unpin", [&](grpc::ClientContext* c) { return stub.Unpin(c, req, &resp); }));
  STRATA_RETURN_IF_ERROR(CheckStatusCount("Unpin", resp.status_size(), ids.size()));
  return BlockStatuses(resp.status());
}

absl::StatusOr<EvictOutcome> EvictBlocks(v1::Cache::Stub& stub, const CallRunner& run,
                                         const NamespaceId& ns, std::span<const BlockId> ids,
                                         bool cascade, bool force) {
  v1::EvictRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_ids(PackIds(ids));
  req.set_cascade(cascade);
  req.set_force(force);
  v1::EvictResponse resp;
  STRATA_RETURN_IF_ERROR(
      run("Evict", [&](grpc::ClientContext* c) { return stub.Evict(c, req, &resp); }));
  STRATA_RETURN_IF_ERROR(CheckStatusCount("Evict", resp.status_size(), ids.size()));
  return EvictOutcome{BlockStatuses(resp.status()), resp.removed_blocks()};
}

absl::StatusOr<RepositionOutcome> RepositionBlocks(v1::Cache::Stub& stub, const CallRunner& run,
                                                   const NamespaceId& ns,
                                                   std::span<const BlockId> ids,
                                                   const std::string& target_node, bool move,
                                                   std::string_view target_tier) {
  v1::RepositionRequest req;
  if (target_tier == "gpu") {
    req.set_target_tier(v1::TIER_GPU);
  } else if (target_tier == "host" || target_tier.empty()) {
    req.set_target_tier(v1::TIER_HOST);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("target tier '", AsAbsl(target_tier),
                                                   "' is not one of host, gpu"));
  }
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_ids(PackIds(ids));
  req.set_target_node(target_node);
  req.set_move(move);
  v1::RepositionResponse resp;
  STRATA_RETURN_IF_ERROR(
      run("Reposition", [&](grpc::ClientContext* c) { return stub.Reposition(c, req, &resp); }));
  STRATA_RETURN_IF_ERROR(CheckStatusCount("Reposition", resp.status_size(), ids.size()));
  return RepositionOutcome{BlockStatuses(resp.status()), resp.copied(), resp.already_there(),
                           resp.removed_sources()};
}

}  // namespace strata::client
