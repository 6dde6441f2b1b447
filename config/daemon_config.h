// stratad configuration: YAML with documented defaults (kDefaultConfigYaml), flag overrides,
// and validation whose errors name the offending field.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata {

// The embedded default configuration, also printed by `stratad --print-default-config`.
extern const std::string_view kDefaultConfigYaml;

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
};

struct NvmeFileConfig {
  std::string path;
  uint64_t capacity = 0;
};

struct DaemonConfig {
  std::string node_id;
  std::string listen;
  std::string http_listen;  // empty: no HTTP endpoint
  std::string data_dir;
  std::string cluster_secret_file;
  std::string log_level;
  std::string log_format;
  uint64_t host_capacity = 0;
  bool huge_pages = true;
  ArenaSource arena = ArenaSource::kAuto;
  double high_watermark = 0;
  double low_watermark = 0;
  std::string host_policy;  // host_tier.policy
  uint64_t max_block_size = 0;
  // nvme: no files, no NVMe tier.
  std::vector<NvmeFileConfig> nvme_files;
  std::string nvme_catalog_dir;  // empty: <data_dir>/nvme-catalog
  double nvme_high_watermark = 0;
  double nvme_low_watermark = 0;
  std::string nvme_policy;
  std::string nvme_admission;
  uint32_t nvme_queue_depth = 0;
  bool nvme_sync_after_write = true;
  absl::Duration reservation_timeout;
  absl::Duration lease_timeout;
  absl::Duration max_pin_ttl;
  absl::Duration shutdown_grace;
  ClusterConfig cluster;
};

// Parses YAML over the defaults: fields absent from `yaml` keep their default value.
absl::StatusOr<DaemonConfig> ParseConfig(std::string_view yaml);
absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path);
absl::Status ValidateConfig(const DaemonConfig& c);

}  // namespace strata
