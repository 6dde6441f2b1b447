#include "client/control_channel.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/block_calls.h"
#include "client/channel.h"
#include "client/internal/logging.h"
#include "client/internal/wire_status.h"
#include "common/am_wire.h"
#include "common/crc32c.h"
#include "common/packed_ids.h"
#include "common/status_macros.h"
#include "proto/convert.h"
#include "proto/grpc_status.h"

namespace strata::client {
namespace {}  // namespace

// The stream and the completion queue its operations report to.
struct ControlChannel::LookupStream {
  grpc::ClientContext ctx;
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::LookupRequest, v1::LookupResponse>> rw;
  bool usable = false;

  // Waits for `tag` until `deadline`; false on timeout or failure.
  bool Await(void* tag, absl::Time deadline) {
    void* got = nullptr;
    bool ok = false;
    return cq.AsyncNext(&got, &ok, absl::ToChronoTime(deadline)) ==
               grpc::CompletionQueue::GOT_EVENT &&
           got == tag && ok;
  }

  // Tears a stream down: cancel, then drain its queue so no operation refers to it any more.
  static void Close(std::unique_ptr<LookupStream> st) {
    if (!st) return;
    st->ctx.TryCancel();
    st->cq.Shutdown();
    void* tag;
    bool ok;
    while (st->cq.Next(&tag, &ok)) {
    }
  }
};

const std::string ControlChannel::kNoNodeId;

ControlChannel::ControlChannel(ControlOptions options)
    : options_(std::move(options)), fast_path_enabled_(options_.lookup_fast_path) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  channel_ = MakeChannel(options_.endpoint, options_.security, std::move(args));
  // The staging window's size (a read-only zone's), the same for every reconnection:
  // STRATA_CLIENT_STAGING_BYTES, 0 for none.
  if (const char* b = std::getenv("STRATA_CLIENT_STAGING_BYTES"); b != nullptr && *b != '\0')
    staging_bytes_ = std::strtoull(b, nullptr, 10);
  stub_ = v1::Cache::NewStub(channel_);
}

ControlChannel::~ControlChannel() {
  {
    std::lock_guard<std::mutex> lock(stream_mu_);
    LookupStream::Close(std::move(stream_));
  }
  std::unique_lock<std::mutex> lock(release_mu_);
  release_cv_.wait(lock, [this] { return releases_in_flight_ == 0; });
}

absl::Status ControlChannel::NotAnswered(const char* name, absl::StatusCode code,
                                         absl::string_view why) const {
  return absl::Status(
      code, absl::StrCat("stratad at ", options_.endpoint, " did not answer ", name, " within ",
                         absl::FormatDuration(options_.rpc_timeout), why.empty() ? "" : ": ", why,
                         TlsHint(options_.security, why)));
}

absl::Status ControlChannel::Rpc(const char* name, const Call& call) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  absl::Status s = FromGrpcStatus(call(&ctx));
  if (s.ok()) return s;
  // Unreachable: the daemon behind the data-plane endpoint may be gone, and one that comes back
  // is another instance.
  if (s.code() == absl::StatusCode::kUnavailable) data_plane_suspect_ = true;
  if (s.code() == absl::StatusCode::kDeadlineExceeded || s.code() == absl::StatusCode::kUnavailable)
    return NotAnswered(name, s.code(), s.message());
  return absl::Status(s.code(), absl::StrCat(name, ": ", s.message()));
}

absl::Status ControlChannel::NsRpc(const char* name, const NamespaceId& ns, const Call& call) {
  absl::Status s = Rpc(name, call);
  if (s.code() != absl::StatusCode::kFailedPrecondition) return s;
  std::optional<OpenedNamespace> open = Opened(ns);
  if (!open) return s;
  auto reopened = OpenNamespace(open->spec, open->tenant, open->options);
  if (!reopened.ok() || *reopened != ns) return s;
  return Rpc(name, call);
}

void ControlChannel::SetNodeId(const std::string& id) {
  std::lock_guard<std::mutex> lock(node_id_mu_);
  if (*node_id_.load(std::memory_order_relaxed) == id) return;
  node_ids_.push_back(id);
  node_id_.store(&node_ids_.back(), std::memory_order_release);
}

