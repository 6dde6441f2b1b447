// The Cache gRPC service (proto/strata/v1/cache.proto) over this node's BlockStore.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/am_wire.h"
#include "common/helper_thread.h"
#include "daemon/am_drops.h"
#include "daemon/auth.h"
#include "daemon/metrics.h"
#include "daemon/namespace_registry.h"
#include "daemon/staging_table.h"
#include "storage/block_store.h"
#include "storage/gpu/gpu_tiered_store.h"
#include "strata/v1/cache.grpc.pb.h"
#include "transport/ucx.h"

namespace strata::daemon {

class Cluster;
class Transcoder;

// What a client needs to reach the arena over UCX (the arena's address and size are the
// store's).
struct DataPlaneInfo {
  std::string node_id;
  // The data-plane workers' addresses (config data_plane_workers): Connect spreads clients over
  // them; other daemons always get the first, which also serves the cluster's messages.
  std::vector<std::string> worker_addresses;
  std::string arena_rkey;
  // Connect hands clients the arena's key and address (mapped copies on shared memory, RMA on
  // RDMA): with authentication off, or when one tenant is all the daemon serves and no
  // transport lets an unauthenticated peer use the key (OpenDataPlane decides).
  bool clients_map_arena = true;
  // With several tenants: where a same-node client asks for its tenant's zone (ZoneServer).
  std::string zone_socket;
  // ... and its clients may write their zone (auth.tenant_zones_writable).
  bool clients_write_zones = false;
  // ... or else lend staging windows to publish through (ZoneServer adds them). Null: none.
  const StagingTable* stagings = nullptr;
  ucp_mem_h arena_memh = nullptr;  // the arena's UCX registration (push fetches send from it)
  AmDrops* am_drops = nullptr;     // malformed active messages: counted and logged there
  // The workers' progress threads: a Commit on another thread waits on them in TSan builds
  // (ProgressThread::OrderAfterProgress). Empty: nothing to order with (tests).
  std::vector<transport::ProgressThread*> progress;
  // Requests each worker answered by message, in worker_addresses' order (Stats shows them as
  // data_plane_worker_N_requests_total). Empty: not counted (tests).
  std::vector<const std::atomic<uint64_t>*> worker_requests;
  std::string transports;
  bool huge_pages = false;
  // Random per start of the daemon (ConnectResponse.instance_id): tells a client whether the
  // arena it reaches is the one that handed out an offset.
  uint64_t instance_id = 0;
  // The GPU tier (config gpu), the same object as the service's store; null: none.
  GpuTieredStore* gpu = nullptr;
};

class CacheService final : public v1::Cache::Service {
 public:
  // `auth` null: authentication off. Otherwise it must outlive the service.
  CacheService(BlockStore* store, NamespaceRegistry* namespaces, DataPlaneInfo data_plane,
               const Authenticator* auth = nullptr);

