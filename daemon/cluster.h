// The cluster side of one daemon: membership, the directory entries this node owns, announcing
// its own blocks to their owners, locating blocks held elsewhere, and copying blocks between
// nodes (replication, reposition, drain).
//
// Block bytes between daemons move the way a client moves them: the receiving daemon pulls from
// the source's arena with UCX through a libstrata Client, then commits into its own BlockStore,
// where the CRC32C is verified once more. The directory is soft state: each holder re-announces
// its blocks every directory_ttl/3 and whenever membership changes.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "config/daemon_config.h"
#include "daemon/namespace_registry.h"
#include "placement/directory.h"
#include "placement/membership.h"
#include "placement/rendezvous.h"
#include "storage/block_store.h"
#include "strata/block_id.h"
#include "strata/block_status.h"
#include "strata/v1/peer.grpc.pb.h"
#include "transport/ucx.h"

namespace strata {
class Client;
}

namespace strata::daemon {

struct ClusterCounters {
  std::atomic<uint64_t> announced{0};  // ids sent to owners (refreshes included)
  std::atomic<uint64_t> withdrawn{0};
  std::atomic<uint64_t> peer_failures{0};  // peer calls that failed or timed out
  std::atomic<uint64_t> replicated{0};     // copies made on other nodes after a commit
  std::atomic<uint64_t> replication_failed{0};
  std::atomic<uint64_t> pulled{0};          // blocks copied into this node from another
  std::atomic<uint64_t> rereplicated{0};    // copies made to replace ones a departed node held
  std::atomic<uint64_t> remote_located{0};  // lookup blocks found on other nodes
};

class Cluster {
 public:
  struct Options {
    ClusterConfig config;
    placement::NodeRecord self;
    // The daemon's UCX context: directory queries to other daemons go as active messages on
    // a worker of its own (gRPC Peer.Locate is the fallback). Null: gRPC only.
    std::shared_ptr<transport::Context> ucx;
  };

  // `store` must outlive the cluster; its change hook is the cluster's until Stop.
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(Options options, BlockStore& store,
                                                        NamespaceRegistry* namespaces);
  ~Cluster();  // Stop()
  // Stops announcing and leaves the membership. Idempotent.
  void Stop();

  const placement::NodeRecord& self() const { return options_.self; }
  size_t size() const;  // nodes in the current view
  placement::MembershipView View() const;
  bool healthy(std::string* detail) const;
  const ClusterCounters& counters() const { return counters_; }
  absl::Duration options_peer_timeout() const { return options_.config.peer_timeout; }
  void CountRemoteLocated(uint64_t n) { counters_.remote_located.fetch_add(n); }
  const placement::Directory& directory() const { return directory_; }
  std::string membership_kind() const { return membership_->kind(); }

  // Holders of each id according to the directory (this node included once it announced).
  // Owners that do not answer by `deadline` are skipped (the other owners cover for them).
  // kPrimaryFirst asks each id's first owner, and the other owners only for ids it did not
  // know (lookups: one round in steady state); kAllOwners asks every owner at once.
  enum class LocateMode { kPrimaryFirst, kAllOwners };
  std::vector<std::vector<placement::Location>> Locate(std::span<const BlockId> ids,
                                                       absl::Time deadline,
                                                       LocateMode mode = LocateMode::kPrimaryFirst);
  // Waits until every block event queued before the call has been announced to its owners (or
  // `deadline`): a block committed here is then findable from any node.
  void FlushAnnouncements(absl::Time deadline);

  // Peer service.
  // `ids` are req.ids(), unpacked and checked by the caller.
  void HandleAnnounce(const v1::AnnounceRequest& req, std::span<const BlockId> ids);
  void HandleLocate(std::span<const BlockId> ids, v1::PeerLocateResponse* resp);
  // The same over a UCX active message (common/am_wire.h), on the daemon worker's progress
  // thread; replies through `worker`.
  void HandleAmLocate(const transport::AmMessage& m, transport::Worker* worker);
  // Copies `ids` from the daemon at `source_address` into this node's host tier.
  std::vector<BlockStatus> Pull(const NamespaceSpec& spec, const std::string& tenant,
                                uint32_t replicas, std::span<const BlockId> ids,
                                std::span<const BlockId> parents, const std::string& source_node,
                                const std::string& source_address, absl::Time deadline);

  // Copies freshly committed blocks to the namespace's other replica nodes (the next ones in
  // each block's rendezvous ranking). Returns when done or at `deadline`.
  void Replicate(const NamespaceRegistry::Entry& ns, std::span<const BlockId> ids,
                 std::span<const BlockId> parents, absl::Time deadline);
  uint32_t ReplicasFor(const NamespaceRegistry::Entry& ns) const;

  struct RepositionResult {
    std::vector<BlockStatus> status;
    uint64_t copied = 0, already_there = 0, removed_sources = 0;
  };
  absl::StatusOr<RepositionResult> Reposition(const NamespaceRegistry::Entry& ns,
                                              std::span<const BlockId> ids,
                                              const std::string& target_node, bool move,
                                              absl::Time deadline);

