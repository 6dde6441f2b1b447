#include "daemon/daemon_metrics.h"

#include "absl/container/flat_hash_map.h"

#include "codec/codec.h"
#include "daemon/calibrations/calibration_store.h"
#include "daemon/cluster/cluster.h"
#include "daemon/events/kv_event_publisher.h"

namespace strata::daemon {

// Tier series are registered once; a scrape only stores values into them.
struct TierSeries {
  Gauge *ready, *in_flight;
  Gauge *capacity, *used, *committed, *reserved, *blocks, *pinned, *reservations, *leases,
      *namespaces;
  Counter *lookup_hit, *lookup_miss, *fetch_hit, *fetch_miss, *committed_total, *dedup,
      *crc_failures, *evict_lru, *evict_explicit, *no_space, *res_expired, *lease_expired;
  Gauge *codec_raw, *codec_stored, *codec_ratio;
  Counter *quota_evictions, *quota_no_space;
  Counter *transcoded, *transcoded_in, *transcoded_out, *transcode_failures, *transcode_skipped;
  Gauge* transcoding;
};

// NVMe tier series, registered only when the tier is configured.
struct NvmeSeries {
  Gauge *capacity, *used, *blocks, *pinned, *degraded;
  Counter *demotions, *demoted_bytes, *promotions, *promoted_bytes, *rejected, *evict_policy,
      *evict_explicit, *full_drops, *write_errors, *read_errors, *crc_failures, *pressure_drops;
};

// GPU tier series, registered only when the tier is configured.
struct GpuSeries {
  Gauge *capacity, *used, *blocks, *pinned, *leases;
  Counter *promotions, *promoted_bytes, *demotions, *demoted_bytes, *held_below, *dropped,
      *staged_down, *copy_errors, *crc_failures, *peer_copies, *peer_copied_bytes, *peer_reads,
      *peer_read_bytes, *peer_device_encodes;
};

namespace {

std::unique_ptr<GpuSeries> RegisterGpuSeries(MetricsRegistry& m) {
  const MetricLabels gpu = {{"tier", "gpu"}};
  return std::make_unique<GpuSeries>(GpuSeries{
      m.AddGauge("strata_tier_capacity_bytes", "Bytes a tier may hold.", gpu),
      m.AddGauge("strata_tier_used_bytes", "", gpu),
      m.AddGauge("strata_tier_blocks", "Committed blocks resident in a tier.", gpu),
      m.AddGauge("strata_tier_pinned_blocks", "Blocks protected from eviction by a pin.", gpu),
      m.AddGauge("strata_gpu_open_leases", "Device leases of consumers on the GPU not released."),
      m.AddCounter("strata_gpu_promotions_total",
                   "Blocks copied up from host memory into the GPU tier."),
      m.AddCounter("strata_gpu_promoted_bytes_total", "Bytes copied up into the GPU tier."),
      m.AddCounter("strata_gpu_demotions_total",
                   "GPU-tier victims copied down because host memory no longer held them."),
      m.AddCounter("strata_gpu_demoted_bytes_total", "Bytes copied down from the GPU tier."),
      m.AddCounter("strata_gpu_victims_held_below_total",
                   "GPU-tier victims that left without a copy: host memory still held them."),
      m.AddCounter("strata_gpu_victims_dropped_total",
                   "GPU-tier victims lost: no room below, or their copy down failed."),
      m.AddCounter("strata_gpu_staged_down_total",
                   "Blocks only the GPU tier held, copied to host memory for a fetch."),
      m.AddCounter("strata_gpu_copy_errors_total", "Copies to or from the device that failed."),
      m.AddCounter("strata_gpu_crc_failures_total",
                   "GPU-tier blocks whose bytes failed their CRC32C when copied down (dropped, "
                   "never served)."),
      m.AddCounter("strata_gpu_peer_copies_total",
                   "Blocks copied into device buffers same-node engines lent (FetchToDevice)."),
      m.AddCounter("strata_gpu_peer_copied_bytes_total", "Bytes copied into lent buffers."),
      m.AddCounter("strata_gpu_peer_reads_total",
                   "Blocks read out of lent buffers to be published (PublishFromDevice)."),
      m.AddCounter("strata_gpu_peer_read_bytes_total", "Bytes read out of lent buffers."),
      m.AddCounter("strata_gpu_peer_device_encodes_total",
                   "Blocks read out of lent buffers that the codec quantised on the device."),
  });
}

std::unique_ptr<NvmeSeries> RegisterNvmeSeries(MetricsRegistry& m) {
  const MetricLabels nvme = {{"tier", "nvme"}};
  return std::make_unique<NvmeSeries>(NvmeSeries{
      m.AddGauge("strata_tier_capacity_bytes", "Bytes a tier may hold.", nvme),
      m.AddGauge("strata_tier_used_bytes", "", nvme),
      m.AddGauge("strata_tier_blocks", "Committed blocks resident in a tier.", nvme),
      m.AddGauge("strata_tier_pinned_blocks", "Blocks protected from eviction by a pin.", nvme),
      m.AddGauge("strata_tier_degraded",
                 "1 while writes to a tier fail (NVMe: a full disk or an I/O error; host victims "
                 "are dropped instead of demoted); 0 once a probe write works again.",
                 nvme),
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

std::unique_ptr<TierSeries> RegisterTierSeries(MetricsRegistry& m) {
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
      m.AddCounter("strata_quota_evictions_total",
                   "A tenant's own blocks evicted to keep it within limits.tenant_max_share (also "
                   "in strata_evictions_total{tier=\"host\",reason=\"lru\"})."),
      m.AddCounter("strata_quota_no_space_blocks_total",
                   "Blocks refused (NO_SPACE) because of a tenant quota (also in "
                   "strata_reserve_no_space_blocks_total)."),
      m.AddCounter("strata_transcoded_blocks_total",
                   "Cold host blocks rewritten with their namespace's cold codec instead of "
                   "evicted."),
      m.AddCounter("strata_transcoded_bytes_in_total", "Their bytes before transcoding."),
      m.AddCounter("strata_transcoded_bytes_out_total", "Their bytes after transcoding."),
      m.AddCounter("strata_transcode_failures_total",
                   "Blocks handed to the transcoder but evicted after all (no smaller blob, or "
                   "not decodable)."),
      m.AddCounter("strata_transcode_skipped_total",
                   "Transcoded blocks kept as they were: a reader held them when the blob came "
                   "back."),
      m.AddGauge("strata_transcoding_blocks", "Blocks waiting for or being transcoded."),
  });
}

}  // namespace

StoreSeries::StoreSeries(MetricsRegistry& m, uint64_t arena_page_bytes, bool nvme, bool gpu)
    : host_(RegisterTierSeries(m)) {
  m.AddGauge("strata_host_arena_page_bytes",
             "Page size of the memory behind the host tier (2097152 on reserved huge pages; "
             "NVMe reads and RMA into 4 KiB pages cost more).")
      ->Set(static_cast<double>(arena_page_bytes));
  if (nvme) nvme_ = RegisterNvmeSeries(m);
  if (gpu) gpu_ = RegisterGpuSeries(m);
}

StoreSeries::~StoreSeries() = default;

void StoreSeries::Collect(const BlockStore& store, const NamespaceRegistry& namespaces, bool ready,
                          int in_flight) {
  TierSeries& x = *host_;
  x.ready->Set(ready ? 1 : 0);
  x.in_flight->Set(in_flight);
  const BlockStoreStats stats = store.Stats();
  const HostTierStats& s = stats.host;
  x.capacity->Set(static_cast<double>(s.capacity_bytes));
  x.used->Set(static_cast<double>(s.allocated_bytes));
  x.committed->Set(static_cast<double>(s.committed_bytes));
  x.reserved->Set(static_cast<double>(s.reserved_bytes));
  x.blocks->Set(static_cast<double>(s.blocks));
  x.pinned->Set(static_cast<double>(s.pinned_blocks));
  x.reservations->Set(static_cast<double>(s.open_reservations));
  x.leases->Set(static_cast<double>(s.open_leases));
  x.namespaces->Set(static_cast<double>(namespaces.size()));
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
  x.quota_evictions->Set(s.quota_evictions);
  x.quota_no_space->Set(s.quota_no_space);
  x.transcoded->Set(s.transcoded);
  x.transcoded_in->Set(s.transcoded_bytes_in);
  x.transcoded_out->Set(s.transcoded_bytes_out);
  x.transcode_failures->Set(s.transcode_failures);
  x.transcode_skipped->Set(s.transcode_skipped);
  x.transcoding->Set(static_cast<double>(s.transcoding_blocks));
  // The daemon never decodes; what a codec saves follows from each namespace's layout.
  auto usage = store.UsageByNamespace();
  double raw = 0, stored = 0;
  for (const auto& e : namespaces.List()) {
    if (e.spec.codec_policy == kOpaqueCodecPolicy) continue;
    auto it = usage.find(e.id);
    if (it == usage.end()) continue;
    raw += static_cast<double>(it->second.first) * static_cast<double>(e.spec.layout.BlockBytes());
    stored += static_cast<double>(it->second.second);
  }
  x.codec_raw->Set(raw);
  x.codec_stored->Set(stored);
  x.codec_ratio->Set(stored > 0 ? raw / stored : 0);
  if (stats.nvme && nvme_) {
    NvmeSeries& y = *nvme_;
    const NvmeTierCounters& n = *stats.nvme;
    y.capacity->Set(static_cast<double>(n.nvme_capacity_bytes));
    y.used->Set(static_cast<double>(n.nvme_used_bytes));
    y.blocks->Set(static_cast<double>(n.nvme_blocks));
    y.pinned->Set(static_cast<double>(n.nvme_pinned_blocks));
    y.degraded->Set(n.degraded ? 1 : 0);
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
  if (stats.gpu && gpu_) {
    GpuSeries& g = *gpu_;
    const GpuTierCounters& c = *stats.gpu;
    g.capacity->Set(static_cast<double>(c.device.capacity_bytes));
    g.used->Set(static_cast<double>(c.device.allocated_bytes));
    g.blocks->Set(static_cast<double>(c.device.blocks));
    g.pinned->Set(static_cast<double>(c.device.pinned_blocks));
    g.leases->Set(static_cast<double>(c.device.open_leases));
    g.promotions->Set(c.promotions);
    g.promoted_bytes->Set(c.promoted_bytes);
    g.demotions->Set(c.demotions);
    g.demoted_bytes->Set(c.demoted_bytes);
    g.held_below->Set(c.victims_held_below);
    g.dropped->Set(c.victims_dropped);
    g.staged_down->Set(c.staged_down);
    g.copy_errors->Set(c.copy_errors);
    g.crc_failures->Set(c.crc_failures);
    g.peer_copies->Set(c.peer_copies);
    g.peer_copied_bytes->Set(c.peer_copied_bytes);
    g.peer_reads->Set(c.peer_reads);
    g.peer_read_bytes->Set(c.peer_read_bytes);
    g.peer_device_encodes->Set(c.peer_device_encodes);
  }
}

void RegisterTenantSeries(MetricsRegistry& m, const HostTier* tier,
                          const std::vector<std::string>& named) {
  struct Series {
    Gauge *committed, *reserved;
  };
  auto series = std::make_shared<absl::flat_hash_map<std::string, Series>>();
  auto add = [&](const std::string& tenant, bool first) {
    (*series)[tenant] = Series{
        m.AddGauge("strata_tenant_committed_bytes",
                   first ? "Host tier bytes of a tenant's committed blocks (its quota usage; "
                           "tenants outside the tokens file are summed into tenant=\"_other\")."
                         : "",
                   {{"tenant", tenant}}),
        m.AddGauge("strata_tenant_reserved_bytes",
                   first ? "Host tier bytes a tenant holds in open reservations." : "",
                   {{"tenant", tenant}}),
    };
  };
  add("_other", true);
  for (size_t i = 0; i < named.size() && i < kMaxLabelledTenants; ++i)
    if (named[i] != "_other") add(named[i], false);
  m.AddCollector([tier, series] {
    absl::flat_hash_map<std::string, HostTier::TenantUsage> usage = tier->UsageByTenant();
    HostTier::TenantUsage other;
    for (auto& [name, s] : *series) {
      auto it = usage.find(name);
      if (name == "_other" || it == usage.end()) continue;
      s.committed->Set(static_cast<double>(it->second.committed_bytes));
      s.reserved->Set(static_cast<double>(it->second.reserved_bytes));
    }
    for (const auto& [name, u] : usage) {
      if (name != "_other" && series->contains(name)) continue;
      other.committed_bytes += u.committed_bytes;
      other.reserved_bytes += u.reserved_bytes;
    }
    const Series& o = series->at("_other");
    o.committed->Set(static_cast<double>(other.committed_bytes));
    o.reserved->Set(static_cast<double>(other.reserved_bytes));
  });
}

void RegisterEventSeries(MetricsRegistry& m, const KvEventPublisher* events) {
  Counter* batches =
      m.AddCounter("strata_kv_event_batches_total",
                   "KV event batches published over ZMQ (one per namespace and tick).");
  Counter* dropped = m.AddCounter("strata_kv_events_dropped_total",
                                  "KV events dropped because the publisher's queue was full.");
  m.AddCollector([events, batches, dropped] {
    batches->Set(events->batches_published());
    dropped->Set(events->events_dropped());
  });
}

void RegisterCalibrationSeries(MetricsRegistry& m, const CalibrationStore* store) {
  Gauge* count = m.AddGauge("strata_calibrations",
                            "Calibration artefacts (codec modes pca and xl) this daemon stores.");
  Gauge* bytes = m.AddGauge("strata_calibration_bytes",
                            "Their serialized bytes (limits.calibration_bytes bounds them).");
  Gauge* parsed = m.AddGauge(
      "strata_parsed_calibration_bytes",
      "Memory of the parsed calibrations kept for cold transcoding and decodes for GPU peers "
      "(limits.parsed_calibration_bytes bounds those not in use).");
  Counter* evicted = m.AddCounter(
      "strata_parsed_calibration_evictions_total",
      "Parsed calibrations dropped to stay within limits.parsed_calibration_bytes (each parsed "
      "again from the store when a blob names it).");
  m.AddCollector([store, count, bytes, parsed, evicted] {
    count->Set(static_cast<double>(store->size()));
    bytes->Set(static_cast<double>(store->bytes()));
    parsed->Set(static_cast<double>(store->parsed().bytes()));
    evicted->Set(store->parsed().evictions());
  });
}

void RegisterCodecKernelSeries(MetricsRegistry& m) {
  for (const codec::CpuKernel& k : codec::CpuKernels())
    m.AddGauge("strata_codec_kernel_info",
               "1 for the CPU path each part of the codec takes on this node (rans, pca_decode, "
               "pca_encode, xl_products): it sets the codec's speed.",
               {{"part", k.part}, {"kernel", k.kernel}})
        ->Set(1);
}

void RegisterClusterSeries(MetricsRegistry& m, const std::atomic<Cluster*>* cluster) {
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
  Counter* refused = m.AddCounter(
      "strata_directory_refused_total",
      "Announced block ids refused: their node held cluster.max_directory_entries_per_node "
      "entries on this node.");
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
  Counter* dev_in = m.AddCounter("strata_device_link_blocks_in_total",
                                 "Blocks received into the GPU tier over device links (NCCL).");
  Counter* dev_in_bytes = m.AddCounter("strata_device_link_bytes_in_total",
                                       "Bytes received into the GPU tier over device links.");
  Counter* dev_out = m.AddCounter("strata_device_link_blocks_out_total",
                                  "Blocks sent from the GPU tier over device links.");
  Counter* dev_out_bytes = m.AddCounter("strata_device_link_bytes_out_total",
                                        "Bytes sent from the GPU tier over device links.");
  Counter* dev_opened =
      m.AddCounter("strata_device_links_opened_total", "Device links made to other nodes.");
  Counter* dev_fail = m.AddCounter("strata_device_link_failures_total",
                                   "Device transfers that failed (their blocks went over UCX).");
  m.AddCollector([cluster, dev_in, dev_in_bytes, dev_out, dev_out_bytes, dev_opened, dev_fail] {
    Cluster* c = cluster->load(std::memory_order_acquire);
    DeviceTransfers* d = c ? c->device_transfers() : nullptr;
    if (!d) return;
    const DeviceTransferCounters& k = d->counters();
    dev_in->Set(k.blocks_in.load());
    dev_in_bytes->Set(k.bytes_in.load());
    dev_out->Set(k.blocks_out.load());
    dev_out_bytes->Set(k.bytes_out.load());
    dev_opened->Set(k.links_opened.load());
    dev_fail->Set(k.failures.load());
  });
  m.AddCollector([cluster, nodes, healthy, dir_ids, dir_bytes, announced, refused, peer_fail,
                  replicated, repl_fail, pulled, remote, rerepl] {
    Cluster* c = cluster->load(std::memory_order_acquire);
    if (!c) return;
    std::string detail;
    nodes->Set(static_cast<double>(c->size()));
    healthy->Set(c->healthy(&detail) ? 1 : 0);
    dir_ids->Set(static_cast<double>(c->directory().ids()));
    dir_bytes->Set(static_cast<double>(c->directory().memory_bytes()));
    const ClusterCounters& k = c->counters();
    announced->Set(k.announced.load());
    refused->Set(k.directory_refused.load());
    peer_fail->Set(k.peer_failures.load());
    replicated->Set(k.replicated.load());
    repl_fail->Set(k.replication_failed.load());
    pulled->Set(k.pulled.load());
    remote->Set(k.remote_located.load());
    rerepl->Set(k.rereplicated.load());
  });
}

}  // namespace strata::daemon
