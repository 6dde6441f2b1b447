// The publish side of the Cache service: Reserve and Commit, by gRPC and as active messages on
// the data-plane worker (am_wire kReserveRequestAm, kCommitRequestAm), and the blocks published
// by message (kPublishBlockAm). Both routes run the same
// bodies, ReserveFor and CommitFor, with the same checks; the message route only leaves out
// what would make the progress thread wait on other nodes.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/am_wire.h"
#include "common/crc32c.h"
#include "common/crc_pieces.h"
#include "common/packed_ids.h"
#include "daemon/cache_service.h"
#include "daemon/cache_service_internal.h"
#include "daemon/cluster/cluster.h"
#include "daemon/logging.h"
#include "daemon/request_checks.h"
#include "proto/grpc_status.h"

namespace strata::daemon {

using cache_internal::AddStatuses;
using cache_internal::IsOpenIn;
using cache_internal::UnknownId;

namespace {

// A block committed into a spare at least this large lets the progress thread sleep once idle
// (ProgressThread::SleepWhenIdle): its client's next request comes after copying a block about
// as large (~25 us for 256 KiB), longer than waking the thread costs (~10 us here).
constexpr uint64_t kSleepAfterSpareBytes = 256 << 10;

// The id a spare's block is reserved under until a Commit names it: drawn at random once per
// process and counted on, so never a real block's (and never reserved twice).
BlockId SpareId() {
  static const std::array<uint32_t, 6> seed = [] {
    std::random_device rd;
    std::array<uint32_t, 6> s;
    for (uint32_t& w : s) w = rd();
    return s;
  }();
  static std::atomic<uint64_t> count{0};
  BlockId id;
  std::memcpy(id.bytes.data(), seed.data(), sizeof(seed));
  const uint64_t n = count.fetch_add(1, std::memory_order_relaxed);
  std::memcpy(id.bytes.data() + sizeof(seed), &n, sizeof(n));
  return id;
}

}  // namespace

grpc::Status CacheService::CheckReserve(const Caller& caller, const v1::ReserveRequest& req,
                                        NamespaceId* ns, std::vector<ReserveItem>* items) const {
  auto scoped = CheckScoped(req.namespace_id(), req.ids(), IsOpenIn(*namespaces_));
  if (!scoped.ok()) return ToGrpcStatus(scoped.status());
  if (!MayUseNamespace(caller, scoped->ns))
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "the namespace belongs to another tenant than the token's");
  const std::vector<BlockId>& ids = scoped->ids;
  auto parents = CheckReserveParents(req, ids.size());
  if (!parents.ok()) return ToGrpcStatus(parents.status());
  *ns = scoped->ns;
  items->assign(ids.size(), ReserveItem{});
  for (size_t i = 0; i < items->size(); ++i) {
    (*items)[i].id = ids[i];
    if (!parents->empty()) (*items)[i].parent = (*parents)[i];
    (*items)[i].size = req.sizes(static_cast<int>(i));
  }
  return grpc::Status::OK;
}

grpc::Status CacheService::ReserveFor(const Caller& caller, const v1::ReserveRequest& req,
                                      v1::ReserveResponse* resp, bool spare) {
  NamespaceId ns;
  std::vector<ReserveItem> items;
  if (grpc::Status s = CheckReserve(caller, req, &ns, &items); !s.ok()) return s;
  ReserveResult r = store_->Reserve(ns, items);
  if (metrics_ && !spare) {  // a spare's bytes count once it is named (RenameSpare)
    uint64_t granted = 0;
    for (size_t i = 0; i < r.status.size(); ++i)
      if (r.status[i] == BlockStatus::kOk) granted += items[i].size;
    metrics_->AddPublishBytes(granted);
  }
  RememberReplication(ns, items, r);
  if (r.reservation_id != 0 && !caller.trusted && caller.role == Role::kTenant)
    id_owners_.Add(r.reservation_id, caller.tenant, r.expires_in);
  resp->set_reservation_id(r.reservation_id);
  AddStatuses(r.status, resp->mutable_status());
  resp->mutable_offsets()->Add(r.offsets.begin(), r.offsets.end());
  resp->set_expires_in_ms(absl::ToInt64Milliseconds(r.expires_in));
  resp->set_instance_id(data_plane_.instance_id);
  // One line per call, never one per block (a Reserve carries up to 65,536 blocks).
  size_t no_space = 0, first = 0;
  for (size_t i = 0; i < r.status.size(); ++i) {
    if (r.status[i] != BlockStatus::kNoSpace) continue;
    if (no_space++ == 0) first = i;
  }
  static LogRateLimiter limit;
  // A spare refused is no publish refused: its client publishes the usual way.
  if (uint64_t suppressed = 0; !spare && no_space > 0 && limit.Allow(&suppressed))
    spdlog::warn("Reserve in namespace {}: no space for {} of {} blocks (first: {}, {} bytes){}",
                 ns.ShortHex(), no_space, items.size(), items[first].id.ShortHex(),
                 items[first].size, SuppressedNote(suppressed));
  return grpc::Status::OK;
}

