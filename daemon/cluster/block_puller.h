// This node's side of a copy from another daemon (Peer.Pull): fetch the blocks from the
// source, commit them into this node's store (where their CRC32C is verified once more), and
// make them findable before answering. Also removes blocks at a source once a move copied them.
//
// The bytes come the way any client fetches them, without a whole Client: a link to the source
// daemon (client::DaemonLink: its control channel and a data mover to its arena) acquires the
// blocks, moves them over UCX and releases them (FetchFromSource).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/cluster/announcer.h"
#include "daemon/cluster/context.h"
#include "daemon/namespace_registry.h"
#include "storage/block_store.h"
#include "strata/block_status.h"

namespace strata::client {
class DaemonLink;
}

namespace strata {
class GpuTieredStore;
}

namespace strata::daemon {

class DeviceTransfers;

// Where a pull puts the blocks.
enum class PullInto {
  kHost,
  kDevice,         // the GPU tier: an error (kInvalid) on a node without one
  kDeviceIfAny,    // the GPU tier where there is one and it has room, else host memory
};

// Whether `store` holds `id` in namespace `ns`: Holds and the directory know ids only, and an
// id another namespace holds here (ids of the vllm scheme carry none) is not the block. Holds
// first, so that only a held id pays the namespace's lookup (which counts and touches it).
inline bool HeldIn(BlockStore& store, const NamespaceId& ns, const BlockId& id) {
  return store.Holds(id) && store.Lookup(ns, {&id, 1}, nullptr) == 1;
}

class BlockPuller {
 public:
  // `gpu`: this node's GPU tier (null: none); `device`: its device links to other GPU tiers
  // (null: none). Both must outlive the puller.
  BlockPuller(ClusterContext& ctx, BlockStore& store, NamespaceRegistry& namespaces,
              Announcer& announcer, GpuTieredStore* gpu = nullptr,
              DeviceTransfers* device = nullptr);
  ~BlockPuller();
  BlockPuller(const BlockPuller&) = delete;
  BlockPuller& operator=(const BlockPuller&) = delete;

  // Copies `ids` (with their `parents`, or none) of the namespace (`spec`, `tenant`) from the
  // daemon `source_node` at `source_address` into this node's store; opens the namespace here
  // first (with `replicas` when > 0). Per id: kOk (copied), kExists (already held here), or why
  // not (kNotFound when the source could not be used).
  // Into the GPU tier (`into`): blocks the source holds on its device come over a device link
  // first (when both nodes have one), the rest over UCX; then every block asked for is
  // promoted. kDevice: a block's status is the promotion's where it did not get onto the
  // device, and all are kInvalid on a node without a GPU tier.
  std::vector<BlockStatus> Pull(const NamespaceSpec& spec, const std::string& tenant,
                                uint32_t replicas, std::span<const BlockId> ids,
                                std::span<const BlockId> parents, const std::string& source_node,
                                const std::string& source_address, absl::Time deadline,
                                PullInto into = PullInto::kHost);

  // Evicts `ids` of `ns` on the daemon `node` at `address`; how many it removed (0 when it
  // could not be reached).
  uint64_t EvictAtSource(const std::string& node, const std::string& address,
                         const NamespaceRegistry::Entry& ns, std::span<const BlockId> ids);

  // Closes the connections to sources. Idempotent.
  void Stop();

 private:
  struct Fetched {
    std::vector<BlockStatus> status;          // per asked id
    std::vector<std::vector<uint8_t>> blobs;  // the kOk ones' bytes
  };
  // The blobs of `ids` of `ns` from the source, or why not (logged and counted here).
  absl::StatusOr<Fetched> FetchFromSource(const NamespaceSpec& spec, const std::string& tenant,
                                          const NamespaceId& ns, std::span<const BlockId> ids,
                                          const std::string& source_node,
                                          const std::string& source_address);
  // Reserves, writes and commits the fetched blocks (`need[k]` is where fetched block k sits in
  // `status`); sets their final statuses.
  void Commit(const NamespaceId& ns, std::span<const BlockId> ids, std::span<const BlockId> parents,
              const std::vector<size_t>& need, const Fetched& fetched,
              std::vector<BlockStatus>& status);
  // The link to the daemon at `address`, made on first use and kept.
  absl::StatusOr<std::shared_ptr<client::DaemonLink>> SourceLink(const std::string& node,
                                                                 const std::string& address);

  ClusterContext& ctx_;
  BlockStore& store_;
  NamespaceRegistry& namespaces_;
  Announcer& announcer_;
  GpuTieredStore* const gpu_;
  DeviceTransfers* const device_;

  std::mutex sources_mu_;
  std::map<std::string, std::shared_ptr<client::DaemonLink>> sources_;  // by address
};

}  // namespace strata::daemon
