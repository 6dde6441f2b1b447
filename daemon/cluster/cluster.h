// The cluster side of one daemon: membership and the ring it implies, wiring the parts that do
// the work. Announcer keeps this node's blocks findable and its share of the directory;
// Locator asks directory owners where blocks are; BlockPuller copies blocks in from another
// node; BlockMover asks other nodes to take copies (replication, reposition, drain, repair).
//
// The directory is soft state: each holder re-announces its blocks every directory_ttl/3 and
// whenever membership changes.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "config/daemon_config.h"
#include "daemon/cluster/announcer.h"
#include "daemon/cluster/block_mover.h"
#include "daemon/cluster/block_puller.h"
#include "daemon/cluster/calibration_sync.h"
#include "daemon/cluster/context.h"
#include "daemon/cluster/device_transfers.h"
#include "daemon/cluster/locator.h"
#include "daemon/namespace_registry.h"
#include "placement/directory.h"
#include "placement/membership.h"
#include "storage/block_store.h"
#include "storage/gpu/gpu_tiered_store.h"
#include "transport/device_link.h"
#include "transport/ucx.h"

namespace strata::daemon {

class Cluster {
 public:
  struct Options {
    ClusterConfig config;
    placement::NodeRecord self;
    // The daemon's UCX context: directory queries to other daemons go as active messages on
    // a worker of the locator's own (gRPC Peer.Locate is the fallback). Null: gRPC only.
    std::shared_ptr<transport::Context> ucx;
    // This node's token (a peer role on the other nodes) and TLS for every call to them.
    client::ChannelSecurity peer_security;
    // This node's GPU tier (null: none; must outlive the cluster) and how its device links to
    // other nodes' GPU tiers are made (null: none; blocks then reach them over UCX).
    GpuTieredStore* gpu = nullptr;
    std::unique_ptr<transport::DeviceLinkFactory> device_links;
  };

  // Joins the membership and starts announcing. `store` and `namespaces` must outlive the
  // cluster; the store's change hook is the cluster's until Stop.
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(Options options, BlockStore& store,
                                                        NamespaceRegistry& namespaces);
  ~Cluster();  // Stop()
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;
  // Stops announcing and repairing and leaves the membership. Idempotent.
  void Stop();
  // A block became visible in this node's host memory or left it: what the directory learns.
  // The daemon forwards the store's change hook here (cheap; called with the tier's lock held).
  void OnBlockEvent(const BlockEvent& event);

  // Moves every block off this node (BlockMover::Drain), then stops announcing and leaves the
  // membership: peers stop sending work here.
  BlockMover::DrainResult Drain(absl::Time deadline);

  const placement::NodeRecord& self() const { return ctx_.self; }
  size_t size() const;  // nodes in the current view
  placement::MembershipView View() const;
  bool healthy(std::string* detail) const { return membership_->healthy(detail); }
  std::string membership_kind() const { return membership_->kind(); }
  absl::Duration peer_timeout() const { return ctx_.config.peer_timeout; }
  const ClusterCounters& counters() const { return ctx_.counters; }
  void CountRemoteLocated(uint64_t n) { ctx_.counters.remote_located.fetch_add(n); }
  const placement::Directory& directory() const { return directory_; }

  Announcer& announcer() { return *announcer_; }
  Locator& locator() { return *locator_; }
  BlockPuller& puller() { return *puller_; }
  BlockMover& mover() { return *mover_; }
  CalibrationSync& calibrations() { return calibrations_; }
  // Null when this node has no device links.
  DeviceTransfers* device_transfers() { return device_.get(); }

 private:
  Cluster(Options options, BlockStore& store, NamespaceRegistry& namespaces);
  void OnView(const placement::MembershipView& view);

  ClusterContext ctx_;
  BlockStore& store_;
  placement::Directory directory_;
  std::unique_ptr<placement::Membership> membership_;
  std::unique_ptr<Announcer> announcer_;
  std::unique_ptr<DeviceTransfers> device_;
  std::unique_ptr<Locator> locator_;
  std::unique_ptr<BlockPuller> puller_;
  std::unique_ptr<BlockMover> mover_;
  CalibrationSync calibrations_{ctx_};
  std::atomic<bool> stopped_{false};
};

}  // namespace strata::daemon
