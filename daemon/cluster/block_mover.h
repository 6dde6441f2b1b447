// Puts copies of blocks on other nodes by asking them to pull (Peer.Pull) from a holder:
// replication after a commit, reposition on a client's request, drain before a node leaves,
// and repair of the copies a departed node held.
//
// Placement follows each block's rendezvous ranking, so any node can tell where a block's
// replicas belong without asking: replica k goes to the k-th node of the ranking (skipping the
// publisher), a drained block to the best node other than this one.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/cluster/announcer.h"
#include "daemon/cluster/block_puller.h"
#include "daemon/cluster/context.h"
#include "daemon/cluster/locator.h"
#include "daemon/namespace_registry.h"
#include "storage/block_store.h"
#include "strata/v1/peer.grpc.pb.h"

namespace strata::daemon {

class BlockMover {
 public:
  // `gpu`: this node's GPU tier (null: none).
  BlockMover(ClusterContext& ctx, BlockStore& store, NamespaceRegistry& namespaces,
             Locator& locator, Announcer& announcer, BlockPuller& puller,
             GpuTieredStore* gpu = nullptr);
  ~BlockMover();  // StopRepairs()
  BlockMover(const BlockMover&) = delete;
  BlockMover& operator=(const BlockMover&) = delete;

  // Starts the repair thread (when cluster.rereplicate is on).
  void StartRepairs();
  // No more repairs; waits for a running one. Idempotent.
  void StopRepairs();
  // A node left: copies of replicated blocks it held are made again, by the holder with the
  // smallest node id (so exactly one node acts for each block), once every holder had the time
  // to re-announce to the new owners.
  void ScheduleRepair();

  // Copies of the namespace's blocks (this node's default replica count unless it has its own).
  uint32_t ReplicasFor(const NamespaceRegistry::Entry& ns) const;
  // Copies freshly committed blocks to the namespace's other replica nodes. Returns when done
  // or at `deadline`.
  void Replicate(const NamespaceRegistry::Entry& ns, std::span<const BlockId> ids,
                 std::span<const BlockId> parents, absl::Time deadline);

  struct RepositionResult {
    std::vector<BlockStatus> status;
    uint64_t copied = 0, already_there = 0, removed_sources = 0;
  };
  // Puts a copy of each block on `target_node` (this node when empty), pulled from a holder;
  // with `move`, the holders it came from drop theirs. NotFound when the target is not in view.
  // `to_device`: into the target's GPU tier (BlockPuller::Pull), blocks it holds already
  // included; kOk then means on its device.
  absl::StatusOr<RepositionResult> Reposition(const NamespaceRegistry::Entry& ns,
                                              std::span<const BlockId> ids,
                                              const std::string& target_node, bool move,
                                              absl::Time deadline, bool to_device = false);

  struct DrainResult {
    uint64_t blocks = 0, moved = 0, failed = 0;
    std::vector<std::string> targets;
  };
  // Moves every block of this node (any tier) to its best other node, then withdraws and drops
  // the local copies.
  DrainResult Drain(absl::Time deadline);

  // Asks `target_address` to pull `ids` of `ns` from the daemon `source_node`; per-id statuses
  // (kNotFound for all when the call failed).
  std::vector<BlockStatus> AskToPull(const std::string& target_address,
                                     const NamespaceRegistry::Entry& ns,
                                     std::span<const BlockId> ids, std::span<const BlockId> parents,
                                     const std::string& source_node,
                                     const std::string& source_address, absl::Time deadline,
                                     PullInto into = PullInto::kHost);
  // AskToPull, with the blocks this node holds on its device asked into the target's GPU tier
  // where it has one (PullInto::kDeviceIfAny: device to device over a device link).
  std::vector<BlockStatus> AskToPullKeepingTiers(const std::string& target_address,
                                                 const NamespaceRegistry::Entry& ns,
                                                 std::span<const BlockId> ids,
                                                 std::span<const BlockId> parents,
                                                 absl::Time deadline);

 private:
  v1::PullRequest MakePullRequest(const NamespaceRegistry::Entry& ns, std::span<const BlockId> ids,
                                  std::span<const BlockId> parents, const std::string& source_node,
                                  const std::string& source_address) const;
  // Per-id statuses of a finished Pull (kNotFound for all when the call failed).
  std::vector<BlockStatus> PullStatuses(const grpc::Status& s, const v1::PullResponse& resp,
                                        size_t n, const std::string& target_address,
                                        const std::string& source_node);
  // Asks for the copies of `blocks` (all of namespace `ns`) that this node is the one to make;
  // counts the copies made and failed.
  void RepairNamespace(const Ring& ring, const NamespaceRegistry::Entry& ns,
                       const std::vector<BlockInfo>& blocks, uint64_t* made, uint64_t* failed);
  void Repair();
  void RepairLoop();

  ClusterContext& ctx_;
  BlockStore& store_;
  NamespaceRegistry& namespaces_;
  Locator& locator_;
  Announcer& announcer_;
  BlockPuller& puller_;
  GpuTieredStore* const gpu_;

  std::mutex repair_mu_;
  std::condition_variable repair_cv_;
  bool repair_due_ = false;  // guarded by repair_mu_
  bool stop_ = false;        // guarded by repair_mu_
  std::mutex join_mu_;
  std::thread repairer_;
};

}  // namespace strata::daemon
