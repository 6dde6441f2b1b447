// Moves block bytes between a caller's buffers and one stratad's host arena.
//
// The mover owns the UCX side of a connection to one daemon: a context, a worker, the endpoint
// to the daemon's worker, the caller's registered buffers and, when a shared-memory transport
// maps the arena into this process, that mapping. It knows nothing of gRPC: it learns where the
// arena is from a Dialer (in libstrata, the daemon's Connect RPC), and dials again when the
// endpoint has failed. What to move comes from the control plane (a reservation's or a lease's
// extents); the mover moves it, checksums it and keeps to the deadline.
//
// One fallback ladder picks the route of every transfer (ChooseRoute):
//   kMapped  the arena is mapped here: plain copies, checksummed in the same pass;
//   kPush    fetches only, when preferred (DataMoverOptions::fetch_transfer): the daemon sends
//            each leased block as an active message, received straight into the caller's buffer;
//   kRma     one-sided put/get, with CRC checks of landed chunks overlapping later chunks.
//
// Thread-safe. Transfers on the endpoint are serialized; mapped copies run beside them.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/helper_thread.h"
#include "client/internal/publish_buffers.h"
#include "client/internal/zone_window.h"
#include "common/am_wire.h"
#include "strata/client.h"
#include "transport/ucx.h"

namespace strata::client {

// Where a daemon's data plane is (its Connect answer).
struct ArenaEndpoint {
  std::string worker_address;  // the daemon's UCX worker
  // Its first worker, where worker_address is another: taken instead when the arena maps.
  std::string first_worker_address;
  std::string rkey;            // packed remote key of its host arena
  uint64_t base = 0;           // the arena's address in the daemon
  uint64_t bytes = 0;
  // The daemon hands out a remote key (rkey); without one it is reached by messages only.
  bool rma = true;
  bool push_fetch = true;           // the daemon serves push fetches
  bool publish_by_message = false;  // the daemon accepts publishes by message
  bool push_in_pieces = false;      // ... and pushes larger blocks in pieces when asked
  bool publish_in_pieces = false;   // ... and takes published blocks in pieces
  // Which start of the daemon answered (ConnectResponse.instance_id; 0: it does not say).
  uint64_t instance_id = 0;
  // Several tenants: this client's tenant zone, mapped read-only; fetches inside it are copies.
  std::shared_ptr<const ZoneWindow> zone_window;
};

// kPush also names a publish by message (the client sends each block as an active message);
// kStaged a publish through the staging window of a read-only tenant zone.
enum class Route { kMapped, kPush, kRma, kStaged };
std::string_view RouteName(Route route);

struct DataMoverOptions {
  // "rma", "push" or "auto" (push without an RDMA device): see ClientOptions::fetch_transfer.
  std::string fetch_transfer = "auto";
  // Bound on one batch of transfers (also kept under 80% of the lease or reservation).
  absl::Duration transfer_timeout = absl::Seconds(10);
  // The daemon runs on this machine: keep shared-memory transports (see Worker::Connect).
  bool same_node = true;
  // Reply ids of the request/reply exchanges run with Exchange (installed at Connect).
  std::vector<uint16_t> exchange_replies = {am_wire::kLookupReplyAm, am_wire::kAcquireReplyAm,
                                           am_wire::kReserveReplyAm, am_wire::kCommitReplyAm,
                                           am_wire::kPublishInOneReplyAm,
                                           am_wire::kFetchInOneReplyAm,
                                           am_wire::kDeviceFetchReplyAm};
  // How a waiting call progresses the worker (Worker::ProgressWaiting, ClientOptions::
  // wait_spin): polls for wait_spin, then polls between yields for wait_yield, then sleeps.
  absl::Duration wait_spin = absl::InfiniteDuration();
  absl::Duration wait_yield = absl::InfiniteDuration();
  // Whether this host has an RDMA device; unset: /sys/class/infiniband is looked at once.
  std::optional<bool> rdma_device;
  // Pushed blocks larger than this come in pieces of at most this many bytes where the endpoint
  // carries messages over tcp (ClientOptions::push_piece_bytes); 0: whole. Unset: what fits one
  // of UCX's tcp receive segments (transport::TcpReceiveSegmentBytes, less kPieceHeadroom).
  std::optional<uint32_t> push_piece_bytes;
  LogSink log;
};

// One block between a caller's buffer and the arena.
struct BlockMove {
  void* local;            // the caller's buffer: source of a put, destination of a get
  uint64_t length;        // bytes of the block
  uint64_t arena_offset;  // where the daemon reserved or leased it, from the arena's start
  uint32_t crc32c = 0;    // gets: what the daemon recorded at commit
};

// The reply to an active-message request (DataMover::Exchange).
struct AmReply {
  std::string header;
  std::string data;
};

// An active-message request posted right behind the blocks of a publish by message (Put's
// `follow_up_for`): the daemon handles it after them, so a Commit takes no round trip of its own.
struct FollowUp {
  uint16_t request_am = 0, reply_am = 0;
  std::string header, data;  // as for DataMover::Exchange (the mover writes the request id)
  uint32_t push_piece_bytes = 0;  // an acquire-and-push: the piece size it asks for (0: none)
};
// Given the blocks' CRCs, the request to post behind them, or nullopt for none.
using FollowUpFor = std::function<std::optional<FollowUp>(std::span<const uint32_t> crcs)>;

struct PutOutcome {
  Route route;
  std::vector<uint32_t> crc32c;  // of each block's bytes as sent
  // Set when a follow-up went behind the blocks: its reply, or why none came.
  std::optional<absl::StatusOr<AmReply>> follow_up_reply;
};

struct GetOutcome {
  Route route;
  std::vector<uint8_t> intact;  // per block: 0 when the CRC check failed (1 when not checked)
};

class LandingChecks;  // client/internal/landing_checks.h

class DataMover {
 public:
  // Where the arena is now; called at Connect and again whenever the endpoint has failed.
  using Dialer = std::function<absl::StatusOr<ArenaEndpoint>()>;

