#include "daemon/daemon.h"

#include <grpcpp/grpcpp.h>
#include <openssl/rand.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "codec/codec.h"
#include "common/am_wire.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "daemon/admin_service.h"
#include "daemon/auth.h"
#include "daemon/cache_service.h"
#include "daemon/calibrations/calibration_service.h"
#include "daemon/calibrations/calibration_store.h"
#include "daemon/device/device_service.h"
#include "daemon/cluster/cluster.h"
#include "daemon/daemon_metrics.h"
#include "daemon/events/kv_event_publisher.h"
#include "daemon/host_memory.h"
#include "daemon/http_server.h"
#include "daemon/metrics.h"
#include "daemon/namespace_registry.h"
#include "daemon/peer_service.h"
#include "daemon/tls_setup.h"
#include "daemon/transcode/transcoder.h"
#include "daemon/zone_server.h"
#include "storage/arena.h"
#include "storage/block_store.h"
#include "storage/host_block_store.h"
#include "storage/host_tier.h"
#include "storage/gpu/gpu_tiered_store.h"
#include "transport/device_link.h"
#include "storage/tiered_store.h"
#include "storage/zoned_arena.h"
#include "transport/ucx.h"

namespace strata::daemon {

// Everything one running stratad holds, and the steps that start it (in the order of Start).
struct Daemon::Impl {
  // A start that failed part way never runs Shutdown: the progress threads could still be in
  // handlers that reach the service and the cluster, which are destroyed before them.
  ~Impl() {
    am_service.store(nullptr, std::memory_order_release);
    am_device_service.store(nullptr, std::memory_order_release);
    cluster_ptr.store(nullptr, std::memory_order_release);
    for (auto& p : more_progress) p->Stop();
    if (progress) progress->Stop();
  }
  // HTTP first, so /healthz answers (and /readyz says "starting") while a large arena faults
  // in.
  absl::Status StartHttp();
  // UCX context and worker, the arena registered once (clients get its address and rkey at
  // Connect), the active-message handlers, and the worker's progress thread.
  absl::Status OpenDataPlane();
  // The host tier over the arena, the NVMe tier under it when configured, the namespaces.
  absl::Status OpenStore(std::string secret);
  // The gRPC services and server; sets `endpoint` to the address bound.
  absl::Status StartServices();
  // Membership and the cluster layer (they need the bound address).
  absl::Status StartCluster();
  // The KV event publisher when configured, and the store's change hook feeding it and the
  // cluster's directory.
  absl::Status StartEvents();
  // The tokens file and this node's peer token (config section auth), the TLS credentials
  // (section tls, files read and checked here); the warning when serving without
  // authentication.
  absl::Status LoadAuth();
  // Ends expired reservations, leases and pins in the background.
  void StartReclaim();
  void LogStarted() const;

  DaemonConfig config;
  std::string node_id;
  std::string endpoint;
  MetricsRegistry metrics;  // outlives everything that records into it
  std::unique_ptr<RpcMetrics> rpc_metrics;
  std::unique_ptr<StoreSeries> store_series;
  std::shared_ptr<transport::Context> ucx;
  AmDrops am_drops;  // outlives the worker, whose handlers count into it
  // Requests each worker answered, the first worker's first (Stats'
  // data_plane_worker_N_requests_total); outlives the workers, whose handlers count into it.
  // A cache line each: every count is bumped on its own worker's thread, per request.
  struct alignas(64) WorkerRequests {
    std::atomic<uint64_t> n{0};
  };
  std::unique_ptr<WorkerRequests[]> worker_requests;
  std::unique_ptr<transport::Worker> worker;
  std::vector<std::unique_ptr<transport::Worker>> more_workers;  // data_plane_workers - 1
  std::unique_ptr<MmapArena> mmap_arena;            // when the arena is ours
  std::unique_ptr<ZonedArena> zoned_arena;          // several tenants: a zone each
  std::unique_ptr<transport::MemoryRegion> region;  // the arena as UCX sees it
  bool huge_pages = false;                          // the mmap arena got huge pages
  bool clients_map_arena = true;                    // OpenDataPlane: Connect hands out the key
  MappingPages arena_pages;                         // what backs the arena
  std::unique_ptr<transport::ProgressThread> progress;
  std::vector<std::unique_ptr<transport::ProgressThread>> more_progress;  // more_workers' threads
  std::unique_ptr<HostTier> tier;
  // What the services and the cluster see: `tier` alone, or the TieredStore over it (then
  // `tiered` is that same object, stopped before `tier` goes); with a GPU tier, the
  // GpuTieredStore over either (`gpu`), which then holds the one below in `below_gpu`.
  std::unique_ptr<BlockStore> below_gpu;
  std::unique_ptr<BlockStore> store;
  TieredStore* tiered = nullptr;
  GpuTieredStore* gpu = nullptr;
  std::unique_ptr<NamespaceRegistry> namespaces;
  std::unique_ptr<Authenticator> auth;  // never null; enabled() with auth.tokens_file
  std::string peer_token;               // for calls to other daemons; empty: none
  // TLS (config tls): the server's credentials on `listen`, and what calls to other daemons
  // carry (peer_token included).
  std::shared_ptr<grpc::ServerCredentials> server_credentials;
  client::ChannelSecurity peer_security;
  std::unique_ptr<CacheService> service;
  std::atomic<CacheService*> am_service{nullptr};
  // Read-only zones: the staging windows clients lend to publish through (ZoneServer).
  std::unique_ptr<StagingTable> stagings;
  std::unique_ptr<ZoneServer> zone_server;  // with zoned_arena; asks `service` about tickets
  std::unique_ptr<AdminService> admin;
  std::unique_ptr<PeerService> peer;
  // The namespaces' calibrations (codec mode pca) under <data_dir>/calibrations.
  std::unique_ptr<CalibrationStore> calibrations;
  std::unique_ptr<CalibrationService> calibration_service;
  // Rewrites cold blocks of namespaces with a cold codec instead of evicting them.
  std::unique_ptr<Transcoder> transcoder;
  // Device buffers same-node engines lend for fetches from the GPU tier.
  std::unique_ptr<DeviceService> device_service;
  std::atomic<DeviceService*> am_device_service{nullptr};  // once it serves messages
  std::unique_ptr<grpc::Server> server;
  // Set once membership is up.
  std::unique_ptr<Cluster> cluster;
  std::atomic<Cluster*> cluster_ptr{nullptr};
  std::unique_ptr<KvEventPublisher> events;
  absl::Notification stop_reclaim;
  std::thread reclaim;
  bool shut_down = false;
  // Read by HTTP threads: set once the tier and namespaces exist (never cleared), and while the
  // gRPC server serves and is not draining.
  std::atomic<bool> tier_open{false};
  std::atomic<bool> serving{false};
  std::atomic<bool> shut_down_started{false};
  // Last member: destroyed (stopped) first, so its handlers never see a destroyed member.
  std::unique_ptr<HttpServer> http;
};

namespace {

absl::StatusOr<std::string> LoadOrCreateSecret(const DaemonConfig& c) {
  std::string path = c.cluster_secret_file;
  if (path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(c.data_dir, ec);
    if (ec)
      return absl::FailedPreconditionError(
          absl::StrCat("config field 'data_dir': cannot create ", c.data_dir, ": ", ec.message()));
    path = c.data_dir + "/cluster_secret";
    if (!std::filesystem::exists(path)) {
      unsigned char raw[32];
      if (RAND_bytes(raw, sizeof raw) != 1)
        return absl::InternalError("cannot draw random bytes for the cluster secret");
      std::string hex =
          absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(raw), sizeof raw));
      std::ofstream out(path, std::ios::trunc);
      out << hex << "\n";
      if (!out)
        return absl::FailedPreconditionError(absl::StrCat("cannot write cluster secret ", path));
      chmod(path.c_str(), 0600);
      spdlog::info("generated a new cluster secret in {}", path);
    }
  }
  std::ifstream in(path);
  if (!in)
    return absl::FailedPreconditionError(
        absl::StrCat("config field 'cluster_secret_file': cannot read ", path));
  std::string secret;
  std::getline(in, secret);
  secret = std::string(absl::StripAsciiWhitespace(secret));
  if (secret.size() < 16)
    return absl::FailedPreconditionError(absl::StrCat("config field 'cluster_secret_file': ", path,
                                                      " must hold at least 16 characters"));
  return secret;
}