absl::StatusOr<ArenaEndpoint> ControlChannel::ConnectDataPlane() {
  v1::ConnectRequest req;
  req.set_client_name(options_.client_name);
  v1::ConnectResponse resp;
  STRATA_RETURN_IF_ERROR(
      Rpc("Connect", [&](grpc::ClientContext* c) { return stub_->Connect(c, req, &resp); }));
  SetNodeId(resp.node_id());
  clustered_ = resp.cluster_nodes() > 1;
  if (resp.active_messages_off()) fast_path_enabled_ = false;
  acquire_by_message_ = options_.control_by_message && resp.acquire_by_message();
  control_by_message_ = options_.control_by_message && resp.control_by_message();
  acquire_and_push_ = acquire_by_message_.load() && resp.acquire_and_push();
  push_releases_ = resp.push_releases();
  answer_in_block_ = acquire_and_push_.load() && resp.answer_in_first_block();
  push_in_pieces_ = acquire_and_push_.load() && resp.push_in_pieces();
  publish_in_one_ = control_by_message_.load() && resp.publish_in_one();
  fetch_in_one_ = acquire_by_message_.load() && resp.fetch_in_one();
  device_fetch_ = control_by_message_.load() && resp.device_fetch_by_message();
  spare_reservations_ = resp.spare_reservations();
  {
    std::lock_guard<std::mutex> lock(ticket_mu_);
    am_ticket_ = resp.am_ticket();
  }
  ArenaEndpoint arena;
  arena.worker_address = resp.worker_address();
  arena.first_worker_address = resp.first_worker_address();
  arena.rkey = resp.arena_rkey();
  arena.base = resp.arena_base();
  arena.bytes = resp.arena_bytes();
  arena_bytes_ = resp.arena_bytes();
  arena.rma = !resp.rma_off();
  // Before rma_off existed, active_messages_off meant no push fetches either.
  arena.push_fetch = resp.rma_off() || !resp.active_messages_off();
  arena.publish_by_message = resp.publish_by_message();
  arena.push_in_pieces = resp.push_in_pieces();
  arena.publish_in_pieces = resp.publish_in_pieces();
  arena.instance_id = resp.instance_id();
  if (!resp.zone_socket().empty() && !resp.am_ticket().empty()) {
    // A daemon elsewhere has no socket here: fetches then go by push, as before.
    auto window = OpenZoneWindow(resp.zone_socket(), resp.am_ticket(), resp.arena_bytes(),
                                 absl::Seconds(1), staging_bytes_);
    if (window.ok()) {
      if (!(*window)->writable() && !(*window)->staging_status().ok())
        Log(options_.log, LogLevel::kInfo,
            absl::StrCat("publishes go by message: ", (*window)->staging_status().ToString()));
      arena.zone_window = std::move(*window);
    } else {
      Log(options_.log, LogLevel::kInfo,
          absl::StrCat("fetches go by push: ", window.status().ToString()));
    }
  }
  return arena;
}

absl::StatusOr<NamespaceId> ControlChannel::OpenNamespace(const NamespaceSpec& spec,
                                                          const std::string& tenant,
                                                          const NamespaceOptions& options) {
  v1::OpenNamespaceRequest req;
  *req.mutable_spec() = ToProto(spec);
  req.set_tenant(tenant);
  req.set_replicas(options.replicas);
  req.set_cold_codec(options.cold_codec);
  v1::OpenNamespaceResponse resp;
  STRATA_RETURN_IF_ERROR(Rpc("OpenNamespace", [&](grpc::ClientContext* c) {
    return stub_->OpenNamespace(c, req, &resp);
  }));
  STRATA_ASSIGN_OR_RETURN(NamespaceId id, Digest::FromBytes(resp.namespace_id()));
  std::lock_guard<std::mutex> lock(ns_mu_);
  namespaces_[id] = {spec, tenant, options};
  return id;
}