void CacheService::RememberReplication(const NamespaceId& ns, std::span<const ReserveItem> items,
                                       const ReserveResult& r) {
  Cluster* cluster = cluster_.load();
  if (!cluster || r.reservation_id == 0 || cluster->size() <= 1) return;
  auto entry = namespaces_->Find(ns);
  if (!entry || cluster->mover().ReplicasFor(*entry) <= 1) return;
  PendingReplication p{ns, {}, {}, 0, absl::Now() + store_->reservation_timeout()};
  for (size_t i = 0; i < items.size(); ++i) {
    if (r.status[i] != BlockStatus::kOk) continue;
    p.ids.push_back(items[i].id);
    p.parents.push_back(items[i].parent);
    p.bytes += items[i].size;
  }
  absl::MutexLock lock(&replicate_mu_);
  // Forget reservations that were abandoned (never committed nor aborted).
  const absl::Time now = absl::Now();
  absl::erase_if(to_replicate_, [&](const auto& kv) { return kv.second.expires < now; });
  to_replicate_[r.reservation_id] = std::move(p);
}

grpc::Status CacheService::CommitFor(const Caller& caller, const v1::CommitRequest& req,
                                     absl::Time deadline, bool may_wait, bool* deferred,
                                     v1::CommitResponse* resp) {
  if (deferred) *deferred = false;
  if (!id_owners_.Allowed(req.reservation_id(), caller))
    return UnknownId("reservation", req.reservation_id());
  Cluster* cluster = cluster_.load();
  if (!may_wait) {
    // Other nodes must learn of the blocks (and replicas hold them) before Commit returns:
    // network waits, which only the gRPC route takes. Nothing is committed here then.
    bool replicates;
    {
      absl::MutexLock lock(&replicate_mu_);
      replicates = to_replicate_.contains(req.reservation_id());
    }
    if (replicates || (cluster && cluster->size() > 1)) {
      *deferred = true;
      return grpc::Status::OK;
    }
  }
  if (req.has_rename()) {
    if (std::optional<grpc::Status> answered = RenameSpare(caller, req, resp)) {
      if (answered->ok()) GrantSpare(caller, req.spare(), resp->mutable_spare());
      return *answered;
    }
  }
  std::vector<uint32_t> crcs(req.crc32c().begin(), req.crc32c().end());
  // The CRC check reads bytes UCX may have written on the progress thread (a software put).
  // (From a progress thread, a Commit by message, nothing is waited for: the endpoint's own
  // worker wrote the bytes, and two workers each waiting for the other would never return.)
  if (transport::ProgressThread::Current() == nullptr)
    for (transport::ProgressThread* p : data_plane_.progress) p->OrderAfterProgress();
  // (abort drops a pending replication below too: its reservation id never commits)
  // Only where the caller could have written the bytes itself anyway: a mapped arena (one
  // tenant) or its own writable zone.
  const bool writer_maps =
      data_plane_.clients_map_arena || data_plane_.clients_write_zones;
  // Or stratad wrote every byte itself and took each CRC as it did (a staging window's blocks).
  const bool staged = StagedWithCrcs(req.reservation_id(), crcs);
  const CommitCheck check = (req.crcs_taken_while_writing() && writer_maps) || staged
                                ? CommitCheck::kWriterChecksummed
                                : CommitCheck::kReread;
  auto r = store_->Commit(req.reservation_id(), crcs, check);
  if (!r.ok()) return ToGrpcStatus(r.status());  // a retried Commit still replicates (or expires)
  ForgetPieces(req.reservation_id());
  std::optional<PendingReplication> replicate;
  {
    absl::MutexLock lock(&replicate_mu_);
    auto it = to_replicate_.find(req.reservation_id());
    if (it != to_replicate_.end()) {
      replicate = std::move(it->second);
      to_replicate_.erase(it);
    }
  }
  id_owners_.Forget(req.reservation_id());
  AddStatuses(*r, resp->mutable_status());
  if (cluster && cluster->size() > 1) {
    // Published means findable: the directory owners know the new blocks before Commit
    // returns, so a lookup on any node right after (a decode node after its prefill node) sees
    // them.
    cluster->announcer().FlushAnnouncements(absl::Now() + cluster->peer_timeout());
  }
  if (replicate && cluster && r->size() == replicate->ids.size()) {
    // Synchronous: once Commit returns, every replica holds the block (or the failure is
    // counted and logged), so losing the publishing node loses nothing.
    std::vector<BlockId> ids, parents;
    for (size_t i = 0; i < r->size(); ++i) {
      if ((*r)[i] != BlockStatus::kOk) continue;
      ids.push_back(replicate->ids[i]);
      parents.push_back(replicate->parents[i]);
    }
    // Within the caller's deadline, and within peer_timeout plus the time the bytes take at a
    // floor rate (the replica's pull runs under the same deadline): a stalled replica must not
    // hold a Commit without a deadline forever, nor use up a client's, while a large commit's
    // copies keep the time they need.
    constexpr double kFloorBytesPerSecond = 50e6;
    const absl::Duration budget =
        cluster->peer_timeout() +
        absl::Seconds(static_cast<double>(replicate->bytes) / kFloorBytesPerSecond);
    if (auto entry = namespaces_->Find(replicate->ns); entry && !ids.empty())
      cluster->mover().Replicate(*entry, ids, parents, std::min(deadline, absl::Now() + budget));
  }
  const auto crc_failed = std::count(r->begin(), r->end(), BlockStatus::kCrcMismatch);
  static LogRateLimiter limit;
  if (uint64_t suppressed = 0; crc_failed > 0 && limit.Allow(&suppressed))
    spdlog::warn(
        "Commit of reservation {}: {} of {} blocks failed CRC32C verification and were "
        "dropped{}",
        req.reservation_id(), crc_failed, r->size(), SuppressedNote(suppressed));
  GrantSpare(caller, req.spare(), resp->mutable_spare());
  return grpc::Status::OK;
}