  static absl::StatusOr<std::unique_ptr<DataMover>> Connect(DataMoverOptions options, Dialer dial);
  ~DataMover();
  DataMover(const DataMover&) = delete;
  DataMover& operator=(const DataMover&) = delete;

  // A publish buffer (client/internal/publish_buffers.h) of `bytes`, valid until destruction;
  // FailedPrecondition unless the daemon's arena is a read-only tenant zone mapped here.
  absl::StatusOr<uint8_t*> AllocatePublishBuffer(uint64_t bytes);
  // Registers [data, data+size) for transfers until UnregisterBuffer or destruction.
  absl::Status RegisterBuffer(void* data, size_t size);
  absl::Status UnregisterBuffer(void* data);

  enum class Direction { kPut, kGet };
  // The route a transfer in `direction` takes now.
  Route route(Direction direction) const;
  // Copies a fetched block's n bytes into the caller's dst, around the CPU caches or through
  // them. Returns their CRC32C when `checksum` or `around_caches` (the streaming copy takes it on
  // the way), else 0 after a plain copy.
  static uint32_t CopyFetched(void* dst, const void* src, size_t n, bool checksum,
                              bool around_caches);
  // Whether a publish's blocks would go to the daemon as messages carrying their bytes (no
  // mapping of the arena or of a tenant zone here): a small one may then go in one request.
  bool PublishesByMessage() const;

  // Copies blocks into extents the daemon reserved under `reservation_id`. `expires_in`: how
  // long the reservation holds them. `instance_id`: the daemon instance that reserved them
  // (ReserveResponse.instance_id; 0: not checked); when the endpoint leads to another one (the
  // daemon restarted since it was dialed) the mover dials again first, and fails Unavailable
  // when the reservation's instance is gone too. On an error the reservation's bytes are
  // undefined (the caller aborts it), and no transfer still reads the caller's buffers.
  // `follow_up_for`: where the blocks go by message and each is small enough to go eagerly
  // (kFollowUpBlockBytes), the request it returns is posted right behind them and its reply
  // waited for with their acknowledgements (PutOutcome::follow_up_reply).
  absl::StatusOr<PutOutcome> Put(uint64_t reservation_id, std::span<const BlockMove> blocks,
                                 absl::Duration expires_in, uint64_t instance_id = 0,
                                 const FollowUpFor& follow_up_for = nullptr);
  static constexpr uint64_t kFollowUpBlockBytes = 256 << 10;

