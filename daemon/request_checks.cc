#include "daemon/request_checks.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/packed_ids.h"
#include "common/status_macros.h"
#include "proto/convert.h"

namespace strata::daemon {

absl::StatusOr<NamespaceId> CheckNamespaceId(std::string_view raw, NamespaceCheck is_open) {
  auto id = Digest::FromBytes(raw);
  if (!id.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("namespace_id must be 32 bytes, got ", raw.size()));
  STRATA_RETURN_IF_ERROR(is_open(*id));
  return *id;
}

absl::StatusOr<ScopedRequest> CheckScoped(std::string_view ns, std::string_view ids,
                                          NamespaceCheck is_open) {
  STRATA_ASSIGN_OR_RETURN(NamespaceId id, CheckNamespaceId(ns, is_open));
  STRATA_ASSIGN_OR_RETURN(std::vector<BlockId> unpacked, UnpackIds(ids, "ids", kMaxIdsPerCall));
  return ScopedRequest{id, std::move(unpacked)};
}

absl::StatusOr<std::vector<BlockId>> CheckReserveParents(const v1::ReserveRequest& req,
                                                         size_t ids) {
  STRATA_ASSIGN_OR_RETURN(std::vector<BlockId> parents,
                          UnpackIds(req.parent_ids(), "parent_ids", kMaxIdsPerCall));
  if (static_cast<size_t>(req.sizes_size()) != ids || (!parents.empty() && parents.size() != ids))
    return absl::InvalidArgumentError(absl::StrCat("Reserve has ", ids, " ids, ", parents.size(),
                                                   " parent ids and ", req.sizes_size(),
                                                   " sizes; they must match"));
  return parents;
}

absl::Status CheckPin(const v1::PinRequest& req) {
  if (req.ttl_ms() == 0) return absl::InvalidArgumentError("Pin needs ttl_ms > 0");
  return absl::OkStatus();
}

absl::StatusOr<ListBlocksQuery> CheckListBlocks(const v1::ListBlocksRequest& req,
                                                NamespaceCheck is_open) {
  ListBlocksQuery q;
  if (!req.namespace_id().empty()) {
    auto id = Digest::FromBytes(req.namespace_id());
    if (!id.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("namespace_id must be 32 bytes, got ", req.namespace_id().size()));
    // An unknown namespace is one with no blocks to list, not a precondition to fix.
    if (auto s = is_open(*id); !s.ok()) return absl::NotFoundError(s.message());
    q.ns = *id;
  }
  q.page = req.page_size() == 0 ? kDefaultListPage : std::min(req.page_size(), kMaxListPage);
  q.cursor = req.page_token();
  return q;
}

absl::StatusOr<std::vector<BlockId>> CheckInspectBlocks(const v1::InspectBlocksRequest& req) {
  return UnpackIds(req.ids(), "ids", kMaxListPage);
}

absl::StatusOr<std::vector<BlockId>> CheckAnnounce(const v1::AnnounceRequest& req) {
  STRATA_ASSIGN_OR_RETURN(std::vector<BlockId> ids, UnpackIds(req.ids(), "ids", kMaxIdsPerCall));
  if (req.node_id().empty()) return absl::InvalidArgumentError("Announce needs node_id");
  return ids;
}

absl::StatusOr<std::vector<BlockId>> CheckPeerLocate(const v1::PeerLocateRequest& req) {
  return UnpackIds(req.ids(), "ids", kMaxIdsPerCall);
}

absl::StatusOr<PullOrder> CheckPull(const v1::PullRequest& req) {
  PullOrder order;
  STRATA_ASSIGN_OR_RETURN(order.ids, UnpackIds(req.ids(), "ids", kMaxIdsPerCall));
  STRATA_ASSIGN_OR_RETURN(order.parents, UnpackIds(req.parent_ids(), "parent_ids", kMaxIdsPerCall));
  if (!order.parents.empty() && order.parents.size() != order.ids.size())
    return absl::InvalidArgumentError("parent_ids must be empty or match ids one for one");
  if (req.source_address().empty()) return absl::InvalidArgumentError("Pull needs source_address");
  order.spec = FromProto(req.spec());
  if (absl::Status s = order.spec.Validate(); !s.ok())
    return absl::InvalidArgumentError(absl::StrCat("spec: ", s.message()));
  return order;
}

}  // namespace strata::daemon