std::string Hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

// The NVMe tier (config section 'nvme') under `host`, its catalog recovered; logged.
absl::StatusOr<std::unique_ptr<TieredStore>> OpenTieredStore(const DaemonConfig& config,
                                                             HostTier* host) {
  const NvmeTierConfig& nvme = config.nvme;
  TieredStoreOptions n;
  for (const NvmeFileConfig& f : nvme.files) n.nvme.tier.files.push_back({f.path, f.capacity});
  n.nvme.tier.queue_depth = nvme.queue_depth;
  n.nvme.tier.sync_after_write = nvme.sync_after_write;
  // Promotions run on gRPC handler threads, which come and go: one ring for all of them.
  n.nvme.tier.shared_ring = true;
  n.nvme.catalog_path = NvmeCatalogDir(config);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(n.nvme.catalog_path).parent_path(), ec);
  n.nvme_high_watermark = nvme.high_watermark;
  n.nvme_low_watermark = nvme.low_watermark;
  n.nvme_policy = nvme.policy;
  n.admission = nvme.admission;
  n.warn = [](const std::string& msg) { spdlog::warn("{}", msg); };
  auto tiered = TieredStore::Open(host, std::move(n));
  if (!tiered.ok())
    return absl::Status(tiered.status().code(), absl::StrCat("nvme tier (config section 'nvme'): ",
                                                             tiered.status().message()));
  const NvmeTier& t = (*tiered)->nvme_tier();
  const NvmeRecoveryReport& rec = (*tiered)->recovery();
  spdlog::info(
      "nvme tier: {} in {} file(s), io {} (queue depth {}{}), {}; catalog {}: recovered {} "
      "blocks of {} entries in {} (dropped: {} undecodable, {} missing extent, {} overlapping)",
      FormatSize(t.capacity_bytes()), t.file_count(), NvmeIoBackendName(t.io_backend()),
      t.queue_depth(), t.registered_buffers() ? ", registered buffers" : "",
      t.direct_io() ? "O_DIRECT" : "buffered (the filesystem refused O_DIRECT)",
      NvmeCatalogDir(config), rec.entries_kept, rec.entries_loaded,
      absl::FormatDuration(rec.elapsed), rec.dropped_undecodable, rec.dropped_missing_extent,
      rec.dropped_overlapping);
  if (!t.io_uring_error().empty())
    spdlog::warn("nvme tier: io_uring unavailable ({}); using the thread-pool fallback",
                 t.io_uring_error());
  return tiered;
}

