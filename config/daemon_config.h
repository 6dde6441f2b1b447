// stratad configuration: YAML with documented defaults (DefaultConfigYaml()), flag overrides,
// and validation whose errors name the offending field.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "storage/watermarks.h"

namespace strata {

// The embedded default configuration, also printed by `stratad --print-default-config`.
std::string_view DefaultConfigYaml();

enum class ArenaSource { kAuto, kUcx, kMmap };

struct StaticNode {
  std::string id;
  std::string address;
};

struct ClusterConfig {
  std::string membership;  // "static" | "etcd"
  std::vector<StaticNode> static_nodes;
  std::vector<std::string> etcd_endpoints;
  std::string etcd_prefix;
  absl::Duration etcd_lease_ttl;
  std::string advertise_address;  // empty: the bound listen address
  uint32_t directory_owners = 0;  // R: owners of each block's directory entry
  absl::Duration directory_ttl;
  uint32_t replicas = 0;    // default copies per block (namespaces may override)
  bool rereplicate = true;  // restore lost copies when a node leaves the view
  absl::Duration peer_timeout;
  // From the config file (default 2,000,000); unbounded for code that builds a ClusterConfig
  // itself.
  uint64_t max_directory_entries_per_node = UINT64_MAX;
};

struct NvmeFileConfig {
  std::string path;
  uint64_t capacity = 0;
};

// YAML section host_tier, plus the publish and fetch timeouts (top-level keys) it enforces.
struct HostTierConfig {
  uint64_t capacity = 0;
  bool huge_pages = true;
  ArenaSource arena = ArenaSource::kAuto;
  double high_watermark = kDefaultHighWatermark;
  double low_watermark = kDefaultLowWatermark;
  std::string policy;
  uint64_t max_block_size = 0;
  absl::Duration reservation_timeout;
  absl::Duration lease_timeout;
  absl::Duration max_pin_ttl;
};

// YAML section nvme. No files: no NVMe tier.
struct NvmeTierConfig {
  std::vector<NvmeFileConfig> files;
  std::string catalog_dir;  // empty: <data_dir>/nvme-catalog (NvmeCatalogDir)
  double high_watermark = kDefaultHighWatermark;
  double low_watermark = kDefaultLowWatermark;
  std::string policy;
  std::string admission;
  uint32_t queue_depth = 0;
  bool sync_after_write = true;
};

// YAML section gpu (docs/tiers.md#gpu-tier). capacity 0: no GPU tier.
struct GpuTierConfig {
  uint64_t capacity = 0;
  int32_t device = 0;  // CUDA device ordinal
  // "cuda", or "host-stand-in": host memory in the device's place, so the tier's bookkeeping
  // runs (and is tested) on machines without a GPU. Nothing on a device can use that one.
  std::string memory = "cuda";
  double high_watermark = kDefaultHighWatermark;
  double low_watermark = kDefaultLowWatermark;
  std::string policy;
};

// KV events for KV-aware routers (daemon/events/kv_event_publisher.h).
struct EventsConfig {
  std::string endpoint;         // ZMQ endpoint the PUB socket binds; empty: no events
  std::string replay_endpoint;  // ROUTER socket for replays; empty: none
  uint32_t buffer_steps = 10000;
  bool int_hashes = true;
};

// YAML section auth (docs/security.md).
struct AuthConfig {
  std::string tokens_file;      // "TOKEN TENANT ROLE" lines; empty: no authentication
  std::string peer_token_file;  // this node's token for calls to other nodes; empty: none
  // With authentication the data plane opens no UCX tcp port unless this is true: UCX's tcp
  // transport writes received put requests wherever they say, so only hosts the operator trusts
  // (a network policy admits only them) may reach that port.
  bool ucx_tcp_trusted = false;
  // Several tenants: a tenant's same-node clients may write their own zone (publish by plain
  // copies, as with one tenant) and so also overwrite their own tenant's committed blocks;
  // never another tenant's. false: the zone is read-only to them, publishes are messages.
  bool tenant_zones_writable = false;
};

// YAML section tls (docs/operations.md#tls): TLS on the gRPC listen address, client certificates,
// and TLS on the calls this daemon makes to other nodes. All PEM files; empty: off.
struct TlsConfig {
  std::string cert_file;  // this node's certificate (chain); with key_file, TLS on `listen`
  std::string key_file;
  // CA(s) that sign client certificates: a client that presents one is verified against it (and
  // auth.tokens_file may map its identity to a tenant and role). Empty: none is asked for.
  std::string client_ca_file;
  bool require_client_cert = false;  // refuse a handshake without a verified client certificate
  // CA(s) that sign the other nodes' certificates: calls to them go over TLS, presenting
  // cert_file/key_file as this node's client certificate. Empty: plaintext to other nodes.
  std::string peer_ca_file;
  // The name other nodes' certificates must carry, instead of the host of the address dialed:
  // one certificate for a DNS name shared by every node reached by pod IP. Empty: that host.
  std::string peer_server_name;
  bool enabled() const { return !cert_file.empty(); }
};

// YAML section limits: what clients can make one daemon hold (docs/operations.md#limits).
struct LimitsConfig {
  uint32_t max_namespaces = 0;
  absl::Duration namespace_idle_timeout;
  // Per-tenant quotas on the host tier (storage/host_tier.h, HostTierOptions::tenant_*).
  double tenant_max_share = 1.0;           // of host_tier.capacity; 1: no bound
  uint64_t tenant_max_reserved_bytes = 0;  // 0: no bound
  // daemon/calibrations/calibration_store.h
  uint32_t max_calibrations_per_namespace = 16;
  uint64_t calibration_bytes = 1ull << 30;
  uint64_t parsed_calibration_bytes = 256ull << 20;  // 0: no bound
};

struct DaemonConfig {
  std::string node_id;
  std::string listen;
  std::string http_listen;  // empty: no HTTP endpoint
  std::string data_dir;
  std::string cluster_secret_file;
  std::string log_level;
  std::string log_format;
  HostTierConfig host;
  NvmeTierConfig nvme;
  GpuTierConfig gpu;
  absl::Duration shutdown_grace;
  absl::Duration busy_poll;  // the progress thread polls this long after its last message
  // UCX workers, a progress thread each; clients spread over them. 0: one per CPU this
  // process may run on, 1 to 4.
  uint32_t data_plane_workers = 0;
  ClusterConfig cluster;
  EventsConfig events;
  AuthConfig auth;
  TlsConfig tls;
  // Serve without authentication on a non-loopback address (ValidateConfig refuses otherwise).
  bool insecure = false;
  LimitsConfig limits;
};

// Parses YAML over the defaults: fields absent from `yaml` keep their default value.
absl::StatusOr<DaemonConfig> ParseConfig(std::string_view yaml);
absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path);
absl::Status ValidateConfig(const DaemonConfig& c);

// Whether a listen address is reachable from this host only (127.0.0.0/8, ::1, localhost,
// unix:PATH).
bool IsLoopbackListen(std::string_view listen);

// Where the NVMe tier's catalog lives (nvme.catalog_dir, or its default under data_dir).
std::string NvmeCatalogDir(const DaemonConfig& c);

}  // namespace strata
