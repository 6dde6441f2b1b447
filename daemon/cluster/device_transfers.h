// Blocks from one node's GPU tier straight into another's, over device links
// (transport/device_link.h: NCCL on GPU nodes, a TCP stand-in between host pools elsewhere).
// UCX stays the path for blocks in host memory or on NVMe.
//
// One link per pair of nodes, made on first use and kept; links to nodes that left the view are
// torn down, and so is a link whose transfer failed (the next transfer makes a new one). Sends
// and receives on a link are matched in issue order, so the pair's lower node id (rank 0) runs
// every transfer of the link, one at a time: it tells the other end to do its part
// (Peer.RunDeviceTransfer) while it does its own. The other end never issues an operation on
// its own, so both ends see the same order.
//
// A transfer, as the receiver runs it (Pull):
//   1. Peer.PrepareDeviceSend at the source: it leases the blocks its device holds (no
//      promotion: what only its host memory holds goes over UCX) and answers sizes and CRCs;
//   2. the receiver reserves device extents for them (GpuTieredStore::ReserveOnDevice);
//   3. rank 0 runs the transfer: the source sends, the receiver receives into the extents;
//   4. the receiver commits the blocks with the source's CRCs (every later copy down checks
//      them) and they are announced; on any failure it aborts the reservation, only once its
//      part stopped writing.
// A prepared part that is never run gives its lease back after cluster.peer_timeout.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <future>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/cluster/context.h"
#include "daemon/namespace_registry.h"
#include "storage/gpu/gpu_tiered_store.h"
#include "strata/v1/peer.pb.h"
#include "transport/device_link.h"

namespace strata::daemon {

struct DeviceTransferCounters {
  std::atomic<uint64_t> blocks_in{0}, bytes_in{0}, blocks_out{0}, bytes_out{0};
  std::atomic<uint64_t> links_opened{0}, failures{0};
};

class DeviceTransfers {
 public:
  DeviceTransfers(ClusterContext& ctx, GpuTieredStore& gpu, NamespaceRegistry& namespaces,
                  std::unique_ptr<transport::DeviceLinkFactory> factory);
  ~DeviceTransfers();  // Stop()
  DeviceTransfers(const DeviceTransfers&) = delete;
  DeviceTransfers& operator=(const DeviceTransfers&) = delete;

  // Copies the blocks of namespace `ns` (`spec`, `tenant`) among `ids` that `source_node` holds
  // on its device into this node's device. Per id: kOk (arrived), kExists (this node holds it
  // already, in any tier), kNotFound (not moved by a device link: not on the source's device,
  // no room here, or the transfer failed; the caller pulls it over UCX).
  std::vector<BlockStatus> Pull(const NamespaceSpec& spec, const std::string& tenant,
                                const NamespaceId& ns, std::span<const BlockId> ids,
                                const std::string& source_node, const std::string& source_address,
                                absl::Time deadline);

  // --- The Peer service's handlers ---
  absl::Status Join(const v1::JoinDeviceLinkRequest& req);
  absl::Status PrepareSend(const v1::PrepareDeviceSendRequest& req,
                           v1::PrepareDeviceSendResponse* resp);
  absl::StatusOr<uint64_t> Run(const v1::RunDeviceTransferRequest& req, absl::Time deadline);

  // Tears down the links to nodes that are not in `view`.
  void Retain(const placement::MembershipView& view);
  // Tears down every link and gives back every prepared lease. Idempotent.
  void Stop();

  const DeviceTransferCounters& counters() const { return n_; }

 private:
  // One end of a transfer on this node: what it sends or receives, in order.
  struct Part {
    std::string peer;
    bool send = false;
    std::vector<transport::DeviceRange> ranges;  // send: per prepared id (size 0: not held)
    uint64_t lease = 0;                          // send: the device lease on the blocks
    absl::Time expires;
    uint64_t device_address = 0;  // send: the pool's address (for the lease's extents)
    bool running = false;
    bool ran = false;
    absl::Status result;
  };
  // The link to one peer, with the lock that keeps its operations in order.
  struct Slot {
    std::timed_mutex run_mu;  // held while a transfer runs on the link (and rank 0 makes it)
    // Rank 1: fixed before the slot is shared. Rank 0: guarded by state_mu.
    uint64_t epoch = 0;
    std::mutex state_mu;
    std::shared_ptr<transport::DeviceLink> link;  // guarded by state_mu
    absl::Status join_error;                      // guarded by state_mu (rank 1)
    bool dropped = false;  // guarded by state_mu: torn down; a link made late is aborted
    // Rank 1: ready once the join ended (link or join_error set).
    std::shared_future<void> joined;
  };
  // Marks the slot torn down and breaks its link, if any (a join still running breaks its own
  // when it ends).
  static void TearDown(Slot& slot);
  bool IsRankZeroWith(const std::string& peer) const { return ctx_.self.id < peer; }
  // Both ends join a new link within this (NCCL's set-up takes longer than a peer call).
  absl::Duration LinkSetupTimeout() const {
    return std::max(ctx_.config.peer_timeout, absl::Seconds(10));
  }
  bool InView(const std::string& node, std::string* address = nullptr) const;
  std::shared_ptr<Slot> SlotFor(const std::string& peer);
  void DropSlot(const std::string& peer, const std::shared_ptr<Slot>& slot);
  // Rank 0: makes the link to `peer` (slot->run_mu held).
  absl::Status OpenLink(const std::string& peer, const std::string& address, Slot& slot,
                        absl::Time deadline);
  // Rank 0: runs this node's part `mine` and asks the peer to run `theirs`.
  absl::StatusOr<uint64_t> Conduct(const std::string& peer, uint64_t mine, uint64_t theirs,
                                   std::span<const uint32_t> take, absl::Time deadline);
  // Rank 1: this node's part, when rank 0 says so.
  absl::StatusOr<uint64_t> RunAsked(const std::string& peer, uint64_t epoch, uint64_t part,
                                    std::span<const uint32_t> take, absl::Time deadline);
  // Runs part `id` on `link` (sends: only the prepared ids in `take`); the bytes moved.
  absl::StatusOr<uint64_t> RunPart(uint64_t id, const std::string& peer,
                                   transport::DeviceLink& link, std::span<const uint32_t> take,
                                   absl::Time deadline);
  // A peer that cannot have a device link with this node is not asked for a while.
  bool BackingOff(const std::string& peer);
  void BackOff(const std::string& peer, std::string_view why, absl::Duration how_long);
  uint64_t AddPart(Part part);
  // Removes a part made for `peer` once it is not running (a running one ends by its deadline).
  std::optional<Part> TakePart(uint64_t id, const std::string& peer);
  void ReleaseExpiredParts();

  ClusterContext& ctx_;
  GpuTieredStore& gpu_;
  NamespaceRegistry& namespaces_;
  // Shared with rank 1's join threads, which may outlive a transfer.
  const std::shared_ptr<transport::DeviceLinkFactory> factory_;

  mutable std::mutex mu_;
  std::condition_variable part_done_;
  absl::flat_hash_map<uint64_t, Part> parts_;                      // guarded by mu_
  absl::flat_hash_map<std::string, std::shared_ptr<Slot>> slots_;  // guarded by mu_
  absl::flat_hash_map<std::string, absl::Time> backoff_;           // guarded by mu_
  bool stopped_ = false;                                           // guarded by mu_
  DeviceTransferCounters n_;
};

}  // namespace strata::daemon
