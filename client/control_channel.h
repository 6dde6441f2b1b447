// The control plane to one stratad: its gRPC stub, a deadline on every call, the mapping of
// gRPC statuses to absl ones, the namespaces opened through it (reopened by itself when the
// daemon restarted and forgot them), and lookups by the cheapest route that answers: an active
// message on the data mover's endpoint, then the long-lived lookup stream, then the unary call.
//
// Thread-safe. Block bytes never pass through here: Reserve/Acquire answer with arena extents
// that a DataMover moves.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/channel.h"
#include "client/data_mover.h"
#include "strata/client.h"
#include "strata/v1/cache.grpc.pb.h"

namespace strata::client {

struct ControlOptions {
  std::string endpoint = "127.0.0.1:7420";
  std::string client_name = "libstrata";
  ChannelSecurity security;  // ClientOptions::auth_token and ::tls, loaded
  absl::Duration rpc_timeout = absl::Seconds(5);
  // Lookups of up to am_wire::kMaxIds ids as an active message (see UseFastPath).
  bool lookup_fast_path = true;
  bool control_by_message = true;  // ClientOptions::control_by_message
  LogSink log;
};

// A namespace as opened through a channel: what reopening it takes.
struct OpenedNamespace {
  NamespaceSpec spec;
  std::string tenant;
  NamespaceOptions options;
};

// The daemon's answer to Reserve: where to put each block it did not already have.
struct Reservation {
  uint64_t id = 0;  // 0 when nothing was reserved
  absl::Duration expires_in;
  std::vector<BlockStatus> status;  // kOk: reserved at offsets[i]; kExists: already stored
  std::vector<uint64_t> offsets;
  uint64_t instance_id = 0;  // the daemon instance whose arena the offsets are in (0: unsaid)
};

// What a Commit may carry besides the CRCs, where the daemon offers spare reservations
// (ControlChannel::spare_reservations): a spare holds one extent for a block not yet named, so
// a publish into it is the copy and one Commit that names the block.
struct CommitSpares {
  const NamespaceId* ns = nullptr;  // of the block named and of the spare wanted
  // The reservation committed is a spare, and its block is this one (CommitRequest.rename).
  const BlockId* named = nullptr;
  BlockId named_parent{};
  uint64_t named_size = 0;
  uint64_t want_bytes = 0;  // a spare of this many bytes for the next publish (0: none)
  Reservation granted;      // out: the spare granted (id 0: none); one kOk status and offset
};

// The daemon's answer to Acquire: the blocks it pinned for reading, until Release.
struct Lease {
  uint64_t id = 0;  // 0 when nothing was leased
  absl::Duration expires_in;
  std::vector<BlockStatus> status;  // kOk: held at offsets[i], sizes[i] bytes
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> sizes;
  std::vector<uint32_t> crc32c;  // recorded at commit
  uint64_t instance_id = 0;      // as in Reservation
};

class ControlChannel {
 public:
  using Call = std::function<grpc::Status(grpc::ClientContext*)>;

  explicit ControlChannel(ControlOptions options);
  ~ControlChannel();  // waits for the Releases still in flight
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  const ControlOptions& options() const { return options_; }
  v1::Cache::Stub& stub() { return *stub_; }
  // The channel itself, for the stubs of the daemon's other services (Calibrations).
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

  // Runs one call under the channel's deadline. A daemon that is down or silent reads
  // "stratad at ADDRESS did not answer NAME within T".
  absl::Status Rpc(const char* name, const Call& call);
  // A namespace-scoped call: if the daemon forgot the namespace (it restarted), reopens it once
  // and retries.
  absl::Status NsRpc(const char* name, const NamespaceId& ns, const Call& call);

  // Asks for the daemon's data plane (the Connect RPC): a DataMover's Dialer. Also learns the
  // daemon's node id and whether it has other nodes in its cluster view.
  absl::StatusOr<ArenaEndpoint> ConnectDataPlane();
  // The daemon's node id as of the last ConnectDataPlane. A reconnection (DataMover::Redial, on
  // whichever thread found the daemon gone) sets it while other threads read it, so the string
  // referred to is never changed or freed while the channel lives (see node_ids_).
  const std::string& node_id() const { return *node_id_.load(std::memory_order_acquire); }
  bool clustered() const { return clustered_.load(); }

  // Opens (idempotently) a namespace on the daemon and remembers it for reopening.
  absl::StatusOr<NamespaceId> OpenNamespace(const NamespaceSpec& spec, const std::string& tenant,
                                            const NamespaceOptions& options = {});
  // Whether `ns` was opened through this channel, and how.
  std::optional<OpenedNamespace> Opened(const NamespaceId& ns) const;

  // Lookups of up to am_wire::kMaxIds ids first try an active message on `mover`'s endpoint
  // (when ControlOptions::lookup_fast_path). `mover` must outlive this channel's lookups.
  void UseFastPath(DataMover* mover) { fast_path_ = mover; }
  absl::StatusOr<v1::LookupResponse> Lookup(const NamespaceId& ns, std::span<const BlockId> ids);