// The GPU tier (config section 'gpu') over `below`; logged.
absl::StatusOr<std::unique_ptr<GpuTieredStore>> OpenGpuTier(const DaemonConfig& config,
                                                            BlockStore* below) {
  const GpuTierConfig& g = config.gpu;
  absl::StatusOr<std::unique_ptr<DeviceMemory>> memory;
  if (g.memory == "host-stand-in") {
    // Host memory in the device's place: held to the same bound as the host tier beside it.
    const HostMemory m = ReadHostMemory();
    const uint64_t limit = MaxHostCapacity(m);
    if (config.host.capacity + g.capacity > limit)
      return absl::InvalidArgumentError(absl::StrCat(
          "config field 'gpu.capacity': ", FormatSize(g.capacity),
          " of host memory standing in for the device, with host_tier.capacity ",
          FormatSize(config.host.capacity), ", exceeds the ", FormatSize(limit),
          " this host can hold"));
    auto stand_in = HostStandInMemory::Create(g.capacity);
    if (stand_in.ok()) memory = std::move(*stand_in);
    else memory = stand_in.status();
  } else {
    memory = OpenCudaDeviceMemory(g.device, g.capacity);
  }
  if (!memory.ok())
    return absl::Status(memory.status().code(),
                        absl::StrCat("gpu tier (config section 'gpu'): ",
                                     memory.status().message()));
  GpuTieredStoreOptions o;
  o.device.high_watermark = g.high_watermark;
  o.device.low_watermark = g.low_watermark;
  o.device.eviction_policy = g.policy;
  o.device.reservation_timeout = config.host.reservation_timeout;
  o.device.lease_timeout = config.host.lease_timeout;
  o.device.max_pin_ttl = config.host.max_pin_ttl;
  o.device.tenant_max_share = config.limits.tenant_max_share;
  o.device.max_block_bytes = std::min(config.host.max_block_size, g.capacity);
  o.warn = [](const std::string& msg) { spdlog::warn("{}", msg); };
  const std::string kind((*memory)->kind());
  auto opened = GpuTieredStore::Open(below, std::move(*memory), std::move(o));
  if (!opened.ok()) return opened.status();
  spdlog::info("gpu tier: {} of {} memory (device {}), policy {}", FormatSize(g.capacity), kind,
               g.device, g.policy);
  return opened;
}

// How this node's GPU tier reaches other nodes' device to device: NCCL for device memory (when
// libnccl loads), the TCP stand-in between stand-in pools (listening on the advertised host).
// Null, logged, when there is no way: blocks then go over UCX and are promoted on arrival.
std::unique_ptr<transport::DeviceLinkFactory> DeviceLinksFor(const GpuTierConfig& g,
                                                             const std::string& address) {
  if (g.memory == "host-stand-in") {
    std::string host = address.substr(0, address.rfind(':'));
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
      host = host.substr(1, host.size() - 2);
    spdlog::info("device links: stand-in over TCP on {}", host);
    return transport::NewStandInLinkFactory(host);
  }
  auto nccl = transport::NewNcclLinkFactory(g.device);
  if (!nccl.ok()) {
    spdlog::info("device links off ({}); blocks reach other GPU tiers over UCX",
                 nccl.status().ToString());
    return nullptr;
  }
  spdlog::info("device links: NCCL on device {}", g.device);
  return std::move(*nccl);
}

}  // namespace

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Daemon::~Daemon() { Shutdown(); }

const std::string& Daemon::endpoint() const { return impl_->endpoint; }

const std::string& Daemon::events_endpoint() const {
  static const std::string kNone;
  return impl_->events ? impl_->events->endpoint() : kNone;
}

const std::string& Daemon::events_replay_endpoint() const {
  static const std::string kNone;
  return impl_->events ? impl_->events->replay_endpoint() : kNone;
}

const std::string& Daemon::http_endpoint() const {
  static const std::string kNone;
  return impl_->http ? impl_->http->endpoint() : kNone;
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonConfig& config) {
  STRATA_RETURN_IF_ERROR(ValidateConfig(config));
  // Before anything is allocated: an arena larger than the host is refused here, not met by the
  // OOM killer halfway through faulting it in.
  const HostMemory memory = ReadHostMemory();
  std::vector<std::string> warnings;
  STRATA_RETURN_IF_ERROR(CheckHostCapacity(config.host, memory, &warnings));
  for (const std::string& w : warnings) spdlog::warn("{}", w);
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->node_id = config.node_id.empty() ? Hostname() : config.node_id;
  STRATA_ASSIGN_OR_RETURN(std::string secret, LoadOrCreateSecret(config));
  STRATA_RETURN_IF_ERROR(impl->LoadAuth());
  STRATA_RETURN_IF_ERROR(impl->StartHttp());
  STRATA_RETURN_IF_ERROR(impl->OpenDataPlane());
  STRATA_RETURN_IF_ERROR(impl->OpenStore(std::move(secret)));
  STRATA_RETURN_IF_ERROR(impl->StartServices());
  STRATA_RETURN_IF_ERROR(impl->StartCluster());
  STRATA_RETURN_IF_ERROR(impl->StartEvents());
  impl->StartReclaim();
  impl->serving.store(true, std::memory_order_release);
  impl->LogStarted();
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
}

