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
#include <mutex>
#include <optional>
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
  // Calibrated blobs (codec modes pca and xl) decode with these; `ensure_calibrations`, when
  // set, is asked once per fetch for the ids a blob named that `calibrations` lacked, and what
  // it returns is held until those blobs decode (so a bounded set keeps them meanwhile).
  const codec::CalibrationSet* calibrations = nullptr;
  std::function<std::vector<std::shared_ptr<const codec::Calibration>>(std::span<const uint64_t>)>
      ensure_calibrations;
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

  ~DaemonLink();  // gives back the spare reservation it holds
  DaemonLink(const DaemonLink&) = delete;
  DaemonLink& operator=(const DaemonLink&) = delete;

  const ClientOptions& options() const { return options_; }
  ControlChannel& control() { return *control_; }
  DataMover& mover() { return *mover_; }

  // Publishes blobs under `ids` (parents: empty, or ids[i-1] of the chain): Reserve, move the
  // bytes, Commit; a failed transfer aborts the reservation. A one-blob publish through the
  // mapped arena goes into the spare reservation the last one's Commit asked for, when it fits
  // (CommitSpares): the copy and one Commit, no Reserve.
  absl::StatusOr<PublishResult> PublishBlobs(const NamespaceId& ns, std::span<const BlockId> ids,
                                             std::span<const BlockId> parents,
                                             std::span<const ConstBuffer> blobs);

  // Fetches from this daemon only: Acquire, move under the lease, Release. Missing, corrupt and
  // too-large blocks are reported per block.
  absl::StatusOr<FetchResult> Fetch(const NamespaceId& ns, std::span<const BlockId> ids,
                                    const FetchLanding& into);

 private:
  struct Plan;
  // A spare reservation granted to this link (CommitSpares::granted): one extent of `bytes` in
  // `ns`, for the next one-blob publish there.
  struct Spare {
    uint64_t id = 0;
    NamespaceId ns;
    uint64_t offset = 0, bytes = 0;
    absl::Time expires;
    absl::Duration lifetime;
    uint64_t instance_id = 0;
  };

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
  // Whether a publish of `n` blobs asks for and uses spares: one blob, through the mapped
  // arena, where the daemon offers them.
  bool UsesSpares(size_t n) const;
  // The spare held, when it is for `ns` and holds `bytes`; a spare near its expiry is given
  // back instead.
  std::optional<Spare> TakeSpare(const NamespaceId& ns, uint64_t bytes);
  // Holds `granted` (id 0: nothing), giving back the one held before.
  void KeepSpare(const NamespaceId& ns, uint64_t bytes, const Reservation& granted);
  // A one-blob publish into `spare`: the copy, then a Commit that names the block and asks for
  // the next spare. nullopt: the spare is gone (expired, or its daemon restarted) or the Commit
  // failed: publish as usual.
  std::optional<absl::StatusOr<PublishResult>> PublishIntoSpare(const Spare& spare,
                                                                const NamespaceId& ns,
                                                                const BlockId& id,
                                                                const BlockId& parent,
                                                                const ConstBuffer& blob);

  const ClientOptions options_;
  std::unique_ptr<ControlChannel> control_;
  std::unique_ptr<DataMover> mover_;  // destroyed first: the channel's fast path points at it
  bool spares_on_ = true;  // STRATA_CLIENT_SPARES=0 turns them off (for comparisons)
  std::mutex spare_mu_;
  std::optional<Spare> spare_;
};

}  // namespace strata::client
