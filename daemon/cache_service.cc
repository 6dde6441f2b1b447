#include "daemon/cache_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <type_traits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/am_wire.h"
#include "common/packed_ids.h"
#include "common/status_macros.h"
#include "daemon/cache_service_internal.h"
#include "daemon/cluster/cluster.h"
#include "daemon/request_checks.h"
#include "daemon/transcode/transcoder.h"
#include "daemon/logging.h"
#include "proto/convert.h"
#include "proto/grpc_status.h"

namespace strata::daemon {
namespace {

using cache_internal::AddStatuses;
using cache_internal::TrustedCaller;
using cache_internal::IsOpenIn;
using cache_internal::UnknownId;

v1::Tier ToProto(Tier tier) {
  switch (tier) {
    case Tier::kGpu: return v1::TIER_GPU;
    case Tier::kNvme: return v1::TIER_NVME;
    default: return v1::TIER_HOST;
  }
}

}  // namespace

CacheService::CallScope::CallScope(CacheService* s) : service_(s) {
  absl::MutexLock lock(&s->drain_mu_);
  admitted_ = !s->draining_;
  if (admitted_) ++s->in_flight_;
}

CacheService::CallScope::~CallScope() {
  if (!admitted_) return;
  absl::MutexLock lock(&service_->drain_mu_);
  --service_->in_flight_;
}

grpc::Status CacheService::CallScope::refusal() const {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, "stratad is shutting down");
}

template <typename Handler>
grpc::Status CacheService::Serve(const grpc::ServerContext* ctx, Handler&& handler) {
  CallScope call(this);
  if (!call.admitted()) return call.refusal();
  Caller caller;
  if (grpc::Status s = auth_->Check(ctx, kAnyRole, &caller); !s.ok()) return s;
  if constexpr (std::is_invocable_v<Handler, const Caller&>) {
    return handler(caller);
  } else {
    return handler();
  }
}

template <typename Request, typename Handler>
grpc::Status CacheService::ServeScoped(const grpc::ServerContext* ctx, const Request& req,
                                       Handler&& handler) {
  CallScope call(this);
  if (!call.admitted()) return call.refusal();
  Caller caller;
  if (grpc::Status s = auth_->Check(ctx, kAnyRole, &caller); !s.ok()) return s;
  auto scoped = CheckScoped(req.namespace_id(), req.ids(), IsOpenIn(*namespaces_));
  if (!scoped.ok()) return ToGrpcStatus(scoped.status());
  if (!MayUseNamespace(caller, scoped->ns))
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        "the namespace belongs to another tenant than the token's");
  if constexpr (std::is_invocable_v<Handler, const NamespaceId&, const std::vector<BlockId>&,
                                    const Caller&>) {
    return handler(scoped->ns, scoped->ids, caller);
  } else {
    return handler(scoped->ns, scoped->ids);
  }
}


bool CacheService::MayUseNamespace(const Caller& caller, const NamespaceId& ns) const {
  if (caller.trusted) return true;  // authentication off: no lookup on the hot path
  // A tenant's credentials reach only namespaces opened under that tenant.
  auto entry = namespaces_->Find(ns);
  return entry && caller.MayUse(entry->tenant);
}

bool CacheService::Drain(absl::Duration grace) {
  absl::MutexLock lock(&drain_mu_);
  draining_ = true;
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(drain_mu_) { return in_flight_ == 0; };
  return drain_mu_.AwaitWithTimeout(absl::Condition(&idle), grace);
}

CacheService::CacheService(BlockStore* store, NamespaceRegistry* namespaces,
                           DataPlaneInfo data_plane, const Authenticator* auth)
    : store_(store),
      namespaces_(namespaces),
      data_plane_(std::move(data_plane)),
      auth_(auth ? auth : &no_auth_) {
  if (data_plane_.stagings != nullptr) staged_copier_ = std::make_unique<HelperThread>();
}

