// Keeps this node's blocks findable, and keeps its own share of the directory.
//
// Announcing: the store's change hook queues block events; a thread sends each new block to its
// directory owners (the top directory_owners nodes of the block's rendezvous ranking) and
// withdraws removed ones, then, every directory_ttl/3 and after every membership change,
// re-announces everything held so new owners learn of it and no entry expires. This node's own
// share goes straight into its directory.
//
// The directory share: what other holders announce to this node (HandleAnnounce); after a view
// change, entries this node no longer owns are dropped (RetainOwned).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "daemon/cluster/context.h"
#include "placement/directory.h"
#include "storage/block_store.h"
#include "strata/v1/peer.grpc.pb.h"

namespace strata::daemon {

class CallGroup;

class Announcer {
 public:
  // Which of some ids this node's GPU tier holds (may be empty: none); such blocks are
  // announced with TIER_GPU, so other nodes know where a device-to-device copy can come from.
  using DeviceHeld = std::function<absl::flat_hash_set<BlockId>(std::span<const BlockId>)>;
  Announcer(ClusterContext& ctx, placement::Directory& directory, const BlockStore& store,
            DeviceHeld on_device = {});
  ~Announcer();  // Stop()
  Announcer(const Announcer&) = delete;
  Announcer& operator=(const Announcer&) = delete;

  // Starts the announcing thread; its first round announces everything held.
  void Start();
  // No more announcements: the thread ends and flushes return at once. Idempotent.
  void Stop();

  // The store's change hook (the store's lock is held): queues the event (after Stop, a drain's
  // among them, drops it: nothing would take it off the queue).
  void OnBlockEvent(const BlockEvent& event);
  // Events queued and not yet announced.
  size_t QueuedEvents() const;
  // Everything held is announced again on the next round.
  void RequestFullRefresh();
  // Drops directory entries this node does not own in `ring`, and re-announces everything
  // held (the owners of some blocks changed with the view).
  void RetainOwned(const Ring& ring);
  // Waits until every block event queued before the call has been announced to its owners (or
  // `deadline`): a block committed here is then findable from any node.
  void FlushAnnouncements(absl::Time deadline);
  // Sends (or withdraws) `ids` to their owners now; returns when every owner answered or timed
  // out.
  void Announce(std::span<const BlockId> ids, bool withdraw);

  // Peer.Announce from a holder; `ids` are req.ids(), unpacked and checked by the caller.
  void HandleAnnounce(const v1::AnnounceRequest& req, std::span<const BlockId> ids);

 private:
  void Loop();
  // Announces the last event of each id in `events`.
  void AnnounceEvents(const std::vector<BlockEvent>& events);
  // Sends one owner's share (in messages of at most kIdsPerMessage ids) as callback calls.
  void SendToOwner(const std::string& address, std::span<const BlockId> ids,
                   std::span<const placement::LocationTier> tiers, bool withdraw,
                   CallGroup& calls);

  ClusterContext& ctx_;
  placement::Directory& directory_;
  const BlockStore& store_;
  const DeviceHeld on_device_;

  mutable std::mutex mu_;
  std::condition_variable wake_;     // events queued, refresh due, or stop
  std::condition_variable flushed_;  // events_announced_ advanced, or stop
  std::vector<BlockEvent> events_;   // guarded by mu_, as is everything below
  uint64_t events_queued_ = 0;       // events ever queued
  uint64_t events_announced_ = 0;    // events whose announcement finished
  std::chrono::steady_clock::time_point first_event_at_;  // of the events queued now
  int flushes_waiting_ = 0;                               // in FlushAnnouncements
  bool full_refresh_ = true;
  bool stop_ = false;
  std::mutex join_mu_;  // Stop may come from a drain and from shutdown at once
  std::thread thread_;
};

}  // namespace strata::daemon
