#include "client/data_mover.h"

#include <sys/mman.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "client/internal/data_mover_waits.h"
#include "client/internal/landing_checks.h"
#include "client/internal/logging.h"
#include "client/internal/pushed_block.h"
#include "common/crc32c.h"
#include "common/crc_pieces.h"
#include "common/status_macros.h"

namespace strata::client {
namespace {

// UCX reaches peers by RDMA only through an HCA; without one it emulates RMA in software.
bool HostHasRdmaDevice() {
  std::error_code ec;
  std::filesystem::directory_iterator it("/sys/class/infiniband", ec);
  return !ec && it != std::filesystem::directory_iterator();
}

// One job of a mapped copy: big enough that combining CRCs is noise.
constexpr uint64_t kMappedPieceBytes = 2 << 20;

absl::Status Prefixed(const absl::Status& s, const char* prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

}  // namespace

std::string_view RouteName(Route route) {
  switch (route) {
    case Route::kMapped: return "mapped";
    case Route::kPush: return "push";
    case Route::kRma: return "rma";
    case Route::kStaged: return "staged";
  }
  return "?";
}

// A fetch by push in progress; see common/am_wire.h.
struct DataMover::PushWait {
  uint64_t request_id = 0;
  bool planned = true;  // false until the answer of an acquire-and-push says what comes
  size_t expected = 0;  // blocks that will come
  std::span<const BlockMove> blocks;
  std::vector<ucp_mem_h> memh;
  std::vector<uint8_t> arrived;  // per block: a daemon that sends one twice is refused
  size_t done = 0;
  absl::Status error;
  std::vector<std::pair<size_t, void*>> kept;              // rendezvous payloads still to receive
  LandingChecks* checks = nullptr;  // told when block i is whole in its buffer
  uint32_t piece_bytes = 0;         // asked of the daemon: blocks larger come in pieces
  std::optional<PushedPieces> pieces;  // once `blocks` is known
};

DataMover::DataMover(DataMoverOptions options, Dialer dial)
    : options_(std::move(options)), dial_(std::move(dial)) {}

uint32_t DataMover::CopyFetched(void* dst, const void* src, size_t n, bool checksum,
                                bool around_caches) {
  if (around_caches) return CopyWithCrc32cStreaming(dst, src, n);
  if (checksum) return CopyWithCrc32c(dst, src, n);
  std::memcpy(dst, src, n);
  return 0;
}

absl::StatusOr<std::unique_ptr<DataMover>> DataMover::Connect(DataMoverOptions options,
                                                              Dialer dial) {
  std::unique_ptr<DataMover> m(new DataMover(std::move(options), std::move(dial)));
  const std::string& mode = m->options_.fetch_transfer;
  m->rdma_ =
      m->options_.rdma_device.has_value() ? *m->options_.rdma_device : HostHasRdmaDevice();
  m->want_push_ = mode == "push" || (mode == "auto" && !m->rdma_);
  const bool sleeps = m->options_.wait_spin != absl::InfiniteDuration() &&
                      m->options_.wait_yield != absl::InfiniteDuration();
  STRATA_ASSIGN_OR_RETURN(m->ucx_, transport::Context::Create(/*wakeup=*/sleeps));
  STRATA_ASSIGN_OR_RETURN(m->worker_, transport::Worker::Create(m->ucx_));
  m->worker_->SetWaitSpin(m->options_.wait_spin, m->options_.wait_yield);
  DataMover* raw = m.get();
  for (uint16_t id : m->options_.exchange_replies) {
    STRATA_RETURN_IF_ERROR(m->worker_->SetAmHandler(
        id, [raw, id](const transport::AmMessage& msg) { raw->OnExchangeReply(id, msg); }));
  }
  STRATA_RETURN_IF_ERROR(m->worker_->SetAmRendezvousHandler(
      am_wire::kFetchBlockAm,
      [raw](const transport::AmMessage& msg) { return raw->OnPushedBlock(msg); }));
  STRATA_RETURN_IF_ERROR(m->worker_->SetAmRendezvousHandler(
      am_wire::kFetchBlockAnsweredAm,
      [raw](const transport::AmMessage& msg) { return raw->OnAnsweredBlock(msg); }));
  STRATA_RETURN_IF_ERROR(m->worker_->SetAmHandler(
      am_wire::kFetchPieceAm,
      [raw](const transport::AmMessage& msg) { raw->OnPushedPiece(msg); }));
  STRATA_RETURN_IF_ERROR(m->worker_->SetAmHandler(
      am_wire::kFetchPieceAnsweredAm,
      [raw](const transport::AmMessage& msg) { raw->OnAnsweredPiece(msg); }));
  STRATA_RETURN_IF_ERROR(m->worker_->SetAmHandler(
      am_wire::kPublishAckAm,
      [raw](const transport::AmMessage& msg) { raw->OnPublishAck(msg); }));
  STRATA_RETURN_IF_ERROR(m->worker_->SetAmHandler(
      am_wire::kPublishAcksAm,
      [raw](const transport::AmMessage& msg) { raw->OnPublishAcks(msg); }));
  std::lock_guard<std::mutex> lock(m->ucx_mu_);
  STRATA_RETURN_IF_ERROR(m->Redial());
  return m;
}

DataMover::~DataMover() {
  StopPrefault();
  std::lock_guard<std::mutex> lock(ucx_mu_);
  ep_.reset();
  std::lock_guard<std::mutex> reg_lock(reg_mu_);
  registered_.clear();
}

absl::Status DataMover::Redial() {
  if (ep_ && ep_->failed())
    Log(options_.log, LogLevel::kInfo, "data-plane endpoint failed; connecting to stratad again");
  STRATA_ASSIGN_OR_RETURN(ArenaEndpoint arena, dial_());
  // Same node, or another one over tcp: an endpoint watched for the daemon's death keeps shared
  // memory and tcp's zero-copy rendezvous (see Worker::Connect). Over RDMA the endpoint itself
  // detects, as before: an endpoint without detection is untested there.
  const auto failure = options_.same_node || !rdma_ ? transport::Worker::PeerFailure::kWatch
                                                    : transport::Worker::PeerFailure::kDetect;
  // A tenant's client that maps its zone copies its fetched blocks itself, and its published
  // ones too where the zone is writable or a staging window is lent (the daemon's helper thread
  // copies those), as a client that maps the whole arena does (below): it takes the daemon's
  // first worker from the start.
  const ZoneWindow* zone = arena.zone_window.get();
  const bool own_bytes = zone != nullptr && (zone->writable() || zone->staging_status().ok());
  const std::string& address = own_bytes && !arena.first_worker_address.empty()
                                   ? arena.first_worker_address
                                   : arena.worker_address;
  auto dialed = worker_->Connect(address, failure);
  if (!dialed.ok() && address != arena.worker_address) {  // the worker handed out, then
    Log(options_.log, LogLevel::kInfo,
        absl::StrCat("first data-plane worker: ", dialed.status().ToString()));
    dialed = worker_->Connect(arena.worker_address, failure);
  }
  if (!dialed.ok()) return dialed.status();
  std::unique_ptr<transport::Endpoint> ep = std::move(*dialed);
  uint8_t* mapped = nullptr;
  if (arena.rma) {
    STRATA_RETURN_IF_ERROR(ep->SetRemoteKey(arena.rkey));
    mapped = static_cast<uint8_t*>(ep->MapRemote(arena.base));
    // Through a mapping this client copies every byte itself and the daemon answers only small
    // requests: the daemon's first worker takes those, and its other workers' threads stay
    // free for the clients whose bytes they move (on a small node they share the cores with
    // this client's copies). Where the first worker cannot be reached or maps nothing, the
    // endpoint handed out stays.
    if (mapped != nullptr && !arena.first_worker_address.empty() &&
        address != arena.first_worker_address) {
      auto first = worker_->Connect(arena.first_worker_address, failure);
      if (first.ok() && (*first)->SetRemoteKey(arena.rkey).ok()) {
        if (auto* m = static_cast<uint8_t*>((*first)->MapRemote(arena.base)); m != nullptr) {
          ep = std::move(*first);
          mapped = m;
        }
      }
    }
  } else if (!arena.push_fetch || !arena.publish_by_message) {
    return absl::FailedPreconditionError(
        "stratad hands out no remote key but does not serve push fetches and publishes by "
        "message either: it is older or newer than this libstrata");
  }
  prefer_push_ = arena.push_fetch && (want_push_ || !arena.rma);
  // Pieces pay where a large block would otherwise land only at the end of its batch (tcp's
  // rendezvous); shared memory and RDMA land it by one copy or none.
  uint32_t piece_bytes = 0;
  if ((arena.push_in_pieces || arena.publish_in_pieces) && ep->MessagesOverTcp()) {
    const uint64_t segment = transport::TcpReceiveSegmentBytes();
    piece_bytes = options_.push_piece_bytes.has_value()
                      ? *options_.push_piece_bytes
                      : static_cast<uint32_t>(std::clamp<uint64_t>(
                            segment > kPieceHeadroom ? (segment - kPieceHeadroom) & ~uint64_t{63}
                                                     : 0,
                            am_wire::kMinPushPieceBytes, am_wire::kMaxPushPieceBytes));
    if (!am_wire::ValidPushPieceBytes(piece_bytes)) piece_bytes = 0;
  }
  push_piece_bytes_ = arena.push_in_pieces ? piece_bytes : 0;
  publish_piece_bytes_ = arena.publish_in_pieces ? piece_bytes : 0;
  publish_by_message_ = arena.publish_by_message && (want_push_ || !arena.rma);
  // The old mapping lives exactly as long as the old endpoint (its remote key), and copies
  // through it run under map_mu_ shared without ucx_mu_: the swap waits for them, and the old
  // endpoint goes only once no copy can still hold its mapping.
  StopPrefault();
  std::unique_ptr<transport::Endpoint> old;
  {
    std::unique_lock<std::shared_mutex> map_lock(map_mu_);
    old = std::move(ep_);
    ep_ = std::move(ep);
    arena_base_ = arena.base;
    arena_bytes_ = arena.bytes;
    instance_id_ = arena.instance_id;
    mapped_arena_ = mapped;
    zone_window_ = mapped == nullptr ? arena.zone_window : nullptr;
  }
  old.reset();
  if (mapped != nullptr || zone_window_ != nullptr) StartPrefault();
  return absl::OkStatus();
}

// A daemon that restarted on the same address is a new instance with a new arena. Nothing on
// the data plane need fail for that to go unnoticed: over shared memory the old arena stays
// mapped here after its process died, and copies through it "succeed" into memory nobody reads
// (every publish then fails its commit's CRC check, and unchecked fetches read stale bytes).
// So the instance that handed out the extents is compared with the one dialed.
absl::Status DataMover::RedialIfStale(uint64_t instance_id) {
  auto current = [&] {
    return ep_ && !ep_->failed() && (instance_id == 0 || instance_id == instance_id_);
  };
  {
    std::shared_lock<std::shared_mutex> map_lock(map_mu_);
    if (current()) return absl::OkStatus();
  }
  std::lock_guard<std::mutex> lock(ucx_mu_);
  if (current()) return absl::OkStatus();  // another thread redialed meanwhile
  if (ep_ && !ep_->failed())
    Log(options_.log, LogLevel::kInfo, "stratad restarted; connecting to it again");
  STRATA_RETURN_IF_ERROR(Redial());
  if (instance_id != 0 && instance_id != instance_id_)
    return absl::UnavailableError(
        "stratad restarted during the call: the extents it handed out belong to an instance "
        "that is gone");
  return absl::OkStatus();
}

absl::Status DataMover::Reconnect() {
  std::lock_guard<std::mutex> lock(ucx_mu_);
  return Redial();
}

absl::Status DataMover::RegisterBuffer(void* data, size_t size) {
  STRATA_ASSIGN_OR_RETURN(auto region, ucx_->Register(data, size));
  std::lock_guard<std::mutex> lock(reg_mu_);
  registered_[reinterpret_cast<uintptr_t>(data)] = std::move(region);
  return absl::OkStatus();
}

absl::Status DataMover::UnregisterBuffer(void* data) {
  std::lock_guard<std::mutex> lock(reg_mu_);
  if (registered_.erase(reinterpret_cast<uintptr_t>(data)) == 0)
    return absl::NotFoundError("buffer was not registered");
  return absl::OkStatus();
}

ucp_mem_h DataMover::FindMemh(const void* p, size_t n) {
  std::lock_guard<std::mutex> lock(reg_mu_);
  auto it = registered_.upper_bound(reinterpret_cast<uintptr_t>(p));
  if (it == registered_.begin()) return nullptr;
  --it;
  return it->second->Contains(p, n) ? it->second->handle() : nullptr;
}

// The fallback ladder: a mapped arena beats any transfer; fetches then go by push where that
// is preferred (UCX would emulate RMA in software); one-sided RMA is the rest.
Route DataMover::ChooseRoute(Direction direction, bool mapped) const {
  if (mapped) return Route::kMapped;
  if (direction == Direction::kGet && prefer_push_) return Route::kPush;
  if (direction == Direction::kPut && publish_by_message_) return Route::kPush;
  return Route::kRma;
}

Route DataMover::route(Direction direction) const {
  std::shared_lock<std::shared_mutex> lock(map_mu_);
  // This tenant's own namespaces live in its zone: the window covers them (for publishes too
  // where it is writable).
  const bool window = zone_window_ != nullptr &&
                      (direction == Direction::kGet || zone_window_->writable());
  return ChooseRoute(direction, mapped_arena_ != nullptr || window);
}

bool DataMover::InZoneWindow(std::span<const BlockMove> blocks) const {
  if (zone_window_ == nullptr) return false;
  return std::all_of(blocks.begin(), blocks.end(), [&](const BlockMove& b) {
    return zone_window_->Covers(b.arena_offset, b.length);
  });
}

// Kept below the daemon's own timeout, so a slow transfer never touches space the daemon has
// reclaimed.
absl::Time DataMover::DeadlineWithin(absl::Duration expires_in) const {
  return absl::Now() + std::min(options_.transfer_timeout, expires_in * 0.8);
}

// Caller holds ucx_mu_ or map_mu_.
absl::Status DataMover::CheckExtents(std::span<const BlockMove> blocks) const {
  for (const BlockMove& b : blocks)
    if (b.length > arena_bytes_ || b.arena_offset > arena_bytes_ - b.length)
      return absl::InternalError("daemon returned an extent outside its arena");
  return absl::OkStatus();
}

absl::StatusOr<GetOutcome> DataMover::Get(uint64_t lease_id, std::span<const BlockMove> blocks,
                                          bool verify, absl::Duration expires_in,
                                          uint64_t instance_id, bool around_caches) {
  const absl::Time deadline = DeadlineWithin(expires_in);
  STRATA_RETURN_IF_ERROR(RedialIfStale(instance_id));
  std::shared_lock<std::shared_mutex> map_lock(map_mu_);
  GetOutcome out{
      ChooseRoute(Direction::kGet, mapped_arena_ != nullptr || InZoneWindow(blocks)), {}};
  if (out.route == Route::kMapped) {
    STRATA_ASSIGN_OR_RETURN(std::vector<uint32_t> crcs,
                            CopyMapped(blocks, Direction::kGet, verify, around_caches));
    out.intact.assign(blocks.size(), 1);
    for (size_t k = 0; verify && k < blocks.size(); ++k)
      out.intact[k] = crcs[k] == blocks[k].crc32c;
    return out;
  }
  map_lock.unlock();
  if (blocks.empty()) return out;
  auto moved = out.route == Route::kPush
                   ? GetByPush(lease_id, blocks, verify, deadline, around_caches)
                   : GetByRma(blocks, verify, deadline);
  if (!moved.ok()) return Prefixed(moved.status(), "fetch transfer failed: ");
  out.intact = std::move(*moved);
  return out;
}

// Caller holds map_mu_ shared. Runs on this thread and the helper, checksumming as it copies.
absl::StatusOr<std::vector<uint32_t>> DataMover::CopyMapped(std::span<const BlockMove> blocks,
                                                            Direction direction, bool checksum,
                                                            bool around_caches) {
  STRATA_RETURN_IF_ERROR(CheckExtents(blocks));
  uint8_t* const arena = mapped_arena_;
  // The caller checked that the window covers every block (and is writable for a put).
  const ZoneWindow* const window = arena == nullptr ? zone_window_.get() : nullptr;
  if (arena == nullptr &&
      (window == nullptr || (direction == Direction::kPut && !window->writable())))
    return absl::InternalError("mapped copy without a (writable) mapping");
  const std::vector<CrcPiece> pieces = SplitIntoCrcPieces(
      blocks.size(), [&](size_t i) { return blocks[i].length; }, kMappedPieceBytes);
  std::vector<uint32_t> piece_crcs(pieces.size());
  helper_.ParallelFor(pieces.size(), [&](size_t i) {
    const CrcPiece& p = pieces[i];
    const BlockMove& b = blocks[p.block];
    uint8_t* local = static_cast<uint8_t*>(b.local) + p.offset;
    uint8_t* remote = window != nullptr
                          ? const_cast<uint8_t*>(window->At(b.arena_offset)) + p.offset
                          : arena + b.arena_offset + p.offset;
    uint8_t* dst = direction == Direction::kGet ? local : remote;
    const uint8_t* src = direction == Direction::kGet ? remote : local;
    if (direction == Direction::kGet)
      piece_crcs[i] = CopyFetched(dst, src, p.len, checksum, around_caches);
    else if (checksum)  // a published block is read again only by a later fetch: not cached
      piece_crcs[i] = CopyWithCrc32cStreaming(dst, src, p.len);
    else
      std::memcpy(dst, src, p.len);
  });
  if (!checksum) return std::vector<uint32_t>{};
  return CombineCrcPieces(pieces, piece_crcs, blocks.size());
}

absl::Status DataMover::TransferRma(std::span<const BlockMove> blocks, Direction direction,
                                    absl::Time deadline) {
  std::lock_guard<std::mutex> lock(ucx_mu_);
  if (!ep_ || ep_->failed()) STRATA_RETURN_IF_ERROR(Redial());
  STRATA_RETURN_IF_ERROR(CheckExtents(blocks));
  std::vector<transport::RmaOp> ops;
  ops.reserve(blocks.size());
  for (const BlockMove& b : blocks)
    ops.push_back({direction == Direction::kGet ? transport::RmaOp::kGet : transport::RmaOp::kPut,
                   b.local, b.length, arena_base_ + b.arena_offset, FindMemh(b.local, b.length)});
  return ep_->Transfer(ops, deadline);
}

// Blocks move in chunks; a chunk's CRCs are checked (on the helper thread, and on this thread
// once it has no transfers left) while the next chunk moves.
absl::StatusOr<std::vector<uint8_t>> DataMover::GetByRma(std::span<const BlockMove> blocks,
                                                         bool verify, absl::Time deadline) {
  struct Pipeline {
    std::atomic<size_t> transferred{0};  // blocks [0, transferred) have landed
    std::atomic<size_t> next{0};         // next block to claim for verification
    std::atomic<bool> aborted{false};
    std::vector<uint8_t> ok;
  };
  auto pipe = std::make_shared<Pipeline>();
  pipe->ok.assign(blocks.size(), verify ? 0 : 1);
  auto verify_some = [pipe, blocks](bool wait_for_more) {
    while (true) {
      size_t i = pipe->next.load();
      if (i >= blocks.size() || pipe->aborted.load()) return;
      size_t landed = pipe->transferred.load();
      if (i >= landed) {
        if (!wait_for_more) return;
        // Sleep, not spin: over TCP the daemon's progress thread needs this core.
        pipe->transferred.wait(landed);
        continue;
      }
      if (!pipe->next.compare_exchange_weak(i, i + 1)) continue;
      pipe->ok[i] = Crc32c(blocks[i].local, blocks[i].length) == blocks[i].crc32c;
    }
  };
  uint64_t total_bytes = 0;
  for (const BlockMove& b : blocks) total_bytes += b.length;
  constexpr uint64_t kChunkBytes = 4 << 20;
  const bool pipelined = verify && blocks.size() > 1 && total_bytes >= 2 * kChunkBytes;
  std::atomic<bool> helper_done{!pipelined};
  if (pipelined) {
    helper_.Post([verify_some, &helper_done] {
      verify_some(/*wait_for_more=*/true);
      helper_done.store(true);
    });
  }
  absl::Status moved = absl::OkStatus();
  for (size_t begin = 0; begin < blocks.size() && moved.ok();) {
    size_t end = begin;
    uint64_t bytes = 0;
    while (end < blocks.size() && (end == begin || !pipelined || bytes < kChunkBytes))
      bytes += blocks[end++].length;
    moved = TransferRma(blocks.subspan(begin, end - begin), Direction::kGet, deadline);
    if (moved.ok()) {
      pipe->transferred.store(end);
      pipe->transferred.notify_all();
    }
    begin = end;
  }
  if (!moved.ok()) {
    pipe->aborted.store(true);
    pipe->transferred.store(SIZE_MAX);  // wakes the helper, which then sees `aborted`
    pipe->transferred.notify_all();
  }
  if (verify && moved.ok()) verify_some(/*wait_for_more=*/false);
  while (!helper_done.load()) std::this_thread::yield();  // the helper reads the buffers
  STRATA_RETURN_IF_ERROR(moved);
  return std::move(pipe->ok);
}

absl::StatusOr<std::vector<uint8_t>> DataMover::GetByPush(uint64_t lease_id,
                                                          std::span<const BlockMove> blocks,
                                                          bool verify, absl::Time deadline,
                                                          bool around_caches) {
  LandingChecks checks(helper_, verify, around_caches);
  checks.Expect(blocks);
  absl::Status moved = ReceivePushed(lease_id, blocks, deadline, checks);
  std::vector<uint8_t> good = checks.Finish();  // the checks read the caller's buffers
  STRATA_RETURN_IF_ERROR(moved);
  return good;
}

// Asks the daemon to push the leased `blocks` and receives them. On an error (a timeout
// included) the endpoint is aborted, so no late byte lands in a buffer the caller has taken back.
absl::Status DataMover::ReceivePushed(uint64_t lease_id, std::span<const BlockMove> blocks,
                                      absl::Time deadline,
                                      LandingChecks& checks) {
  std::lock_guard<std::mutex> lock(ucx_mu_);
  if (!ep_ || ep_->failed()) STRATA_RETURN_IF_ERROR(Redial());
  STRATA_RETURN_IF_ERROR(CheckExtents(blocks));
  PushWait w;
  w.request_id = next_request_id_++;
  w.blocks = blocks;
  w.expected = blocks.size();
  w.checks = &checks;
  w.arrived.assign(blocks.size(), 0);
  w.piece_bytes = push_piece_bytes_;
  w.pieces.emplace(w.piece_bytes, blocks.size());
  std::string header(am_wire::kFetchRequestHeaderBytes, '\0');
  am_wire::PutU64(header.data(), w.request_id);
  am_wire::PutU64(header.data() + 8, lease_id);
  am_wire::PutU32(header.data() + 16, static_cast<uint32_t>(blocks.size()));
  am_wire::PutU32(header.data() + 20, w.piece_bytes);
  std::string data(blocks.size() * 16, '\0');
  for (size_t i = 0; i < blocks.size(); ++i) {
    am_wire::PutU64(data.data() + 16 * i, blocks[i].arena_offset);
    am_wire::PutU64(data.data() + 16 * i + 8, blocks[i].length);
    w.memh.push_back(FindMemh(blocks[i].local, blocks[i].length));
  }
  push_wait_ = &w;
  return AwaitPushed(w, ep_->AmPost(am_wire::kFetchRequestAm, std::move(header), std::move(data)),
                     deadline, nullptr);
}

absl::Status DataMover::AwaitPushed(PushWait& w, absl::Status sent, const absl::Time& deadline,
                                    const ExchangeWait* reply) {
  std::vector<std::pair<size_t, void*>> receiving;
  auto waiting = [&] { return (reply != nullptr && !reply->done) || w.done < w.expected; };
  unsigned spins = 0;
  auto idle_since = transport::Worker::Clock::now();
  while (sent.ok() && w.error.ok() && waiting()) {
    worker_->ProgressWaiting(&idle_since, deadline, /*may_sleep=*/receiving.empty());
    StartKeptReceives(w, &receiving);
    ReapReceives(w, &receiving);
    if (w.error.ok() && ep_->failed()) w.error = DaemonWentAway("a fetch");
    // Still waiting: an answer just handled may have set the deadline to now (a lease of
    // misses only: nothing comes, and its lifetime is zero).
    if ((++spins & 63) == 0 && waiting() && absl::Now() >= deadline) {
      w.error = reply != nullptr && !reply->done
                    ? absl::DeadlineExceededError("no answer to the acquire-and-push in time")
                    : absl::DeadlineExceededError("pushed blocks did not all arrive in time");
      break;
    }
  }
  if (!sent.ok()) w.error = sent;
  if (!w.error.ok() && (!receiving.empty() || waiting())) {
    // A receive from a daemon that died may never finish where UCX does not detect (a watched
    // endpoint): after the abort no byte can land, so it is not waited for.
    const bool gone = ep_->failed();
    ep_->Abort();  // stops every transfer still aimed at the caller's buffers
    CancelReceives(receiving, gone ? absl::ZeroDuration() : absl::Milliseconds(500));
  }
  for (auto [index, desc] : w.kept) worker_->AmDiscard(desc);
  push_wait_ = nullptr;
  return w.error;
}

absl::StatusOr<DataMover::AcquiredGet> DataMover::AcquireAndGet(FollowUp request,
                                                                const PushPlan& plan, bool verify,
                                                                absl::Duration reply_timeout,
                                                                bool around_caches) {
  std::lock_guard<std::mutex> lock(ucx_mu_);
  if (!ep_ || ep_->failed()) return absl::FailedPreconditionError("no working data-plane endpoint");
  if (request.header.size() < 8)
    return absl::InvalidArgumentError("a request header starts with its id");
  LandingChecks checks(helper_, verify, around_caches);
  AcquiredGet out;
  std::vector<BlockMove> moves;
  absl::Time deadline = absl::Now() + reply_timeout;
  PushWait w;
  ExchangeWait reply;
  w.request_id = reply.request_id = next_request_id_++;
  w.planned = false;
  w.checks = &checks;
  w.piece_bytes = request.push_piece_bytes;
  reply.reply_am = request.reply_am;
  // Runs in the reply's handler, before any pushed block's handler (the daemon sends the answer
  // first, on the same endpoint).
  reply.on_reply = [&](const Reply& r) {
    std::optional<PushLanding> landing = plan(r);
    if (!landing) return;  // no lease: nothing comes
    moves = std::move(landing->moves);
    if (absl::Status in_arena = CheckExtents(moves); !in_arena.ok()) {
      w.error = in_arena;
      return;
    }
    deadline = DeadlineWithin(landing->expires_in);
    out.pushed = true;
    w.blocks = moves;
    w.arrived.assign(moves.size(), 0);
    for (const BlockMove& b : moves) {
      w.memh.push_back(b.local ? FindMemh(b.local, b.length) : nullptr);
      if (b.local != nullptr || b.length != 0) ++w.expected;
    }
    checks.Expect(moves);
    w.pieces.emplace(w.piece_bytes, moves.size());
    w.planned = true;
  };
  am_wire::PutU64(request.header.data(), reply.request_id);
  exchange_wait_ = &reply;
  push_wait_ = &w;
  absl::Status s =
      ep_->AmPost(request.request_am, std::move(request.header), std::move(request.data));
  s = AwaitPushed(w, std::move(s), deadline, &reply);
  exchange_wait_ = nullptr;
  out.intact = checks.Finish();  // the checks read the caller's buffers
  STRATA_RETURN_IF_ERROR(s);
  return out;
}

void DataMover::StartKeptReceives(PushWait& w, std::vector<std::pair<size_t, void*>>* receiving) {
  for (auto [index, desc] : w.kept) {
    const BlockMove& b = w.blocks[index];
    auto r = worker_->AmRecvData(desc, b.local, b.length, w.memh[index]);
    if (!r.ok()) {
      w.error = r.status();
    } else if (*r == nullptr) {
      ++w.done;
      w.checks->Landed(index);
    } else {
      receiving->emplace_back(index, *r);
    }
  }
  w.kept.clear();
}

void DataMover::ReapReceives(PushWait& w, std::vector<std::pair<size_t, void*>>* receiving) {
  for (size_t k = 0; k < receiving->size();) {
    auto [index, request] = (*receiving)[k];
    int state = transport::Worker::RequestState(request);
    if (state == 0) {
      ++k;
      continue;
    }
    transport::Worker::RequestFree(request);
    if (state < 0) {
      w.error = absl::UnavailableError("receiving a pushed block failed");
    } else {
      ++w.done;
      w.checks->Landed(index);
    }
    (*receiving)[k] = receiving->back();
    receiving->pop_back();
  }
}

void DataMover::CancelReceives(const std::vector<std::pair<size_t, void*>>& receiving,
                               absl::Duration wait) {
  for (auto [index, r] : receiving) worker_->RequestCancel(r);
  const absl::Time stop = absl::Now() + wait;
  for (auto [index, r] : receiving) {
    while (transport::Worker::RequestState(r) == 0 && absl::Now() < stop) worker_->Progress();
    // Not finished even now: UCX owns it until it completes; it no longer targets a live
    // connection, so nothing more lands in the buffer.
    transport::Worker::RequestFree(r);
  }
}

bool DataMover::OnPushedBlock(const transport::AmMessage& m) {
  if (!push_wait_) return false;  // a late block of a fetch that gave up: dropped
  PushWait& w = *push_wait_;
  if (!w.planned) {
    const auto h = am_wire::DecodeFetchBlockHeader(m.header);
    if (h && h->request_id == w.request_id)
      w.error = absl::InternalError("stratad pushed a block before answering the acquire");
    return false;
  }
  const PushedBlock got = ReadPushedBlock(
      m.header, m.data, m.length, m.rendezvous, w.request_id, w.blocks.size(),
      [&w](size_t i) { return w.blocks[i].length; }, w.arrived);
  if (got.kind == PushedBlock::kNotOurs) return false;
  if (got.kind != PushedBlock::kAccepted) {
    w.error = got.error;
    return false;
  }
  const uint32_t index = got.index;
  w.arrived[index] = 1;
  if (w.blocks[index].local == nullptr) {  // leased, but not wanted here: dropped
    ++w.done;
    return false;
  }
  if (m.rendezvous) {
    w.kept.emplace_back(index, m.desc);
    return true;
  }
  // The bytes are in cache now: checked in the same pass as the copy, not again from memory
  // (or on the helper thread, whose wake-up costs more than a small block's check).
  const uint32_t crc = CopyFetched(w.blocks[index].local, m.data.data(), m.data.size(),
                                   w.checks->verify(), w.checks->around_caches());
  if (w.checks->verify()) w.checks->Copied(index, crc);
  ++w.done;
  return false;
}

void DataMover::OnPushedPiece(const transport::AmMessage& m) {
  if (!push_wait_) return;  // a late piece of a fetch that gave up: dropped
  PushWait& w = *push_wait_;
  if (!w.planned || !w.pieces) {
    const auto h = am_wire::DecodeFetchPieceHeader(m.header);
    if (h && h->block.request_id == w.request_id)
      w.error = absl::InternalError("stratad pushed a piece before answering the acquire");
    return;
  }
  const PushedPieces::Piece got = w.pieces->Read(
      m.header, m.data.size(), w.request_id, [&w](size_t i) { return w.blocks[i].length; },
      w.arrived);
  if (got.kind == PushedPieces::kNotOurs) return;
  if (got.kind != PushedPieces::kTake) {
    w.error = got.error;
    return;
  }
  const BlockMove& b = w.blocks[got.index];
  uint32_t crc = 0;
  // Out of the receive segment it arrived in, still in cache: copied and checked in one pass.
  if (b.local != nullptr)
    crc = CopyFetched(static_cast<uint8_t*>(b.local) + got.offset, m.data.data(), m.data.size(),
                      w.checks->verify(), w.checks->around_caches());
  std::optional<uint32_t> block_crc;
  if (!w.pieces->Took(got.index, got.offset, m.data.size(), crc, &block_crc)) return;
  w.arrived[got.index] = 1;
  ++w.done;
  if (b.local == nullptr || !w.checks->verify()) return;  // leased, not wanted: dropped
  if (block_crc)
    w.checks->Copied(got.index, *block_crc);
  else
    w.checks->Landed(got.index);  // pieces out of order: checked from memory
}

bool DataMover::OnAnsweredBlock(const transport::AmMessage& m) {
  if (!push_wait_) return false;  // late: dropped
  const auto h = am_wire::DecodeAnsweredBlockHeader(m.header);
  if (!h) {
    if (m.header.size() >= 8 && am_wire::GetU64(m.header.data()) == push_wait_->request_id)
      push_wait_->error = absl::InternalError("stratad sent a malformed answered block");
    return false;
  }
  transport::AmMessage answer;
  answer.header = h->reply;
  answer.data = h->answer;
  OnExchangeReply(am_wire::kAcquireReplyAm, answer);
  // No lease came of that answer (the plan found none usable): the block is not waited for.
  if (!push_wait_->planned) return false;
  transport::AmMessage block = m;
  block.header = h->block;
  return OnPushedBlock(block);
}

void DataMover::OnAnsweredPiece(const transport::AmMessage& m) {
  if (!push_wait_) return;  // late: dropped
  const auto h = am_wire::DecodeAnsweredPieceHeader(m.header);
  if (!h) {
    if (m.header.size() >= 8 && am_wire::GetU64(m.header.data()) == push_wait_->request_id)
      push_wait_->error = absl::InternalError("stratad sent a malformed answered piece");
    return;
  }
  transport::AmMessage answer;
  answer.header = h->reply;
  answer.data = h->answer;
  OnExchangeReply(am_wire::kAcquireReplyAm, answer);
  // No lease came of that answer (the plan found none usable): the piece is not waited for.
  if (!push_wait_->planned) return;
  transport::AmMessage piece = m;
  piece.header = h->block;
  OnPushedPiece(piece);
}

void DataMover::StartPrefault() {
  prefault_stop_ = false;
  prefault_ = std::thread([this] {
    constexpr uint64_t kStep = 64 << 20;
    for (uint64_t off = 0; !prefault_stop_.load(); off += kStep) {
      std::shared_lock<std::shared_mutex> lock(map_mu_);
      // The window is read-only: its pages are faulted in for reading.
      const uint8_t* const base = mapped_arena_ ? mapped_arena_ : zone_window_ ? zone_window_->data() : nullptr;
      const uint64_t bytes = mapped_arena_ ? arena_bytes_ : zone_window_ ? zone_window_->bytes() : 0;
      const bool writable = mapped_arena_ || (zone_window_ && zone_window_->writable());
      const int advice = writable ? MADV_POPULATE_WRITE : MADV_POPULATE_READ;
      if (base == nullptr || off >= bytes) return;
      uint64_t len = std::min(kStep, bytes - off);
      uintptr_t start = reinterpret_cast<uintptr_t>(base + off) & ~uintptr_t{4095};
      uintptr_t end = reinterpret_cast<uintptr_t>(base + off + len);
      // Only a hint: kernels before 5.14 refuse it and the copies fault pages in as before.
      if (madvise(reinterpret_cast<void*>(start), end - start, advice) != 0) return;
    }
  });
}

void DataMover::StopPrefault() {
  prefault_stop_ = true;
  if (prefault_.joinable()) prefault_.join();
}

}  // namespace strata::client
