// One stratad as a client reaches it: the control channel to it, the data mover to its arena,
// and the two data operations built from both (publish blobs, fetch blocks).
//
// libstrata holds one for the local daemon and one per peer node it fetches from. Nothing here
// needs a Client: a daemon copying blocks from another daemon holds a DaemonLink to the source
// (or just a ControlChannel and a DataMover, to land blocks in memory of its own choosing).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "client/control_channel.h"
#include "client/data_mover.h"
#include "codec/calibration.h"
#include "strata/client.h"

namespace strata::client {

// Where fetched blocks land: the caller's buffers (decoded there when `decode`), or, with
// `blobs` set, blobs[i] as stored (sized to fit; `buffers` ignored).
struct FetchLanding {
  std::span<const MutableBuffer> buffers;
  std::vector<std::vector<uint8_t>>* blobs = nullptr;
  // The namespace has a codec: blobs land in staging buffers and are decoded into `buffers`,
  // `decoded_bytes` (the layout's BlockBytes()) each. Each blob's own CRC32C guards it then.
  bool decode = false;
  uint64_t decoded_bytes = 0;
  // Calibrated blobs (codec mode pca) decode with these; `ensure_calibrations`, when set, is
  // asked once per fetch for the ids a blob named that `calibrations` lacked.
  const codec::CalibrationSet* calibrations = nullptr;
  std::function<void(std::span<const uint64_t>)> ensure_calibrations;
};

class DaemonLink {
 public:
  // Uses endpoint, client_name, auth_token, tls, rpc_timeout, lookup_fast_path,
  // transfer_timeout, verify_crc, fetch_transfer, same_node and log of `options` (and
  // fetch_bypasses_cache in Fetch).
  static absl::StatusOr<std::unique_ptr<DaemonLink>> Connect(const ClientOptions& options);
  // The same with the token and TLS already loaded (`options.auth_token` and `.tls` unused): a
  // daemon dialing other nodes reads its certificate files once, at start.
  static absl::StatusOr<std::unique_ptr<DaemonLink>> Connect(const ClientOptions& options,
                                                             ChannelSecurity security);

  const ClientOptions& options() const { return options_; }
  ControlChannel& control() { return *control_; }
  DataMover& mover() { return *mover_; }

  // Publishes blobs under `ids` (parents: empty, or ids[i-1] of the chain): Reserve, move the
  // bytes, Commit; a failed transfer aborts the reservation.
  absl::StatusOr<PublishResult> PublishBlobs(const NamespaceId& ns, std::span<const BlockId> ids,
                                             std::span<const BlockId> parents,
                                             std::span<const ConstBuffer> blobs);

  // Fetches from this daemon only: Acquire, move under the lease, Release. Missing, corrupt and
  // too-large blocks are reported per block.
  absl::StatusOr<FetchResult> Fetch(const NamespaceId& ns, std::span<const BlockId> ids,
                                    const FetchLanding& into);

 private:
  struct Plan;

  explicit DaemonLink(const ClientOptions& options) : options_(options) {}
  Plan PlanLanding(const Lease& lease, const FetchLanding& into, FetchResult* r);
  // Fetched bytes go around the CPU caches (fetch_bypasses_cache) only where they land in the
  // engine's own buffers: blobs handed back and blobs staged for decoding are read at once.
  bool AroundCaches(const FetchLanding& into) const {
    return options_.fetch_bypasses_cache && !into.blobs && !into.decode;
  }
  // Counts a publish's outcome from its final per-block statuses.
  static PublishResult Tally(PublishResult result, std::span<const ConstBuffer> blobs);
  // A fetch whose blocks the daemon pushes right behind the lease it grants: one round trip
  // plus the bytes. nullopt: the route or the daemon does not offer it, or the daemon granted
  // no lease that way; the caller fetches in two steps (nothing moved).
  std::optional<absl::StatusOr<FetchResult>> FetchInOneRequest(const NamespaceId& ns,
                                                               std::span<const BlockId> ids,
                                                               const FetchLanding& into,
                                                               bool verify, FetchResult* r);
  // A fetch small enough for the blocks to come inside the daemon's answer (no lease to
  // release): true when it was answered so (then `r` is the result); false when nothing
  // landed and the caller fetches another way.
  bool FetchSmallInOne(const NamespaceId& ns, std::span<const BlockId> ids,
                       const FetchLanding& into, bool verify, FetchResult* r);
  void Finish(const FetchLanding& into, const Plan& plan, std::vector<uint8_t> intact,
              FetchResult* r);

  const ClientOptions options_;
  std::unique_ptr<ControlChannel> control_;
  std::unique_ptr<DataMover> mover_;  // destroyed first: the channel's fast path points at it
};

}  // namespace strata::client