  absl::StatusOr<Reservation> Reserve(const NamespaceId& ns, std::span<const BlockId> ids,
                                      std::span<const BlockId> parents,
                                      std::span<const uint64_t> sizes);
  // The committed status of each reserved block, in reservation order. `taken_while_writing`:
  // the CRCs come from one pass that wrote the blocks through the mapped arena (the daemon may
  // then skip reading them again).
  // `answered`: the reply to CommitFollowUp's request, when it went behind the blocks.
  absl::StatusOr<std::vector<BlockStatus>> Commit(
      uint64_t reservation_id, std::span<const uint32_t> crc32c, bool taken_while_writing = false,
      const std::optional<absl::StatusOr<AmReply>>* answered = nullptr,
      CommitSpares* spares = nullptr);
  // Whether Commit takes CommitSpares (the daemon said so at the last Connect).
  bool spare_reservations() const { return spare_reservations_.load(); }
  // The Commit as an active message to post behind a publish's blocks (DataMover::Put), or
  // nullopt where Commit does not go by message.
  std::optional<FollowUp> CommitFollowUp(uint64_t reservation_id, std::span<const uint32_t> crc32c,
                                         bool taken_while_writing) const;
  // A small publish as one active message (am_wire::kPublishInOneAm: Reserve, the blocks and
  // Commit in one round trip), the CRCs taken here: each block's status as after Commit (kOk
  // stored now, kExists held already, ...); nullopt where it must go the usual way (not
  // offered, too large, sent back undone, or refused with an error, which stored nothing); an
  // error when no answer came in time.
  absl::StatusOr<std::optional<std::vector<BlockStatus>>> PublishInOne(
      const NamespaceId& ns, std::span<const BlockId> ids, std::span<const BlockId> parents,
      std::span<const ConstBuffer> blobs);
  // A small fetch as one active message (am_wire::kFetchInOneAm): the lease-shaped answer
  // (id 0: nothing to release; offsets empty) and the bytes of its kOk blocks back to back;
  // nullopt where it must go the usual way (not offered, not answered in one, no answer in
  // time: a fetch may be asked again).
  struct FetchedInOne {
    Lease lease;
    std::string answer;      // the whole answer, kept rather than copied
    std::string_view bytes;  // the blocks' bytes, one after the other, in `answer`
  };
  std::optional<FetchedInOne> FetchInOne(const NamespaceId& ns, std::span<const BlockId> ids);
  // A FetchToDevice as an active message (am_wire::kDeviceFetchAm; `request` serialized): the
  // serialized answer, or nullopt where it must go through gRPC (not offered, sent back undone
  // because the device alone could not serve it, refused, no answer in time: nothing copied).
  std::optional<std::string> DeviceFetch(const NamespaceId& ns, std::string request);
  // Best effort: an abandoned reservation also expires on the daemon. `may_wait` false: only as
  // a one-way message, never a gRPC call that could wait out its deadline (a spare given back).
  void Abort(uint64_t reservation_id, bool may_wait = true);

  absl::StatusOr<Lease> Acquire(const NamespaceId& ns, std::span<const BlockId> ids);
  // An Acquire whose blocks the daemon pushes right behind its answer (DataMover::AcquireAndGet),
  // or nullopt where the daemon does not offer it. `piece_bytes` (DataMover::push_piece_bytes):
  // blocks larger come in pieces of at most that, where the daemon offers it (0: whole).
  std::optional<FollowUp> AcquirePushRequest(const NamespaceId& ns, std::span<const BlockId> ids,
                                             uint32_t piece_bytes = 0) const;
  // The lease in the daemon's answer to AcquirePushRequest; nullopt when it granted none (it
  // then pushes nothing, and the caller acquires the usual way).
  std::optional<Lease> LeaseFromPushReply(const AmReply& reply, size_t ids);
  // The arena size ConnectDataPlane learns; tests set it without a daemon.
  void SetArenaBytesForTesting(uint64_t bytes) { arena_bytes_ = bytes; }
  // The daemon ends the lease of an AcquirePushRequest itself: no ReleaseAsync for it.
  bool DaemonReleasesPushes() const { return push_releases_.load(); }
  // Fire and forget: the lease also expires on the daemon, so a lost Release only delays
  // reclaiming the space.
  void ReleaseAsync(uint64_t lease_id);

  // Every node known to hold each id, best first.
  absl::StatusOr<std::vector<std::vector<BlockHolder>>> Locate(const NamespaceId& ns,
                                                               std::span<const BlockId> ids);

 private:
  // The lease in an Acquire answer, refused (InternalError) where its entries do not match the
  // ids or a block's extent lies outside the daemon's arena: a broken or hostile daemon's sizes
  // must not size the buffers a fetch allocates before its extents are checked.
  absl::StatusOr<Lease> LeaseFrom(const v1::AcquireResponse& resp, size_t ids) const;
  struct LookupStream;