grpc::Status CacheService::DoConnect(grpc::ServerContext* ctx, const v1::ConnectRequest* req,
                                     v1::ConnectResponse* resp) {
  return Serve(ctx, [&](const Caller& caller) {
    resp->set_node_id(data_plane_.node_id);
    resp->set_version(STRATA_VERSION);
    // Other daemons (the cluster's locator) to the first worker, which answers their messages;
    // clients round the workers, so their transfers run on several threads.
    // (A probe of which daemon answers, instance_only, takes no worker's turn.)
    const auto& addresses = data_plane_.worker_addresses;
    const bool first = req->client_name().starts_with("stratad:") || req->instance_only();
    if (!addresses.empty()) {
      const size_t turn = first ? 0 : next_worker_.fetch_add(1) % addresses.size();
      resp->set_worker_address(addresses[turn]);
      // A client that maps the arena moves its own bytes: it takes the first worker instead.
      if (turn != 0) resp->set_first_worker_address(addresses[0]);
    }
    resp->set_arena_bytes(store_->arena_bytes());
    // With several tenants a remote key would open the whole arena, every tenant's blocks, to
    // the caller: none is handed out, and bytes move only by messages this daemon checks
    // against the caller's own lease or reservation.
    if (data_plane_.clients_map_arena) {
      resp->set_arena_base(reinterpret_cast<uint64_t>(store_->arena_base()));
      resp->set_arena_rkey(data_plane_.arena_rkey);
    }
    resp->set_rma_off(!data_plane_.clients_map_arena);
    if (caller.role == Role::kTenant) resp->set_zone_socket(data_plane_.zone_socket);
    resp->set_publish_by_message(true);
    resp->set_publish_in_pieces(true);
    resp->set_instance_id(data_plane_.instance_id);
    resp->set_reservation_timeout_ms(absl::ToInt64Milliseconds(store_->reservation_timeout()));
    resp->set_lease_timeout_ms(absl::ToInt64Milliseconds(store_->lease_timeout()));
    Cluster* cluster = cluster_.load();
    resp->set_cluster_nodes(cluster ? static_cast<uint32_t>(cluster->size()) : 1);
    // With authentication the fast paths need the caller's ticket; without one (no random
    // bytes) they stay off for this client.
    std::string ticket;
    if (auth_->enabled() && !req->instance_only()) ticket = am_tickets_.Issue(caller);
    const bool fast_paths = !auth_->enabled() || !ticket.empty();
    resp->set_active_messages_off(!fast_paths);
    resp->set_acquire_by_message(fast_paths);
    resp->set_control_by_message(fast_paths);
    resp->set_acquire_and_push(fast_paths);
    resp->set_push_releases(fast_paths);
    resp->set_answer_in_first_block(fast_paths);
    resp->set_push_in_pieces(fast_paths);
    resp->set_spare_reservations(true);
    resp->set_publish_in_one(fast_paths);
    resp->set_fetch_in_one(fast_paths);
    resp->set_device_fetch_by_message(fast_paths && data_plane_.gpu != nullptr);
    resp->set_am_ticket(ticket);
    spdlog::debug("client '{}' connected from {}", LogSafe(req->client_name()), ctx->peer());
    return grpc::Status::OK;
  });
}

grpc::Status CacheService::DoOpenNamespace(grpc::ServerContext* ctx,
                                           const v1::OpenNamespaceRequest* req,
                                           v1::OpenNamespaceResponse* resp) {
  return Serve(ctx, [&](const Caller& caller) {
    // A tenant's token decides its tenant: a request may repeat it, never name another.
    std::string tenant = req->tenant();
    if (!caller.trusted && caller.role == Role::kTenant) {
      if (!tenant.empty() && tenant != caller.tenant)
        return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                            absl::StrCat("the token is tenant '", caller.tenant,
                                         "'s; it cannot open namespaces of tenant '", tenant, "'"));
      tenant = caller.tenant;
    }
    const NamespaceSpec spec = FromProto(req->spec());
    // Checked before the namespace opens: a refused request must not hold a slot of
    // limits.max_namespaces until the idle release.
    if (req->replicas() > 8)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "replicas must be 0 to 8");
    if (!req->cold_codec().empty()) {
      absl::Status cold = absl::FailedPreconditionError("this daemon does not transcode");
      if (transcoder_) cold = Transcoder::CheckColdCodec(req->cold_codec(), spec);
      if (!cold.ok()) return ToGrpcStatus(cold);
    }
    auto id = namespaces_->Open(spec, tenant);
    if (!id.ok()) {
      static LogRateLimiter limit;
      if (uint64_t suppressed = 0; limit.Allow(&suppressed))
        spdlog::warn("OpenNamespace for tenant '{}' model '{}' refused: {}{}",
                     LogSafe(tenant), LogSafe(req->spec().model_id()),
                     LogSafe(id.status().ToString(), 512), SuppressedNote(suppressed));
      return ToGrpcStatus(id.status());
    }
    if (req->replicas() > 0) namespaces_->SetReplicas(*id, req->replicas());
    if (!req->cold_codec().empty()) {
      namespaces_->SetColdCodec(*id, req->cold_codec());
      transcoder_->Enable(*id);
    }
    resp->set_namespace_id(std::string(id->AsBytes()));
    return grpc::Status::OK;
  });
}

grpc::Status CacheService::LookupStream(
    grpc::ServerContext* c,
    grpc::ServerReaderWriter<v1::LookupResponse, v1::LookupRequest>* stream) {
  // Each message is admitted (and refused while draining) like a unary Lookup; the stream itself
  // is not counted as in flight, so idle streams never hold up a drain (Shutdown cancels them).
  {
    // Refused as a whole, so a caller without a token learns nothing from the stream either.
    Caller caller;
    if (grpc::Status s = auth_->Check(c, kAnyRole, &caller); !s.ok()) return s;
  }
  v1::LookupRequest req;
  while (stream->Read(&req)) {
    v1::LookupResponse resp;
    grpc::Status s = Timed(RpcMetrics::kLookup, [&] { return DoLookup(c, &req, &resp); });
    if (!s.ok()) {
      resp.Clear();
      resp.set_error_code(static_cast<uint32_t>(s.error_code()));
      resp.set_error_message(s.error_message());
    }
    if (!stream->Write(resp)) break;
  }
  return grpc::Status::OK;
}