  grpc::Status Connect(grpc::ServerContext* c, const v1::ConnectRequest* q,
                       v1::ConnectResponse* r) override {
    return Timed(RpcMetrics::kConnect, [&] { return DoConnect(c, q, r); });
  }
  grpc::Status OpenNamespace(grpc::ServerContext* c, const v1::OpenNamespaceRequest* q,
                             v1::OpenNamespaceResponse* r) override {
    return Timed(RpcMetrics::kOpenNamespace, [&] { return DoOpenNamespace(c, q, r); });
  }
  grpc::Status Lookup(grpc::ServerContext* c, const v1::LookupRequest* q,
                      v1::LookupResponse* r) override {
    return Timed(RpcMetrics::kLookup, [&] { return DoLookup(c, q, r); });
  }
  grpc::Status LookupStream(
      grpc::ServerContext* c,
      grpc::ServerReaderWriter<v1::LookupResponse, v1::LookupRequest>* stream) override;
  grpc::Status Reserve(grpc::ServerContext* c, const v1::ReserveRequest* q,
                       v1::ReserveResponse* r) override {
    return Timed(RpcMetrics::kReserve, [&] { return DoReserve(c, q, r); });
  }
  grpc::Status Commit(grpc::ServerContext* c, const v1::CommitRequest* q,
                      v1::CommitResponse* r) override {
    return Timed(RpcMetrics::kCommit, [&] { return DoCommit(c, q, r); });
  }
  grpc::Status Abort(grpc::ServerContext* c, const v1::AbortRequest* q,
                     v1::AbortResponse* r) override {
    return Timed(RpcMetrics::kAbort, [&] { return DoAbort(c, q, r); });
  }
  grpc::Status Acquire(grpc::ServerContext* c, const v1::AcquireRequest* q,
                       v1::AcquireResponse* r) override {
    return Timed(RpcMetrics::kAcquire, [&] { return DoAcquire(c, q, r); });
  }
  grpc::Status Release(grpc::ServerContext* c, const v1::ReleaseRequest* q,
                       v1::ReleaseResponse* r) override {
    return Timed(RpcMetrics::kRelease, [&] { return DoRelease(c, q, r); });
  }
  grpc::Status Evict(grpc::ServerContext* c, const v1::EvictRequest* q,
                     v1::EvictResponse* r) override {
    return Timed(RpcMetrics::kEvict, [&] { return DoEvict(c, q, r); });
  }
  grpc::Status Pin(grpc::ServerContext* c, const v1::PinRequest* q, v1::PinResponse* r) override {
    return Timed(RpcMetrics::kPin, [&] { return DoPin(c, q, r); });
  }
  grpc::Status Unpin(grpc::ServerContext* c, const v1::UnpinRequest* q,
                     v1::UnpinResponse* r) override {
    return Timed(RpcMetrics::kUnpin, [&] { return DoUnpin(c, q, r); });
  }
  grpc::Status Stats(grpc::ServerContext* c, const v1::StatsRequest* q,
                     v1::StatsResponse* r) override {
    return Timed(RpcMetrics::kStats, [&] { return DoStats(c, q, r); });
  }
  grpc::Status Locate(grpc::ServerContext* c, const v1::LocateRequest* q,
                      v1::LocateResponse* r) override;
  grpc::Status Reposition(grpc::ServerContext* c, const v1::RepositionRequest* q,
                          v1::RepositionResponse* r) override;

  // Lookup fast path (common/am_wire.h): answers an active message on the data-plane
  // worker's progress thread and replies through `worker`. Never blocks on other nodes.
  void HandleAmLookup(const transport::AmMessage& m, transport::Worker* worker);