  // Copies leased extents into the caller's buffers, checking each block's CRC32C when `verify`.
  // `expires_in`: how long the lease holds them. `instance_id`: the daemon instance that leased
  // them, checked as in Put. On an error no transfer still targets the caller's buffers when
  // this returns, but their bytes are undefined; a CRC failure is reported per block, not as an
  // error. `around_caches`: the bytes this process copies itself (not those a transport writes)
  // are written with non-temporal stores (ClientOptions::fetch_bypasses_cache).
  absl::StatusOr<GetOutcome> Get(uint64_t lease_id, std::span<const BlockMove> blocks, bool verify,
                                 absl::Duration expires_in, uint64_t instance_id = 0,
                                 bool around_caches = false);

  // A request/reply exchange of active messages on the endpoint (common/am_wire.h): writes a
  // fresh request id into the first 8 bytes of `header`, sends it and waits for the reply on
  // `reply_am` (one of DataMoverOptions::exchange_replies) whose header starts with that id.
  // `timeout` counts from when the endpoint is free (a transfer may hold it). Errors:
  // FailedPrecondition, there is no working endpoint (nothing was sent); DeadlineExceeded, no
  // reply in time; Unavailable, the send failed.
  // `answering`, when set, is asked (on another thread, while the wait goes on) once the reply
  // is kProbeAfter late whether the daemon that was sent the request is still the one serving
  // (ControlChannel::SameDaemon); false ends the wait with Unavailable (nothing will answer:
  // that daemon is gone).
  using Reply = AmReply;
  static constexpr absl::Duration kProbeAfter = absl::Milliseconds(250);
  absl::StatusOr<Reply> Exchange(uint16_t request_am, std::string header, std::string data,
                                 uint16_t reply_am, absl::Duration timeout,
                                 const std::function<bool()>& answering = nullptr);
  // The daemon instance the data plane is connected to (0 before it is).
  uint64_t instance_id() const;

  // Connects to the daemon again (its handshake, a new endpoint, zone window and loans), for a
  // daemon that may have been replaced since. No lock of this mover held.
  absl::Status Reconnect();

  // Acquire and push in one request (ControlChannel::AcquirePushRequest): sends `request`, and
  // `plan` reads the daemon's answer (on this thread, within the worker's progress) and says
  // where each pushed block lands, by the position of its id: length 0 and local null, not
  // leased (nothing comes); local null, coming but not wanted (discarded). nullopt from `plan`:
  // no lease, nothing comes. Then the blocks are received as by a push fetch, each checked
  // against its CRC32C when `verify`. `reply_timeout` bounds the wait for the answer, the
  // lease's expiry (as in Get) the wait for the blocks. Errors as for Get, with no byte landing
  // after this returns; FailedPrecondition: no working endpoint (nothing was sent);
  // DeadlineExceeded before any answer: the caller may acquire the usual way.
  struct PushLanding {
    std::vector<BlockMove> moves;
    absl::Duration expires_in;
  };
  using PushPlan = std::function<std::optional<PushLanding>(const AmReply&)>;
  struct AcquiredGet {
    bool pushed = false;          // false: `plan` found no lease; nothing moved
    std::vector<uint8_t> intact;  // per entry of the plan (1 where nothing was checked)
  };
  absl::StatusOr<AcquiredGet> AcquireAndGet(FollowUp request, const PushPlan& plan, bool verify,
                                            absl::Duration reply_timeout,
                                            bool around_caches = false);

  // The piece size a push fetch asks for on the current endpoint (am_wire::kFetchPieceAm): 0
  // where blocks come whole (pieces are off, or messages do not travel over tcp).
  uint32_t push_piece_bytes() const { return push_piece_bytes_.load(std::memory_order_relaxed); }
  // UCX's and the piece header's bytes within a receive segment, besides the piece.
  static constexpr uint32_t kPieceHeadroom = 256;

  // A one-way active message on the endpoint (no reply is awaited). FailedPrecondition when
  // there is no working endpoint.
  absl::Status Post(uint16_t am, std::string header, std::string data);

  // Spare hands for the caller's own per-block work (encoding, decoding).
  HelperThread& helper() { return helper_; }

 private:
  struct PushWait;
  struct PublishWait;
  struct ExchangeWait;

