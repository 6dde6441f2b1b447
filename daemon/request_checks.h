// The pure parse-and-check step of the gRPC handlers (Cache, Admin, Peer): what a request must
// satisfy before it touches the store, the namespace registry or the cluster. The handlers read
// a request's bytes only through these, so tests/fuzz/grpc_request_fuzzer, which feeds them
// arbitrary messages, runs exactly what production runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "strata/block_id.h"
#include "strata/v1/admin.pb.h"
#include "strata/v1/cache.pb.h"
#include "strata/v1/peer.pb.h"

namespace strata::daemon {

// Ids one Cache or Peer call may carry.
inline constexpr size_t kMaxIdsPerCall = 1 << 16;
inline constexpr uint32_t kDefaultListPage = 100;
inline constexpr uint32_t kMaxListPage = 10000;

// Whether a namespace is open on this daemon (NamespaceRegistry::Check). A function, so the
// checks need no registry: the fuzzer answers it from the input.
using NamespaceCheck = absl::FunctionRef<absl::Status(const NamespaceId&)>;

// The namespace (32 bytes, open here) and packed ids every block-scoped Cache request carries.
struct ScopedRequest {
  NamespaceId ns;
  std::vector<BlockId> ids;
};
absl::StatusOr<ScopedRequest> CheckScoped(std::string_view ns, std::string_view ids,
                                          NamespaceCheck is_open);
// A namespace id on the wire: 32 bytes and open here.
absl::StatusOr<NamespaceId> CheckNamespaceId(std::string_view raw, NamespaceCheck is_open);
// Cache.Reserve past its scope: the parent ids (none, or one per id) and one size per id.
absl::StatusOr<std::vector<BlockId>> CheckReserveParents(const v1::ReserveRequest& req, size_t ids);
absl::Status CheckPin(const v1::PinRequest& req);

// Admin.ListBlocks: the namespace filter (none: every namespace), page size and cursor.
struct ListBlocksQuery {
  std::optional<NamespaceId> ns;
  uint32_t page = kDefaultListPage;
  uint64_t cursor = 0;
};
absl::StatusOr<ListBlocksQuery> CheckListBlocks(const v1::ListBlocksRequest& req,
                                                NamespaceCheck is_open);
absl::StatusOr<std::vector<BlockId>> CheckInspectBlocks(const v1::InspectBlocksRequest& req);

// Peer.Announce and Peer.Locate: their ids (Announce also needs its node id).
absl::StatusOr<std::vector<BlockId>> CheckAnnounce(const v1::AnnounceRequest& req);
absl::StatusOr<std::vector<BlockId>> CheckPeerLocate(const v1::PeerLocateRequest& req);
// Peer.Pull: the namespace spec, the ids and their parents (none, or one per id).
struct PullOrder {
  NamespaceSpec spec;
  std::vector<BlockId> ids;
  std::vector<BlockId> parents;
};
absl::StatusOr<PullOrder> CheckPull(const v1::PullRequest& req);

}  // namespace strata::daemon