  // Fetch by push (common/am_wire.h): sends the leased extents a client asks for from the
  // arena, as active messages, on the progress thread. Refuses extents its lease does not hold.
  void HandleAmFetch(const transport::AmMessage& m, transport::Worker* worker);
  // An answer not sent yet: it goes inside the first pushed block.
  struct HeldAnswer {
    am_wire::ReplyHeader header;
    std::string data;
  };
  // Sends the arena's `extents` to `reply_ep` as blocks of push request `request_id`, block k
  // with index indices[k], each under a read hold of `lease_id`; false (nothing sent) when an
  // extent is not that lease's. `answer`, when given, rides in the first block's header (or its
  // first piece's). `piece_bytes` (not 0): blocks larger go in pieces (kFetchPieceAm).
  // Up to a few hundred KiB the rendezvous round trip costs more than the receiver's copy: a
  // whole block this small is pushed eagerly.
  static constexpr uint64_t kEagerPushBytes = 256 << 10;
  bool PushExtents(transport::Worker* worker, ucp_ep_h reply_ep, uint64_t request_id,
                   uint64_t lease_id, std::span<const ArenaExtent> extents,
                   std::span<const uint32_t> indices, const HeldAnswer* answer = nullptr,
                   uint32_t piece_bytes = 0);
  // An Acquire as an active message (am_wire::kAcquireRequestAm), answered when every block is
  // in host memory; else the reply sends the client to the gRPC Acquire.
  void HandleAmAcquire(const transport::AmMessage& m, transport::Worker* worker);
  // The same Acquire (am_wire::kAcquirePushRequestAm), then a push of every leased block.
  void HandleAmAcquirePush(const transport::AmMessage& m, transport::Worker* worker);
  // The same, its answer inside the first pushed block (am_wire::kAcquirePushAnsweredRequestAm).
  void HandleAmAcquirePushAnswered(const transport::AmMessage& m, transport::Worker* worker);
  // The same, larger blocks pushed in pieces (am_wire::kAcquirePushPiecesRequestAm).
  void HandleAmAcquirePushPieces(const transport::AmMessage& m, transport::Worker* worker);
  // Answers an acquire request (`request_am`'s); true when the reply was a complete lease, then
  // in `*granted` when not null. With `held`, a lease of at least one block whose answer is
  // small enough is not sent but left there (empty data otherwise: it was sent).
  bool ServeAmAcquire(const transport::AmMessage& m, transport::Worker* worker,
                      uint16_t request_am, v1::AcquireResponse* granted,
                      std::optional<HeldAnswer>* held = nullptr);
  void AcquireAndPush(const transport::AmMessage& m, transport::Worker* worker,
                      uint16_t request_am, bool answer_in_block, uint32_t piece_bytes = 0);
  // A one-way release (am_wire::kReleaseAm) of a lease; with authentication, of the ticket's
  // caller's own lease only.
  void HandleAmRelease(const transport::AmMessage& m);
  // A one-way abort (am_wire::kAbortAm) of a reservation, checked as the gRPC Abort.
  void HandleAmAbort(const transport::AmMessage& m);
  grpc::Status AbortFor(const Caller& caller, uint64_t reservation_id);
  // Publish by message (common/am_wire.h): writes a block into the extent of the sender's
  // reservation, receiving a rendezvous payload straight there, and acknowledges it. Returns
  // whether it kept the rendezvous descriptor (never: a receive it starts owns it).
  bool HandleAmPublish(const transport::AmMessage& m, transport::Worker* worker);
  // A piece of a block published by message (am_wire::kPublishPieceAm), copied in with its CRC.
  void HandleAmPublishPiece(const transport::AmMessage& m, transport::Worker* worker);
  // A block the client copied into its staging window (am_wire::kPublishStagedAm), or several
  // of one reservation (kPublishStagedManyAm).
  void HandleAmPublishStaged(const transport::AmMessage& m, transport::Worker* worker);
  void HandleAmPublishStagedMany(const transport::AmMessage& m, transport::Worker* worker);
  // Reserve and Commit as active messages (am_wire kReserveRequestAm, kCommitRequestAm), with
  // the checks of their gRPC twins. A Commit that must wait on other nodes (announcements,
  // replicas) is sent back to gRPC undone.
  void HandleAmReserve(const transport::AmMessage& m, transport::Worker* worker);
  void HandleAmCommit(const transport::AmMessage& m, transport::Worker* worker);
  // A small publish in one request (am_wire::kPublishInOneAm): Reserve, the copies of a publish
  // by message and Commit, with their checks. Sent back undone where Commit would wait.
  void HandleAmPublishInOne(const transport::AmMessage& m, transport::Worker* worker);
  // A small fetch in one request (am_wire::kFetchInOneAm): the blocks inside the answer.
  void HandleAmFetchInOne(const transport::AmMessage& m, transport::Worker* worker);
  // Counts and (rate-limited) logs a malformed active message.
  void DropAm(uint16_t id, const transport::AmMessage& m, std::string_view why);
  // Releases a lease and forgets whose it was (every route that ends one: Release by gRPC or by
  // message, and the fetches that end their own).
  absl::Status EndLease(uint64_t lease_id);

