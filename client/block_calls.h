// The calls on blocks that both the engine's Client and the operator's AdminClient make (pin,
// unpin, evict, reposition): the request built and the answer read in one place. Each caller
// runs the call its own way (the Client re-opens a namespace the daemon forgot; the AdminClient
// names the daemon in its errors), through a CallRunner.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "strata/admin_client.h"
#include "strata/block_id.h"
#include "strata/block_status.h"
#include "strata/client.h"
#include "strata/v1/cache.grpc.pb.h"

namespace strata::client {

using GrpcCall = std::function<grpc::Status(grpc::ClientContext*)>;
// Runs `call` (named `name` in errors) with a deadline of the runner's choosing.
using CallRunner = std::function<absl::Status(const char* name, const GrpcCall& call)>;

// A daemon answers one status per id; any other count is a broken reply (InternalError naming
// `name`), not a per-block outcome.
absl::Status CheckStatusCount(const char* name, int statuses, size_t ids);

// The daemon's status and counters (Cache.Stats), tiers host first.
absl::StatusOr<NodeStatus> ReadNodeStatus(v1::Cache::Stub& stub, const CallRunner& run);

absl::StatusOr<std::vector<BlockStatus>> PinBlocks(v1::Cache::Stub& stub, const CallRunner& run,
                                                   const NamespaceId& ns,
                                                   std::span<const BlockId> ids,
                                                   absl::Duration ttl);
absl::StatusOr<std::vector<BlockStatus>> UnpinBlocks(v1::Cache::Stub& stub, const CallRunner& run,
                                                     const NamespaceId& ns,
                                                     std::span<const BlockId> ids);
absl::StatusOr<EvictOutcome> EvictBlocks(v1::Cache::Stub& stub, const CallRunner& run,
                                         const NamespaceId& ns, std::span<const BlockId> ids,
                                         bool cascade, bool force);
absl::StatusOr<RepositionOutcome> RepositionBlocks(v1::Cache::Stub& stub, const CallRunner& run,
                                                   const NamespaceId& ns,
                                                   std::span<const BlockId> ids,
                                                   const std::string& target_node, bool move,
                                                   std::string_view target_tier = "host");

}  // namespace strata::client