std::optional<grpc::Status> CacheService::RenameSpare(const Caller& caller,
                                                      const v1::CommitRequest& req,
                                                      v1::CommitResponse* resp) {
  NamespaceId ns;
  std::vector<ReserveItem> items;
  if (grpc::Status s = CheckReserve(caller, req.rename(), &ns, &items); !s.ok()) return s;
  if (items.size() != 1)
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a spare is renamed to exactly one block (one id, one size)");
  const ReserveItem& item = items[0];
  auto renamed = store_->RenameReserved(req.reservation_id(), ns, item);
  if (!renamed.ok()) return ToGrpcStatus(renamed.status());
  spares_named_.fetch_add(1, std::memory_order_relaxed);
  if (*renamed != BlockStatus::kOk) {  // held already (or refused): the spare went back
    id_owners_.Forget(req.reservation_id());
    AddStatuses({*renamed}, resp->mutable_status());
    return grpc::Status::OK;
  }
  if (metrics_) metrics_->AddPublishBytes(item.size);
  ReserveResult r;
  r.reservation_id = req.reservation_id();
  r.status = {BlockStatus::kOk};
  RememberReplication(ns, items, r);
  return std::nullopt;
}

void CacheService::GrantSpare(const Caller& caller, const v1::SpareRequest& want,
                              v1::ReserveResponse* spare) {
  if (want.bytes() == 0) return;
  v1::ReserveRequest rq;
  rq.set_namespace_id(want.namespace_id());
  const BlockId id = SpareId();
  rq.set_ids(id.bytes.data(), id.bytes.size());
  rq.add_sizes(want.bytes());
  // Refused (no room, no such namespace, another tenant's): the client publishes as usual.
  if (!ReserveFor(caller, rq, spare, /*spare=*/true).ok() || spare->reservation_id() == 0)
    spare->Clear();
  else
    spares_granted_.fetch_add(1, std::memory_order_relaxed);
}

grpc::Status CacheService::PublishMade(
    const Caller& caller, const NamespaceId& ns, std::span<const BlockId> ids,
    std::span<const BlockId> parents, std::span<const uint64_t> sizes,
    const std::function<absl::StatusOr<uint32_t>(size_t, uint8_t*)>& write, absl::Time deadline,
    std::vector<BlockStatus>* status) {
  v1::ReserveRequest rq;
  rq.set_namespace_id(std::string(ns.AsBytes()));
  rq.set_ids(PackIds(ids));
  if (!parents.empty()) rq.set_parent_ids(PackIds(parents));
  rq.mutable_sizes()->Add(sizes.begin(), sizes.end());
  v1::ReserveResponse reserved;
  if (grpc::Status s = ReserveFor(caller, rq, &reserved); !s.ok()) return s;
  status->assign(ids.size(), BlockStatus::kOk);
  std::vector<size_t> granted;
  for (size_t i = 0; i < ids.size(); ++i) {
    (*status)[i] = static_cast<BlockStatus>(reserved.status(static_cast<int>(i)));
    if ((*status)[i] == BlockStatus::kOk) granted.push_back(i);
  }
  if (granted.empty()) return grpc::Status::OK;
  const uint64_t reservation = reserved.reservation_id();
  v1::CommitRequest cq;
  cq.set_reservation_id(reservation);
  for (size_t i : granted) {
    const ArenaExtent extent{reserved.offsets(static_cast<int>(i)), sizes[i]};
    if (absl::Status held = store_->BeginReservedWrite(reservation, extent); !held.ok()) {
      (void)AbortFor(caller, reservation);
      return ToGrpcStatus(held);
    }
    absl::StatusOr<uint32_t> crc = write(i, store_->arena_base() + extent.offset);
    store_->EndReservedWrite(reservation);
    if (!crc.ok()) {
      (void)AbortFor(caller, reservation);
      return ToGrpcStatus(crc.status());
    }
    NoteStaged(reservation, extent.offset, extent.size, *crc);  // Commit need not read it again
    cq.add_crc32c(*crc);
  }
  v1::CommitResponse committed;
  if (grpc::Status s = CommitFor(caller, cq, deadline, /*may_wait=*/true, nullptr, &committed);
      !s.ok())
    return s;
  for (size_t k = 0; k < granted.size() && k < static_cast<size_t>(committed.status_size()); ++k)
    (*status)[granted[k]] = static_cast<BlockStatus>(committed.status(static_cast<int>(k)));
  return grpc::Status::OK;
}