  // Who a Connect ticket stands for (the zone server asks; authentication off: anyone).
  std::optional<Caller> CallerOfTicket(std::string_view ticket) const { return AmCaller(ticket); }

  // The cluster layer, once it is up (null: this node answers alone).
  void set_cluster(Cluster* cluster) { cluster_.store(cluster); }

  // Per-method request, latency and error metrics; null (the default) records nothing.
  void set_metrics(RpcMetrics* metrics) { metrics_ = metrics; }
  // What rewrites cold blocks of namespaces opened with a cold codec; set before serving (null:
  // such opens are refused).
  void set_transcoder(Transcoder* transcoder) { transcoder_ = transcoder; }

  // Refuses new calls from now on and waits up to `grace` for in-flight ones; true if they all
  // finished.
  bool Drain(absl::Duration grace);

  // Publishes blocks this daemon makes itself (read out of an engine's lent device buffer) as
  // `caller` would: ReserveFor, the bytes written into the arena with their CRC32C taken,
  // CommitFor (so replicas, announcements and events follow as for any publish). One status per
  // block: Reserve's refusal, or Commit's answer.
  // `write(i, dst)` fills block i's extent (sizes[i] bytes) and returns its CRC32C; it is called
  // for the blocks Reserve grants only. A failed write aborts the reservation and the call.
  grpc::Status PublishMade(
      const Caller& caller, const NamespaceId& ns, std::span<const BlockId> ids,
      std::span<const BlockId> parents, std::span<const uint64_t> sizes,
      const std::function<absl::StatusOr<uint32_t>(size_t, uint8_t*)>& write,
      absl::Time deadline, std::vector<BlockStatus>* status);
  // Calls admitted and still running.
  int in_flight() {
    absl::MutexLock lock(&drain_mu_);
    return in_flight_;
  }

 private:
  // Admits a call unless draining, and counts it while it runs.
  class CallScope {
   public:
    explicit CallScope(CacheService* s);
    ~CallScope();
    bool admitted() const { return admitted_; }
    grpc::Status refusal() const;

   private:
    CacheService* service_;
    bool admitted_;
  };

  // The opening every handler shares: the call is admitted (refused while draining), its caller
  // authenticated, and it is counted until `handler(caller)` returns.
  template <typename Handler>
  grpc::Status Serve(const grpc::ServerContext* ctx, Handler&& handler);
  // The same for a block-scoped request, whose namespace (opened here, by the caller's tenant)
  // and packed ids are parsed and checked first: `handler(ns, ids, caller)`.
  template <typename Request, typename Handler>
  grpc::Status ServeScoped(const grpc::ServerContext* ctx, const Request& req, Handler&& handler);

