// Finds which nodes hold blocks, by asking each block's directory owners.
//
// A round batches the ids per owner. This node's share is answered from its own directory;
// other owners are asked over UCX active messages first (tens of microseconds a round trip, on
// a worker of the locator's own), and those that do not answer in time over gRPC Peer.Locate.
// Owners that do not answer by the deadline are skipped: the other owners cover for them.
//
// The serving side answers the same questions from this node's directory (HandleLocate,
// HandleAmLocate).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "daemon/cluster/context.h"
#include "daemon/cluster/locate_wire.h"
#include "placement/directory.h"
#include "strata/v1/peer.grpc.pb.h"
#include "transport/ucx.h"

namespace strata::daemon {

class Locator {
 public:
  // kPrimaryFirst asks each id's first owner, and the other owners only for ids it did not
  // know (lookups: one round in steady state); kAllOwners asks every owner at once.
  enum class Mode { kPrimaryFirst, kAllOwners };

  // `ucx` null: gRPC only.
  Locator(ClusterContext& ctx, const placement::Directory& directory,
          std::shared_ptr<transport::Context> ucx);
  ~Locator();  // Stop()
  Locator(const Locator&) = delete;
  Locator& operator=(const Locator&) = delete;

  // Holders of each id according to the directory (this node included once it announced),
  // only nodes in the current view.
  Holders Locate(std::span<const BlockId> ids, absl::Time deadline,
                 Mode mode = Mode::kPrimaryFirst);

  // Peer.Locate: `ids` are req.ids(), unpacked and checked by the caller.
  void HandleLocate(std::span<const BlockId> ids, v1::PeerLocateResponse* resp) const;
  // The same over a UCX active message, on the daemon worker's progress thread; replies
  // through `worker`.
  void HandleAmLocate(const transport::AmMessage& m, transport::Worker* worker) const;

  // Closes the active-message endpoints and worker. Idempotent.
  void Stop();

 private:
  // Positions (in the ids of one Locate) each owner is asked about, by rendezvous index.
  using Calls = std::vector<std::pair<size_t, std::vector<uint32_t>>>;
  using Merge = std::function<void(uint32_t, placement::Location)>;

  // One round: this node's share from its directory, the rest over AM then gRPC.
  void AskOwners(const Ring& ring, std::span<const BlockId> ids,
                 std::vector<std::vector<uint32_t>> per_owner, absl::Time deadline, Holders* out);
  // Returns the calls whose owner did not answer (the caller asks those over gRPC).
  std::vector<size_t> AskOverAm(const Ring& ring, const Calls& calls, std::span<const BlockId> ids,
                                absl::Time deadline, const Merge& merge);
  void AskOverGrpc(const Ring& ring, const Calls& calls, const std::vector<size_t>& which,
                   std::span<const BlockId> ids, absl::Time deadline, const Merge& merge);
  // The endpoint to a peer daemon's worker, from its worker address once known; null when it
  // is not known or cannot be reached. Caller holds am_mu_.
  transport::Endpoint* AmLink(const std::string& address);
  bool EnsureAmWorker();  // caller holds am_mu_
  // Learns the worker addresses of peers without a live endpoint (Cache.Connect, the call
  // every client makes), with no lock held across the calls.
  void ResolveWorkerAddresses(const std::vector<std::string>& addresses, absl::Time deadline);

  ClusterContext& ctx_;
  const placement::Directory& directory_;
  const std::shared_ptr<transport::Context> ucx_;

  struct AmPending {
    bool done = false;
    uint32_t code = 0;
    uint32_t nodes = 0;
    std::string data;
  };
  std::mutex am_mu_;  // the worker is progressed by one caller at a time; guards all below
  std::unique_ptr<transport::Worker> am_worker_;
  std::map<std::string, std::unique_ptr<transport::Endpoint>> am_links_;  // by address
  std::map<std::string, absl::Time> am_retry_after_;
  std::map<std::string, std::string> am_worker_addrs_;  // gRPC address -> UCX worker address
  std::map<uint64_t, AmPending*> am_pending_;
  uint64_t am_next_ = 1;
};

}  // namespace strata::daemon