grpc::Status CacheService::DoLookup(grpc::ServerContext* ctx, const v1::LookupRequest* req,
                                    v1::LookupResponse* resp) {
  return ServeScoped(ctx, *req, [&](const NamespaceId& ns, const std::vector<BlockId>& ids) {
    std::vector<Tier> tiers;
    const size_t local = store_->Lookup(ns, ids, &tiers);
    size_t n = local;
    resp->mutable_tiers()->Reserve(static_cast<int>(ids.size()));
    for (size_t i = 0; i < local; ++i) resp->add_tiers(ToProto(tiers[i]));
    Cluster* cluster = cluster_.load();
    if (cluster && cluster->size() > 1 && local < ids.size())
      n += LookupRemote(*cluster, std::span<const BlockId>(ids).subspan(local), local, resp);
    if (metrics_) {
      const uint64_t tpb = namespaces_->TokensPerBlock(ns);
      metrics_->AddLookupTokens(n * tpb, (ids.size() - n) * tpb);
    }
    resp->set_prefix_blocks(static_cast<uint32_t>(n));
    resp->set_node_id(data_plane_.node_id);
    return grpc::Status::OK;
  });
}

size_t CacheService::LookupRemote(Cluster& cluster, std::span<const BlockId> rest, size_t local,
                                  v1::LookupResponse* resp) {
  auto located = cluster.locator().Locate(rest, absl::Now() + cluster.peer_timeout());
  auto* self = resp->add_nodes();
  self->set_id(cluster.self().id);
  self->set_address(cluster.self().address);
  for (size_t i = 0; i < local; ++i) resp->add_holder(0);
  absl::flat_hash_map<std::string, uint32_t> index;
  auto view = cluster.View();
  size_t found = 0;
  for (const auto& holders : located) {
    const placement::Location* best = nullptr;
    for (const auto& h : holders)
      if (view.Find(h.node) && (!best || h.node == cluster.self().id)) best = &h;
    if (!best) break;
    uint32_t at = 0;
    if (best->node != cluster.self().id) {
      auto [it, fresh] = index.try_emplace(best->node, resp->nodes_size());
      if (fresh) {
        auto* ref = resp->add_nodes();
        ref->set_id(best->node);
        ref->set_address(view.Find(best->node)->address);
      }
      at = it->second;
    }
    resp->add_holder(at);
    resp->add_tiers(best->tier == placement::LocationTier::kNvme ? v1::TIER_NVME : v1::TIER_HOST);
    ++found;
  }
  cluster.CountRemoteLocated(found);
  return found;
}

grpc::Status CacheService::DoReserve(grpc::ServerContext* ctx, const v1::ReserveRequest* req,
                                     v1::ReserveResponse* resp) {
  return Serve(ctx, [&](const Caller& caller) { return ReserveFor(caller, *req, resp); });
}

grpc::Status CacheService::DoCommit(grpc::ServerContext* ctx, const v1::CommitRequest* req,
                                    v1::CommitResponse* resp) {
  return Serve(ctx, [&](const Caller& caller) {
    return CommitFor(caller, *req, absl::FromChrono(ctx->deadline()), /*may_wait=*/true,
                     nullptr, resp);
  });
}

grpc::Status CacheService::DoAbort(grpc::ServerContext* ctx, const v1::AbortRequest* req,
                                   v1::AbortResponse*) {
  return Serve(ctx, [&](const Caller& caller) { return AbortFor(caller, req->reservation_id()); });
}

grpc::Status CacheService::AbortFor(const Caller& caller, uint64_t reservation_id) {
  if (!id_owners_.Allowed(reservation_id, caller)) return UnknownId("reservation", reservation_id);
  absl::Status aborted = store_->Abort(reservation_id);
  ForgetStaged(reservation_id);
  ForgetPieces(reservation_id);
  if (aborted.ok()) {
    absl::MutexLock lock(&replicate_mu_);
    to_replicate_.erase(reservation_id);
    id_owners_.Forget(reservation_id);
  }
  return ToGrpcStatus(aborted);
}

void CacheService::HandleAmAbort(const transport::AmMessage& m) {
  const auto abort = am_wire::DecodeReleaseHeader(m.header);
  if (!abort) return DropAm(am_wire::kAbortAm, m, "abort with a header that is not 8 or 24 bytes");
  const std::optional<Caller> caller = AmCaller(abort->ticket);
  if (!caller)
    return DropAm(am_wire::kAbortAm, m, "abort without a valid ticket (authentication is on)");
  CallScope call(this);
  if (!call.admitted()) return;  // draining: the reservation expires
  (void)AbortFor(*caller, abort->lease_id);  // another tenant's or an unknown one: unchanged
}

grpc::Status CacheService::DoAcquire(grpc::ServerContext* ctx, const v1::AcquireRequest* req,
                                     v1::AcquireResponse* resp) {
  return ServeScoped(ctx, *req, [&](const NamespaceId& ns, const std::vector<BlockId>& ids,
                                    const Caller& caller) {
    AcquireInto(ns, ids, caller, resp);
    return grpc::Status::OK;
  });
}

