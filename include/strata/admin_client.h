// The operator's view of one stratad: status and counters, the cluster as the node sees it, the
// namespaces and blocks it holds, and the operations an operator runs on them (pin, evict,
// reposition, drain). What `stratactl` is built on; a serving engine uses strata/client.h.
//
// Every call has a deadline (AdminClientOptions::timeout; reposition and drain get at least
// `long_timeout`, since they move data). A daemon that cannot be reached within it answers
// kUnavailable or kDeadlineExceeded; a refusal by the daemon keeps the daemon's code and message.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "strata/block_id.h"
#include "strata/block_status.h"
#include "strata/client.h"

namespace strata {

struct AdminClientOptions {
  std::string endpoint = "127.0.0.1:7420";
  // Bearer token of an admin role (see ClientOptions::auth_token); empty: none.
  std::string auth_token;
  TlsOptions tls;  // see ClientOptions::tls
  absl::Duration timeout = absl::Seconds(5);
  absl::Duration long_timeout = absl::Minutes(10);
};

struct TierUsage {
  std::string tier;  // "host", "nvme", "gpu"
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t blocks = 0;
  uint64_t reserved_bytes = 0;
};

struct NodeStatus {
  std::string node_id;
  std::string version;
  uint64_t uptime_ms = 0;
  std::string transport;         // UCX transports in use
  std::vector<TierUsage> tiers;  // host first
  uint64_t open_reservations = 0;
  uint64_t open_leases = 0;
  uint64_t pinned_blocks = 0;
  uint64_t namespaces = 0;
  std::map<std::string, uint64_t> counters;

  const TierUsage* Tier(const std::string& name) const;
};

struct NodeEntry {
  std::string id;
  std::string address;
  std::string version;
  uint64_t host_capacity = 0;
  bool self = false;
};

struct ClusterView {
  std::string membership;  // "static" | "etcd"
  bool healthy = false;    // false: the membership store is unreachable (view may be stale)
  std::string detail;
  uint64_t epoch = 0;
  uint64_t directory_ids = 0;  // directory entries the node owns
  uint64_t directory_bytes = 0;
  std::vector<NodeEntry> nodes;
};

struct NamespaceSummary {
  NamespaceId id;
  std::string tenant;
  std::string model_id;
  std::string codec_policy;
  uint64_t blocks = 0;
  uint64_t bytes = 0;
};

struct BlockDetail {
  BlockId id;
  NamespaceId ns;
  BlockId parent;  // zero for a chain's first block
  uint64_t size_bytes = 0;
  uint32_t crc32c = 0;
  uint32_t leases = 0;
  uint64_t pinned_for_ms = 0;  // 0 when not pinned
  uint64_t idle_ms = 0;
};

struct BlockPage {
  std::vector<BlockDetail> blocks;
  uint64_t next_page_token = 0;  // 0 after the last page
};

// A namespace's calibration (codec mode pca) as a daemon holds it.
struct CalibrationSummary {
  NamespaceId ns;
  uint64_t id = 0;
  uint32_t version = 0;
  uint64_t bytes = 0;
  uint32_t num_layers = 0, num_kv_heads = 0, head_dim = 0;
  float target_bits = 0, sample_bits = 0, rope_theta = 0;
  std::string mode;  // the codec mode it serves: "pca" or "xl"
  float step = 0;    // xl: the step it was made with
  int64_t added_unix_ms = 0;
  bool current = false;  // what new blobs of the namespace are coded with
};

struct DrainReport {
  uint64_t blocks = 0;  // held when the drain began
  uint64_t moved = 0;
  uint64_t failed = 0;
  std::vector<std::string> targets;
};

class AdminClient {
 public:
  // Creates the channel; nothing is sent until the first call.
  static absl::StatusOr<std::unique_ptr<AdminClient>> Connect(const AdminClientOptions& options);
  ~AdminClient();
  AdminClient(const AdminClient&) = delete;
  AdminClient& operator=(const AdminClient&) = delete;

  const std::string& endpoint() const;

  absl::StatusOr<NodeStatus> Status();
  absl::StatusOr<ClusterView> ListNodes();
  absl::StatusOr<std::vector<NamespaceSummary>> ListNamespaces();
  absl::StatusOr<BlockPage> ListBlocks(const NamespaceId& ns, uint32_t page_size,
                                       uint64_t page_token);
  // The blocks among `ids` the node holds (any namespace).
  absl::StatusOr<std::vector<BlockDetail>> InspectBlocks(std::span<const BlockId> ids);

  absl::StatusOr<std::vector<BlockStatus>> Pin(const NamespaceId& ns, std::span<const BlockId> ids,
                                               absl::Duration ttl);
  absl::StatusOr<std::vector<BlockStatus>> Unpin(const NamespaceId& ns,
                                                 std::span<const BlockId> ids);
  absl::StatusOr<EvictOutcome> Evict(const NamespaceId& ns, std::span<const BlockId> ids,
                                     bool cascade, bool force);
  // Copies (move: moves) blocks to `target_node` (empty: this node), into `target_tier` ("host"
  // or "gpu", see Client::Reposition).
  absl::StatusOr<RepositionOutcome> Reposition(const NamespaceId& ns, std::span<const BlockId> ids,
                                               const std::string& target_node, bool move,
                                               std::string_view target_tier = "host");
  // Drains this node: its blocks move to the nodes ranking next for them, then it leaves.
  absl::StatusOr<DrainReport> Drain();

  // Calibrations (codec mode pca) of one namespace, or of every namespace (nullopt).
  absl::StatusOr<std::vector<CalibrationSummary>> ListCalibrations(std::optional<NamespaceId> ns);
  // One calibration's serialized bytes (`id` 0: the namespace's current one), from the node or,
  // when it lacks it, from the rest of its cluster.
  absl::StatusOr<std::string> GetCalibration(const NamespaceId& ns, uint64_t id,
                                             CalibrationSummary* summary);
  // Stores serialized calibration bytes for a namespace (and copies them to the cluster).
  absl::StatusOr<CalibrationSummary> PutCalibration(const NamespaceId& ns, std::string artefact);

  class Rpcs;

 private:
  explicit AdminClient(std::unique_ptr<Rpcs> rpcs);
  std::unique_ptr<Rpcs> rpcs_;
};

}  // namespace strata
