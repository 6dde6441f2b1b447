#include "client/block_calls.h"

#include "absl/strings/str_cat.h"
#include "common/packed_ids.h"
#include "common/status_macros.h"
#include "proto/convert.h"

namespace strata::client {
namespace {

// A daemon answers one status per id; anything else is a broken reply, not a per-block outcome.
absl::Status CheckCount(const char* name, int statuses, size_t ids) {
  if (statuses == static_cast<int>(ids)) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(name, " answered ", statuses, " statuses for ", ids, " ids"));
}

}  // namespace

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
  STRATA_RETURN_IF_ERROR(CheckCount("Pin", resp.status_size(), ids.size()));
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
  STRATA_RETURN_IF_ERROR(CheckCount("Unpin", resp.status_size(), ids.size()));
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
  STRATA_RETURN_IF_ERROR(CheckCount("Evict", resp.status_size(), ids.size()));
  return EvictOutcome{BlockStatuses(resp.status()), resp.removed_blocks()};
}

absl::StatusOr<RepositionOutcome> RepositionBlocks(v1::Cache::Stub& stub, const CallRunner& run,
                                                   const NamespaceId& ns,
                                                   std::span<const BlockId> ids,
                                                   const std::string& target_node, bool move) {
  v1::RepositionRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_ids(PackIds(ids));
  req.set_target_node(target_node);
  req.set_target_tier(v1::TIER_HOST);
  req.set_move(move);
  v1::RepositionResponse resp;
  STRATA_RETURN_IF_ERROR(
      run("Reposition", [&](grpc::ClientContext* c) { return stub.Reposition(c, req, &resp); }));
  STRATA_RETURN_IF_ERROR(CheckCount("Reposition", resp.status_size(), ids.size()));
  return RepositionOutcome{BlockStatuses(resp.status()), resp.copied(), resp.already_there(),
                           resp.removed_sources()};
}

}  // namespace strata::client
