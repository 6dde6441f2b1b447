#include "daemon/daemon.h"

#include <grpcpp/grpcpp.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/am_wire.h"
#include "common/status_macros.h"
#include "common/units.h"
#include "daemon/admin_service.h"
#include "daemon/cache_service.h"
#include "daemon/cluster/cluster.h"
#include "daemon/http_server.h"
#include "daemon/metrics.h"
#include "daemon/namespace_registry.h"
#include "daemon/peer_service.h"
#include "storage/arena.h"
#include "storage/block_store.h"
#include "storage/host_block_store.h"
#include "storage/host_tier.h"
#include "storage/tiered_store.h"
#include "transport/ucx.h"

namespace strata::daemon {

// Tier series are registered once; a scrape only stores values into them.
struct TierSeries {
  Gauge *ready, *in_flight;
  Gauge *capacity, *used, *committed, *reserved, *blocks, *pinned, *reservations, *leases,
      *namespaces;
  Counter *lookup_hit, *lookup_miss, *fetch_hit, *fetch_miss, *committed_total, *dedup,
      *crc_failures, *evict_lru, *evict_explicit, *no_space, *res_expired, *lease_expired;
  Gauge *codec_raw, *codec_stored, *codec_ratio;
};

// NVMe tier series, registered only when the tier is configured.
struct NvmeSeries {
  Gauge *capacity, *used, *blocks, *pinned;
  Counter *demotions, *demoted_bytes, *promotions, *promoted_bytes, *rejected, *evict_policy,
      *evict_explicit, *full_drops, *write_errors, *read_errors, *crc_failures, *pressure_drops;
};

static std::unique_ptr<NvmeSeries> RegisterNvmeSeries(MetricsRegistry& m) {
  const MetricLabels nvme = {{"tier", "nvme"}};
  return std::make_unique<NvmeSeries>(NvmeSeries{
      m.AddGauge("strata_tier_capacity_bytes", "Bytes a tier may hold.", nvme),
      m.AddGauge("strata_tier_used_bytes", "", nvme),
      m.AddGauge("strata_tier_blocks", "Committed blocks resident in a tier.", nvme),
      m.AddGauge("strata_tier_pinned_blocks", "Blocks protected from eviction by a pin.", nvme),
      m.AddCounter("strata_demotions_total",
                   "Host-tier victims written to the NVMe tier instead of being dropped."),
      m.AddCounter("strata_demoted_bytes_total", "Bytes of blocks demoted to the NVMe tier."),
      m.AddCounter("strata_promotions_total",
                   "NVMe blocks staged into host memory by a fetch (they become host blocks)."),
      m.AddCounter("strata_promoted_bytes_total", "Bytes of blocks promoted from the NVMe tier."),
      m.AddCounter("strata_admission_rejected_total",
                   "Host-tier victims the NVMe admission rule dropped instead of demoting."),
      m.AddCounter("strata_evictions_total", "", {{"tier", "nvme"}, {"reason", "policy"}}),
      m.AddCounter("strata_evictions_total", "", {{"tier", "nvme"}, {"reason", "explicit"}}),
      m.AddCounter("strata_nvme_full_drops_total",
                   "Host-tier victims dropped because the NVMe tier had no room for them."),
      m.AddCounter("strata_nvme_write_errors_total",
                   "Host-tier victims dropped because their NVMe write failed."),
      m.AddCounter("strata_nvme_read_errors_total", "NVMe reads of a fetch that failed."),
      m.AddCounter("strata_nvme_crc_failures_total",
                   "NVMe blocks dropped because their CRC32C failed when read (never served)."),
      m.AddCounter("strata_evictions_total", "", {{"tier", "host"}, {"reason", "pressure_drop"}}),
  });
}

static std::unique_ptr<TierSeries> RegisterTierSeries(MetricsRegistry& m) {
  const MetricLabels host = {{"tier", "host"}};
  return std::make_unique<TierSeries>(TierSeries{
      m.AddGauge("strata_ready", "1 while /readyz answers 200: serving and not draining."),
      m.AddGauge("strata_rpc_in_flight", "Cache gRPC calls admitted and still running."),
      m.AddGauge("strata_tier_capacity_bytes", "Bytes a tier may hold.", host),
      m.AddGauge("strata_tier_used_bytes",
                 "Bytes allocated in a tier: committed, reserved, and evicted but still "
                 "leased.",
                 host),
      m.AddGauge("strata_tier_committed_bytes", "Bytes of committed blocks in a tier.", host),
      m.AddGauge("strata_tier_reserved_bytes",
                 "Bytes reserved by publishes that have not committed yet.", host),
      m.AddGauge("strata_tier_blocks", "Committed blocks resident in a tier.", host),
      m.AddGauge("strata_tier_pinned_blocks", "Blocks protected from eviction by a pin.", host),
      m.AddGauge("strata_open_reservations", "Publish reservations not yet committed."),
      m.AddGauge("strata_open_leases", "Fetch read leases not yet released."),
      m.AddGauge("strata_namespaces", "Namespaces opened on this daemon."),
      m.AddCounter("strata_lookup_blocks_total",
                   "Blocks asked for by Lookup, by result (hit: in the cached prefix).",
                   {{"result", "hit"}}),
      m.AddCounter("strata_lookup_blocks_total", "", {{"result", "miss"}}),
      m.AddCounter("strata_fetch_blocks_total", "Blocks asked for by a fetch (Acquire), by result.",
                   {{"result", "hit"}}),
      m.AddCounter("strata_fetch_blocks_total", "", {{"result", "miss"}}),
      m.AddCounter("strata_committed_blocks_total",
                   "Blocks published: committed after CRC32C verification."),
      m.AddCounter("strata_dedup_blocks_total",
                   "Blocks a publish skipped because they were already cached."),
      m.AddCounter("strata_crc_failures_total",
                   "Blocks dropped at commit because their CRC32C did not match."),
      m.AddCounter("strata_evictions_total", "Blocks evicted from a tier, by reason.",
                   {{"tier", "host"}, {"reason", "lru"}}),
      m.AddCounter("strata_evictions_total", "", {{"tier", "host"}, {"reason", "explicit"}}),
      m.AddCounter("strata_reserve_no_space_blocks_total",
                   "Blocks a publish could not reserve because the tier was full."),
      m.AddCounter("strata_reservations_expired_total",
                   "Reservations reclaimed because the client never committed."),
      m.AddCounter("strata_leases_expired_total",
                   "Read leases reclaimed because the client never released them."),
      m.AddGauge("strata_codec_raw_bytes",
                 "Uncompressed size of the resident blocks of codec namespaces (blocks x layout "
                 "block bytes)."),
      m.AddGauge("strata_codec_stored_bytes", "Bytes those blocks occupy as encoded blobs."),
      m.AddGauge("strata_codec_ratio",
                 "strata_codec_raw_bytes / strata_codec_stored_bytes; 0 with no codec blocks."),
  });
}

struct Daemon::Impl {
  DaemonConfig config;
  std::string endpoint;
  MetricsRegistry metrics;  // outlives everything that records into it
  std::unique_ptr<RpcMetrics> rpc_metrics;
  std::unique_ptr<TierSeries> tier_series;
  std::shared_ptr<transport::Context> ucx;
  std::unique_ptr<transport::Worker> worker;
  std::unique_ptr<MmapArena> mmap_arena;            // when the arena is ours
  std::unique_ptr<transport::MemoryRegion> region;  // the arena as UCX sees it
  std::unique_ptr<transport::ProgressThread> progress;
  std::unique_ptr<HostTier> tier;
  // What the services and the cluster see: `tier` alone, or the TieredStore over it (then
  // `tiered` is that same object, stopped before `tier` goes).
  std::unique_ptr<BlockStore> store;
  TieredStore* tiered = nullptr;
  std::unique_ptr<NvmeSeries> nvme_series;
  std::unique_ptr<NamespaceRegistry> namespaces;
  std::unique_ptr<CacheService> service;
  std::atomic<CacheService*> am_service{nullptr};
  std::unique_ptr<AdminService> admin;
  std::unique_ptr<PeerService> peer;
  std::unique_ptr<grpc::Server> server;
  // Set once membership is up.
  std::unique_ptr<Cluster> cluster;
  std::atomic<Cluster*> cluster_ptr{nullptr};
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

}  // namespace

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Daemon::~Daemon() { Shutdown(); }

const std::string& Daemon::endpoint() const { return impl_->endpoint; }

const std::string& Daemon::http_endpoint() const {
  static const std::string kNone;
  return impl_->http ? impl_->http->endpoint() : kNone;
}

namespace {

// Metrics read from the host tier at scrape time; `d.tier_open` must be true.
void CollectTierMetrics(Daemon::Impl& d);

// Cluster series, refreshed at scrape time from the cluster's counters and view.
void RegisterClusterSeries(Daemon::Impl* d) {
  MetricsRegistry& m = d->metrics;
  Gauge* nodes = m.AddGauge("strata_cluster_nodes", "Nodes in this daemon's cluster view.");
  Gauge* healthy = m.AddGauge("strata_cluster_membership_healthy",
                              "1 while the membership store (etcd) answers; 0 = degraded: the "
                              "last view stays in force and local blocks are still served.");
  Gauge* dir_ids =
      m.AddGauge("strata_directory_entries", "Block ids whose directory entry this node owns.");
  Gauge* dir_bytes = m.AddGauge("strata_directory_memory_bytes",
                                "Memory this node's directory entries take (estimate).");
  Counter* announced = m.AddCounter("strata_directory_announced_total",
                                    "Block ids this node announced to their owners.");
  Counter* peer_fail = m.AddCounter("strata_peer_failures_total",
                                    "Calls to other daemons that failed or timed out.");
  Counter* replicated = m.AddCounter("strata_replicated_blocks_total",
                                     "Copies of committed blocks made on other nodes.");
  Counter* repl_fail = m.AddCounter("strata_replication_failures_total",
                                    "Block copies to replica nodes that failed.");
  Counter* pulled =
      m.AddCounter("strata_pulled_blocks_total", "Blocks copied into this node from another node.");
  Counter* remote = m.AddCounter("strata_lookup_remote_blocks_total",
                                 "Lookup prefix blocks found on other nodes.");
  Counter* rerepl = m.AddCounter("strata_rereplicated_blocks_total",
                                 "Copies made to replace the ones a departed node held.");
  m.AddCollector([d, nodes, healthy, dir_ids, dir_bytes, announced, peer_fail, replicated,
                  repl_fail, pulled, remote, rerepl] {
    Cluster* c = d->cluster_ptr.load(std::memory_order_acquire);
    if (!c) return;
    std::string detail;
    nodes->Set(static_cast<double>(c->size()));
    healthy->Set(c->healthy(&detail) ? 1 : 0);
    dir_ids->Set(static_cast<double>(c->directory().ids()));
    dir_bytes->Set(static_cast<double>(c->directory().memory_bytes()));
    const ClusterCounters& k = c->counters();
    announced->Set(k.announced.load());
    peer_fail->Set(k.peer_failures.load());
    replicated->Set(k.replicated.load());
    repl_fail->Set(k.replication_failed.load());
    pulled->Set(k.pulled.load());
    remote->Set(k.remote_located.load());
    rerepl->Set(k.rereplicated.load());
  });
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonConfig& config) {
  STRATA_RETURN_IF_ERROR(ValidateConfig(config));
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  const std::string node_id = config.node_id.empty() ? Hostname() : config.node_id;
  STRATA_ASSIGN_OR_RETURN(std::string secret, LoadOrCreateSecret(config));

  // HTTP first, so /healthz answers (and /readyz says "starting") while a large arena faults in.
  impl->rpc_metrics = std::make_unique<RpcMetrics>(&impl->metrics);
  impl->metrics
      .AddGauge("strata_build_info", "Always 1; labels carry the stratad version.",
                {{"version", STRATA_VERSION}})
      ->Set(1);
  RegisterProcessMetrics(&impl->metrics);
  if (!config.http_listen.empty()) {
    Impl* raw = impl.get();
    Histogram* render_time = impl->metrics.AddHistogram(
        "strata_metrics_render_duration_seconds",
        "Time stratad took to build a /metrics response (read tier stats and render).",
        LatencyBucketsSeconds());
    raw->metrics.AddCollector([raw] {
      if (raw->tier_open.load(std::memory_order_acquire)) CollectTierMetrics(*raw);
    });
    HttpServer::Handlers h;
    h.metrics = [raw, render_time] {
      auto t0 = std::chrono::steady_clock::now();
      std::string text = raw->metrics.Render();
      render_time->Observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      return text;
    };
    h.ready = [raw](std::string* why) {
      if (raw->serving.load(std::memory_order_acquire)) return true;
      *why = raw->shut_down_started.load() ? "draining" : "starting (host tier or gRPC not up)";
      return false;
    };
    STRATA_ASSIGN_OR_RETURN(impl->http, HttpServer::Start(config.http_listen, std::move(h)));
  }

  // Data plane: the arena is registered once; clients get its address and rkey at Connect.
  STRATA_ASSIGN_OR_RETURN(impl->ucx, transport::Context::Create(/*wakeup=*/true));
  STRATA_ASSIGN_OR_RETURN(impl->worker, transport::Worker::Create(impl->ucx));
  bool huge = false;
  if (config.host.arena != ArenaSource::kMmap) {
    auto region = impl->ucx->Allocate(config.host.capacity);
    if (region.ok()) {
      impl->region = std::move(*region);
      // Fault every page in now: otherwise the first publish into each page pays a page fault
      // inside the client's RMA, which shows up as a publish-latency spike.
      std::memset(impl->region->data(), 0, impl->region->size());
    } else if (config.host.arena == ArenaSource::kUcx) {
      return region.status();
    } else {
      spdlog::warn("UCX could not allocate the arena ({}); using an mmap arena",
                   region.status().ToString());
    }
  }
  if (!impl->region) {
    STRATA_ASSIGN_OR_RETURN(impl->mmap_arena,
                            MmapArena::Create(config.host.capacity, config.host.huge_pages));
    huge = impl->mmap_arena->huge_pages();
    STRATA_ASSIGN_OR_RETURN(
        impl->region, impl->ucx->Register(impl->mmap_arena->data(), impl->mmap_arena->size()));
  }
  {
    // Installed before the progress thread runs (the worker is serialized); lookups arriving
    // before the service exists are dropped and their senders fall back to gRPC.
    Impl* raw = impl.get();
    STRATA_RETURN_IF_ERROR(
        impl->worker->SetAmHandler(am_wire::kLookupRequestAm, [raw](const transport::AmMessage& m) {
          CacheService* s = raw->am_service.load(std::memory_order_acquire);
          if (s) s->HandleAmLookup(m, raw->worker.get());
        }));
    STRATA_RETURN_IF_ERROR(
        impl->worker->SetAmHandler(am_wire::kFetchRequestAm, [raw](const transport::AmMessage& m) {
          CacheService* s = raw->am_service.load(std::memory_order_acquire);
          if (s) s->HandleAmFetch(m, raw->worker.get());
        }));
    STRATA_RETURN_IF_ERROR(
        impl->worker->SetAmHandler(am_wire::kPeerLocateAm, [raw](const transport::AmMessage& m) {
          Cluster* c = raw->cluster_ptr.load(std::memory_order_acquire);
          if (c) c->locator().HandleAmLocate(m, raw->worker.get());
        }));
  }
  impl->progress = std::make_unique<transport::ProgressThread>(impl->worker.get());

  const HostTierConfig& host = config.host;
  HostTierOptions topts;
  topts.high_watermark = host.high_watermark;
  topts.low_watermark = host.low_watermark;
  topts.reservation_timeout = host.reservation_timeout;
  topts.lease_timeout = host.lease_timeout;
  topts.max_pin_ttl = host.max_pin_ttl;
  topts.max_block_bytes = std::min(host.max_block_size, host.capacity);
  topts.eviction_policy = host.policy;
  topts.write_back = !config.nvme.files.empty();
  // With an NVMe tier, host extents start and end on 4 KiB so blocks move between the tiers
  // with O_DIRECT straight from/into host memory (no staging copy); costs < 4 KiB per block.
  if (topts.write_back) topts.alignment = kNvmeAlignment;
  impl->tier = std::make_unique<HostTier>(
      impl->region->data(), std::min<uint64_t>(impl->region->size(), host.capacity), topts);
  impl->namespaces = std::make_unique<NamespaceRegistry>(secret);
  if (config.nvme.files.empty()) impl->store = std::make_unique<HostBlockStore>(impl->tier.get());
  if (!config.nvme.files.empty()) {
    const NvmeTierConfig& nvme = config.nvme;
    TieredStoreOptions n;
    for (const NvmeFileConfig& f : nvme.files) n.nvme.tier.files.push_back({f.path, f.capacity});
    n.nvme.tier.queue_depth = nvme.queue_depth;
    n.nvme.tier.sync_after_write = nvme.sync_after_write;
    // Promotions run on gRPC handler threads, which come and go: one ring for all of them.
    n.nvme.tier.shared_ring = true;
    n.nvme.catalog_path = NvmeCatalogDir(config);
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(n.nvme.catalog_path).parent_path(),
                                        ec);
    n.nvme_high_watermark = nvme.high_watermark;
    n.nvme_low_watermark = nvme.low_watermark;
    n.nvme_policy = nvme.policy;
    n.admission = nvme.admission;
    n.warn = [](const std::string& msg) { spdlog::warn("{}", msg); };
    auto tiered = TieredStore::Open(impl->tier.get(), std::move(n));
    if (!tiered.ok())
      return absl::Status(
          tiered.status().code(),
          absl::StrCat("nvme tier (config section 'nvme'): ", tiered.status().message()));
    impl->tiered = tiered->get();
    impl->store = std::move(*tiered);
    const NvmeTier& t = impl->tiered->nvme_tier();
    const NvmeRecoveryReport& rec = impl->tiered->recovery();
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
  }