template <typename Request, typename Response, typename Body>
void CacheService::ServeAmControl(const transport::AmMessage& m, transport::Worker* worker,
                                  AmScopedKind kind, Body&& body) {
  namespace w = am_wire;
  const auto request = OpenAmRequest(m, kind);
  if (!request) return;
  const auto t0 = std::chrono::steady_clock::now();
  w::ReplyHeader h;
  h.request_id = request->request_id;
  h.complete = true;
  std::string data;
  grpc::Status status;
  CallScope call(this);
  const std::optional<Caller> caller = AmCaller(request->ticket);
  Request req;
  if (!call.admitted()) {
    status = call.refusal();
  } else if (!caller) {
    status = grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          absl::StrCat("active-message ", kind.what,
                                       " without a valid ticket (authentication is on: Connect "
                                       "issues one)"));
  } else if (!req.ParseFromArray(m.data.data(), static_cast<int>(m.data.size()))) {
    DropAm(kind.request_am, m, absl::StrCat(kind.what, " request that does not parse"));
    status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat(kind.what, " request that does not parse"));
  } else {
    Response resp;
    bool deferred = false;
    status = body(*caller, req, &resp, &deferred);
    if (deferred) {
      h.complete = false;
    } else if (status.ok()) {
      data = resp.SerializeAsString();
      controls_by_message_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (!status.ok()) {
    h.code = static_cast<uint32_t>(status.error_code());  // gRPC and absl codes coincide
    data = status.error_message();
  }
  worker->AmReply(m.reply_ep, kind.reply_am, w::EncodeReplyHeader(h), std::move(data));
  if (metrics_ && h.complete)
    metrics_->Record(kind.rpc, static_cast<int>(status.error_code()),
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

void CacheService::HandleAmReserve(const transport::AmMessage& m, transport::Worker* worker) {
  ServeAmControl<v1::ReserveRequest, v1::ReserveResponse>(
      m, worker,
      {am_wire::kReserveRequestAm, am_wire::kReserveReplyAm, RpcMetrics::kReserve, "reserve"},
      [&](const Caller& caller, const v1::ReserveRequest& req, v1::ReserveResponse* resp,
          bool* deferred) {
        // A large batch is the gRPC call's: its answer would not fit an eager message.
        if (req.sizes_size() > static_cast<int>(am_wire::kMaxControlIds)) {
          *deferred = true;
          return grpc::Status::OK;
        }
        return ReserveFor(caller, req, resp);
      });
}

void CacheService::HandleAmCommit(const transport::AmMessage& m, transport::Worker* worker) {
  ServeAmControl<v1::CommitRequest, v1::CommitResponse>(
      m, worker,
      {am_wire::kCommitRequestAm, am_wire::kCommitReplyAm, RpcMetrics::kCommit, "commit"},
      [&](const Caller& caller, const v1::CommitRequest& req, v1::CommitResponse* resp,
          bool* deferred) {
        // A large block committed into a spare: its client's next request comes after its next
        // copy, so polling until then only takes the core from it.
        transport::ProgressThread* progress = transport::ProgressThread::Current();
        if (progress != nullptr && req.has_rename() && req.rename().sizes_size() == 1 &&
            req.rename().sizes(0) >= kSleepAfterSpareBytes)
          progress->SleepWhenIdle();
        return CommitFor(caller, req, absl::Now(), /*may_wait=*/false, deferred, resp);
      });
}

// What a publish in one request carries (am_wire::kPublishInOneAm), parsed as ServeAmControl
// parses the other requests.
struct CacheService::PublishInOneRequest {
  v1::ReserveRequest reserve;
  std::vector<uint32_t> crc32c;
  std::string_view blocks;  // views the message, which lives as long as its handler

  bool ParseFromArray(const void* data, int size) {
    auto d = am_wire::DecodePublishInOneData(
        {static_cast<const char*>(data), static_cast<size_t>(size)});
    if (!d || !reserve.ParseFromArray(d->reserve.data(), static_cast<int>(d->reserve.size())) ||
        static_cast<size_t>(reserve.sizes_size()) != d->crc32c.size())
      return false;
    uint64_t total = 0;
    for (uint64_t size_of_one : reserve.sizes()) {
      if (size_of_one > am_wire::kMaxPublishInOneBytes) return false;
      total += size_of_one;  // at most kMaxControlIds of them: no overflow
    }
    if (total != d->blocks.size()) return false;
    crc32c = std::move(d->crc32c);
    blocks = d->blocks;
    return true;
  }
};

void CacheService::HandleAmPublishInOne(const transport::AmMessage& m, transport::Worker* worker) {
  ServeAmControl<PublishInOneRequest, v1::PublishInOneResponse>(
      m, worker,
      {am_wire::kPublishInOneAm, am_wire::kPublishInOneReplyAm, RpcMetrics::kCommit,
       "publish in one"},
      [&](const Caller& caller, const PublishInOneRequest& req, v1::PublishInOneResponse* resp,
          bool* deferred) { return PublishInOneFor(caller, req, resp, deferred); });
}

// Reserve, the copies a publish by message makes, and Commit, on the progress thread. Nothing
// here waits: what would (other nodes to tell, replicas to make) is sent back undone.
grpc::Status CacheService::PublishInOneFor(const Caller& caller, const PublishInOneRequest& req,
                                           v1::PublishInOneResponse* resp, bool* deferred) {
  Cluster* cluster = cluster_.load();
  uint8_t* const arena = store_->arena_base();
  if ((cluster && cluster->size() > 1) || arena == nullptr) {
    *deferred = true;
    return grpc::Status::OK;
  }
  v1::ReserveResponse reserved;
  if (grpc::Status s = ReserveFor(caller, req.reserve, &reserved); !s.ok()) return s;
  const uint64_t reservation_id = reserved.reservation_id();
  const int n = req.reserve.sizes_size();
  if (reserved.status_size() != n || (reservation_id != 0 && reserved.offsets_size() != n))
    return grpc::Status(grpc::StatusCode::INTERNAL, "reserve answered a different block count");
  resp->mutable_status()->CopyFrom(reserved.status());
  resp->set_instance_id(data_plane_.instance_id);
  if (reservation_id == 0) return grpc::Status::OK;  // every block held already, or no space
  auto give_up = [&](grpc::Status why) {
    (void)AbortFor(caller, reservation_id);
    resp->Clear();
    return why;
  };
  v1::CommitRequest commit;
  commit.set_reservation_id(reservation_id);
  uint64_t at = 0;
  for (int i = 0; i < n; ++i) {
    const uint64_t size = req.reserve.sizes(i);
    const char* const bytes = req.blocks.data() + at;
    at += size;
    if (reserved.status(i) != v1::BLOCK_OK) continue;
    const ArenaExtent extent{reserved.offsets(i), size};
    if (extent.offset > store_->arena_bytes() || size > store_->arena_bytes() - extent.offset)
      return give_up(grpc::Status(grpc::StatusCode::INTERNAL, "reserved outside the arena"));
    if (absl::Status held = store_->BeginReservedWrite(reservation_id, extent); !held.ok())
      return give_up(ToGrpcStatus(held));
    const uint32_t crc = CopyWithCrc32cStreaming(arena + extent.offset, bytes, size);
    store_->EndReservedWrite(reservation_id);
    // Written and checksummed here in one pass: Commit records the CRC without reading the
    // bytes again. A block that is not what the client took its CRC of is left unnoted, and
    // Commit's second read refuses it.
    if (crc == req.crc32c[i]) NoteStaged(reservation_id, extent.offset, size, crc);
    commit.add_crc32c(req.crc32c[i]);
  }
  v1::CommitResponse committed;
  bool commit_deferred = false;
  grpc::Status s = CommitFor(caller, commit, absl::Now(), /*may_wait=*/false, &commit_deferred,
                             &committed);
  if (!s.ok() || commit_deferred) {
    if (commit_deferred) *deferred = true;
    return give_up(s);
  }
  if (committed.status_size() != commit.crc32c_size())
    return grpc::Status(grpc::StatusCode::INTERNAL, "commit answered a different block count");
  for (int i = 0, k = 0; i < n; ++i)
    if (reserved.status(i) == v1::BLOCK_OK) resp->set_status(i, committed.status(k++));
  published_in_one_.fetch_add(1, std::memory_order_relaxed);
  return grpc::Status::OK;
}

// The client copied the block into its staging window (or the engine wrote it into a publish
// buffer); the daemon copies it on into the reserved extent of that window's tenant zone.
// Answered on the progress thread: a copy of at most one block, with no wait.
void CacheService::HandleAmPublishStaged(const transport::AmMessage& m, transport::Worker* worker) {
  namespace w = am_wire;
  const auto staged = w::DecodePublishStagedHeader(m.header);
  if (m.reply_ep == nullptr || !staged || !m.data.empty()) {
    DropAm(w::kPublishStagedAm, m, "staged block without a reply endpoint, with data, or with a "
                                   "header that is not 64 bytes with its reserved words zero");
    return;
  }
  const bool crc_here = (staged->flags & w::kStagedCrcByDaemon) != 0;
  auto ack = [&](const absl::Status& s, std::optional<uint32_t> crc = {}) {
    worker->AmReply(m.reply_ep, w::kPublishAckAm,
                    w::EncodePublishAck({staged->block.request_id, staged->block.index,
                                         static_cast<uint32_t>(s.code()), crc}),
                    std::string(s.message()));
  };
  CallScope call(this);
  if (!call.admitted()) return ack(absl::UnavailableError("stratad is shutting down"));
  CopyStagedBlocks(std::span(&*staged, 1), [&](size_t, const absl::Status& s, uint32_t crc) {
    if (s.code() == absl::StatusCode::kInvalidArgument)
      DropAm(w::kPublishStagedAm, m, std::string(s.message()));
    // Asked to (a publish buffer the client never read): the CRC of what was stored goes back,
    // for the client's Commit to name.
    ack(s, s.ok() && crc_here ? std::optional<uint32_t>(crc) : std::nullopt);
  });
}

// Several staged blocks of one reservation (am_wire::kPublishStagedManyAm): the same checks and
// copies, on two threads, and one acknowledgement for all that were stored.
void CacheService::HandleAmPublishStagedMany(const transport::AmMessage& m,
                                             transport::Worker* worker) {
  namespace w = am_wire;
  const auto many = w::DecodePublishStagedMany(m.header, m.data);
  if (m.reply_ep == nullptr || !many) {
    DropAm(w::kPublishStagedManyAm, m,
           "staged blocks without a reply endpoint, or not laid out as kPublishStagedManyAm says");
    return;
  }
  auto refuse = [&](uint32_t index, const absl::Status& s) {
    worker->AmReply(m.reply_ep, w::kPublishAckAm,
                    w::EncodePublishAck(
                        {many->request_id, index, static_cast<uint32_t>(s.code()), std::nullopt}),
                    std::string(s.message()));
  };
  CallScope call(this);
  if (!call.admitted()) {
    for (const w::PublishStagedHeader& b : many->blocks)
      refuse(b.block.index, absl::UnavailableError("stratad is shutting down"));
    return;
  }
  std::vector<w::StagedAck> stored;
  stored.reserve(many->blocks.size());
  CopyStagedBlocks(many->blocks, [&](size_t i, const absl::Status& s, uint32_t crc) {
    const uint32_t index = many->blocks[i].block.index;
    if (s.ok())
      stored.push_back({index, crc});
    else
      refuse(index, s);
  });
  if (stored.empty()) return;
  worker->AmReply(
      m.reply_ep, w::kPublishAcksAm,
      w::EncodePublishAcksHeader(many->request_id, static_cast<uint32_t>(stored.size())),
      w::EncodeStagedAcks(stored));
}

void CacheService::CopyStagedBlocks(
    std::span<const am_wire::PublishStagedHeader> staged,
    const std::function<void(size_t, const absl::Status&, uint32_t)>& report) {
  namespace w = am_wire;
  struct Admitted {
    size_t index;  // in `staged`
    uint8_t* dst;
    const uint8_t* src;
    uint64_t size;
    std::shared_ptr<const StagingWindow> window;  // mapped while the copy reads it
  };
  uint8_t* const arena = store_->arena_base();
  std::vector<Admitted> admitted;
  admitted.reserve(staged.size());
  for (size_t i = 0; i < staged.size(); ++i) {
    const w::PublishStagedHeader& h = staged[i];
    const w::PublishBlockHeader& block = h.block;
    const absl::Status checked = w::CheckPublishBlock(block, block.size, store_->arena_bytes());
    if (arena == nullptr || !checked.ok()) {
      report(i, checked.ok() ? absl::InvalidArgumentError("no arena") : checked, 0);
      continue;
    }
    // The window id is a credential like the reservation id: unguessable, and good only for
    // the zone of the tenant whose client lent the window.
    std::shared_ptr<const StagingWindow> window =
        data_plane_.stagings ? data_plane_.stagings->Find(h.staging_id) : nullptr;
    if (window == nullptr) {
      report(i,
             absl::FailedPreconditionError(
                 "unknown staging window (lent on a connection that has closed?)"),
             0);
      continue;
    }
    if (!window->Holds(h.staging_offset, block.size)) {
      report(i, absl::InvalidArgumentError("the block lies outside the staging window"), 0);
      continue;
    }
    if (!window->ZoneCovers(block.offset, block.size)) {
      report(
          i,
          absl::PermissionDeniedError("the extent lies outside the staging window's tenant zone"),
          0);
      continue;
    }
    if (absl::Status held =
            store_->BeginReservedWrite(block.reservation_id, {block.offset, block.size});
        !held.ok()) {
      report(i, held, 0);
      continue;
    }
    const uint8_t* src = window->data + h.staging_offset;
    admitted.push_back({i, arena + block.offset, src, block.size, std::move(window)});
  }
  // Pieces small enough that two threads share even two blocks evenly; combining CRCs is noise.
  constexpr uint64_t kPieceBytes = 256 << 10;
  constexpr uint64_t kSplitBytes = 512 << 10;  // less than this is copied on this thread alone
  const std::vector<CrcPiece> pieces = SplitIntoCrcPieces(
      admitted.size(), [&](size_t k) { return admitted[k].size; }, kPieceBytes);
  std::vector<uint32_t> piece_crcs(pieces.size());
  uint64_t total = 0;
  for (const Admitted& a : admitted) total += a.size;
  auto copy = [&](size_t k) {
    const CrcPiece& p = pieces[k];
    const Admitted& a = admitted[p.block];
    piece_crcs[k] = CopyWithCrc32cStreaming(a.dst + p.offset, a.src + p.offset, p.len);
  };
  if (staged_copier_ != nullptr && total >= kSplitBytes) {
    staged_copier_->ParallelFor(pieces.size(), copy);
  } else {
    for (size_t k = 0; k < pieces.size(); ++k) copy(k);
  }
  const std::vector<uint32_t> crcs = CombineCrcPieces(pieces, piece_crcs, admitted.size());
  for (size_t k = 0; k < admitted.size(); ++k) {
    const w::PublishStagedHeader& h = staged[admitted[k].index];
    store_->EndReservedWrite(h.block.reservation_id);
    if ((h.flags & w::kStagedCrcByDaemon) == 0 && crcs[k] != h.crc32c) {
      report(admitted[k].index,
             absl::DataLossError("the staged bytes are not those the client took the CRC of "
                                 "(changed while copied)"),
             0);
      continue;
    }
    NoteStaged(h.block.reservation_id, h.block.offset, h.block.size, crcs[k]);
    staged_blocks_.fetch_add(1, std::memory_order_relaxed);
    report(admitted[k].index, absl::OkStatus(), crcs[k]);
  }
}

void CacheService::NoteStaged(uint64_t reservation_id, uint64_t offset, uint64_t size,
                              uint32_t crc) {
  absl::MutexLock lock(&staged_mu_);
  if (staged_.size() >= kMaxStagedReservations && !staged_.contains(reservation_id))
    staged_.clear();
  staged_[reservation_id][offset] = {size, crc};
}

void CacheService::ForgetStaged(uint64_t reservation_id, std::optional<uint64_t> offset) {
  absl::MutexLock lock(&staged_mu_);
  auto it = staged_.find(reservation_id);
  if (it == staged_.end()) return;
  if (offset)
    it->second.erase(*offset);
  else
    staged_.erase(it);
}

bool CacheService::StagedWithCrcs(uint64_t reservation_id, std::span<const uint32_t> crcs) {
  absl::flat_hash_map<uint64_t, StagedExtent> staged;
  {
    absl::MutexLock lock(&staged_mu_);
    auto it = staged_.find(reservation_id);
    if (it == staged_.end()) return false;
    staged = std::move(it->second);
    staged_.erase(it);
  }
  const std::vector<ArenaExtent> extents = store_->ReservedExtents(reservation_id);
  if (extents.empty() || extents.size() != crcs.size()) return false;
  for (size_t i = 0; i < extents.size(); ++i) {
    auto s = staged.find(extents[i].offset);
    if (s == staged.end() || s->second.size != extents[i].size || s->second.crc != crcs[i])
      return false;
  }
  return true;
}

bool CacheService::HandleAmPublish(const transport::AmMessage& m, transport::Worker* worker) {
  namespace w = am_wire;
  const auto block = w::DecodePublishBlockHeader(m.header);
  if (m.reply_ep == nullptr || !block) {
    DropAm(w::kPublishBlockAm, m, "published block without a reply endpoint or with a header "
                                  "that is not 40 bytes ending in a zero word");
    return false;
  }
  const ucp_ep_h reply_ep = m.reply_ep;
  auto ack = [worker, reply_ep, id = block->request_id, index = block->index](
                 absl::StatusCode code, std::string why) {
    worker->AmReply(reply_ep, w::kPublishAckAm,
                    w::EncodePublishAck({id, index, static_cast<uint32_t>(code), std::nullopt}),
                    std::move(why));
  };
  CallScope call(this);
  if (!call.admitted()) {
    ack(absl::StatusCode::kUnavailable, "stratad is shutting down");
    return false;
  }
  uint8_t* const arena = store_->arena_base();
  const absl::Status checked = w::CheckPublishBlock(*block, m.length, store_->arena_bytes());
  if (arena == nullptr || !checked.ok()) {
    const std::string why = checked.ok() ? "no arena" : std::string(checked.message());
    DropAm(w::kPublishBlockAm, m, why);
    ack(absl::StatusCode::kInvalidArgument, why);
    return false;
  }
  // The reservation id is the credential (as the lease id of a push fetch), and the write hold
  // keeps the extent this reservation's until the bytes have landed, whatever happens to it.
  const uint64_t reservation_id = block->reservation_id;
  if (absl::Status held = store_->BeginReservedWrite(reservation_id, {block->offset, block->size});
      !held.ok()) {
    ack(held.code(), std::string(held.message()));
    return false;
  }
  ForgetStaged(reservation_id);  // these bytes are not stratad's own copy
  uint8_t* const dest = arena + block->offset;
  if (!m.rendezvous) {
    std::memcpy(dest, m.data.data(), m.data.size());
    store_->EndReservedWrite(reservation_id);
    published_blocks_.fetch_add(1, std::memory_order_relaxed);
    ack(absl::StatusCode::kOk, {});
    return false;
  }
  BlockStore* store = store_;
  std::atomic<uint64_t>* published = &published_blocks_;
  worker->AmRecvDataThen(m.desc, dest, block->size, data_plane_.arena_memh,
                         [store, reservation_id, published, ack](bool ok) {
                           store->EndReservedWrite(reservation_id);
                           if (!ok) return;  // the sender's endpoint failed: nobody to tell
                           published->fetch_add(1, std::memory_order_relaxed);
                           ack(absl::StatusCode::kOk, {});
                         });
  return false;  // the receive owns the descriptor now (UCX: recv started inside the callback)
}

size_t CacheService::MaxBlocksInPieces() const {
  return std::clamp<size_t>(store_->arena_bytes() / am_wire::kMinPushPieceBytes,
                            kMaxBlocksInPieces, kMostBlocksInPieces);
}

void CacheService::ForgetPieces(uint64_t reservation_id) {
  absl::MutexLock lock(&pieces_mu_);
  if (publish_pieces_.empty()) return;
  absl::erase_if(publish_pieces_, [&](const auto& e) {
    return !e.second.busy && e.first.first == reservation_id;
  });
}

void CacheService::SweepEndedPieces() {
  std::vector<uint64_t> reservations;
  {
    absl::MutexLock lock(&pieces_mu_);
    if (publish_pieces_.size() < MaxBlocksInPieces()) return;
    for (const auto& [key, so_far] : publish_pieces_)
      if (!so_far.busy) reservations.push_back(key.first);
  }
  std::sort(reservations.begin(), reservations.end());
  reservations.erase(std::unique(reservations.begin(), reservations.end()), reservations.end());
  absl::flat_hash_set<uint64_t> ended;  // asked without pieces_mu_: the store takes its own lock
  for (uint64_t id : reservations)
    if (store_->ReservedExtents(id).empty()) ended.insert(id);
  if (ended.empty()) return;
  absl::MutexLock lock(&pieces_mu_);
  absl::erase_if(publish_pieces_, [&](const auto& e) {
    return !e.second.busy && ended.contains(e.first.first);
  });
}

constexpr const char* kTwoWriters =
    "pieces of one block came from two writers at once; publish it again";

void CacheService::HandleAmPublishPiece(const transport::AmMessage& m,
                                        transport::Worker* worker) {
  namespace w = am_wire;
  const auto piece = w::DecodePublishPieceHeader(m.header);
  if (m.reply_ep == nullptr || !piece || m.rendezvous) {
    DropAm(w::kPublishPieceAm, m, "published piece without a reply endpoint, as a rendezvous "
                                  "or with a header that is not 48 bytes");
    return;
  }
  const w::PublishBlockHeader& block = piece->block;
  const ucp_ep_h reply_ep = m.reply_ep;
  auto ack = [&](absl::StatusCode code, std::string why) {
    worker->AmReply(reply_ep, w::kPublishAckAm,
                    w::EncodePublishAck({block.request_id, block.index,
                                         static_cast<uint32_t>(code), std::nullopt}),
                    std::move(why));
  };
  CallScope call(this);
  if (!call.admitted()) return ack(absl::StatusCode::kUnavailable, "stratad is shutting down");
  uint8_t* const arena = store_->arena_base();
  const absl::Status checked = w::CheckPublishPiece(*piece, m.data.size(), store_->arena_bytes());
  if (arena == nullptr || !checked.ok()) {
    const std::string why = checked.ok() ? "no arena" : std::string(checked.message());
    DropAm(w::kPublishPieceAm, m, why);
    return ack(absl::StatusCode::kInvalidArgument, why);
  }
  if (block.size <= w::kMinPushPieceBytes) {
    DropAm(w::kPublishPieceAm, m, "a block this small is published whole");
    return ack(absl::StatusCode::kInvalidArgument,
               "a block of at most 4 KiB is published whole, not in pieces");
  }
  const uint64_t reservation_id = block.reservation_id;
  const auto key = std::make_pair(reservation_id, block.offset);
  const absl::Time now = absl::Now();
  if (piece->offset == 0) SweepEndedPieces();
  const size_t max_blocks = MaxBlocksInPieces();
  PiecesSoFar so_far;
  absl::Status refused;  // answered after the lock is released
  {
    absl::MutexLock lock(&pieces_mu_);
    auto at = publish_pieces_.find(key);
    if (at != publish_pieces_.end() && at->second.busy) {
      // Another piece of this block is being copied in right now, so a second writer (another
      // endpoint, on another worker) sends pieces of it too: neither's CRC would be the bytes'.
      publish_pieces_.erase(at);
      ForgetStaged(reservation_id);
      refused = absl::InvalidArgumentError(kTwoWriters);
    } else if (piece->offset == 0) {
      // A block (re)starts: a CRC noted for it earlier no longer holds.
      ForgetStaged(reservation_id, block.offset);
      if (at == publish_pieces_.end()) {
        if (publish_pieces_.size() >= max_blocks) {
          const absl::Duration idle = store_->reservation_timeout();
          absl::erase_if(publish_pieces_, [&](const auto& e) {
            return !e.second.busy && now - e.second.touched > idle;
          });
        }
        if (publish_pieces_.size() < max_blocks)
          at = publish_pieces_.emplace(key, PiecesSoFar{}).first;
        else
          refused = absl::ResourceExhaustedError(
              "too many blocks are being published in pieces at once");
      }
      if (at != publish_pieces_.end()) at->second = PiecesSoFar{0, 0, now, ++pieces_started_};
    }
    if (refused.ok() && (at == publish_pieces_.end() || at->second.next != piece->offset)) {
      // Out of order, or for a block that is whole already: the block's CRC is unknown here,
      // so Commit must read the bytes again; the publish fails anyway.
      if (at != publish_pieces_.end()) publish_pieces_.erase(at);
      ForgetStaged(reservation_id);
      refused = absl::InvalidArgumentError(
          "a published piece does not continue its block where the last one ended");
    }
    if (refused.ok()) {
      at->second.busy = true;
      so_far = at->second;
    }
  }
  if (!refused.ok()) return ack(refused.code(), std::string(refused.message()));
  // Puts this piece's result back (or, `keep` false, drops the entry, and with `whole` notes
  // the block's CRC in the same hold, so no restart of the block slips in between); false when
  // the entry went while the piece was copied (a second writer, or the idle sweep).
  auto finish = [&](bool keep, bool whole = false) {
    absl::MutexLock lock(&pieces_mu_);
    auto at = publish_pieces_.find(key);
    if (at == publish_pieces_.end() || at->second.started != so_far.started) return false;
    if (keep) {
      at->second = so_far;
      at->second.busy = false;
    } else {
      publish_pieces_.erase(at);
    }
    // Whole, and stratad took its CRC as it wrote every byte: Commit need not read it again.
    if (whole) NoteStaged(reservation_id, block.offset, block.size, so_far.crc);
    return true;
  };
  // The write hold keeps the extent this reservation's while the piece is copied in.
  if (absl::Status held = store_->BeginReservedWrite(reservation_id, {block.offset, block.size});
      !held.ok()) {
    finish(false);
    return ack(held.code(), std::string(held.message()));
  }
  so_far.crc = CopyWithCrc32cStreaming(arena + block.offset + piece->offset, m.data.data(),
                                       m.data.size(), so_far.crc);
  store_->EndReservedWrite(reservation_id);
  so_far.next += m.data.size();
  so_far.touched = now;
  const bool whole = so_far.next >= block.size;
  if (!finish(/*keep=*/!whole, whole)) {
    ForgetStaged(reservation_id);
    return ack(absl::StatusCode::kInvalidArgument, kTwoWriters);
  }
  if (!whole) return;
  published_blocks_.fetch_add(1, std::memory_order_relaxed);
  published_in_pieces_.fetch_add(1, std::memory_order_relaxed);
  ack(absl::StatusCode::kOk, {});
}

}  // namespace strata::daemon