absl::Status Daemon::Impl::LoadAuth() {
  if (!config.auth.peer_token_file.empty()) {
    STRATA_ASSIGN_OR_RETURN(peer_token, ReadTokenFile(config.auth.peer_token_file));
  }
  STRATA_ASSIGN_OR_RETURN(server_credentials, LoadServerCredentials(config.tls));
  STRATA_ASSIGN_OR_RETURN(peer_security, LoadPeerSecurity(config.tls, peer_token));
  if (config.tls.enabled())
    spdlog::info("TLS on {}{}{}", config.listen,
                 config.tls.client_ca_file.empty() ? ""
                 : config.tls.require_client_cert  ? ", client certificates required"
                                                   : ", client certificates verified",
                 config.tls.peer_ca_file.empty() ? "" : "; TLS to other nodes");
  if (config.auth.tokens_file.empty()) {
    auth = std::make_unique<Authenticator>();
    if (!IsLoopbackListen(config.listen))
      spdlog::warn(
          "INSECURE: serving {} without authentication (insecure: true): anyone who "
          "reaches it can read, overwrite and evict every tenant's blocks; set "
          "auth.tokens_file (docs/security.md)",
          config.listen);
    return absl::OkStatus();
  }
  STRATA_ASSIGN_OR_RETURN(auth, Authenticator::Load(config.auth.tokens_file));
  if (auth->maps_certificates()) {
    if (config.tls.client_ca_file.empty())
      return absl::InvalidArgumentError(
          "config field 'auth.tokens_file': maps client certificates (cn: / san: lines), but "
          "tls.client_ca_file is not set, so no client certificate is asked for or verified");
    auth->TrustVerifiedClientCertificates();
  }
  // With TLS to the other nodes this node's certificate may be what identifies it to them.
  const bool peer_certificate = peer_security.tls != nullptr && config.tls.enabled();
  if (peer_token.empty() && !peer_certificate && config.cluster.membership == "etcd")
    spdlog::warn(
        "auth.tokens_file is set but auth.peer_token_file is not: calls to other "
        "nodes carry no token and they will refuse them");
  return absl::OkStatus();
}

absl::Status Daemon::Impl::StartHttp() {
  rpc_metrics = std::make_unique<RpcMetrics>(&metrics);
  metrics
      .AddGauge("strata_build_info", "Always 1; labels carry the stratad version.",
                {{"version", STRATA_VERSION}})
      ->Set(1);
  RegisterProcessMetrics(&metrics);
  if (config.http_listen.empty()) return absl::OkStatus();
  Histogram* render_time = metrics.AddHistogram(
      "strata_metrics_render_duration_seconds",
      "Time stratad took to build a /metrics response (read tier stats and render).",
      LatencyBucketsSeconds());
  metrics.AddCollector([this] {
    if (tier_open.load(std::memory_order_acquire))
      store_series->Collect(*store, *namespaces, serving.load(std::memory_order_acquire),
                            service->in_flight());
  });
  HttpServer::Handlers h;
  h.metrics = [this, render_time] {
    auto t0 = std::chrono::steady_clock::now();
    std::string text = metrics.Render();
    render_time->Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return text;
  };
  h.ready = [this](std::string* why) {
    if (serving.load(std::memory_order_acquire)) {
      // Still ready: blocks are served from host memory (and NVMe reads work); the pod must not
      // leave its Service or stall a DaemonSet rollout over a full disk. The body and
      // strata_tier_degraded say so instead.
      std::string nvme;
      if (tiered && tiered->Degraded(&nvme)) *why = absl::StrCat("nvme tier: ", nvme);
      return true;
    }
    *why = shut_down_started.load() ? "draining" : "starting (host tier or gRPC not up)";
    return false;
  };
  STRATA_ASSIGN_OR_RETURN(http, HttpServer::Start(config.http_listen, std::move(h)));
  return absl::OkStatus();
}