void CacheService::AcquireInto(const NamespaceId& ns, const std::vector<BlockId>& ids,
                               const Caller& caller, v1::AcquireResponse* resp) {
  AcquireResult r = store_->Acquire(ns, ids);
  if (metrics_) {
    uint64_t leased = 0;
    for (size_t i = 0; i < r.status.size(); ++i)
      if (r.status[i] == BlockStatus::kOk) leased += r.sizes[i];
    metrics_->AddFetchBytes(leased);
  }
  if (r.lease_id != 0 && !caller.trusted && caller.role == Role::kTenant)
    id_owners_.Add(r.lease_id, caller.tenant, r.expires_in);
  resp->set_lease_id(r.lease_id);
  AddStatuses(r.status, resp->mutable_status());
  resp->mutable_offsets()->Add(r.offsets.begin(), r.offsets.end());
  resp->mutable_sizes()->Add(r.sizes.begin(), r.sizes.end());
  resp->mutable_crc32c()->Add(r.crcs.begin(), r.crcs.end());
  resp->set_expires_in_ms(absl::ToInt64Milliseconds(r.expires_in));
  resp->set_instance_id(data_plane_.instance_id);
}

grpc::Status CacheService::DoRelease(grpc::ServerContext* ctx, const v1::ReleaseRequest* req,
                                     v1::ReleaseResponse*) {
  return Serve(ctx, [&](const Caller& caller) {
    if (!id_owners_.Allowed(req->lease_id(), caller)) return UnknownId("lease", req->lease_id());
    return ToGrpcStatus(EndLease(req->lease_id()));
  });
}

grpc::Status CacheService::DoEvict(grpc::ServerContext* ctx, const v1::EvictRequest* req,
                                   v1::EvictResponse* resp) {
  return ServeScoped(ctx, *req, [&](const NamespaceId& ns, const std::vector<BlockId>& ids) {
    EvictResult r = store_->Evict(ns, ids, req->cascade(), req->force());
    AddStatuses(r.status, resp->mutable_status());
    resp->set_removed_blocks(r.removed_blocks);
    static LogRateLimiter limit;
    if (uint64_t suppressed = 0; limit.Allow(&suppressed))
      spdlog::info("Evict in namespace {}: {} ids requested, {} blocks removed{}", ns.ShortHex(),
                   ids.size(), r.removed_blocks, SuppressedNote(suppressed));
    return grpc::Status::OK;
  });
}

grpc::Status CacheService::DoPin(grpc::ServerContext* ctx, const v1::PinRequest* req,
                                 v1::PinResponse* resp) {
  return ServeScoped(ctx, *req, [&](const NamespaceId& ns, const std::vector<BlockId>& ids) {
    if (absl::Status s = CheckPin(*req); !s.ok()) return ToGrpcStatus(s);
    AddStatuses(store_->Pin(ns, ids, absl::Milliseconds(req->ttl_ms())), resp->mutable_status());
    return grpc::Status::OK;
  });
}

grpc::Status CacheService::DoUnpin(grpc::ServerContext* ctx, const v1::UnpinRequest* req,
                                   v1::UnpinResponse* resp) {
  return ServeScoped(ctx, *req, [&](const NamespaceId& ns, const std::vector<BlockId>& ids) {
    AddStatuses(store_->Unpin(ns, ids), resp->mutable_status());
    return grpc::Status::OK;
  });
}