  std::optional<DataMover::Reply> ExchangeByActiveMessage(uint16_t request_am, uint16_t reply_am,
                                                          const NamespaceId& ns,
                                                          std::span<const BlockId> ids);
  // The same with the request's data as given (not empty, an eager message's size).
  std::optional<DataMover::Reply> ExchangeByActiveMessage(uint16_t request_am, uint16_t reply_am,
                                                          const NamespaceId& ns,
                                                          std::string data);
  // A fast-path request header: room for the request id, the namespace (zeros when null) and,
  // with authentication, the ticket.
  std::string AmRequestHeader(const NamespaceId* ns) const;
  // Reserve or Commit as an active message (data: the serialized request): the serialized
  // response when the daemon answered it that way; nullopt when the gRPC call must be made (not
  // offered, refused with an error, or sent back undone); an error when no answer came in time.
  absl::StatusOr<std::optional<std::string>> ControlByActiveMessage(const char* name,
                                                                    uint16_t request_am,
                                                                    uint16_t reply_am,
                                                                    const NamespaceId* ns,
                                                                    std::string data);
  bool ControlsByMessage() const;
  // Whether calls by message may go on the data-plane endpoint now: reconnects it first where
  // the daemon may have been replaced; false when that failed (gRPC then).
  bool DataPlaneCurrent();
  // Whether the daemon gRPC reaches is the instance the data plane is connected to (a Connect
  // call; true when it does not answer in time: slow, not replaced).
  bool SameDaemon();
  static constexpr absl::Duration kSameDaemonTimeout = absl::Milliseconds(200);
  // What ControlByActiveMessage makes of the daemon's reply (or of its absence).
  absl::StatusOr<std::optional<std::string>> ControlReply(
      const char* name, const absl::StatusOr<AmReply>& reply) const;
  std::optional<v1::LookupResponse> LookupByActiveMessage(const NamespaceId& ns,
                                                          std::span<const BlockId> ids);
  std::optional<absl::StatusOr<v1::LookupResponse>> LookupOnStream(const v1::LookupRequest& req);
  absl::Status NotAnswered(const char* name, absl::StatusCode code, absl::string_view why) const;

  const ControlOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  uint64_t staging_bytes_ = kDefaultStagingBytes;
  std::unique_ptr<v1::Cache::Stub> stub_;

  void SetNodeId(const std::string& id);
  // Every node id this channel's daemon has had, the current one last: a reconnection that
  // finds another id appends it (one that finds the same adds nothing), and node_id_ points at
  // the current one. Appending to a deque leaves the older strings where they are, so a
  // reference node_id() returned earlier stays valid.
  static const std::string kNoNodeId;
  std::mutex node_id_mu_;
  std::deque<std::string> node_ids_;  // guarded by node_id_mu_
  std::atomic<const std::string*> node_id_{&kNoNodeId};
  std::atomic<bool> clustered_{false};
  std::atomic<uint64_t> arena_bytes_{0};  // the daemon's, from its last Connect (0: unknown)

  mutable std::mutex ns_mu_;
  absl::flat_hash_map<NamespaceId, OpenedNamespace> namespaces_;

  // One long-lived LookupStream (see cache.proto), used when free; a lookup that finds it busy,
  // broken or not yet open takes the unary call instead.
  std::mutex stream_mu_;
  std::unique_ptr<LookupStream> stream_;

  // The active-message fast path, switched off after a few consecutive timeouts (a daemon
  // without it must not cost every lookup a wait).
  DataMover* fast_path_ = nullptr;
  std::atomic<bool> acquire_by_message_{false};  // the daemon answers Acquire on the fast path
  std::atomic<bool> control_by_message_{false};  // ... and Reserve and Commit
  std::atomic<bool> acquire_and_push_{false};    // ... and pushes a lease's blocks right after
  std::atomic<bool> push_releases_{false};       // ... and then ends that lease itself
  std::atomic<bool> answer_in_block_{false};     // ... answering inside the first block
  std::atomic<bool> push_in_pieces_{false};      // ... pushing larger blocks in pieces
  std::atomic<bool> publish_in_one_{false};      // ... and takes a small publish in one message
  std::atomic<bool> fetch_in_one_{false};        // ... and answers a small fetch with its bytes
  std::atomic<bool> device_fetch_{false};        // ... and fetches into lent device buffers
  std::atomic<bool> spare_reservations_{false};  // Commit takes CommitSpares (any route)
  // With authentication: what stands for this client in fast-path messages (Connect sets it
  // again after a reconnection).
  std::string ticket() const {
    std::lock_guard<std::mutex> lock(ticket_mu_);
    return am_ticket_;
  }
  mutable std::mutex ticket_mu_;
  std::string am_ticket_;
  std::atomic<bool> fast_path_enabled_;
  std::atomic<int> fast_path_timeouts_{0};
  // The daemon may have been replaced since the data plane connected (see DataPlaneCurrent).
  std::atomic<bool> data_plane_suspect_{false};
  std::mutex reconnect_mu_;

  std::mutex release_mu_;
  std::condition_variable release_cv_;
  int releases_in_flight_ = 0;
};

}  // namespace strata::client