absl::Status Daemon::Impl::OpenDataPlane() {
  const HostTierConfig& host = config.host;
  // With authentication no peer may put or get this process's memory: UCX's software RMA
  // (tcp) would write and read wherever a message says, remote key or not; and UCX's tcp
  // transport itself does so for its put requests, so tcp stays off unless the operator trusts
  // every host that reaches it.
  //
  // One tenant (the common deployment) keeps the fast path: its clients map the arena as
  // without authentication, since there is no other tenant's data to guard, as long as tcp is
  // off. Shared memory and RDMA check access in the kernel or the NIC; software RMA over tcp
  // would serve anyone who reaches the port, token or not.
  const bool authenticated = auth && auth->enabled();
  transport::ContextOptions ucx_options;
  ucx_options.wakeup = true;
  ucx_options.unnamed_allocations = true;
  ucx_options.workers_on_threads = true;
  ucx_options.tcp = !authenticated || config.auth.ucx_tcp_trusted;
  const bool one_tenant = authenticated && auth->tenants().size() <= 1;
  clients_map_arena = !authenticated || (one_tenant && !ucx_options.tcp);
  ucx_options.rma = clients_map_arena;
  auto created = transport::Context::Create(ucx_options);
  if (!created.ok())
    return absl::Status(created.status().code(),
                        absl::StrCat("data plane: ", created.status().message(),
                                     ucx_options.tcp ? ""
                                                     : " (authentication keeps UCX tcp off; "
                                                       "see auth.ucx_tcp_trusted)"));
  ucx = std::move(*created);
  if (!ucx_options.tcp) spdlog::info("data plane: UCX tcp off (authentication on)");
  if (authenticated)
    spdlog::info(clients_map_arena
                     ? "data plane: one tenant, clients map the arena"
                     : "data plane: clients get no remote key; blocks move by checked messages");
  STRATA_ASSIGN_OR_RETURN(worker, transport::Worker::Create(ucx));
  if (authenticated && !one_tenant) {
    // Each tenant's blocks in a file of its own, which that tenant's clients on this node map
    // read-only (ZoneServer): fetches by plain copies, with no other tenant's byte in reach.
    auto zoned = ZonedArena::Create(host.capacity, auth->tenants(), /*prefault=*/true,
                                    config.auth.tenant_zones_writable);
    if (zoned.ok()) {
      zoned_arena = std::move(*zoned);
      STRATA_ASSIGN_OR_RETURN(region, ucx->Register(zoned_arena->data(), zoned_arena->size()));
      spdlog::info("host tier: {} tenant zones of {} (common zone {}); huge pages not used",
                   zoned_arena->zones().size() - 1, FormatSize(zoned_arena->zones().back().size),
                   FormatSize(zoned_arena->zones().front().size));
    } else if (zoned.status().code() == absl::StatusCode::kInvalidArgument) {
      // More tenants than the capacity has zones for: a tokens file that grew must not stop the
      // daemon. Blocks then move by checked messages only, as before zones existed.
      spdlog::warn("host tier: no tenant zones ({}); fetches and publishes go by messages",
                   zoned.status().ToString());
    } else {
      return zoned.status();
    }
  }
  if (!region && host.arena != ArenaSource::kMmap) {
    auto allocated = ucx->Allocate(host.capacity);
    if (allocated.ok()) {
      region = std::move(*allocated);
      // Fault every page in now: otherwise the first publish into each page pays a page fault
      // inside the client's RMA, which shows up as a publish-latency spike.
      std::memset(region->data(), 0, region->size());
    } else if (host.arena == ArenaSource::kUcx) {
      return allocated.status();
    } else {
      spdlog::warn("UCX could not allocate the arena ({}); using an mmap arena",
                   allocated.status().ToString());
    }
  }
  if (!region) {
    STRATA_ASSIGN_OR_RETURN(mmap_arena, MmapArena::Create(host.capacity, host.huge_pages));
    huge_pages = mmap_arena->huge_pages();
    STRATA_ASSIGN_OR_RETURN(region, ucx->Register(mmap_arena->data(), mmap_arena->size()));
  }
  // Every worker answers the same messages, each on its own progress thread (a client's
  // endpoint lives on one worker: its requests and replies stay on that thread).
  auto install = [&](transport::Worker* w, std::atomic<uint64_t>* requests) -> absl::Status {
    // Installed before the progress thread runs (the worker is serialized); lookups arriving
    // before the service exists are dropped and their senders fall back to gRPC.
    // First: every id then has a handler, so unknown ids and misrouted rendezvous payloads are
    // counted and logged at a bounded rate instead of warned about by UCX once per message.
    STRATA_RETURN_IF_ERROR(
        w->SetAmDropHandler([this](uint16_t id, const transport::AmMessage& m,
                                   std::string_view why) { am_drops.Note(id, m, why); }));
    // A request the Cache service answers on this worker; one that comes before the service
    // exists is dropped (its sender falls back to gRPC or times out).
    using AmMethod = void (CacheService::*)(const transport::AmMessage&, transport::Worker*);
    auto serve = [this, w, requests](uint16_t id, AmMethod handle) {
      return w->SetAmHandler(id, [this, w, requests, handle](const transport::AmMessage& m) {
        CacheService* s = am_service.load(std::memory_order_acquire);
        if (!s) return;
        requests->fetch_add(1, std::memory_order_relaxed);
        (s->*handle)(m, w);
      });
    };
    STRATA_RETURN_IF_ERROR(serve(am_wire::kLookupRequestAm, &CacheService::HandleAmLookup));
    STRATA_RETURN_IF_ERROR(serve(am_wire::kAcquireRequestAm, &CacheService::HandleAmAcquire));
    STRATA_RETURN_IF_ERROR(
        serve(am_wire::kAcquirePushRequestAm, &CacheService::HandleAmAcquirePush));
    STRATA_RETURN_IF_ERROR(
        serve(am_wire::kAcquirePushAnsweredRequestAm, &CacheService::HandleAmAcquirePushAnswered));
    STRATA_RETURN_IF_ERROR(
        serve(am_wire::kAcquirePushPiecesRequestAm, &CacheService::HandleAmAcquirePushPieces));
    STRATA_RETURN_IF_ERROR(serve(am_wire::kReserveRequestAm, &CacheService::HandleAmReserve));
    STRATA_RETURN_IF_ERROR(serve(am_wire::kCommitRequestAm, &CacheService::HandleAmCommit));
    STRATA_RETURN_IF_ERROR(serve(am_wire::kPublishInOneAm, &CacheService::HandleAmPublishInOne));
    STRATA_RETURN_IF_ERROR(serve(am_wire::kFetchInOneAm, &CacheService::HandleAmFetchInOne));
    STRATA_RETURN_IF_ERROR(
        serve(am_wire::kPublishStagedManyAm, &CacheService::HandleAmPublishStagedMany));
    STRATA_RETURN_IF_ERROR(
        w->SetAmHandler(am_wire::kAbortAm, [this](const transport::AmMessage& m) {
          CacheService* s = am_service.load(std::memory_order_acquire);
          if (s) s->HandleAmAbort(m);
        }));
    STRATA_RETURN_IF_ERROR(
        w->SetAmHandler(am_wire::kReleaseAm, [this, requests](const transport::AmMessage& m) {
          CacheService* s = am_service.load(std::memory_order_acquire);
          if (!s) return;
          requests->fetch_add(1, std::memory_order_relaxed);
          s->HandleAmRelease(m);
        }));
    STRATA_RETURN_IF_ERROR(serve(am_wire::kFetchRequestAm, &CacheService::HandleAmFetch));
    STRATA_RETURN_IF_ERROR(
        w->SetAmHandler(am_wire::kDeviceFetchAm, [this, w](const transport::AmMessage& m) {
          DeviceService* s = am_device_service.load(std::memory_order_acquire);
          if (s) s->HandleAmFetch(m, w);
        }));
    STRATA_RETURN_IF_ERROR(w->SetAmRendezvousHandler(
        am_wire::kPublishBlockAm, [this, w](const transport::AmMessage& m) {
          CacheService* s = am_service.load(std::memory_order_acquire);
          if (s) return s->HandleAmPublish(m, w);
          am_drops.Note(am_wire::kPublishBlockAm, m, "published block before the service started");
          return false;
        }));
    STRATA_RETURN_IF_ERROR(
        w->SetAmHandler(am_wire::kPublishPieceAm, [this, w](const transport::AmMessage& m) {
          CacheService* s = am_service.load(std::memory_order_acquire);
          if (s) return s->HandleAmPublishPiece(m, w);
          am_drops.Note(am_wire::kPublishPieceAm, m, "published piece before the service started");
        }));
    STRATA_RETURN_IF_ERROR(
        w->SetAmHandler(am_wire::kPublishStagedAm, [this, w](const transport::AmMessage& m) {
          CacheService* s = am_service.load(std::memory_order_acquire);
          if (s) return s->HandleAmPublishStaged(m, w);
          am_drops.Note(am_wire::kPublishStagedAm, m, "staged block before the service started");
        }));
    STRATA_RETURN_IF_ERROR(
        w->SetAmHandler(am_wire::kPeerLocateAm, [this, w](const transport::AmMessage& m) {
          if (m.reply_ep == nullptr || m.header.size() != 8)
            return am_drops.Note(am_wire::kPeerLocateAm, m,
                                 "locate request without a reply endpoint or an 8-byte header");
          if (auth && auth->enabled())
            return am_drops.Note(am_wire::kPeerLocateAm, m,
                                 "locate request while authentication is on (gRPC only)");
          Cluster* c = cluster_ptr.load(std::memory_order_acquire);
          if (c) c->locator().HandleAmLocate(m, w);
        }));
    return absl::OkStatus();
  };
  more_workers.clear();
  // Automatic: one per CPU this process may run on, up to 4 (an idle worker's thread sleeps on
  // its event fd). On a 2-core VM a second worker made four clients' 1 MiB gets over tcp
  // faster in every alternating pair (1.4-3x); their 64 KiB gets came out lower in the calm
  // pairs (0.57x, 0.82x): bench/peers/README.md.
  uint32_t cpus = std::max(1u, std::thread::hardware_concurrency());
  if (cpu_set_t set; sched_getaffinity(0, sizeof set, &set) == 0)
    cpus = static_cast<uint32_t>(std::max(1, CPU_COUNT(&set)));
  const uint32_t workers = config.data_plane_workers != 0 ? config.data_plane_workers
                                                          : std::clamp(cpus, 1u, 4u);
  for (uint32_t i = 1; i < workers; ++i) {
    STRATA_ASSIGN_OR_RETURN(auto more, transport::Worker::Create(ucx));
    more_workers.push_back(std::move(more));
  }
  worker_requests = std::make_unique<WorkerRequests[]>(workers);
  std::vector<Counter*> request_series;
  for (uint32_t i = 0; i < workers; ++i)
    request_series.push_back(metrics.AddCounter(
        "strata_data_plane_requests_total",
        "Requests by active message a data-plane worker answered (lookups, acquires, reserves, "
        "commits, releases, fetches and publishes in one message); clients that map the arena "
        "(or their tenant's zone) all use worker 0.",
        {{"worker", std::to_string(i)}}));
  metrics.AddCollector([this, request_series] {
    for (size_t i = 0; i < request_series.size(); ++i)
      request_series[i]->Set(worker_requests[i].n.load(std::memory_order_relaxed));
  });
  STRATA_RETURN_IF_ERROR(install(worker.get(), &worker_requests[0].n));
  for (size_t i = 0; i < more_workers.size(); ++i)
    STRATA_RETURN_IF_ERROR(install(more_workers[i].get(), &worker_requests[i + 1].n));
  progress = std::make_unique<transport::ProgressThread>(worker.get(), config.busy_poll);
  for (auto& w : more_workers)
    more_progress.push_back(std::make_unique<transport::ProgressThread>(w.get(), config.busy_poll));
  return absl::OkStatus();
}