grpc::Status CacheService::DoStats(grpc::ServerContext* ctx, const v1::StatsRequest*,
                                   v1::StatsResponse* resp) {
  return Serve(ctx, [&] {
    const BlockStoreStats stats = store_->Stats();
    const HostTierStats& s = stats.host;
    resp->set_node_id(data_plane_.node_id);
    resp->set_version(STRATA_VERSION);
    resp->set_uptime_ms(absl::ToInt64Milliseconds(absl::Now() - started_));
    auto* t = resp->add_tiers();
    t->set_tier(v1::TIER_HOST);
    t->set_capacity_bytes(s.capacity_bytes);
    t->set_used_bytes(s.allocated_bytes);
    t->set_blocks(s.blocks);
    t->set_reserved_bytes(s.reserved_bytes);
    t->set_huge_pages(data_plane_.huge_pages);
    resp->set_open_reservations(s.open_reservations);
    resp->set_open_leases(s.open_leases);
    resp->set_pinned_blocks(s.pinned_blocks);
    auto& c = *resp->mutable_counters();
    if (stats.nvme) {
      const NvmeTierCounters& n = *stats.nvme;
      auto* nt = resp->add_tiers();
      nt->set_tier(v1::TIER_NVME);
      nt->set_capacity_bytes(n.nvme_capacity_bytes);
      nt->set_used_bytes(n.nvme_used_bytes);
      nt->set_blocks(n.nvme_blocks);
      resp->set_pinned_blocks(s.pinned_blocks + n.nvme_pinned_blocks);
      c["demotions_total"] = n.demotions;
      c["promotions_total"] = n.promotions;
      c["admission_rejected_total"] = n.admission_rejected;
      c["nvme_evictions_total"] = n.nvme_evictions;
      c["nvme_full_drops_total"] = n.nvme_full_drops;
      c["nvme_write_errors_total"] = n.nvme_write_errors;
      c["nvme_read_errors_total"] = n.nvme_read_errors;
      c["nvme_crc_failures_total"] = n.nvme_crc_failures;
      c["nvme_evictions_explicit_total"] = n.nvme_removed_explicit;
      c["host_pressure_drops_total"] = s.pressure_drops;
    }
    if (stats.gpu) {
      const GpuTierCounters& g = *stats.gpu;
      auto* gt = resp->add_tiers();
      gt->set_tier(v1::TIER_GPU);
      gt->set_capacity_bytes(g.device.capacity_bytes);
      gt->set_used_bytes(g.device.allocated_bytes);
      gt->set_blocks(g.device.blocks);
      gt->set_reserved_bytes(g.device.reserved_bytes);
      c["gpu_promotions_total"] = g.promotions;
      c["gpu_demotions_total"] = g.demotions;
      c["gpu_victims_held_below_total"] = g.victims_held_below;
      c["gpu_victims_dropped_total"] = g.victims_dropped;
      c["gpu_staged_down_total"] = g.staged_down;
      c["gpu_copy_errors_total"] = g.copy_errors;
      c["gpu_crc_failures_total"] = g.crc_failures;
      c["gpu_peer_copies_total"] = g.peer_copies;
      c["gpu_peer_fetches_device_only_total"] = g.peer_fetches_device_only;
      c["gpu_peer_copied_bytes_total"] = g.peer_copied_bytes;
      c["gpu_peer_reads_total"] = g.peer_reads;
      c["gpu_peer_read_bytes_total"] = g.peer_read_bytes;
      c["gpu_peer_device_encodes_total"] = g.peer_device_encodes;
    }
    if (Cluster* cl = cluster_.load(); cl && cl->device_transfers()) {
      const DeviceTransferCounters& d = cl->device_transfers()->counters();
      c["device_link_blocks_in_total"] = d.blocks_in.load();
      c["device_link_bytes_in_total"] = d.bytes_in.load();
      c["device_link_blocks_out_total"] = d.blocks_out.load();
      c["device_link_bytes_out_total"] = d.bytes_out.load();
      c["device_links_opened_total"] = d.links_opened.load();
      c["device_link_failures_total"] = d.failures.load();
    }
    resp->set_namespaces(namespaces_->size());
    resp->set_transport(data_plane_.transports);
    c["lookups_total"] = s.lookups;
    c["pushed_blocks_total"] = pushed_blocks_.load(std::memory_order_relaxed);
    c["pushed_pieces_total"] = pushed_pieces_.load(std::memory_order_relaxed);
    c["published_in_pieces_total"] = published_in_pieces_.load(std::memory_order_relaxed);
    c["published_by_message_total"] = published_blocks_.load(std::memory_order_relaxed);
    c["published_staged_total"] = staged_blocks_.load(std::memory_order_relaxed);
    if (data_plane_.stagings) c["staging_windows_lent"] = data_plane_.stagings->size();
    c["acquires_by_message_total"] = acquires_by_message_.load(std::memory_order_relaxed);
    for (size_t i = 0; i < data_plane_.worker_requests.size(); ++i)
      c[absl::StrCat("data_plane_worker_", i, "_requests_total")] =
          data_plane_.worker_requests[i]->load(std::memory_order_relaxed);
    c["acquires_with_push_total"] = acquires_with_push_.load(std::memory_order_relaxed);
    c["answers_in_first_block_total"] = answers_in_block_.load(std::memory_order_relaxed);
    c["spares_granted_total"] = spares_granted_.load(std::memory_order_relaxed);
    c["spares_named_total"] = spares_named_.load(std::memory_order_relaxed);
    c["releases_by_message_total"] = releases_by_message_.load(std::memory_order_relaxed);
    c["reserves_and_commits_by_message_total"] =
        controls_by_message_.load(std::memory_order_relaxed);
    c["fetches_in_one_total"] = fetched_in_one_.load(std::memory_order_relaxed);
    c["publishes_in_one_total"] = published_in_one_.load(std::memory_order_relaxed);
    c["locates_total"] = locates_.load(std::memory_order_relaxed);
    if (data_plane_.am_drops) c["am_dropped_total"] = data_plane_.am_drops->total();
    c["lookup_hit_blocks_total"] = s.lookup_hit_blocks;
    c["lookup_miss_blocks_total"] = s.lookup_miss_blocks;
    c["fetch_hit_blocks_total"] = s.acquire_hit_blocks;
    c["fetch_miss_blocks_total"] = s.acquire_miss_blocks;
    c["committed_blocks_total"] = s.committed_total;
    c["dedup_blocks_total"] = s.dedup_total;
    c["crc_failures_total"] = s.crc_failures;
    c["evictions_lru_total"] = s.evictions_lru;
    c["evictions_explicit_total"] = s.evictions_explicit;
    c["no_space_total"] = s.no_space;
    c["quota_evictions_total"] = s.quota_evictions;
    c["quota_no_space_total"] = s.quota_no_space;
    c["reservations_expired_total"] = s.reservations_expired;
    c["leases_expired_total"] = s.leases_expired;
    c["transcoded_blocks_total"] = s.transcoded;
    c["transcoded_bytes_in_total"] = s.transcoded_bytes_in;
    c["transcoded_bytes_out_total"] = s.transcoded_bytes_out;
    c["transcode_failures_total"] = s.transcode_failures;
    c["transcode_skipped_total"] = s.transcode_skipped;
    c["transcoding_blocks"] = s.transcoding_blocks;
    return grpc::Status::OK;
  });
}