  DataPlaneInfo dp;
  dp.node_id = node_id;
  dp.worker_address = impl->worker->address();
  STRATA_ASSIGN_OR_RETURN(dp.arena_rkey, impl->region->PackRkey());
  dp.arena_memh = impl->region->handle();
  dp.transports = impl->worker->TransportSummary();
  dp.huge_pages = huge;
  impl->service = std::make_unique<CacheService>(impl->store.get(), impl->namespaces.get(), dp);
  impl->service->set_metrics(impl->rpc_metrics.get());
  impl->am_service.store(impl->service.get(), std::memory_order_release);
  impl->tier_series = RegisterTierSeries(impl->metrics);  // tier series appear once it exists
  const MappingPages arena_pages = DescribeMapping(impl->region->data());
  impl->metrics
      .AddGauge("strata_host_arena_page_bytes",
                "Page size of the memory behind the host tier (2097152 on reserved huge pages; "
                "NVMe reads and RMA into 4 KiB pages cost more).")
      ->Set(static_cast<double>(arena_pages.page_bytes));
  if (impl->tiered) impl->nvme_series = RegisterNvmeSeries(impl->metrics);
  impl->tier_open.store(true, std::memory_order_release);

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config.listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(impl->service.get());
  impl->admin = std::make_unique<AdminService>(impl->store.get(), impl->namespaces.get());
  builder.RegisterService(impl->admin.get());
  impl->peer = std::make_unique<PeerService>();
  builder.RegisterService(impl->peer.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  // gRPC sets SO_REUSEPORT by default; then an ephemeral bind can land on a port another
  // daemon already listens on, and the two silently split the connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);

  impl->server = builder.BuildAndStart();
  if (!impl->server || port == 0)
    return absl::UnavailableError(
        absl::StrCat("config field 'listen': cannot listen on ", config.listen));
  if (config.listen.rfind("unix:", 0) == 0) {
    impl->endpoint = config.listen;  // a Unix socket has no port to resolve
  } else {
    std::string host = config.listen.substr(0, config.listen.rfind(':'));
    impl->endpoint = absl::StrCat(host, ":", port);
  }

  // The cluster layer needs the bound address, so it starts once the server listens.
  {
    Cluster::Options co;
    co.config = config.cluster;
    co.self.id = node_id;
    co.self.address = config.cluster.advertise_address.empty() ? impl->endpoint
                                                               : config.cluster.advertise_address;
    co.self.host_capacity = impl->store->arena_bytes();
    co.self.version = STRATA_VERSION;
    co.ucx = impl->ucx;
    auto cluster = Cluster::Start(std::move(co), *impl->store, *impl->namespaces);
    if (!cluster.ok()) {
      impl->server->Shutdown(std::chrono::system_clock::now());
      return cluster.status();
    }
    impl->cluster = std::move(*cluster);
    impl->cluster_ptr.store(impl->cluster.get(), std::memory_order_release);
    impl->service->set_cluster(impl->cluster.get());
    impl->admin->set_cluster(impl->cluster.get());
    impl->peer->set_cluster(impl->cluster.get());
    RegisterClusterSeries(impl.get());
  }

  absl::Duration period =
      std::min({absl::Seconds(1), host.reservation_timeout / 4, host.lease_timeout / 4});
  Impl* raw = impl.get();
  impl->reclaim = std::thread([raw, period] {
    while (!raw->stop_reclaim.WaitForNotificationWithTimeout(period)) raw->store->ReclaimExpired();
  });

  impl->serving.store(true, std::memory_order_release);
  spdlog::info(
      "stratad {} node '{}' listening on {}; host tier {} ({}, {} pages{}), UCX "
      "transports {}",
      STRATA_VERSION, node_id, impl->endpoint, FormatSize(impl->store->arena_bytes()),
      impl->mmap_arena ? (huge ? "mmap, huge pages" : "mmap") : "UCX-allocated",
      arena_pages.page_bytes ? FormatSize(arena_pages.page_bytes) : "unknown",
      arena_pages.thp_bytes
          ? absl::StrCat(", ", FormatSize(arena_pages.thp_bytes), " transparent huge")
          : std::string(),
      dp.transports);
  if (impl->http) spdlog::info("HTTP /metrics, /healthz, /readyz on {}", impl->http->endpoint());
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
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
  d.stop_reclaim.Notify();
  if (d.reclaim.joinable()) d.reclaim.join();
  d.progress->Stop();
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

namespace {

void CollectTierMetrics(Daemon::Impl& d) {
  TierSeries& x = *d.tier_series;
  x.ready->Set(d.serving.load(std::memory_order_acquire) ? 1 : 0);
  x.in_flight->Set(d.service->in_flight());
  const BlockStoreStats stats = d.store->Stats();
  const HostTierStats& s = stats.host;
  x.capacity->Set(static_cast<double>(s.capacity_bytes));
  x.used->Set(static_cast<double>(s.allocated_bytes));
  x.committed->Set(static_cast<double>(s.committed_bytes));
  x.reserved->Set(static_cast<double>(s.reserved_bytes));
  x.blocks->Set(static_cast<double>(s.blocks));
  x.pinned->Set(static_cast<double>(s.pinned_blocks));
  x.reservations->Set(static_cast<double>(s.open_reservations));
  x.leases->Set(static_cast<double>(s.open_leases));
  x.namespaces->Set(static_cast<double>(d.namespaces->size()));
  x.lookup_hit->Set(s.lookup_hit_blocks);
  x.lookup_miss->Set(s.lookup_miss_blocks);
  x.fetch_hit->Set(s.acquire_hit_blocks);
  x.fetch_miss->Set(s.acquire_miss_blocks);
  x.committed_total->Set(s.committed_total);
  x.dedup->Set(s.dedup_total);
  x.crc_failures->Set(s.crc_failures);
  x.evict_lru->Set(s.evictions_lru);
  x.evict_explicit->Set(s.evictions_explicit);
  x.no_space->Set(s.no_space);
  x.res_expired->Set(s.reservations_expired);
  x.lease_expired->Set(s.leases_expired);
  // The daemon never decodes; what a codec saves follows from each namespace's layout.
  auto usage = d.store->UsageByNamespace();
  double raw = 0, stored = 0;
  for (const auto& e : d.namespaces->List()) {
    if (e.spec.codec_policy == kOpaqueCodecPolicy) continue;
    auto it = usage.find(e.id);
    if (it == usage.end()) continue;
    raw += static_cast<double>(it->second.first) * static_cast<double>(e.spec.layout.BlockBytes());
    stored += static_cast<double>(it->second.second);
  }
  x.codec_raw->Set(raw);
  x.codec_stored->Set(stored);
  x.codec_ratio->Set(stored > 0 ? raw / stored : 0);
  if (stats.nvme && d.nvme_series) {
    NvmeSeries& y = *d.nvme_series;
    const NvmeTierCounters& n = *stats.nvme;
    y.capacity->Set(static_cast<double>(n.nvme_capacity_bytes));
    y.used->Set(static_cast<double>(n.nvme_used_bytes));
    y.blocks->Set(static_cast<double>(n.nvme_blocks));
    y.pinned->Set(static_cast<double>(n.nvme_pinned_blocks));
    y.demotions->Set(n.demotions);
    y.demoted_bytes->Set(n.demoted_bytes);
    y.promotions->Set(n.promotions);
    y.promoted_bytes->Set(n.promoted_bytes);
    y.rejected->Set(n.admission_rejected);
    y.evict_policy->Set(n.nvme_evictions);
    y.evict_explicit->Set(n.nvme_removed_explicit);
    y.full_drops->Set(n.nvme_full_drops);
    y.write_errors->Set(n.nvme_write_errors);
    y.read_errors->Set(n.nvme_read_errors);
    y.crc_failures->Set(n.nvme_crc_failures);
    y.pressure_drops->Set(s.pressure_drops);
  }
}

}  // namespace

}  // namespace strata::daemon