  grpc::Status DoConnect(grpc::ServerContext*, const v1::ConnectRequest*, v1::ConnectResponse*);
  grpc::Status DoOpenNamespace(grpc::ServerContext*, const v1::OpenNamespaceRequest*,
                               v1::OpenNamespaceResponse*);
  grpc::Status DoLookup(grpc::ServerContext*, const v1::LookupRequest*, v1::LookupResponse*);
  grpc::Status DoReserve(grpc::ServerContext*, const v1::ReserveRequest*, v1::ReserveResponse*);
  grpc::Status DoCommit(grpc::ServerContext*, const v1::CommitRequest*, v1::CommitResponse*);
  grpc::Status DoAbort(grpc::ServerContext*, const v1::AbortRequest*, v1::AbortResponse*);
  grpc::Status DoAcquire(grpc::ServerContext*, const v1::AcquireRequest*, v1::AcquireResponse*);
  grpc::Status DoRelease(grpc::ServerContext*, const v1::ReleaseRequest*, v1::ReleaseResponse*);
  grpc::Status DoEvict(grpc::ServerContext*, const v1::EvictRequest*, v1::EvictResponse*);
  grpc::Status DoPin(grpc::ServerContext*, const v1::PinRequest*, v1::PinResponse*);
  grpc::Status DoUnpin(grpc::ServerContext*, const v1::UnpinRequest*, v1::UnpinResponse*);
  grpc::Status DoStats(grpc::ServerContext*, const v1::StatsRequest*, v1::StatsResponse*);
  // What tells the lookup-shaped fast paths apart (ServeAmScoped).
  struct AmScopedKind {
    uint16_t request_am, reply_am;
    RpcMetrics::Op rpc;
    const char* what;
  };
  // The frame of a fast path whose request is a namespace and ids (am_wire's lookup request)
  // and whose reply is a ReplyHeader and data: decoded and checked like its gRPC twin (with
  // authentication, its ticket names the caller), always answered. `answer(ns, ids, caller,
  // &header, &data)` fills a complete answer, or leaves header.complete false to send the
  // client to gRPC. `keep(header, &data)`, when given, may take a complete, successful answer
  // to send later itself (true: nothing is sent here).
  using KeepAnswer = absl::FunctionRef<bool(const am_wire::ReplyHeader&, std::string*)>;
  template <typename Answer>
  void ServeAmScoped(const transport::AmMessage& m, transport::Worker* worker, AmScopedKind kind,
                     Answer&& answer, std::optional<KeepAnswer> keep = std::nullopt);
  // The bodies of Reserve and Commit (daemon/cache_publish.cc), by gRPC or active message.
  // CommitFor with `may_wait` false commits only what needs no network wait; otherwise it sets
  // *deferred and changes nothing.
  // The checks every Reserve passes (namespace open and the caller's, ids, parents, sizes),
  // and its items.
  grpc::Status CheckReserve(const Caller& caller, const v1::ReserveRequest& req, NamespaceId* ns,
                            std::vector<ReserveItem>* items) const;
  // `spare`: a spare for a block not yet named (GrantSpare).
  grpc::Status ReserveFor(const Caller& caller, const v1::ReserveRequest& req,
                          v1::ReserveResponse* resp, bool spare = false);
  grpc::Status CommitFor(const Caller& caller, const v1::CommitRequest& req, absl::Time deadline,
                         bool may_wait, bool* deferred, v1::CommitResponse* resp);
  // CommitRequest.rename: names the spare's block (checked as a Reserve of it is). nullopt:
  // named, commit it; otherwise the answer to send (the spare went back) or the error.
  std::optional<grpc::Status> RenameSpare(const Caller& caller, const v1::CommitRequest& req,
                                          v1::CommitResponse* resp);
  // CommitRequest.spare: reserves one for the caller's next publish into `spare` (left empty
  // where none is granted).
  void GrantSpare(const Caller& caller, const v1::SpareRequest& want,
                  v1::ReserveResponse* spare);
  // The frame of a fast path whose request and reply are a gRPC call's messages (am_wire's
  // reserve and commit): `body(caller, req, &resp, &deferred)`.
  template <typename Request, typename Response, typename Body>
  void ServeAmControl(const transport::AmMessage& m, transport::Worker* worker, AmScopedKind kind,
                      Body&& body);
  // The opening every request/reply fast path shares: its header, when it has one and a reply
  // endpoint (otherwise the message is dropped and counted).
  std::optional<am_wire::LookupRequestHeader> OpenAmRequest(const transport::AmMessage& m,
                                                            const AmScopedKind& kind);
  // Who an active message's ticket stands for (authentication off: anyone, trusted).
  std::optional<Caller> AmCaller(std::string_view ticket) const;
  // Whether `caller` may act on namespace `ns` (its tenant's, or any for trusted callers).
  bool MayUseNamespace(const Caller& caller, const NamespaceId& ns) const;
  // Whether an acquire of `ids` needs no disk read, so a message handler may answer it:
  // `resident` (store_->Inspect(ids)) are all of `ns`, and every other id is one no tier holds
  // (a miss, as a remote fetch starts with). A block held lower down goes to the gRPC Acquire.
  bool AnswerableHere(const NamespaceId& ns, std::span<const BlockId> ids,
                      std::span<const BlockInfo> resident) const;
  // The body of an Acquire, by gRPC or active message.
  void AcquireInto(const NamespaceId& ns, const std::vector<BlockId>& ids, const Caller& caller,
                   v1::AcquireResponse* resp);
  // The part of a Lookup's prefix past the `local` blocks, from the directory: adds holders
  // and tiers to `resp`; returns how many more blocks the prefix has.
  size_t LookupRemote(Cluster& cluster, std::span<const BlockId> rest, size_t local,
                      v1::LookupResponse* resp);
  // Keeps what a reservation of a replicated namespace must copy once it commits.
  void RememberReplication(const NamespaceId& ns, std::span<const ReserveItem> items,
                           const ReserveResult& r);
  template <typename F>
  grpc::Status Timed(RpcMetrics::Op op, F&& handler) {
    if (!metrics_) return handler();
    auto t0 = std::chrono::steady_clock::now();
    grpc::Status s = handler();
    metrics_->Record(op, s.error_code(),
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return s;
  }

  BlockStore* const store_;
  std::atomic<Cluster*> cluster_{nullptr};
  std::atomic<uint64_t> pushed_blocks_{0};  // blocks sent by HandleAmFetch (push fetches)
  std::atomic<uint64_t> pushed_pieces_{0};  // pieces those blocks went in (kFetchPieceAm)
  std::atomic<uint64_t> published_in_pieces_{0};  // blocks that came in pieces (kPublishPieceAm)
  std::atomic<uint64_t> next_worker_{0};  // the data-plane worker Connect hands out next
  std::atomic<uint64_t> published_blocks_{0};  // blocks written by HandleAmPublish
  std::atomic<uint64_t> staged_blocks_{0};     // ... and by HandleAmPublishStaged
  std::atomic<uint64_t> acquires_by_message_{0};  // leases granted by HandleAmAcquire(Push)
  std::atomic<uint64_t> acquires_with_push_{0};   // ... whose blocks HandleAmAcquirePush sent
  std::atomic<uint64_t> answers_in_block_{0};     // ... with the answer in the first block
  std::atomic<uint64_t> spares_granted_{0};       // spare reservations granted by Commits
  std::atomic<uint64_t> spares_named_{0};         // ... and named by a later Commit
  std::atomic<uint64_t> releases_by_message_{0};  // leases a Release message ended
  std::atomic<uint64_t> controls_by_message_{0};  // reserves and commits answered by message
  std::atomic<uint64_t> published_in_one_{0};     // publishes answered by HandleAmPublishInOne
  std::atomic<uint64_t> fetched_in_one_{0};       // fetches answered by HandleAmFetchInOne
  std::atomic<uint64_t> locates_{0};              // Locate calls (clients finding holders)
  struct PublishInOneRequest;
  grpc::Status PublishInOneFor(const Caller& caller, const PublishInOneRequest& req,
                               v1::PublishInOneResponse* resp, bool* deferred);
  // Reservations of namespaces that replicate: what to copy once they commit.
  struct PendingReplication {
    NamespaceId ns;
    std::vector<BlockId> ids, parents;  // the BLOCK_OK entries, in commit order
    uint64_t bytes = 0;                 // theirs, for the copies' time budget
    absl::Time expires;
  };
  // Blocks stratad itself copied in from a staging window, with the CRC it took as it wrote
  // them, by reservation and extent offset: a Commit whose CRCs are these needs no second read
  // of the bytes. Forgotten at Commit, at Abort and at any other write to the reservation;
  // cleared whole past kMaxStagedReservations (then Commit reads again).
  struct StagedExtent {
    uint64_t size;
    uint32_t crc;
  };
  static constexpr size_t kMaxStagedReservations = 4096;
  // Blocks being published in pieces, by reservation and extent offset: where the next piece
  // must start and the CRC of the bytes so far. A client sends a block's pieces in order over
  // one endpoint; the map is shared by the workers and not locked while a piece is copied, so
  // an entry is marked busy meanwhile: pieces of one block from two writers at once fail the
  // block instead of leaving a CRC that is not its bytes'. A reservation's entries go at its
  // Commit or Abort; past MaxBlocksInPieces(), those of reservations that ended otherwise
  // (expired) go, then those untouched for a reservation timeout. Only blocks larger than
  // am_wire::kMinPushPieceBytes come in pieces, so below a 256 MiB arena open reservations
  // cannot fill the table; above it, filling it takes 256 MiB of reservations left open.
  struct PiecesSoFar {
    uint64_t next = 0;
    uint32_t crc = 0;
    absl::Time touched;
    uint64_t started = 0;  // pieces_started_ when the block (re)started: tells restarts apart
    bool busy = false;     // a piece is being copied in (the lock is not held meanwhile)
  };
  static constexpr size_t kMaxBlocksInPieces = 4096;    // at least; see MaxBlocksInPieces
  static constexpr size_t kMostBlocksInPieces = 65536;  // ~4 MiB of entries at most
  size_t MaxBlocksInPieces() const;
  void ForgetPieces(uint64_t reservation_id);
  // With the table full: drops the entries of reservations no longer open.
  void SweepEndedPieces();
  absl::Mutex pieces_mu_;  // taken before staged_mu_ (ForgetStaged), never after it
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, PiecesSoFar> publish_pieces_
      ABSL_GUARDED_BY(pieces_mu_);
  uint64_t pieces_started_ ABSL_GUARDED_BY(pieces_mu_) = 0;
  void NoteStaged(uint64_t reservation_id, uint64_t offset, uint64_t size, uint32_t crc);
  // All of the reservation's extents, or the one at `offset`.
  void ForgetStaged(uint64_t reservation_id, std::optional<uint64_t> offset = std::nullopt);
  // Whether every block of the reservation was copied in from a staging window with exactly
  // the CRC `crcs` gives it (and forgets the reservation's record).
  bool StagedWithCrcs(uint64_t reservation_id, std::span<const uint32_t> crcs);
  absl::Mutex staged_mu_;
  absl::flat_hash_map<uint64_t, absl::flat_hash_map<uint64_t, StagedExtent>> staged_
      ABSL_GUARDED_BY(staged_mu_);
  // Copies half of large staged copies while the progress thread copies the rest (the mapped
  // path a single tenant takes copies on two threads too). With staging windows only.
  std::unique_ptr<HelperThread> staged_copier_;
  // Checks each staged block (its window, its place there, its extent in the window's tenant
  // zone and in its reservation), copies those that pass into the arena taking their CRC32C as
  // it goes, and reports each: report(i, status, CRC stratad took).
  void CopyStagedBlocks(std::span<const am_wire::PublishStagedHeader> staged,
                        const std::function<void(size_t, const absl::Status&, uint32_t)>& report);
  absl::Mutex replicate_mu_;
  absl::flat_hash_map<uint64_t, PendingReplication> to_replicate_ ABSL_GUARDED_BY(replicate_mu_);
  Transcoder* transcoder_ = nullptr;
  RpcMetrics* metrics_ = nullptr;
  NamespaceRegistry* namespaces_;
  const DataPlaneInfo data_plane_;
  const Authenticator no_auth_;  // what auth_ points at when authentication is off
  const Authenticator* const auth_;
  IdOwners id_owners_;  // the tenant behind each live reservation and lease id
  AmTickets am_tickets_;  // with authentication: who each fast-path ticket stands for
  const absl::Time started_ = absl::Now();
  absl::Mutex drain_mu_;
  bool draining_ ABSL_GUARDED_BY(drain_mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(drain_mu_) = 0;
};

}  // namespace strata::daemon