  DataMover(DataMoverOptions options, Dialer dial);
  Route ChooseRoute(Direction direction, bool mapped) const;
  // Whether every block lies in the zone window. Caller holds map_mu_.
  bool InZoneWindow(std::span<const BlockMove> blocks) const;
  absl::Status Redial();  // ucx_mu_ held
  // Redials when the endpoint has failed or leads to another daemon instance than
  // `instance_id` (nonzero) (takes ucx_mu_ then); map_mu_ and ucx_mu_ not held.
  absl::Status RedialIfStale(uint64_t instance_id);
  absl::Status CheckExtents(std::span<const BlockMove> blocks) const;
  // A publish's start (ucx_mu_ held): a working endpoint, every block inside the arena, and `w`
  // installed as the wait its acknowledgements go to.
  absl::Status StartPublishWait(std::span<const BlockMove> blocks, PublishWait* w);
  ucp_mem_h FindMemh(const void* p, size_t n);
  absl::Time DeadlineWithin(absl::Duration expires_in) const;

  absl::StatusOr<std::vector<uint32_t>> CopyMapped(std::span<const BlockMove> blocks,
                                                   Direction direction, bool checksum,
                                                   bool around_caches = false);
  absl::Status TransferRma(std::span<const BlockMove> blocks, Direction direction,
                           absl::Time deadline);
  absl::StatusOr<std::vector<uint8_t>> GetByRma(std::span<const BlockMove> blocks, bool verify,
                                                absl::Time deadline);
  absl::StatusOr<std::vector<uint8_t>> GetByPush(uint64_t lease_id,
                                                 std::span<const BlockMove> blocks, bool verify,
                                                 absl::Time deadline, bool around_caches);
  // `follow_up`, when set, is made once every block is sent (not yet acknowledged) and `ready`
  // says it can be (the CRCs it carries are in; the sends progress meanwhile): the request goes
  // right behind the blocks, its reply in `*follow_up_reply`. Only where every block goes
  // eagerly (SendsEagerly).
  struct LateFollowUp {
    std::function<bool()> ready;
    std::function<std::optional<FollowUp>()> make;
  };
  absl::Status PutByMessage(uint64_t reservation_id, std::span<const BlockMove> blocks,
                            absl::Time deadline, const LateFollowUp* follow_up = nullptr,
                            std::optional<absl::StatusOr<Reply>>* follow_up_reply = nullptr);
  // Whether a published block goes as eager messages only (small, or in pieces), so that the
  // daemon has written it before it handles a message sent after it.
  bool SendsEagerly(const BlockMove& b) const;
  // The pieces a published block goes in (its length: whole).
  uint64_t PublishPieceBytes(const BlockMove& b) const;
  // Whether `window` has a staging window that every block fits and whose zone holds them all.
  // After a redial the publish buffers are lent to a daemon that went away: lends them to the
  // current one, with none of this class's locks held (the loans are socket exchanges).
  void LendPublishBuffersToCurrentWindow();
  // Blocks that a staged publish can take: in a publish buffer, or fitting the staging window.
  bool FitsStaging(const ZoneWindow& window, std::span<const BlockMove> blocks);
  // Publishes through the staging window (client/data_mover_staged.cc); the CRCs it took while
  // copying land in `crcs`. A follow-up, when `follow_up_for` makes one, goes behind the blocks.
  absl::Status PutByStaging(uint64_t reservation_id, std::span<const BlockMove> blocks,
                            const ZoneWindow& window, absl::Time deadline,
                            std::vector<uint32_t>* crcs, const FollowUpFor* follow_up_for,
                            std::optional<absl::StatusOr<Reply>>* follow_up_reply);
  void FinishSends(std::vector<void*>* sending, bool abort);
  void ReapSends(std::vector<void*>* sending, absl::Status* error, const char* failed);
  absl::Status PostFollowUp(FollowUp* follow_up, ExchangeWait* reply);
  absl::Status ReceivePushed(uint64_t lease_id, std::span<const BlockMove> blocks,
                             absl::Time deadline, LandingChecks& checks);
  // The receiving end of a push (ucx_mu_ held, `w` installed as push_wait_, its request sent
  // with status `sent`): progresses until every expected block landed and, when `reply` is not
  // null, its answer came, or until `deadline` (read as it goes: an answer may move it); clears
  // push_wait_.
  absl::Status AwaitPushed(PushWait& w, absl::Status sent, const absl::Time& deadline,
                           const ExchangeWait* reply);
  void StartKeptReceives(PushWait& w, std::vector<std::pair<size_t, void*>>* receiving);
  void ReapReceives(PushWait& w, std::vector<std::pair<size_t, void*>>* receiving);
  // Cancels `receiving` and waits up to `wait` for UCX to finish each (endpoint aborted first).
  void CancelReceives(const std::vector<std::pair<size_t, void*>>& receiving,
                      absl::Duration wait);
  void StartPrefault();
  void StopPrefault();