grpc::Status CacheService::Locate(grpc::ServerContext* ctx, const v1::LocateRequest* req,
                                  v1::LocateResponse* resp) {
  return ServeScoped(ctx, *req, [&](const NamespaceId& ns, const std::vector<BlockId>& ids) {
    locates_.fetch_add(1, std::memory_order_relaxed);
    absl::flat_hash_set<BlockId> local;
    for (const auto& b : store_->Inspect(ids))
      if (b.ns == ns) local.insert(b.id);
    const absl::flat_hash_set<BlockId> on_gpu =
        data_plane_.gpu ? data_plane_.gpu->HeldOnDevice(ns, ids) : absl::flat_hash_set<BlockId>{};
    Cluster* cluster = cluster_.load();
    std::vector<std::vector<placement::Location>> located(ids.size());
    if (cluster && cluster->size() > 1)
      located = cluster->locator().Locate(ids, absl::Now() + cluster->peer_timeout());
    const std::string self = cluster ? cluster->self().id : data_plane_.node_id;
    auto* me = resp->add_nodes();
    me->set_id(self);
    me->set_address(cluster ? cluster->self().address : "");
    absl::flat_hash_map<std::string, uint32_t> index;
    auto view = cluster ? cluster->View() : placement::MembershipView{};
    for (size_t i = 0; i < ids.size(); ++i) {
      uint32_t count = 0;
      if (on_gpu.contains(ids[i])) {
        resp->add_holder_node(0);
        resp->add_holder_tier(v1::TIER_GPU);
        ++count;
      }
      if (local.contains(ids[i])) {
        resp->add_holder_node(0);
        resp->add_holder_tier(v1::TIER_HOST);
        ++count;
      }
      // Host copies before NVMe ones: a host read is the cheaper one to serve.
      for (int pass = 0; pass < 2; ++pass)
        for (const auto& h : located[i]) {
          bool nvme = h.tier == placement::LocationTier::kNvme;
          if ((pass == 0) == nvme || h.node == self) continue;
          const placement::NodeRecord* rec = view.Find(h.node);
          if (!rec) continue;
          auto [it, fresh] = index.try_emplace(h.node, resp->nodes_size());
          if (fresh) {
            auto* ref = resp->add_nodes();
            ref->set_id(h.node);
            ref->set_address(rec->address);
          }
          resp->add_holder_node(it->second);
          resp->add_holder_tier(nvme                                      ? v1::TIER_NVME
                                : h.tier == placement::LocationTier::kGpu ? v1::TIER_GPU
                                                                          : v1::TIER_HOST);
          ++count;
        }
      resp->add_holders_per_id(count);
    }
    return grpc::Status::OK;
  });
}

grpc::Status CacheService::Reposition(grpc::ServerContext* ctx, const v1::RepositionRequest* req,
                                      v1::RepositionResponse* resp) {
  return ServeScoped(ctx, *req, [&](const NamespaceId& ns, const std::vector<BlockId>& ids) {
    const bool to_gpu = req->target_tier() == v1::TIER_GPU;
    if (!to_gpu && req->target_tier() != v1::TIER_HOST && req->target_tier() != v1::TIER_UNKNOWN)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "target_tier must be TIER_HOST or TIER_GPU");
    const bool here = req->target_node().empty() || req->target_node() == data_plane_.node_id;
    // Another node's GPU tier: that node says whether it has one (its Pull answers).
    if (to_gpu && here && !data_plane_.gpu)
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "this node has no GPU tier (config gpu.capacity)");
    Cluster* cluster = cluster_.load();
    if (!cluster) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "cluster layer not up yet");
    auto entry = namespaces_->Find(ns);
    if (!entry) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "namespace not open");
    auto r = cluster->mover().Reposition(*entry, ids, req->target_node(), req->move(),
                                         absl::FromChrono(ctx->deadline()), to_gpu);
    if (!r.ok()) return ToGrpcStatus(r.status());
    if (to_gpu && here) {
      // Every block is on this node now (or failed): copy the ones that arrived up.
      const std::vector<BlockStatus> up = data_plane_.gpu->Promote(ns, ids);
      for (size_t i = 0; i < ids.size() && i < r->status.size(); ++i)
        if (r->status[i] == BlockStatus::kOk) r->status[i] = up[i];
    }
    AddStatuses(r->status, resp->mutable_status());
    resp->set_copied(r->copied);
    resp->set_already_there(r->already_there);
    resp->set_removed_sources(r->removed_sources);
    return grpc::Status::OK;
  });
}

void CacheService::DropAm(uint16_t id, const transport::AmMessage& m, std::string_view why) {
  if (data_plane_.am_drops) data_plane_.am_drops->Note(id, m, why);
}

std::optional<am_wire::LookupRequestHeader> CacheService::OpenAmRequest(
    const transport::AmMessage& m, const AmScopedKind& kind) {
  // Without a reply endpoint or a request id there is nobody to answer: dropped.
  auto request = am_wire::DecodeLookupRequestHeader(m.header);
  if (m.reply_ep == nullptr || !request)
    DropAm(kind.request_am, m,
           absl::StrCat(kind.what, " request without a reply endpoint or with a header that is "
                                   "not 40 or 56 bytes"));
  return m.reply_ep == nullptr ? std::nullopt : request;
}