std::optional<OpenedNamespace> ControlChannel::Opened(const NamespaceId& ns) const {
  std::lock_guard<std::mutex> lock(ns_mu_);
  auto it = namespaces_.find(ns);
  if (it == namespaces_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<v1::LookupResponse> ControlChannel::Lookup(const NamespaceId& ns,
                                                          std::span<const BlockId> ids) {
  if (auto fast = LookupByActiveMessage(ns, ids)) return std::move(*fast);
  v1::LookupRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_ids(PackIds(ids));
  if (auto streamed = LookupOnStream(req)) {
    // A namespace the daemon forgot (it restarted) is reopened by the unary path below.
    if (streamed->ok()) return std::move(**streamed);
    if (streamed->status().code() != absl::StatusCode::kFailedPrecondition)
      return streamed->status();
  }
  v1::LookupResponse resp;
  STRATA_RETURN_IF_ERROR(
      NsRpc("Lookup", ns, [&](grpc::ClientContext* c) { return stub_->Lookup(c, req, &resp); }));
  return resp;
}

// nullopt: no definitive answer this way (off, too many ids, no endpoint, timeout, an error, or
// the prompt continues on other nodes); the caller asks through gRPC.
std::optional<v1::LookupResponse> ControlChannel::LookupByActiveMessage(
    const NamespaceId& ns, std::span<const BlockId> ids) {
  auto reply = ExchangeByActiveMessage(am_wire::kLookupRequestAm, am_wire::kLookupReplyAm, ns, ids);
  if (!reply) return std::nullopt;
  const auto h = am_wire::DecodeDefinitiveLookupReply(reply->header, reply->data, ids.size());
  if (!h) return std::nullopt;
  v1::LookupResponse resp;
  resp.set_prefix_blocks(h->prefix);
  for (char t : reply->data) resp.add_tiers(static_cast<v1::Tier>(static_cast<uint8_t>(t)));
  resp.set_node_id(node_id());
  return resp;
}

// A daemon killed and started again leaves this client an endpoint to shared memory nobody
// reads (same-node transports cannot tell a dead peer): messages sent there are lost and every
// call by message would wait out its deadline. So where a gRPC call found the daemon
// unreachable, or the gRPC connection is down or was dropped since, the data plane connects
// again (Connect; the zone window and its loans anew) before a call by message.
bool ControlChannel::DataPlaneCurrent() {
  if (fast_path_ == nullptr) return false;
  if (channel_->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY) data_plane_suspect_ = true;
  if (!data_plane_suspect_.load(std::memory_order_relaxed)) return true;
  std::lock_guard<std::mutex> lock(reconnect_mu_);  // one reconnects; the others wait for it
  if (!data_plane_suspect_.exchange(false)) return true;
  absl::Status s = fast_path_->Reconnect();
  if (!s.ok()) {
    data_plane_suspect_ = true;
    return false;  // gRPC answers (or says the daemon is unreachable) instead
  }
  return true;
}

bool ControlChannel::SameDaemon() {
  v1::ConnectRequest req;
  req.set_client_name(options_.client_name);
  req.set_instance_only(true);  // issues no ticket: probes must not push others' out
  v1::ConnectResponse resp;
  grpc::ClientContext ctx;
  // Short: a stalled daemon must not cost its callers a second full deadline.
  ctx.set_deadline(
      absl::ToChronoTime(absl::Now() + std::min(options_.rpc_timeout, kSameDaemonTimeout)));
  const grpc::Status s = stub_->Connect(&ctx, req, &resp);
  // Unreachable: gone. No answer in time: cannot tell, so not replaced.
  if (!s.ok()) {
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE) return true;
    data_plane_suspect_ = true;
    return false;
  }
  return resp.instance_id() == fast_path_->instance_id();
}

// A request about `ids` of `ns` on the data-plane endpoint; nullopt (ask through gRPC) when the
// fast path is off, cannot carry that many ids, or gives no complete, successful answer.
std::optional<DataMover::Reply> ControlChannel::ExchangeByActiveMessage(
    uint16_t request_am, uint16_t reply_am, const NamespaceId& ns, std::span<const BlockId> ids) {
  if (ids.empty() || ids.size() > am_wire::kMaxIds) return std::nullopt;
  return ExchangeByActiveMessage(request_am, reply_am, ns, PackIds(ids));
}

std::optional<DataMover::Reply> ControlChannel::ExchangeByActiveMessage(uint16_t request_am,
                                                                       uint16_t reply_am,
                                                                       const NamespaceId& ns,
                                                                       std::string data) {
  if (fast_path_ == nullptr || !fast_path_enabled_.load() || data.empty() ||
      !DataPlaneCurrent())
    return std::nullopt;
  std::string header = AmRequestHeader(&ns);
  // Short: a daemon that does not answer this way is asked through gRPC instead.
  auto reply = fast_path_->Exchange(request_am, std::move(header), std::move(data), reply_am,
                                    std::min(options_.rpc_timeout, absl::Milliseconds(250)));
  if (!reply.ok()) {
    if (reply.status().code() == absl::StatusCode::kFailedPrecondition) return std::nullopt;
    if (!SameDaemon()) data_plane_suspect_ = true;  // replaced: the next call reconnects first
    const int timeouts = ++fast_path_timeouts_;
    // E.g. a daemon without the fast path: stop paying the wait.
    if (timeouts >= 3 && fast_path_enabled_.exchange(false))
      Log(options_.log, LogLevel::kWarning,
          absl::StrCat("active-message fast path disabled after ", timeouts, " timeouts (",
                       reply.status().message(), ")"));
    return std::nullopt;
  }
  fast_path_timeouts_ = 0;
  am_wire::ReplyHeader h;
  if (!am_wire::DecodeReplyHeader(reply->header, &h) || h.code != 0 || !h.complete)
    return std::nullopt;
  return std::move(*reply);
}

// nullopt: the stream could not be used (the caller falls back to the unary call).
std::optional<absl::StatusOr<v1::LookupResponse>> ControlChannel::LookupOnStream(
    const v1::LookupRequest& req) {
  std::unique_lock<std::mutex> lock(stream_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return std::nullopt;
  void* const kStarted = reinterpret_cast<void*>(1);
  void* const kWritten = reinterpret_cast<void*>(2);
  void* const kRead = reinterpret_cast<void*>(3);
  const absl::Time deadline = absl::Now() + options_.rpc_timeout;
  if (!stream_ || !stream_->usable) {
    LookupStream::Close(std::move(stream_));
    auto st = std::make_unique<LookupStream>();
    st->rw = stub_->AsyncLookupStream(&st->ctx, &st->cq, kStarted);
    if (!st->Await(kStarted, deadline)) {
      LookupStream::Close(std::move(st));
      return std::nullopt;
    }
    st->usable = true;
    stream_ = std::move(st);
  }
  LookupStream& st = *stream_;
  v1::LookupResponse resp;
  st.rw->Write(req, kWritten);
  bool written = st.Await(kWritten, deadline);
  if (written) st.rw->Read(&resp, kRead);
  if (!written || !st.Await(kRead, deadline)) {
    st.usable = false;
    LookupStream::Close(std::move(stream_));
    if (absl::Now() >= deadline)
      return absl::StatusOr<v1::LookupResponse>(
          NotAnswered("Lookup", absl::StatusCode::kDeadlineExceeded, ""));
    return std::nullopt;  // the stream broke (daemon restarted?): the unary call decides
  }
  if (!IsOkOnWire(resp.error_code()))
    return absl::StatusOr<v1::LookupResponse>(absl::Status(
        StatusCodeFromWire(resp.error_code()), absl::StrCat("Lookup: ", resp.error_message())));
  return absl::StatusOr<v1::LookupResponse>(std::move(resp));
}

namespace {

v1::ReserveRequest ReserveRequestOf(const NamespaceId& ns, std::span<const BlockId> ids,
                                    std::span<const BlockId> parents,
                                    std::span<const uint64_t> sizes) {
  v1::ReserveRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_ids(PackIds(ids));
  if (!parents.empty()) req.set_parent_ids(PackIds(parents));
  for (uint64_t size : sizes) req.add_sizes(size);
  return req;
}

// A Reserve's answer, whose kOk entries must each have an offset.
absl::StatusOr<Reservation> ReservationOf(const v1::ReserveResponse& resp) {
  Reservation r;
  r.id = resp.reservation_id();
  r.expires_in = absl::Milliseconds(resp.expires_in_ms());
  r.status = BlockStatuses(resp.status());
  r.offsets.assign(resp.offsets().begin(), resp.offsets().end());
  r.instance_id = resp.instance_id();
  for (size_t i = 0; i < r.status.size(); ++i)
    if (r.status[i] == BlockStatus::kOk && i >= r.offsets.size())
      return absl::InternalError("Reserve answered without an offset for a reserved block");
  return r;
}

}  // namespace

absl::StatusOr<Reservation> ControlChannel::Reserve(const NamespaceId& ns,
                                                    std::span<const BlockId> ids,
                                                    std::span<const BlockId> parents,
                                                    std::span<const uint64_t> sizes) {
  const v1::ReserveRequest req = ReserveRequestOf(ns, ids, parents, sizes);
  v1::ReserveResponse resp;
  std::optional<std::string> fast;
  if (ids.size() <= am_wire::kMaxControlIds) {
    STRATA_ASSIGN_OR_RETURN(fast, ControlByActiveMessage("Reserve", am_wire::kReserveRequestAm,
                                                         am_wire::kReserveReplyAm, &ns,
                                                         req.SerializeAsString()));
  }
  if (!fast || !resp.ParseFromString(*fast)) {
    resp.Clear();
    STRATA_RETURN_IF_ERROR(NsRpc(
        "Reserve", ns, [&](grpc::ClientContext* c) { return stub_->Reserve(c, req, &resp); }));
  }
  STRATA_RETURN_IF_ERROR(CheckStatusCount("Reserve", resp.status_size(), ids.size()));
  return ReservationOf(resp);
}

absl::StatusOr<std::optional<std::vector<BlockStatus>>> ControlChannel::PublishInOne(
    const NamespaceId& ns, std::span<const BlockId> ids, std::span<const BlockId> parents,
    std::span<const ConstBuffer> blobs) {
  using Undone = std::optional<std::vector<BlockStatus>>;
  // A daemon with other nodes would send it back undone (they must learn of the blocks before
  // the publish returns): the bytes would travel twice.
  if (!publish_in_one_.load() || clustered_.load() || !ControlsByMessage() || ids.empty() ||
      ids.size() > am_wire::kMaxControlIds)
    return Undone();
  uint64_t total = 0;
  std::vector<uint64_t> sizes;
  std::vector<uint32_t> crcs;
  for (const ConstBuffer& b : blobs) {
    total += b.size;
    if (total > am_wire::kMaxPublishInOneBytes) return Undone();
    sizes.push_back(b.size);
    crcs.push_back(Crc32c(b.data, b.size));
  }
  std::string data = am_wire::EncodePublishInOnePrefix(
      ReserveRequestOf(ns, ids, parents, sizes).SerializeAsString(), crcs);
  data.reserve(data.size() + total);
  for (const ConstBuffer& b : blobs) data.append(static_cast<const char*>(b.data), b.size);
  STRATA_ASSIGN_OR_RETURN(std::optional<std::string> fast,
                          ControlByActiveMessage("Publish", am_wire::kPublishInOneAm,
                                                 am_wire::kPublishInOneReplyAm, &ns,
                                                 std::move(data)));
  v1::PublishInOneResponse resp;
  // Publishing is idempotent: an answer that does not parse costs the usual way's dedup only.
  if (!fast || !resp.ParseFromString(*fast)) return Undone();
  STRATA_RETURN_IF_ERROR(CheckStatusCount("Publish", resp.status_size(), ids.size()));
  return Undone(BlockStatuses(resp.status()));
}

namespace {

v1::CommitRequest CommitRequestOf(uint64_t reservation_id, std::span<const uint32_t> crc32c,
                                  bool taken_while_writing, const CommitSpares* spares = nullptr) {
  v1::CommitRequest req;
  req.set_reservation_id(reservation_id);
  req.set_crcs_taken_while_writing(taken_while_writing);
  for (uint32_t crc : crc32c) req.add_crc32c(crc);
  if (spares != nullptr && spares->ns != nullptr) {
    if (spares->named != nullptr)
      *req.mutable_rename() = ReserveRequestOf(*spares->ns, std::span(spares->named, 1),
                                               std::span(&spares->named_parent, 1),
                                               std::span(&spares->named_size, 1));
    if (spares->want_bytes > 0) {
      req.mutable_spare()->set_namespace_id(std::string(spares->ns->AsBytes()));
      req.mutable_spare()->set_bytes(spares->want_bytes);
    }
  }
  return req;
}

}  // namespace

std::optional<FollowUp> ControlChannel::CommitFollowUp(uint64_t reservation_id,
                                                       std::span<const uint32_t> crc32c,
                                                       bool taken_while_writing) const {
  if (!ControlsByMessage() || crc32c.size() > am_wire::kMaxControlIds) return std::nullopt;
  return FollowUp{am_wire::kCommitRequestAm, am_wire::kCommitReplyAm, AmRequestHeader(nullptr),
                  CommitRequestOf(reservation_id, crc32c, taken_while_writing).SerializeAsString()};
}

absl::StatusOr<std::vector<BlockStatus>> ControlChannel::Commit(
    uint64_t reservation_id, std::span<const uint32_t> crc32c, bool taken_while_writing,
    const std::optional<absl::StatusOr<AmReply>>* answered, CommitSpares* spares) {
  if (spares != nullptr && !spare_reservations_.load()) spares = nullptr;
  const v1::CommitRequest req =
      CommitRequestOf(reservation_id, crc32c, taken_while_writing, spares);
  v1::CommitResponse resp;
  std::optional<std::string> fast;
  if (answered != nullptr && answered->has_value()) {
    STRATA_ASSIGN_OR_RETURN(fast, ControlReply("Commit", **answered));
  } else if (crc32c.size() <= am_wire::kMaxControlIds) {
    STRATA_ASSIGN_OR_RETURN(fast, ControlByActiveMessage("Commit", am_wire::kCommitRequestAm,
                                                         am_wire::kCommitReplyAm, nullptr,
                                                         req.SerializeAsString()));
  }
  if (!fast || !resp.ParseFromString(*fast)) {
    resp.Clear();
    STRATA_RETURN_IF_ERROR(
        Rpc("Commit", [&](grpc::ClientContext* c) { return stub_->Commit(c, req, &resp); }));
  }
  STRATA_RETURN_IF_ERROR(CheckStatusCount("Commit", resp.status_size(), crc32c.size()));
  if (spares != nullptr && resp.has_spare() && resp.spare().reservation_id() != 0) {
    auto spare = ReservationOf(resp.spare());
    if (spare.ok() && spare->status.size() == 1 && spare->status[0] == BlockStatus::kOk)
      spares->granted = *std::move(spare);
  }
  return BlockStatuses(resp.status());
}

void ControlChannel::Abort(uint64_t reservation_id, bool may_wait) {
  if (acquire_and_push_ && ControlsByMessage()) {  // such a daemon takes it one way
    std::string header(am_wire::kReleaseHeaderBytes, '\0');
    am_wire::PutU64(header.data(), reservation_id);
    header += ticket();
    if (fast_path_->Post(am_wire::kAbortAm, std::move(header), {}).ok()) return;
  }
  if (!may_wait) return;
  v1::AbortRequest req;
  req.set_reservation_id(reservation_id);
  v1::AbortResponse ignored;
  (void)Rpc("Abort", [&](grpc::ClientContext* c) { return stub_->Abort(c, req, &ignored); });
}

std::string ControlChannel::AmRequestHeader(const NamespaceId* ns) const {
  std::string header(am_wire::kRequestHeaderBytes, '\0');  // the mover writes the request id
  if (ns != nullptr) std::memcpy(header.data() + 8, ns->bytes.data(), 32);
  return header + ticket();
}

absl::StatusOr<std::optional<std::string>> ControlChannel::ControlByActiveMessage(
    const char* name, uint16_t request_am, uint16_t reply_am, const NamespaceId* ns,
    std::string data) {
  if (!ControlsByMessage() || !DataPlaneCurrent()) return std::optional<std::string>();
  auto reply = fast_path_->Exchange(request_am, AmRequestHeader(ns), std::move(data), reply_am,
                                    options_.rpc_timeout, [this] { return SameDaemon(); });
  if (reply.status().code() == absl::StatusCode::kUnavailable) {
    // The daemon sent the request is gone, and whatever it did went with it: this call goes
    // through gRPC to the one serving now (or says there is none), later ones by message to it.
    if (!fast_path_->Reconnect().ok()) data_plane_suspect_ = true;
    return std::optional<std::string>();
  }
  return ControlReply(name, reply);
}

bool ControlChannel::ControlsByMessage() const {
  return fast_path_ != nullptr && control_by_message_.load() && fast_path_enabled_.load();
}

absl::StatusOr<std::optional<std::string>> ControlChannel::ControlReply(
    const char* name, const absl::StatusOr<AmReply>& reply) const {
  if (!reply.ok()) {
    if (reply.status().code() == absl::StatusCode::kFailedPrecondition)
      return std::optional<std::string>();  // no endpoint now: gRPC
    // The daemon may have acted on it: asking again through gRPC could reserve twice or commit
    // a reservation that is gone. The caller sees the call fail, as a gRPC timeout would.
    return NotAnswered(name, absl::StatusCode::kDeadlineExceeded, reply.status().message());
  }
  am_wire::ReplyHeader h;
  // An error (the namespace is not open here, an unknown reservation, ...) changed nothing:
  // the gRPC call gives the reference answer, and reopens a namespace the daemon forgot.
  if (!am_wire::DecodeReplyHeader(reply->header, &h) || h.code != 0 || !h.complete)
    return std::optional<std::string>();
  return std::optional<std::string>(reply->data);
}

absl::StatusOr<Lease> ControlChannel::Acquire(const NamespaceId& ns, std::span<const BlockId> ids) {
  v1::AcquireResponse resp;
  std::optional<DataMover::Reply> fast;
  if (acquire_by_message_)
    fast = ExchangeByActiveMessage(am_wire::kAcquireRequestAm, am_wire::kAcquireReplyAm, ns, ids);
  if (!fast || !resp.ParseFromString(fast->data)) {
    resp.Clear();
    v1::AcquireRequest req;
    req.set_namespace_id(std::string(ns.AsBytes()));
    req.set_ids(PackIds(ids));
    STRATA_RETURN_IF_ERROR(NsRpc(
        "Acquire", ns, [&](grpc::ClientContext* c) { return stub_->Acquire(c, req, &resp); }));
  }
  absl::StatusOr<Lease> lease = LeaseFrom(resp, ids.size());
  if (!lease.ok() && resp.lease_id() != 0) ReleaseAsync(resp.lease_id());
  return lease;
}

absl::StatusOr<Lease> ControlChannel::LeaseFrom(const v1::AcquireResponse& resp,
                                                size_t ids) const {
  const int n = static_cast<int>(ids);
  if (resp.status_size() != n || resp.offsets_size() != n || resp.sizes_size() != n ||
      resp.crc32c_size() != n)
    return absl::InternalError("Acquire answered with the wrong number of entries");
  if (const uint64_t arena = arena_bytes_.load(); arena != 0) {
    for (int i = 0; i < n; ++i)
      if (resp.status(i) == v1::BLOCK_OK &&
          (resp.sizes(i) > arena || resp.offsets(i) > arena - resp.sizes(i)))
        return absl::InternalError("Acquire answered with an extent outside the daemon's arena");
  }
  Lease lease;
  lease.id = resp.lease_id();
  lease.expires_in = absl::Milliseconds(resp.expires_in_ms());
  lease.status = BlockStatuses(resp.status());
  lease.offsets.assign(resp.offsets().begin(), resp.offsets().end());
  lease.sizes.assign(resp.sizes().begin(), resp.sizes().end());
  lease.crc32c.assign(resp.crc32c().begin(), resp.crc32c().end());
  lease.instance_id = resp.instance_id();
  return lease;
}

std::optional<FollowUp> ControlChannel::AcquirePushRequest(const NamespaceId& ns,
                                                           std::span<const BlockId> ids,
                                                           uint32_t piece_bytes) const {
  if (fast_path_ == nullptr || !fast_path_enabled_.load() || !acquire_and_push_.load() ||
      ids.empty() || ids.size() > am_wire::kMaxIds)
    return std::nullopt;
  if (piece_bytes != 0 && push_in_pieces_.load() && am_wire::ValidPushPieceBytes(piece_bytes)) {
    return FollowUp{am_wire::kAcquirePushPiecesRequestAm, am_wire::kAcquireReplyAm,
                    AmRequestHeader(&ns),
                    am_wire::EncodePiecesRequestPrefix(piece_bytes) + PackIds(ids), piece_bytes};
  }
  return FollowUp{answer_in_block_.load() ? am_wire::kAcquirePushAnsweredRequestAm
                                          : am_wire::kAcquirePushRequestAm,
                  am_wire::kAcquireReplyAm, AmRequestHeader(&ns), PackIds(ids)};
}

std::optional<std::string> ControlChannel::DeviceFetch(const NamespaceId& ns,
                                                       std::string request) {
  if (!device_fetch_.load()) return std::nullopt;
  auto reply = ExchangeByActiveMessage(am_wire::kDeviceFetchAm, am_wire::kDeviceFetchReplyAm, ns,
                                       std::move(request));
  if (!reply) return std::nullopt;
  return std::move(reply->data);
}

std::optional<ControlChannel::FetchedInOne> ControlChannel::FetchInOne(
    const NamespaceId& ns, std::span<const BlockId> ids) {
  if (fast_path_ == nullptr || !fast_path_enabled_.load() || !fetch_in_one_.load() ||
      ids.empty() || ids.size() > am_wire::kMaxIds || !DataPlaneCurrent())
    return std::nullopt;
  // As short as an acquire by message's wait: a daemon slow to answer is asked again the usual
  // way (a read changes nothing).
  auto reply = fast_path_->Exchange(am_wire::kFetchInOneAm, AmRequestHeader(&ns), PackIds(ids),
                                    am_wire::kFetchInOneReplyAm,
                                    std::min(options_.rpc_timeout, absl::Milliseconds(250)));
  if (reply.status().code() == absl::StatusCode::kDeadlineExceeded && !SameDaemon())
    data_plane_suspect_ = true;  // replaced, not slow: the next call reconnects first
  am_wire::ReplyHeader h;
  if (!reply.ok() || !am_wire::DecodeReplyHeader(reply->header, &h) || h.code != 0 ||
      !h.complete)
    return std::nullopt;
  const auto data = am_wire::DecodeFetchInOneData(reply->data);
  v1::AcquireResponse resp;
  if (!data || !resp.ParseFromArray(data->response.data(), static_cast<int>(data->response.size())))
    return std::nullopt;
  // LeaseFrom wants an offset per block; these blocks travelled inside the answer.
  resp.mutable_offsets()->Resize(resp.status_size(), 0);
  auto lease = LeaseFrom(resp, ids.size());
  if (!lease.ok()) return std::nullopt;
  uint64_t total = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (lease->status[i] != BlockStatus::kOk) continue;
    if (lease->sizes[i] > am_wire::kMaxFetchInOneBytes) return std::nullopt;
    total += lease->sizes[i];
  }
  if (total != data->blocks.size()) return std::nullopt;
  const size_t at = data->blocks.data() - reply->data.data();
  FetchedInOne out{std::move(*lease), std::move(reply->data), {}};
  out.bytes = std::string_view(out.answer).substr(at);
  return out;
}

std::optional<Lease> ControlChannel::LeaseFromPushReply(const AmReply& reply, size_t ids) {
  am_wire::ReplyHeader h;
  v1::AcquireResponse resp;
  if (!am_wire::DecodeReplyHeader(reply.header, &h) || h.code != 0 || !h.complete ||
      !resp.ParseFromString(reply.data))
    return std::nullopt;
  // Runs inside the data mover's handler, which holds its endpoint: a malformed answer's lease
  // is left to expire rather than released here (the release would wait for that endpoint).
  auto lease = LeaseFrom(resp, ids);
  if (!lease.ok()) return std::nullopt;
  return std::move(*lease);
}

void ControlChannel::ReleaseAsync(uint64_t lease_id) {
  if (lease_id == 0) return;
  // One way on the data plane where the daemon takes acquires there: a gRPC call costs this
  // thread more than the fetch it ends.
  if (acquire_by_message_ && fast_path_ != nullptr && fast_path_enabled_.load()) {
    std::string header(am_wire::kReleaseHeaderBytes, '\0');
    am_wire::PutU64(header.data(), lease_id);
    header += ticket();
    if (fast_path_->Post(am_wire::kReleaseAm, std::move(header), {}).ok()) return;
  }
  struct Call {
    grpc::ClientContext ctx;
    v1::ReleaseRequest req;
    v1::ReleaseResponse resp;
  };
  auto* call = new Call;
  call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  call->req.set_lease_id(lease_id);
  {
    std::lock_guard<std::mutex> lock(release_mu_);
    ++releases_in_flight_;
  }
  stub_->async()->Release(&call->ctx, &call->req, &call->resp, [this, call](grpc::Status) {
    delete call;
    std::lock_guard<std::mutex> lock(release_mu_);
    if (--releases_in_flight_ == 0) release_cv_.notify_all();
  });
}

absl::StatusOr<std::vector<std::vector<BlockHolder>>> ControlChannel::Locate(
    const NamespaceId& ns, std::span<const BlockId> ids) {
  v1::LocateRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_ids(PackIds(ids));
  v1::LocateResponse resp;
  STRATA_RETURN_IF_ERROR(
      NsRpc("Locate", ns, [&](grpc::ClientContext* c) { return stub_->Locate(c, req, &resp); }));
  if (resp.holders_per_id_size() != static_cast<int>(ids.size()))
    return absl::InternalError("Locate answered with the wrong number of entries");
  std::vector<std::vector<BlockHolder>> out(ids.size());
  int next = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    for (uint32_t h = 0; h < resp.holders_per_id(static_cast<int>(i)); ++h, ++next) {
      if (next >= resp.holder_node_size() || next >= resp.holder_tier_size() ||
          resp.holder_node(next) >= static_cast<uint32_t>(resp.nodes_size()))
        return absl::InternalError("Locate answered with inconsistent holder lists");
      const auto& n = resp.nodes(static_cast<int>(resp.holder_node(next)));
      out[i].push_back(
          {n.id(), n.address(),
           resp.holder_tier(next) == v1::TIER_NVME  ? "nvme"
           : resp.holder_tier(next) == v1::TIER_GPU ? "gpu"
                                                    : "host"});
    }
  }
  return out;
}

}  // namespace strata::client