absl::Status Daemon::Impl::OpenStore(std::string secret) {
  const HostTierConfig& host = config.host;
  HostTierOptions topts;
  topts.high_watermark = host.high_watermark;
  topts.low_watermark = host.low_watermark;
  topts.reservation_timeout = host.reservation_timeout;
  topts.lease_timeout = host.lease_timeout;
  topts.max_pin_ttl = host.max_pin_ttl;
  topts.max_block_bytes = std::min(host.max_block_size, host.capacity);
  topts.eviction_policy = host.policy;
  topts.tenant_max_share = config.limits.tenant_max_share;
  topts.tenant_max_reserved_bytes = config.limits.tenant_max_reserved_bytes;
  topts.write_back = !config.nvme.files.empty();
  topts.transcode = true;  // only namespaces opened with a cold codec
  // With an NVMe tier, host extents start and end on 4 KiB so blocks move between the tiers
  // with O_DIRECT straight from/into host memory (no staging copy); costs < 4 KiB per block.
  if (topts.write_back) topts.alignment = kNvmeAlignment;
  if (zoned_arena) topts.zones = zoned_arena->Layout();
  tier = std::make_unique<HostTier>(region->data(),
                                    std::min<uint64_t>(region->size(), host.capacity), topts);
  namespaces = std::make_unique<NamespaceRegistry>(
      std::move(secret), NamespaceRegistry::Limits{config.limits.max_namespaces,
                                                   config.limits.namespace_idle_timeout});
  namespaces->SetOpenHook([t = tier.get()](const NamespaceId& ns, const std::string& tenant) {
    t->SetNamespaceTenant(ns, tenant);
  });
  if (config.nvme.files.empty()) {
    store = std::make_unique<HostBlockStore>(tier.get());
  } else {
    auto opened = OpenTieredStore(config, tier.get());
    if (!opened.ok()) return opened.status();
    tiered = opened->get();
    store = std::move(*opened);
  }
  if (config.gpu.capacity == 0) return absl::OkStatus();
  auto opened = OpenGpuTier(config, store.get());
  if (!opened.ok()) return opened.status();
  gpu = opened->get();
  // The device's share per tenant is the host tier's (limits.tenant_max_share).
  namespaces->SetOpenHook([t = tier.get(), g = gpu](const NamespaceId& ns,
                                                    const std::string& tenant) {
    t->SetNamespaceTenant(ns, tenant);
    g->SetNamespaceTenant(ns, tenant);
  });
  below_gpu = std::move(store);
  store = std::move(*opened);
  return absl::OkStatus();
}