std::optional<Caller> CacheService::AmCaller(std::string_view ticket) const {
  return auth_->enabled() ? am_tickets_.Find(ticket) : std::optional<Caller>(TrustedCaller());
}

template <typename Answer>
void CacheService::ServeAmScoped(const transport::AmMessage& m, transport::Worker* worker,
                                 AmScopedKind kind, Answer&& answer,
                                 std::optional<KeepAnswer> keep) {
  namespace w = am_wire;
  const auto request = OpenAmRequest(m, kind);
  if (!request) return;
  const auto t0 = std::chrono::steady_clock::now();
  w::ReplyHeader h;
  h.request_id = request->request_id;
  std::string data;
  absl::StatusCode code = absl::StatusCode::kOk;
  auto fail = [&](absl::StatusCode failure, std::string message) {
    if (failure == absl::StatusCode::kInvalidArgument) DropAm(kind.request_am, m, message);
    code = failure;
    h.code = static_cast<uint32_t>(failure);  // am_wire carries absl codes
    data = std::move(message);
  };
  CallScope call(this);
  // An active message carries no credentials: with authentication its ticket names the caller
  // (an authenticated Connect issued it), and the same tenant check as gRPC's applies.
  const std::optional<Caller> caller = AmCaller(request->ticket);
  if (!call.admitted()) {
    fail(absl::StatusCode::kUnavailable, "stratad is shutting down");
  } else if (!caller) {
    fail(absl::StatusCode::kPermissionDenied,
         absl::StrCat("active-message ", kind.what,
                      " without a valid ticket (authentication is on: Connect issues one)"));
  } else if (auto parsed = UnpackIds(m.data, "ids", w::kMaxIds); !parsed.ok()) {
    fail(parsed.status().code(), std::string(parsed.status().message()));
  } else if (auto ns = CheckNamespaceId(request->ns, IsOpenIn(*namespaces_)); !ns.ok()) {
    fail(ns.status().code(), std::string(ns.status().message()));
  } else if (!MayUseNamespace(*caller, *ns)) {
    fail(absl::StatusCode::kPermissionDenied,
         "the namespace belongs to another tenant than the ticket's");
  } else {
    answer(*ns, *parsed, *caller, &h, &data);
  }
  // An incomplete answer sends the client to the gRPC call, which counts itself.
  const bool counted = h.complete;
  if (!(keep && code == absl::StatusCode::kOk && h.complete && (*keep)(h, &data)))
    worker->AmReply(m.reply_ep, kind.reply_am, w::EncodeReplyHeader(h), std::move(data));
  if (metrics_ && counted)
    metrics_->Record(kind.rpc, static_cast<int>(ToGrpcCode(code)),
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

void CacheService::HandleAmLookup(const transport::AmMessage& m, transport::Worker* worker) {
  ServeAmScoped(m, worker, {am_wire::kLookupRequestAm, am_wire::kLookupReplyAm,
                            RpcMetrics::kLookup, "lookup"},
                [&](const NamespaceId& ns, const std::vector<BlockId>& ids, const Caller&,
                    am_wire::ReplyHeader* h, std::string* data) {
                  std::vector<Tier> tiers;
                  const size_t n = store_->Lookup(ns, ids, &tiers);
                  Cluster* cluster = cluster_.load();
                  // Blocks past the local prefix may be on other nodes: only the gRPC Lookup
                  // asks them.
                  h->complete = n == ids.size() || !cluster || cluster->size() <= 1;
                  h->prefix = static_cast<uint32_t>(n);
                  data->resize(n);
                  for (size_t i = 0; i < n; ++i) (*data)[i] = static_cast<char>(ToProto(tiers[i]));
                  if (metrics_ && h->complete) {
                    const uint64_t tpb = namespaces_->TokensPerBlock(ns);
                    metrics_->AddLookupTokens(n * tpb, (ids.size() - n) * tpb);
                    metrics_->AddFastLookup();
                  }
                });
}

void CacheService::HandleAmAcquire(const transport::AmMessage& m, transport::Worker* worker) {
  ServeAmAcquire(m, worker, am_wire::kAcquireRequestAm, nullptr);
}

// The blocks are copied into the answer under a lease that ends before it is sent: nothing
// outlives the call, so no Release follows.
bool CacheService::AnswerableHere(const NamespaceId& ns, std::span<const BlockId> ids,
                                  std::span<const BlockInfo> resident) const {
  if (!std::all_of(resident.begin(), resident.end(),
                   [&](const BlockInfo& b) { return b.ns == ns; }))
    return false;
  if (resident.size() == ids.size()) return true;
  absl::flat_hash_set<BlockId> here;
  for (const BlockInfo& b : resident) here.insert(b.id);
  return std::none_of(ids.begin(), ids.end(),
                      [&](const BlockId& id) { return !here.contains(id) && store_->Holds(id); });
}

void CacheService::HandleAmFetchInOne(const transport::AmMessage& m, transport::Worker* worker) {
  ServeAmScoped(
      m, worker,
      {am_wire::kFetchInOneAm, am_wire::kFetchInOneReplyAm, RpcMetrics::kAcquire, "fetch in one"},
      [&](const NamespaceId& ns, const std::vector<BlockId>& ids, const Caller& caller,
          am_wire::ReplyHeader* h, std::string* data) {
        // As an acquire by message: only what needs no disk read, and no more than one eager
        // message carries.
        const std::vector<BlockInfo> resident = store_->Inspect(ids);
        uint64_t total = 0;
        for (const BlockInfo& b : resident) total += b.size;
        h->complete = total <= am_wire::kMaxFetchInOneBytes && AnswerableHere(ns, ids, resident);
        h->prefix = static_cast<uint32_t>(ids.size());
        uint8_t* const arena = store_->arena_base();
        if (arena == nullptr) h->complete = false;
        if (!h->complete) return;
        v1::AcquireResponse resp;
        AcquireInto(ns, ids, caller, &resp);
        const uint64_t lease_id = resp.lease_id();
        std::vector<ArenaExtent> extents;  // the leased blocks', before the answer drops them
        for (int i = 0; i < resp.status_size(); ++i)
          if (resp.status(i) == v1::BLOCK_OK) extents.push_back({resp.offsets(i), resp.sizes(i)});
        resp.set_lease_id(0);
        resp.clear_offsets();
        // The blocks go straight after the prefix: one copy out of the arena, under the lease.
        *data = am_wire::EncodeFetchInOnePrefix(resp.SerializeAsString());
        data->reserve(data->size() + total);
        for (const ArenaExtent& e : extents)
          data->append(reinterpret_cast<const char*>(arena) + e.offset, e.size);
        EndLease(lease_id).IgnoreError();
        fetched_in_one_.fetch_add(1, std::memory_order_relaxed);
      });
}

bool CacheService::ServeAmAcquire(const transport::AmMessage& m, transport::Worker* worker,
                                  uint16_t request_am, v1::AcquireResponse* granted,
                                  std::optional<HeldAnswer>* held) {
  bool leased = false;
  auto hold = [&](const am_wire::ReplyHeader& h, std::string* data) {
    const bool some_block = std::any_of(granted->status().begin(), granted->status().end(),
                                        [](int s) { return s == v1::BLOCK_OK; });
    if (!leased || !some_block || data->size() > am_wire::kMaxAnswerInBlockBytes) return false;
    held->emplace(HeldAnswer{h, std::move(*data)});
    return true;
  };
  std::optional<KeepAnswer> keep;
  if (held != nullptr && granted != nullptr) keep.emplace(hold);
  ServeAmScoped(m, worker, {request_am, am_wire::kAcquireReplyAm, RpcMetrics::kAcquire, "acquire"},
                [&](const NamespaceId& ns, const std::vector<BlockId>& ids,
                    const Caller& caller, am_wire::ReplyHeader* h, std::string* data) {
                  // Only what needs no disk read is answered here (AnswerableHere). (Inspect sees
                  // committed host blocks and, unlike Lookup, counts nothing.)
                  const std::vector<BlockInfo> resident = store_->Inspect(ids);
                  h->complete = AnswerableHere(ns, ids, resident);
                  h->prefix = static_cast<uint32_t>(ids.size());
                  // A push is bounded as a push fetch is (am_wire::DecodeFetchExtents): one
                  // request never sends more than the arena holds, whatever ids repeat.
                  uint64_t total = 0;
                  for (const BlockInfo& b : resident) total += b.size;
                  if (granted != nullptr && total > store_->arena_bytes()) h->complete = false;
                  if (!h->complete) return;
                  v1::AcquireResponse resp;
                  AcquireInto(ns, ids, caller, &resp);
                  *data = resp.SerializeAsString();
                  acquires_by_message_.fetch_add(1, std::memory_order_relaxed);
                  leased = resp.lease_id() != 0;
                  if (granted != nullptr) *granted = std::move(resp);
                },
                keep);
  return leased;
}

void CacheService::HandleAmRelease(const transport::AmMessage& m) {
  const auto release = am_wire::DecodeReleaseHeader(m.header);
  if (!release)
    return DropAm(am_wire::kReleaseAm, m, "release with a header that is not 8 or 24 bytes");
  const std::optional<Caller> caller = AmCaller(release->ticket);
  if (!caller)
    return DropAm(am_wire::kReleaseAm, m, "release without a valid ticket (authentication is on)");
  CallScope call(this);
  if (!call.admitted()) return;  // draining: the lease expires
  // Another tenant's lease is left alone, as by the gRPC Release; an unknown or already
  // released one changes nothing.
  if (!id_owners_.Allowed(release->lease_id, *caller)) return;
  releases_by_message_.fetch_add(1, std::memory_order_relaxed);
  EndLease(release->lease_id).IgnoreError();
}

absl::Status CacheService::EndLease(uint64_t lease_id) {
  if (lease_id == 0) return absl::NotFoundError("lease 0 is never granted");
  absl::Status released = store_->Release(lease_id);
  if (released.ok()) id_owners_.Forget(lease_id);
  return released;
}

}  // namespace strata::daemon
