// The Prometheus series stratad exports about its block store and its cluster layer:
// registered once at start, set from stats when /metrics is scraped (a scrape registers
// nothing).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/metrics.h"
#include "daemon/namespace_registry.h"
#include "storage/block_store.h"
#include "storage/host_tier.h"

namespace strata::daemon {

class Cluster;
struct TierSeries;
struct NvmeSeries;
struct GpuSeries;

class StoreSeries {
 public:
  // Host tier series, the page size behind the arena (`arena_page_bytes`), the NVMe tier's
  // series when `nvme`, the GPU tier's when `gpu`.
  StoreSeries(MetricsRegistry& m, uint64_t arena_page_bytes, bool nvme, bool gpu = false);
  ~StoreSeries();
  StoreSeries(const StoreSeries&) = delete;
  StoreSeries& operator=(const StoreSeries&) = delete;

  // One scrape. `ready`: /readyz answers 200; `in_flight`: Cache calls running.
  void Collect(const BlockStore& store, const NamespaceRegistry& namespaces, bool ready,
               int in_flight);

 private:
  std::unique_ptr<TierSeries> host_;
  std::unique_ptr<NvmeSeries> nvme_;
  std::unique_ptr<GpuSeries> gpu_;
};

// The cluster series; each scrape reads them from `*cluster` once it is set.
void RegisterClusterSeries(MetricsRegistry& m, const std::atomic<Cluster*>* cluster);

// Per-tenant host tier usage (the quota accounting of limits.tenant_*), read from `tier` at each
// scrape. Labelled series only for `named` (the tenants of the tokens file, at most
// kMaxLabelledTenants of them), so a client inventing tenant names cannot grow the series count;
// every other tenant is summed into tenant="_other". (The quota counters are in StoreSeries.)
inline constexpr size_t kMaxLabelledTenants = 64;
void RegisterTenantSeries(MetricsRegistry& m, const HostTier* tier,
                          const std::vector<std::string>& named);

class KvEventPublisher;
// The KV event series (when events are on); `events` outlives the registry's scrapes.
void RegisterEventSeries(MetricsRegistry& m, const KvEventPublisher* events);

class CalibrationStore;
// The calibration store's series: the artefacts it holds, and the parsed calibrations the
// daemon's coders keep (limits.parsed_calibration_bytes); `store` outlives the scrapes.
void RegisterCalibrationSeries(MetricsRegistry& m, const CalibrationStore* store);

// strata_codec_kernel_info{part, kernel} 1 per part of the codec (codec::CpuKernels): what sets
// this node's encode, decode and transcode speed.
void RegisterCodecKernelSeries(MetricsRegistry& m);

}  // namespace strata::daemon