absl::Status Daemon::Impl::StartServices() {
  DataPlaneInfo dp;
  dp.node_id = node_id;
  dp.worker_addresses.push_back(worker->address());
  for (auto& w : more_workers) dp.worker_addresses.push_back(w->address());
  for (size_t i = 0; i < dp.worker_addresses.size(); ++i)
    dp.worker_requests.push_back(&worker_requests[i].n);
  STRATA_ASSIGN_OR_RETURN(dp.arena_rkey, region->PackRkey());
  dp.clients_map_arena = clients_map_arena;
  dp.clients_write_zones = zoned_arena && config.auth.tenant_zones_writable;
  dp.arena_memh = region->handle();
  dp.am_drops = &am_drops;
  dp.progress.push_back(progress.get());
  for (auto& p : more_progress) dp.progress.push_back(p.get());
  dp.transports = worker->TransportSummary();
  dp.huge_pages = huge_pages;
  dp.gpu = gpu;
  // Nonzero, so that a client can tell "this daemon" from "a daemon that does not say".
  while (dp.instance_id == 0)
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&dp.instance_id), sizeof dp.instance_id) != 1)
      return absl::InternalError("cannot draw random bytes for the instance id");
  if (zoned_arena) {
    auto check = [this](std::string_view ticket) -> std::optional<Caller> {
      CacheService* s = am_service.load(std::memory_order_acquire);
      return s ? s->CallerOfTicket(ticket) : std::nullopt;
    };
    if (!config.auth.tenant_zones_writable) {
      stagings = std::make_unique<StagingTable>();
      dp.stagings = stagings.get();
    }
    STRATA_ASSIGN_OR_RETURN(
        zone_server,
        ZoneServer::Start(zoned_arena.get(), stagings.get(), std::move(check),
                          absl::StrCat("strata-zones-", absl::Hex(dp.instance_id))));
    dp.zone_socket = zone_server->address();
  }
  service = std::make_unique<CacheService>(store.get(), namespaces.get(), dp, auth.get());
  service->set_metrics(rpc_metrics.get());
  am_service.store(service.get(), std::memory_order_release);
  // The store's series appear once it exists.
  arena_pages = DescribeMapping(region->data());
  store_series = std::make_unique<StoreSeries>(metrics, arena_pages.page_bytes, tiered != nullptr,
                                              gpu != nullptr);
  RegisterTenantSeries(metrics, tier.get(), auth->tenants());
  tier_open.store(true, std::memory_order_release);

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config.listen, server_credentials, &port);
  builder.RegisterService(service.get());
  admin = std::make_unique<AdminService>(store.get(), namespaces.get(), auth.get());
  builder.RegisterService(admin.get());
  peer = std::make_unique<PeerService>(auth.get(), namespaces.get());
  builder.RegisterService(peer.get());
  auto calibration_store = CalibrationStore::Open(
      config.data_dir + "/calibrations",
      {config.limits.max_calibrations_per_namespace, config.limits.calibration_bytes,
       config.limits.parsed_calibration_bytes});
  if (!calibration_store.ok())
    return absl::Status(calibration_store.status().code(),
                        absl::StrCat("config field 'data_dir': ",
                                     calibration_store.status().message()));
  calibrations = std::move(*calibration_store);
  RegisterCalibrationSeries(metrics, calibrations.get());
  RegisterCodecKernelSeries(metrics);
  spdlog::info("codec kernels: {}", codec::DescribeCpuKernels());
  calibration_service =
      std::make_unique<CalibrationService>(calibrations.get(), namespaces.get(), auth.get());
  builder.RegisterService(calibration_service.get());
  peer->set_calibrations(calibrations.get());
  transcoder = std::make_unique<Transcoder>(tier.get(), namespaces.get(), calibrations.get());
  transcoder->Start();
  service->set_transcoder(transcoder.get());
  device_service =
      std::make_unique<DeviceService>(gpu, namespaces.get(), auth.get(), calibrations.get());
  device_service->set_publisher(
      [svc = service.get()](const Caller& caller, const NamespaceId& ns,
                            std::span<const BlockId> ids, std::span<const BlockId> parents,
                            std::span<const uint64_t> sizes, const MadeBlockWriter& write,
                            absl::Time deadline, std::vector<BlockStatus>* status) {
        return svc->PublishMade(caller, ns, ids, parents, sizes, write, deadline, status);
      });
  device_service->set_ticket_callers(
      [svc = service.get()](std::string_view ticket) { return svc->CallerOfTicket(ticket); });
  am_device_service.store(device_service.get(), std::memory_order_release);
  builder.RegisterService(device_service.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  // gRPC sets SO_REUSEPORT by default; then an ephemeral bind can land on a port another
  // daemon already listens on, and the two silently split the connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  server = builder.BuildAndStart();
  if (!server || port == 0)
    return absl::UnavailableError(
        absl::StrCat("config field 'listen': cannot listen on ", config.listen));
  if (config.listen.rfind("unix:", 0) == 0) {
    endpoint = config.listen;  // a Unix socket has no port to resolve
  } else {
    endpoint = absl::StrCat(config.listen.substr(0, config.listen.rfind(':')), ":", port);
  }
  return absl::OkStatus();
}