  struct DrainResult {
    uint64_t blocks = 0, moved = 0, failed = 0;
    std::vector<std::string> targets;
  };
  DrainResult Drain(absl::Time deadline);

 private:
  Cluster(Options options, BlockStore& store, NamespaceRegistry* namespaces);
  // The store's change hook (called with the store's lock held): queues the event.
  void OnBlockEvent(const BlockEvent& event);

  struct Ring {  // one membership view, ready for ranking
    placement::MembershipView view;
    placement::Rendezvous rendezvous;
    int self = -1;
  };
  std::shared_ptr<const Ring> ring() const;
  // The node a rendezvous index names (the view holds every node the ring ranks).
  static const placement::NodeRecord& NodeAt(const Ring& r, uint32_t index);
  void OnView(const placement::MembershipView& view);
  // One round of Peer.Locate calls (this node's share answered locally); merges into `out`.
  void AskOwners(const Ring& ring, std::span<const BlockId> ids,
                 std::vector<std::vector<uint32_t>> per_owner, absl::Time deadline,
                 std::vector<std::vector<placement::Location>>* out);
  void AnnounceLoop();
  // After a node left: copies of replicated blocks it held are made again (by the holder with
  // the smallest node id, so exactly one node acts for each block).
  void RepairLoop();
  void Repair();
  // Sends (or withdraws) `ids` to their owners; this node's own share goes to its directory.
  void Announce(std::span<const BlockId> ids, bool withdraw);
  std::shared_ptr<v1::Peer::Stub> PeerStub(const std::string& address);
  // Asks owners over active messages; returns the owners that did not answer (the caller asks
  // those over gRPC). `calls` maps owner index -> (positions in ids, the ids).
  std::vector<size_t> AskOwnersOverAm(
      const Ring& ring, const std::vector<std::pair<size_t, std::vector<uint32_t>>>& calls,
      std::span<const BlockId> ids, absl::Time deadline,
      const std::function<void(uint32_t, placement::Location)>& merge);
  // The endpoint to a peer daemon's worker, from its worker address once known; null when it
  // is not known or cannot be reached. Caller holds am_mu_.
  transport::Endpoint* AmLink(const std::string& address);
  // Learns the worker addresses of peers without a live endpoint (Cache.Connect, the call every
  // client makes), with no lock held across the calls.
  void ResolveWorkerAddresses(const std::vector<std::string>& addresses, absl::Time deadline);
  absl::StatusOr<std::shared_ptr<Client>> SourceClient(const std::string& node,
                                                       const std::string& address);
  v1::PullRequest MakePullRequest(const NamespaceRegistry::Entry& ns, std::span<const BlockId> ids,
                                  std::span<const BlockId> parents, const std::string& source_node,
                                  const std::string& source_address) const;
  // Per-id statuses of a finished Pull (kNotFound for all when the call failed).
  std::vector<BlockStatus> PullStatuses(const grpc::Status& s, const v1::PullResponse& resp,
                                        size_t n, const std::string& target_address,
                                        const std::string& source_node);
  // Asks `target` to pull `ids` of `ns` from this node; per-id statuses (kNotFound on failure).
  std::vector<BlockStatus> AskToPull(const std::string& target_address,
                                     const NamespaceRegistry::Entry& ns,
                                     std::span<const BlockId> ids, std::span<const BlockId> parents,
                                     const std::string& source_node,
                                     const std::string& source_address, absl::Time deadline);

  const Options options_;
  BlockStore& store_;
  NamespaceRegistry* const namespaces_;
  std::unique_ptr<placement::Membership> membership_;
  placement::Directory directory_;
  ClusterCounters counters_;

  mutable std::mutex ring_mu_;
  std::shared_ptr<const Ring> ring_;

  std::mutex stubs_mu_;
  std::map<std::string, std::shared_ptr<v1::Peer::Stub>> stubs_;
  std::mutex am_mu_;  // the active-message worker is progressed by one caller at a time
  std::unique_ptr<transport::Worker> am_worker_;
  std::map<std::string, std::unique_ptr<transport::Endpoint>> am_links_;  // by address
  std::map<std::string, absl::Time> am_retry_after_;
  std::map<std::string, std::string> am_worker_addrs_;  // gRPC address -> UCX worker address
  struct AmPending {
    bool done = false;
    uint32_t code = 0;
    uint32_t nodes = 0;
    std::string data;
  };
  std::map<uint64_t, AmPending*> am_pending_;
  uint64_t am_next_ = 1;
  std::mutex sources_mu_;
  std::map<std::string, std::shared_ptr<Client>> sources_;

  // Announcement queue, fed by OnBlockEvent.
  std::mutex ev_mu_;
  std::condition_variable ev_cv_;
  std::condition_variable flushed_cv_;
  std::vector<BlockEvent> events_;
  uint64_t events_queued_ = 0;     // events ever queued
  uint64_t events_announced_ = 0;  // events whose announcement finished
  bool full_refresh_ = true;
  bool stop_ = false;
  std::thread announcer_;
  std::thread repairer_;
  bool repair_due_ = false;  // guarded by ev_mu_
  std::condition_variable repair_cv_;
  std::atomic<bool> stopped_{false};
};

}  // namespace strata::daemon