  // Active-message handlers; they run on the thread progressing the worker (ucx_mu_ held).
  void OnExchangeReply(uint16_t reply_am, const transport::AmMessage& m);
  bool OnPushedBlock(const transport::AmMessage& m);
  // The first block of an acquire-and-push with the answer in its header: the answer, then
  // the block.
  bool OnAnsweredBlock(const transport::AmMessage& m);
  void OnPushedPiece(const transport::AmMessage& m);
  // The first piece of an acquire-and-push whose answer rides in its header.
  void OnAnsweredPiece(const transport::AmMessage& m);
  void OnPublishAck(const transport::AmMessage& m);
  void OnPublishAcks(const transport::AmMessage& m);  // several stored staged blocks
  // Block `index` of the publish in progress was stored (with the CRC stratad took, if sent).
  void NoteStored(uint32_t index, std::optional<uint32_t> crc32c);

  const DataMoverOptions options_;
  const Dialer dial_;
  bool want_push_ = false;                // fetch_transfer asks for push here
  bool rdma_ = false;                     // this host has an RDMA device
  std::atomic<bool> prefer_push_{false};  // ... and the daemon serves it
  // Publishes go by message: the daemon accepts them and either push is wanted or the daemon
  // hands out no remote key.
  std::atomic<bool> publish_by_message_{false};
  std::atomic<uint32_t> push_piece_bytes_{0};  // see push_piece_bytes()
  std::atomic<uint32_t> publish_piece_bytes_{0};  // the same for publishes by message

  // The endpoint and everything progressed through it. Handlers see push_wait_/exchange_wait_
  // only while the waiting thread holds ucx_mu_, since only that thread progresses the worker.
  std::mutex ucx_mu_;
  std::shared_ptr<transport::Context> ucx_;
  std::unique_ptr<transport::Worker> worker_;
  std::unique_ptr<transport::Endpoint> ep_;
  uint64_t arena_base_ = 0;
  uint64_t arena_bytes_ = 0;  // written under ucx_mu_ and map_mu_ both
  // The daemon instance dialed; written under both too, read without either (instance_id()).
  std::atomic<uint64_t> instance_id_{0};
  uint64_t next_request_id_ = 1;
  PushWait* push_wait_ = nullptr;
  PublishWait* publish_wait_ = nullptr;
  ExchangeWait* exchange_wait_ = nullptr;

  // The daemon's arena mapped into this process when UCX reaches it over shared memory; valid
  // while ep_ (its remote key) lives, failed or not. Copies hold map_mu_ shared; redialing
  // replaces ep_ and the mapping together under it exclusively, and destroys the old endpoint
  // only after that. ep_ is written under both ucx_mu_ and map_mu_, so either lock reads it.
  mutable std::shared_mutex map_mu_;
  uint8_t* mapped_arena_ = nullptr;
  // Instead (several tenants): the client's tenant zone, read-only. Same lifetime rules.
  std::shared_ptr<const ZoneWindow> zone_window_;
  // Outlive every zone window: the engine keeps writing into them across redials.
  PublishBuffers publish_buffers_;

  std::mutex reg_mu_;
  std::map<uintptr_t, std::unique_ptr<transport::MemoryRegion>> registered_;  // by start

  // Faults in this process's page tables for the mapped arena in the background, so the first
  // copy touching a page does not pay a page fault per 4 KiB.
  std::thread prefault_;
  std::atomic<bool> prefault_stop_{false};

  HelperThread helper_;
};

}  // namespace strata::client