absl::Status Daemon::Impl::StartCluster() {
  Cluster::Options co;
  co.config = config.cluster;
  co.self.id = node_id;
  co.self.address =
      config.cluster.advertise_address.empty() ? endpoint : config.cluster.advertise_address;
  co.self.host_capacity = store->arena_bytes();
  co.self.version = STRATA_VERSION;
  co.peer_security = peer_security;
  // Active messages carry no token: an authenticating cluster asks its directory over gRPC.
  if (!auth->enabled() && peer_token.empty()) co.ucx = ucx;
  co.gpu = gpu;
  if (gpu) co.device_links = DeviceLinksFor(config.gpu, co.self.address);
  auto started = Cluster::Start(std::move(co), *store, *namespaces);
  if (!started.ok()) {
    server->Shutdown(std::chrono::system_clock::now());
    return started.status();
  }
  cluster = std::move(*started);
  cluster_ptr.store(cluster.get(), std::memory_order_release);
  service->set_cluster(cluster.get());
  admin->set_cluster(cluster.get());
  peer->set_cluster(cluster.get());
  calibration_service->set_cluster(cluster.get());
  RegisterClusterSeries(metrics, &cluster_ptr);
  return absl::OkStatus();
}

absl::Status Daemon::Impl::StartEvents() {
  if (!config.events.endpoint.empty()) {
    auto started = KvEventPublisher::Start({config.events, node_id}, *namespaces);
    if (!started.ok()) {
      cluster->Stop();
      server->Shutdown(std::chrono::system_clock::now());
      return started.status();
    }
    events = std::move(*started);
    RegisterEventSeries(metrics, events.get());
  }
  store->SetChangeHook([c = cluster.get(), e = events.get()](const BlockEvent& event) {
    c->OnBlockEvent(event);
    if (e) e->OnBlockEvent(event);
  });
  return absl::OkStatus();
}

void Daemon::Impl::StartReclaim() {
  const absl::Duration period = std::min(
      {absl::Seconds(1), config.host.reservation_timeout / 4, config.host.lease_timeout / 4});
  reclaim = std::thread([this, period] {
    while (!stop_reclaim.WaitForNotificationWithTimeout(period)) {
      store->ReclaimExpired();
      if (size_t closed = device_service->CloseIdle(absl::Now()))
        spdlog::info("closed {} lent device buffers left unused", closed);
      const auto usage = store->UsageByNamespace();
      if (size_t released = namespaces->ReleaseIdle(
              absl::Now(), [&](const NamespaceId& id) { return usage.contains(id); }))
        spdlog::info("released {} idle namespaces without blocks", released);
    }
  });
}

void Daemon::Impl::LogStarted() const {
  const MappingPages& pages = arena_pages;
  spdlog::info(
      "stratad {} node '{}' listening on {}; host tier {} ({}, {} pages{}), UCX transports {}, "
      "{} data-plane workers",
      STRATA_VERSION, node_id, endpoint, FormatSize(store->arena_bytes()),
      mmap_arena ? (huge_pages ? "mmap, huge pages" : "mmap") : "UCX-allocated",
      pages.page_bytes ? FormatSize(pages.page_bytes) : "unknown",
      pages.thp_bytes ? absl::StrCat(", ", FormatSize(pages.thp_bytes), " transparent huge")
                      : std::string(),
      worker->TransportSummary(), 1 + more_workers.size());
  if (http) spdlog::info("HTTP /metrics, /healthz, /readyz on {}", http->endpoint());
}

void Daemon::Shutdown() {
  Impl& d = *impl_;
  if (d.shut_down) return;
  d.shut_down = true;
  d.shut_down_started.store(true);
  d.serving.store(false, std::memory_order_release);  // /readyz fails from now on
  spdlog::info("draining: refusing new calls, {} for in-flight ones",
               absl::FormatDuration(d.config.shutdown_grace));
  if (!d.service->Drain(d.config.shutdown_grace))
    spdlog::warn("calls still running after {}; cancelling them",
                 absl::FormatDuration(d.config.shutdown_grace));
  // Leave the cluster before the server goes, so peers stop sending work here.
  if (d.cluster) d.cluster->Stop();
  // Everything admitted has finished (or is being cancelled): close the server at once.
  d.server->Shutdown(std::chrono::system_clock::now());
  d.store->SetChangeHook(nullptr);
  if (d.events) d.events->Stop();
  d.stop_reclaim.Notify();
  if (d.reclaim.joinable()) d.reclaim.join();
  d.progress->Stop();
  for (auto& p : d.more_progress) p->Stop();
  if (d.transcoder) d.transcoder->Stop();
  if (d.gpu) {
    // Device blocks are copies (or, when host memory evicted theirs, lost as host blocks are).
    auto g = d.gpu->Counters();
    d.gpu->Stop();
    spdlog::info("gpu tier closed: {} blocks ({}) dropped", g.device.blocks,
                 FormatSize(g.device.committed_bytes));
  }
  if (d.tiered) {
    // Blocks queued for write-back are dropped; NVMe blocks stay in the catalog for the next
    // start. Host blocks are not flushed to NVMe (they are lost, as without an NVMe tier).
    d.tiered->Stop();
    auto n = d.tiered->Counters();
    spdlog::info("nvme tier closed: {} blocks ({}) kept for the next start", n.nvme_blocks,
                 FormatSize(n.nvme_used_bytes));
  }
  auto s = d.store->Stats().host;
  spdlog::info("stopped: {} blocks, {} open reservations and {} open leases dropped", s.blocks,
               s.open_reservations, s.open_leases);
  if (d.http) d.http->Stop();
}

}  // namespace strata::daemon
