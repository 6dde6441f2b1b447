#include "config/daemon_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"
#include "common/strings.h"
#include "common/units.h"
#include "storage/eviction/admission_policy.h"
#include "storage/eviction/eviction_policy.h"

namespace strata {

namespace {

// The defaults as operators read them; {high_watermark} and {low_watermark} are filled in from
// storage/watermarks.h, where the tiers take their defaults from too.
constexpr std::string_view kDefaultConfigTemplate =
    R"yaml(# stratad configuration. Every field is optional; the values below are the defaults.

# Name of this node in stats and logs. Empty: the host name.
node_id: ""
# gRPC control-plane address: HOST:PORT (port 0 picks a free port), or unix:PATH for a local
# Unix socket (slightly lower latency for clients on this node).
listen: "127.0.0.1:7420"
# Operator HTTP endpoint: /metrics (Prometheus text format), /healthz (liveness), /readyz
# (readiness: host tier open and gRPC serving; 503 while starting or draining). HOST:PORT, port 0
# picks a free port (reported as "http_endpoint" in --ready-file). Empty disables it; the
# conventional port is 9420, e.g. "0.0.0.0:9420" for a Prometheus scraping from another host.
http_listen: ""
# State that outlives the process: the generated cluster secret.
data_dir: "/var/lib/strata"
# File holding the cluster secret that salts tenant namespaces. Empty: <data_dir>/cluster_secret,
# generated on first start. Every node of a cluster must use the same secret.
cluster_secret_file: ""
# trace, debug, info, warn, error
log_level: info
# text (for people) or json (one object per line: time, level, pid, msg).
log_format: text

# Who may call (docs/security.md). tokens_file: lines "TOKEN TENANT ROLE", roles tenant, admin
# or peer; every call then needs "authorization: Bearer TOKEN". Empty: no authentication, which
# stratad accepts only on a loopback or unix: listen address unless 'insecure' is true.
auth:
  tokens_file: ""
  # This daemon's own token (a peer role in the other nodes' tokens files) for calls to them.
  peer_token_file: ""
  # With tokens_file set, the UCX data plane uses shared memory and RDMA only: anyone who
  # reaches a UCX tcp port can write anywhere in this process's memory (UCX checks no key on
  # tcp). true: also tcp, for clusters without RDMA whose network admits only trusted hosts.
  ucx_tcp_trusted: false
  # Several tenants: each has a zone of the host arena that its clients on this node map to
  # fetch by plain copies, read-only. true: writable too, so publishes are plain copies as
  # well, at the price that a tenant's client can overwrite that tenant's own committed blocks
  # (never another tenant's).
  tenant_zones_writable: false
# Serve without authentication on a non-loopback listen address: anyone who reaches the port
# can read, overwrite and evict every tenant's blocks. Also the --insecure flag.
insecure: false

# TLS on gRPC (docs/operations.md#tls). PEM files; empty: plaintext. The UCX data plane is not
# encrypted by this (docs/security.md).
tls:
  # This node's certificate (its SANs must name the addresses clients and other nodes dial) and
  # key: with both set, 'listen' serves TLS only. The same pair is this node's client certificate
  # when it calls other nodes.
  cert_file: ""
  key_file: ""
  # CA certificates that sign client certificates. Set: a client certificate, if presented, must
  # verify against them, and auth.tokens_file may map its identity ("cn:NAME" / "san:VALUE"
  # lines) to a tenant and role.
  client_ca_file: ""
  # Refuse clients without a verified certificate (needs client_ca_file).
  require_client_cert: false
  # CA certificates that sign the other nodes' certificates: calls to them use TLS. Needed when
  # cert_file is set and the cluster has other nodes.
  peer_ca_file: ""
  # The name the other nodes' certificates must carry, checked instead of the host of the address
  # dialed (e.g. one certificate for "strata.NAMESPACE.svc" shared by nodes reached by pod IP).
  # Empty: that host, which their certificates must then name (IP or DNS subjectAltName).
  peer_server_name: ""

host_tier:
  # Bytes of host DRAM for blocks (B, KiB, MiB, GiB, TiB).
  capacity: 1GiB
  # Back the arena with huge pages when the kernel offers them.
  huge_pages: true
  # Who provides the arena: ucx (memory UCX allocates, directly mappable by same-node clients),
  # mmap (an anonymous mapping registered with UCX), or auto (ucx, falling back to mmap).
  arena: auto
  # Above high_watermark x capacity, blocks are evicted down to low_watermark: written back to
  # the NVMe tier when one is configured (below), dropped otherwise.
  high_watermark: {high_watermark}
  low_watermark: {low_watermark}
  # Which blocks leave first: lru, s3fifo, prefix-lru, prefix-freq or prefix-adaptive
  # (docs/tiers.md). Leased and pinned blocks never leave.
  policy: lru
  # Largest blob a client may publish (never more than the capacity).
  max_block_size: 256MiB

# NVMe tier: host-tier victims are written here instead of being dropped, fetched blocks are
# staged back into host memory, and the blocks survive a restart (RocksDB catalog). No files: no
# NVMe tier. Example:
#   files:
#     - {path: /mnt/nvme0/strata.tier, capacity: 512GiB}
#     - {path: /mnt/nvme1/strata.tier, capacity: 512GiB}
nvme:
  # Tier files, preallocated to their capacity at start (the disk space they take is fixed).
  files: []
  # RocksDB catalog of the NVMe blocks. Empty: <data_dir>/nvme-catalog.
  catalog_dir: ""
  # Above high_watermark x capacity, NVMe blocks are dropped down to low_watermark.
  high_watermark: {high_watermark}
  low_watermark: {low_watermark}
  # Which NVMe blocks are dropped first (same names as host_tier.policy).
  policy: lru
  # Which host victims are written down: always, or second-access (only blocks requested
  # again while cached, or rejected once before and back since).
  admission: always
  # io_uring requests in flight per batch.
  queue_depth: 32
  # fdatasync the tier files after every write batch, before the catalog entry is written.
  # false: faster, but a power loss may leave catalog entries whose data never reached the
  # disk (their CRC then fails on first read and they are dropped).
  sync_after_write: true

# GPU tier: device memory owned by stratad, above host memory. Blocks are copied up when a
# consumer on the device asks for them (or a reposition targets the gpu tier); device victims
# go back down to host memory when it no longer holds them. capacity 0: no GPU tier.
gpu:
  capacity: 0
  # CUDA device ordinal.
  device: 0
  # cuda, or host-stand-in (host memory in the device's place: the tier's bookkeeping without
  # a GPU, for tests; nothing on a device can read it).
  memory: cuda
  high_watermark: {high_watermark}
  low_watermark: {low_watermark}
  # Which device blocks leave first (same names as host_tier.policy).
  policy: lru

# A publish that reserved space but did not commit within this time loses the reservation.
reservation_timeout: 30s
# A fetch's read lease ends after this time even if the client never releases it.
lease_timeout: 30s
# Upper bound on any pin's time to live.
max_pin_ttl: 24h
# On SIGTERM, in-flight calls get this long to finish.
shutdown_grace: 10s
# The data plane's progress thread keeps polling this long after its last message before it
# sleeps: a wake-up costs tens of microseconds, more than a small fetch. 0s: sleep at once
# (an idle daemon then uses no CPU at all; a busy one pays the wake-ups).
busy_poll: 50us
# Data-plane workers, each with its own progress thread: clients are spread over them as they
# connect, so the bytes for several clients are sent by several threads at once (one thread
# sends for all of them with 1). Other daemons' messages go to the first. 0: one per CPU
# stratad may run on (its affinity), 1 to 4.
data_plane_workers: 0

cluster:
  # static: this node plus static_nodes (a fixed list). etcd: every daemon registers itself in
  # etcd under a lease and watches the others come and go.
  membership: static
  # static: the other nodes, each "NODE_ID@HOST:PORT" (their gRPC listen address).
  static_nodes: []
  # etcd: client URLs, tried in order; keys live under etcd_prefix; a daemon that dies leaves
  # the view once its lease (etcd_lease_ttl) runs out.
  etcd_endpoints: ["http://127.0.0.1:2379"]
  etcd_prefix: /strata/nodes/
  etcd_lease_ttl: 10s
  # How other nodes and clients reach this one. Empty: the address 'listen' bound.
  advertise_address: ""
  # Nodes holding each block's directory entry (chosen by rendezvous hashing); losing fewer
  # than this many nodes at once loses no entry.
  directory_owners: 2
  # Directory entries expire unless their holder re-announces them within this time.
  directory_ttl: 60s
  # Copies of each block on distinct nodes (the publisher's included), unless a namespace
  # asks for its own count when it is opened. 1: no replication.
  replicas: 1
  # When a node leaves the view, holders of replicated blocks that lost a copy make a new one on
  # the next node of the block's ranking.
  rereplicate: true
  # Deadline of every call to another daemon.
  peer_timeout: 1s
  # Directory entries one announcing node may hold on this node; ids beyond it are refused and
  # counted (strata_directory_refused_total). Size it above the blocks a node holds x
  # directory_owners / nodes; each entry takes about 70 bytes.
  max_directory_entries_per_node: 2000000

# What clients can make this daemon hold.
limits:
  # Namespaces open at once; opening one more is refused with RESOURCE_EXHAUSTED.
  max_namespaces: 10000
  # A namespace with no blocks in the host tier that no call has named for this long is released
  # (opening it again gives the same id). At least reservation_timeout.
  namespace_idle_timeout: 1h
  # Fraction of host_tier.capacity one tenant's blocks and open reservations may occupy. At the
  # bound its publishes evict its own least recently used blocks, never other tenants', and get
  # NO_SPACE when those are pinned or leased. 1: no bound (one tenant may take the whole tier and
  # evict the others). Set e.g. 0.5 when tenants share a daemon; every tenant gets the same share.
  tenant_max_share: 1.0
  # Bytes one tenant may hold in reservations not yet committed; more is NO_SPACE. 0: no bound
  # (tenant_max_share bounds them too).
  tenant_max_reserved_bytes: 0
  # Calibrations (codec modes pca and xl) kept per namespace, and their bytes in all, in memory and
  # under <data_dir>/calibrations. A new one past either is refused; none is ever dropped, as
  # blobs coded with it may still be stored somewhere in the cluster.
  max_calibrations_per_namespace: 16
  calibration_bytes: 1GiB
  # Memory for parsed calibrations (what cold transcoding and decodes for GPU peers code with;
  # an xl one of a 1.5B model takes ~80 MB): the least recently used beyond it are parsed again
  # from the store when a blob names them; those in use stay. 0: no bound.
  parsed_calibration_bytes: 256MiB

# KV events in vLLM's format (msgpack over ZMQ) for KV-aware routers (llm-d, Dynamo):
# BlockStored when a block is committed to host memory, BlockRemoved when it leaves it, one
# topic per namespace ("kv@NODE@MODEL@NAMESPACE").
events:
  # ZMQ endpoint the publisher binds, e.g. tcp://0.0.0.0:5557 (port "*": any free one). Empty: off.
  endpoint: ""
  # Where a subscriber that reconnects asks for the batches it missed (vLLM's replay protocol).
  replay_endpoint: ""
  # Batches kept for replay.
  buffer_steps: 10000
  # Block hashes as vLLM sends them by default: the id's last 8 bytes as an unsigned integer.
  # false: the whole 32-byte id as binary.
  int_hashes: true
)yaml";

using Setter = std::function<absl::Status(const YAML::Node&, DaemonConfig&)>;

absl::Status FieldError(const std::string& field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("config field '", field, "': ", why));
}

// `value` of `field` must be one of `names`.
absl::Status CheckOneOf(const std::string& field, const std::string& value,
                        const std::vector<std::string_view>& names) {
  if (std::find(names.begin(), names.end(), value) != names.end()) return absl::OkStatus();
  std::string all;
  for (std::string_view n : names) absl::StrAppend(&all, all.empty() ? "" : ", ", AsAbsl(n));
  return FieldError(field, absl::StrCat("'", value, "' is not one of ", all));
}

// The watermarks of the tier of config section `section`.
absl::Status CheckWatermarks(const std::string& section, double low, double high) {
  if (low > 0 && low <= high && high <= 1) return absl::OkStatus();
  return FieldError(section + ".low_watermark",
                    "watermarks need 0 < low_watermark <= high_watermark <= 1");
}

template <typename T>
absl::StatusOr<T> Scalar(const YAML::Node& n, const std::string& field) {
  if (!n.IsScalar()) return FieldError(field, "must be a scalar value");
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    return FieldError(field, absl::StrCat("cannot read '", n.Scalar(), "' as the expected type"));
  }
}

// A mapping key as text. YAML allows null, sequence and mapping keys ("?\n:"), which as<string>
// would throw out of ParseConfig and terminate stratad instead of refusing the file.
absl::StatusOr<std::string> Key(const YAML::Node& key, const std::string& section) {
  if (!key.IsScalar())
    return FieldError(section.empty() ? "(top level)" : section, "has a key that is not text");
  return key.Scalar();
}

// Where a field lives in DaemonConfig: a top-level member, or a member of a section struct.
template <typename T>
auto At(T DaemonConfig::*m) {
  return [m](DaemonConfig& c) -> T& { return c.*m; };
}
template <typename S, typename T>
auto At(S DaemonConfig::*section, T S::*m) {
  return [section, m](DaemonConfig& c) -> T& { return (c.*section).*m; };
}

// A setter that reads the scalar as T and stores it where `at` points.
template <typename T, typename Where>
Setter Read(std::string f, Where at) {
  return [f, at](const YAML::Node& n, DaemonConfig& c) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(at(c), Scalar<T>(n, f));
    return absl::OkStatus();
  };
}

// A setter for text parsed by `parse` (ParseSize, ParseDurationText).
template <typename Where, typename Parse>
Setter ReadParsed(std::string f, Where at, Parse parse) {
  return [f, at, parse](const YAML::Node& n, DaemonConfig& c) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(std::string text, Scalar<std::string>(n, f));
    auto v = parse(text);
    if (!v.ok()) return FieldError(f, v.status().message());
    at(c) = *v;
    return absl::OkStatus();
  };
}

template <typename Where>
Setter ReadSize(std::string f, Where at) {
  return ReadParsed(f, at, [](const std::string& t) { return ParseSize(t); });
}

template <typename Where>
Setter ReadDuration(std::string f, Where at) {
  return ReadParsed(f, at, [](const std::string& t) { return ParseDurationText(t); });
}

absl::Status ReadNvmeFiles(const YAML::Node& n, DaemonConfig& c) {
  if (!n.IsSequence() && !n.IsNull())
    return FieldError("nvme.files", "must be a list of {path, capacity}");
  c.nvme.files.clear();
  for (size_t i = 0; n.IsSequence() && i < n.size(); ++i) {
    const std::string f = absl::StrCat("nvme.files[", i, "]");
    if (!n[i].IsMap()) return FieldError(f, "must be a mapping {path, capacity}");
    NvmeFileConfig file;
    bool has_path = false, has_capacity = false;
    for (const auto& kv : n[i]) {
      // Not STRATA_ASSIGN_OR_RETURN: GCC 12 then warns of a string "maybe used uninitialized".
      absl::StatusOr<std::string> named = Key(kv.first, f);
      if (!named.ok()) return named.status();
      const std::string& key = *named;
      if (key == "path") {
        STRATA_ASSIGN_OR_RETURN(file.path, Scalar<std::string>(kv.second, f + ".path"));
        has_path = true;
      } else if (key == "capacity") {
        STRATA_ASSIGN_OR_RETURN(std::string text, Scalar<std::string>(kv.second, f + ".capacity"));
        auto v = ParseSize(text);
        if (!v.ok()) return FieldError(f + ".capacity", v.status().message());
        file.capacity = *v;
        has_capacity = true;
      } else {
        return FieldError(f + "." + key, "is not a known field (known: path, capacity)");
      }
    }
    if (!has_path) return FieldError(f + ".path", "must be set");
    if (!has_capacity) return FieldError(f + ".capacity", "must be set");
    c.nvme.files.push_back(std::move(file));
  }
  return absl::OkStatus();
}

absl::Status ReadArena(const YAML::Node& n, DaemonConfig& c) {
  STRATA_ASSIGN_OR_RETURN(std::string v, Scalar<std::string>(n, "host_tier.arena"));
  if (v == "auto")
    c.host.arena = ArenaSource::kAuto;
  else if (v == "ucx")
    c.host.arena = ArenaSource::kUcx;
  else if (v == "mmap")
    c.host.arena = ArenaSource::kMmap;
  else
    return FieldError("host_tier.arena", absl::StrCat("'", v, "' is not auto, ucx or mmap"));
  return absl::OkStatus();
}

absl::Status ReadStaticNodes(const YAML::Node& n, DaemonConfig& c) {
  if (!n.IsSequence()) return FieldError("cluster.static_nodes", "must be a list");
  c.cluster.static_nodes.clear();
  for (size_t i = 0; i < n.size(); ++i) {
    std::string field = absl::StrCat("cluster.static_nodes[", i, "]");
    STRATA_ASSIGN_OR_RETURN(std::string v, Scalar<std::string>(n[i], field));
    size_t at = v.find('@');
    if (at == 0 || at == std::string::npos || v.find(':', at) == std::string::npos)
      return FieldError(field, absl::StrCat("'", v, "' is not NODE_ID@HOST:PORT"));
    c.cluster.static_nodes.push_back({v.substr(0, at), v.substr(at + 1)});
  }
  return absl::OkStatus();
}

absl::Status ReadEtcdEndpoints(const YAML::Node& n, DaemonConfig& c) {
  if (!n.IsSequence()) return FieldError("cluster.etcd_endpoints", "must be a list");
  c.cluster.etcd_endpoints.clear();
  for (size_t i = 0; i < n.size(); ++i) {
    std::string field = absl::StrCat("cluster.etcd_endpoints[", i, "]");
    STRATA_ASSIGN_OR_RETURN(std::string v, Scalar<std::string>(n[i], field));
    if (v.rfind("http://", 0) != 0)
      return FieldError(field, absl::StrCat("'", v, "' must start with http://"));
    c.cluster.etcd_endpoints.push_back(v);
  }
  return absl::OkStatus();
}

std::map<std::string, Setter> Setters() {
  using C = DaemonConfig;
  using H = HostTierConfig;
  using N = NvmeTierConfig;
  using K = ClusterConfig;
  using A = AuthConfig;
  std::map<std::string, Setter> s;
  s["node_id"] = Read<std::string>("node_id", At(&C::node_id));
  s["listen"] = Read<std::string>("listen", At(&C::listen));
  s["http_listen"] = Read<std::string>("http_listen", At(&C::http_listen));
  s["data_dir"] = Read<std::string>("data_dir", At(&C::data_dir));
  s["cluster_secret_file"] = Read<std::string>("cluster_secret_file", At(&C::cluster_secret_file));
  s["log_level"] = Read<std::string>("log_level", At(&C::log_level));
  s["log_format"] = Read<std::string>("log_format", At(&C::log_format));
  s["auth.tokens_file"] = Read<std::string>("auth.tokens_file", At(&C::auth, &A::tokens_file));
  s["auth.peer_token_file"] =
      Read<std::string>("auth.peer_token_file", At(&C::auth, &A::peer_token_file));
  s["auth.ucx_tcp_trusted"] =
      Read<bool>("auth.ucx_tcp_trusted", At(&C::auth, &A::ucx_tcp_trusted));
  s["auth.tenant_zones_writable"] =
      Read<bool>("auth.tenant_zones_writable", At(&C::auth, &A::tenant_zones_writable));
  s["insecure"] = Read<bool>("insecure", At(&C::insecure));
  using T = TlsConfig;
  s["tls.cert_file"] = Read<std::string>("tls.cert_file", At(&C::tls, &T::cert_file));
  s["tls.key_file"] = Read<std::string>("tls.key_file", At(&C::tls, &T::key_file));
  s["tls.client_ca_file"] =
      Read<std::string>("tls.client_ca_file", At(&C::tls, &T::client_ca_file));
  s["tls.require_client_cert"] =
      Read<bool>("tls.require_client_cert", At(&C::tls, &T::require_client_cert));
  s["tls.peer_ca_file"] = Read<std::string>("tls.peer_ca_file", At(&C::tls, &T::peer_ca_file));
  s["tls.peer_server_name"] =
      Read<std::string>("tls.peer_server_name", At(&C::tls, &T::peer_server_name));
  s["shutdown_grace"] = ReadDuration("shutdown_grace", At(&C::shutdown_grace));
  s["busy_poll"] = ReadDuration("busy_poll", At(&C::busy_poll));
  s["data_plane_workers"] = Read<uint32_t>("data_plane_workers", At(&C::data_plane_workers));

  s["host_tier.capacity"] = ReadSize("host_tier.capacity", At(&C::host, &H::capacity));
  s["host_tier.huge_pages"] = Read<bool>("host_tier.huge_pages", At(&C::host, &H::huge_pages));
  s["host_tier.arena"] = ReadArena;
  s["host_tier.high_watermark"] =
      Read<double>("host_tier.high_watermark", At(&C::host, &H::high_watermark));
  s["host_tier.low_watermark"] =
      Read<double>("host_tier.low_watermark", At(&C::host, &H::low_watermark));
  s["host_tier.policy"] = Read<std::string>("host_tier.policy", At(&C::host, &H::policy));
  s["host_tier.max_block_size"] =
      ReadSize("host_tier.max_block_size", At(&C::host, &H::max_block_size));
  // Top-level keys (they predate the section), kept with the tier that enforces them.
  s["reservation_timeout"] =
      ReadDuration("reservation_timeout", At(&C::host, &H::reservation_timeout));
  s["lease_timeout"] = ReadDuration("lease_timeout", At(&C::host, &H::lease_timeout));
  s["max_pin_ttl"] = ReadDuration("max_pin_ttl", At(&C::host, &H::max_pin_ttl));

  s["nvme.files"] = ReadNvmeFiles;
  s["nvme.catalog_dir"] = Read<std::string>("nvme.catalog_dir", At(&C::nvme, &N::catalog_dir));
  s["nvme.high_watermark"] = Read<double>("nvme.high_watermark", At(&C::nvme, &N::high_watermark));
  s["nvme.low_watermark"] = Read<double>("nvme.low_watermark", At(&C::nvme, &N::low_watermark));
  s["nvme.policy"] = Read<std::string>("nvme.policy", At(&C::nvme, &N::policy));
  s["nvme.admission"] = Read<std::string>("nvme.admission", At(&C::nvme, &N::admission));
  s["nvme.queue_depth"] = Read<uint32_t>("nvme.queue_depth", At(&C::nvme, &N::queue_depth));
  s["nvme.sync_after_write"] =
      Read<bool>("nvme.sync_after_write", At(&C::nvme, &N::sync_after_write));

  using G = GpuTierConfig;
  s["gpu.capacity"] = ReadSize("gpu.capacity", At(&C::gpu, &G::capacity));
  s["gpu.device"] = Read<int32_t>("gpu.device", At(&C::gpu, &G::device));
  s["gpu.memory"] = Read<std::string>("gpu.memory", At(&C::gpu, &G::memory));
  s["gpu.high_watermark"] = Read<double>("gpu.high_watermark", At(&C::gpu, &G::high_watermark));
  s["gpu.low_watermark"] = Read<double>("gpu.low_watermark", At(&C::gpu, &G::low_watermark));
  s["gpu.policy"] = Read<std::string>("gpu.policy", At(&C::gpu, &G::policy));

  s["cluster.membership"] =
      Read<std::string>("cluster.membership", At(&C::cluster, &K::membership));
  s["cluster.static_nodes"] = ReadStaticNodes;
  s["cluster.etcd_endpoints"] = ReadEtcdEndpoints;
  s["cluster.etcd_prefix"] =
      Read<std::string>("cluster.etcd_prefix", At(&C::cluster, &K::etcd_prefix));
  s["cluster.advertise_address"] =
      Read<std::string>("cluster.advertise_address", At(&C::cluster, &K::advertise_address));
  s["cluster.etcd_lease_ttl"] =
      ReadDuration("cluster.etcd_lease_ttl", At(&C::cluster, &K::etcd_lease_ttl));
  s["cluster.directory_ttl"] =
      ReadDuration("cluster.directory_ttl", At(&C::cluster, &K::directory_ttl));
  s["cluster.peer_timeout"] =
      ReadDuration("cluster.peer_timeout", At(&C::cluster, &K::peer_timeout));
  s["cluster.directory_owners"] =
      Read<uint32_t>("cluster.directory_owners", At(&C::cluster, &K::directory_owners));
  s["cluster.replicas"] = Read<uint32_t>("cluster.replicas", At(&C::cluster, &K::replicas));
  s["cluster.rereplicate"] = Read<bool>("cluster.rereplicate", At(&C::cluster, &K::rereplicate));
  s["cluster.max_directory_entries_per_node"] =
      Read<uint64_t>("cluster.max_directory_entries_per_node",
                     At(&C::cluster, &K::max_directory_entries_per_node));

  using E = EventsConfig;
  s["events.endpoint"] = Read<std::string>("events.endpoint", At(&C::events, &E::endpoint));
  s["events.replay_endpoint"] =
      Read<std::string>("events.replay_endpoint", At(&C::events, &E::replay_endpoint));
  s["events.buffer_steps"] =
      Read<uint32_t>("events.buffer_steps", At(&C::events, &E::buffer_steps));
  s["events.int_hashes"] = Read<bool>("events.int_hashes", At(&C::events, &E::int_hashes));

  using L = LimitsConfig;
  s["limits.max_namespaces"] =
      Read<uint32_t>("limits.max_namespaces", At(&C::limits, &L::max_namespaces));
  s["limits.namespace_idle_timeout"] =
      ReadDuration("limits.namespace_idle_timeout", At(&C::limits, &L::namespace_idle_timeout));
  s["limits.tenant_max_share"] =
      Read<double>("limits.tenant_max_share", At(&C::limits, &L::tenant_max_share));
  s["limits.tenant_max_reserved_bytes"] =
      ReadSize("limits.tenant_max_reserved_bytes", At(&C::limits, &L::tenant_max_reserved_bytes));
  s["limits.max_calibrations_per_namespace"] =
      Read<uint32_t>("limits.max_calibrations_per_namespace",
                     At(&C::limits, &L::max_calibrations_per_namespace));
  s["limits.calibration_bytes"] =
      ReadSize("limits.calibration_bytes", At(&C::limits, &L::calibration_bytes));
  s["limits.parsed_calibration_bytes"] = ReadSize("limits.parsed_calibration_bytes",
                                                  At(&C::limits, &L::parsed_calibration_bytes));
  return s;
}

absl::Status Apply(const YAML::Node& node, const std::string& prefix,
                   const std::map<std::string, Setter>& setters, DaemonConfig& c) {
  for (const auto& kv : node) {
    STRATA_ASSIGN_OR_RETURN(std::string key, Key(kv.first, prefix));
    std::string field = prefix.empty() ? key : absl::StrCat(prefix, ".", key);
    if (kv.second.IsMap()) {
      bool is_section = false;
      for (const auto& [name, _] : setters)
        if (name.rfind(field + ".", 0) == 0) is_section = true;
      if (!is_section) return FieldError(field, "is not a known section");
      STRATA_RETURN_IF_ERROR(Apply(kv.second, field, setters, c));
      continue;
    }
    auto it = setters.find(field);
    if (it == setters.end()) {
      std::vector<std::string> known;
      for (const auto& [name, _] : setters) known.push_back(name);
      return FieldError(
          field, absl::StrCat("is not a known field (known: ", absl::StrJoin(known, ", "), ")"));
    }
    STRATA_RETURN_IF_ERROR(it->second(kv.second, c));
  }
  return absl::OkStatus();
}

absl::StatusOr<DaemonConfig> ParseOver(DaemonConfig base, std::string_view yaml) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config is not valid YAML: ", e.what()));
  }
  if (root.IsNull()) return base;
  if (!root.IsMap()) return absl::InvalidArgumentError("config must be a YAML mapping");
  STRATA_RETURN_IF_ERROR(Apply(root, "", Setters(), base));
  return base;
}

// Which TLS fields need which others. Whether the files exist and hold what they should is
// checked when the daemon starts (daemon/tls_setup.h), where they are read.
absl::Status ValidateTls(const DaemonConfig& c) {
  const TlsConfig& t = c.tls;
  if (t.cert_file.empty() != t.key_file.empty())
    return t.cert_file.empty() ? FieldError("tls.key_file", "needs tls.cert_file")
                               : FieldError("tls.cert_file", "needs tls.key_file");
  if (!t.client_ca_file.empty() && t.cert_file.empty())
    return FieldError("tls.client_ca_file",
                      "needs tls.cert_file and tls.key_file: client certificates are verified "
                      "only over TLS");
  if (!t.peer_server_name.empty() && t.peer_ca_file.empty())
    return FieldError("tls.peer_server_name", "needs tls.peer_ca_file");
  if (t.require_client_cert && t.client_ca_file.empty())
    return FieldError("tls.require_client_cert",
                      "needs tls.client_ca_file, the CA client certificates are verified against");
  const bool has_peers = c.cluster.membership == "etcd" || !c.cluster.static_nodes.empty();
  if (t.enabled() && t.peer_ca_file.empty() && has_peers)
    return FieldError("tls.peer_ca_file",
                      "must be set when tls.cert_file is and the cluster has other nodes: they "
                      "serve TLS too, and calls to them verify their certificates against it");
  return absl::OkStatus();
}

}  // namespace

std::string_view DefaultConfigYaml() {
  static const std::string* const yaml = new std::string(absl::StrReplaceAll(
      AsAbsl(kDefaultConfigTemplate), {{"{high_watermark}", absl::StrCat(kDefaultHighWatermark)},
                                       {"{low_watermark}", absl::StrCat(kDefaultLowWatermark)}}));
  return *yaml;
}

absl::StatusOr<DaemonConfig> ParseConfig(std::string_view yaml) {
  static const DaemonConfig defaults = [] {
    auto d = ParseOver(DaemonConfig{}, DefaultConfigYaml());
    if (!d.ok()) {  // a build defect, pinned by tests/daemon/config_test.cc
      std::fprintf(stderr, "stratad: the embedded default config is invalid: %s\n",
                   std::string(d.status().message()).c_str());
      std::abort();
    }
    return *d;
  }();
  STRATA_ASSIGN_OR_RETURN(DaemonConfig c, ParseOver(defaults, yaml));
  STRATA_RETURN_IF_ERROR(ValidateConfig(c));
  return c;
}

absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read config file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto c = ParseConfig(ss.str());
  if (!c.ok())
    return absl::Status(c.status().code(), absl::StrCat(path, ": ", c.status().message()));
  return c;
}

absl::Status ValidateConfig(const DaemonConfig& c) {
  if (c.listen.empty() || c.listen.find(':') == std::string::npos)
    return FieldError("listen", "must be HOST:PORT or unix:PATH");
  if (c.auth.tokens_file.empty() && !c.insecure && !IsLoopbackListen(c.listen))
    return FieldError("listen",
                      absl::StrCat("'", c.listen,
                                   "' is reachable from other hosts and auth.tokens_file is not "
                                   "set: configure tokens, listen on 127.0.0.1 or unix:PATH, or "
                                   "accept an unauthenticated daemon with 'insecure: true' "
                                   "(--insecure)"));
  STRATA_RETURN_IF_ERROR(ValidateTls(c));
  if (!c.http_listen.empty() &&
      (c.http_listen.rfind(':') == std::string::npos || c.http_listen.rfind(':') == 0 ||
       c.http_listen.rfind(':') + 1 == c.http_listen.size()))
    return FieldError("http_listen", "must be HOST:PORT, or empty to disable HTTP");
  if (c.host.capacity < (1u << 20)) return FieldError("host_tier.capacity", "must be >= 1MiB");
  STRATA_RETURN_IF_ERROR(
      CheckWatermarks("host_tier", c.host.low_watermark, c.host.high_watermark));
  if (c.host.max_block_size == 0) return FieldError("host_tier.max_block_size", "must be > 0");
  for (const auto& [field, value] : {std::pair{"events.endpoint", c.events.endpoint},
                                     std::pair{"events.replay_endpoint", c.events.replay_endpoint}})
    if (!value.empty() && value.rfind("tcp://", 0) != 0 && value.rfind("ipc://", 0) != 0)
      return FieldError(field, "must be a ZMQ tcp:// or ipc:// endpoint, or empty");
  if (!c.events.replay_endpoint.empty() && c.events.endpoint.empty())
    return FieldError("events.replay_endpoint", "needs events.endpoint");
  if (!c.events.endpoint.empty() && c.events.buffer_steps == 0)
    return FieldError("events.buffer_steps", "must be > 0");
  const auto policies = OnlineEvictionPolicyNames();
  STRATA_RETURN_IF_ERROR(CheckOneOf("host_tier.policy", c.host.policy, policies));
  STRATA_RETURN_IF_ERROR(CheckOneOf("nvme.policy", c.nvme.policy, policies));
  const auto admissions = AdmissionPolicyNames();
  STRATA_RETURN_IF_ERROR(CheckOneOf("nvme.admission", c.nvme.admission, admissions));
  STRATA_RETURN_IF_ERROR(CheckWatermarks("nvme", c.nvme.low_watermark, c.nvme.high_watermark));
  STRATA_RETURN_IF_ERROR(CheckOneOf("gpu.memory", c.gpu.memory, {"cuda", "host-stand-in"}));
  if (c.gpu.device < 0) return FieldError("gpu.device", "must be >= 0");
  STRATA_RETURN_IF_ERROR(CheckOneOf("gpu.policy", c.gpu.policy, policies));
  STRATA_RETURN_IF_ERROR(CheckWatermarks("gpu", c.gpu.low_watermark, c.gpu.high_watermark));
  if (c.gpu.capacity != 0 && c.gpu.capacity < (1u << 20))
    return FieldError("gpu.capacity", "must be 0 (no GPU tier) or >= 1MiB");
  if (c.nvme.queue_depth < 1 || c.nvme.queue_depth > 4096)
    return FieldError("nvme.queue_depth", "must be between 1 and 4096");
  for (size_t i = 0; i < c.nvme.files.size(); ++i) {
    const std::string f = absl::StrCat("nvme.files[", i, "]");
    if (c.nvme.files[i].path.empty()) return FieldError(f + ".path", "must not be empty");
    if (c.nvme.files[i].capacity < (1u << 16))
      return FieldError(f + ".capacity", "must be >= 64KiB");
    for (size_t j = 0; j < i; ++j)
      if (c.nvme.files[j].path == c.nvme.files[i].path)
        return FieldError(f + ".path",
                          absl::StrCat("'", c.nvme.files[i].path, "' is also nvme.files[", j, "]"));
  }
  if (c.host.reservation_timeout < absl::Milliseconds(100))
    return FieldError("reservation_timeout", "must be >= 100ms");
  if (c.host.lease_timeout < absl::Milliseconds(100))
    return FieldError("lease_timeout", "must be >= 100ms");
  // Below it every pin would end before anyone relied on it, while Pin still answers OK.
  if (c.host.max_pin_ttl < absl::Seconds(1))
    return FieldError("max_pin_ttl", "must be >= 1s");
  // A longer window buys no latency (the next burst comes later) and keeps a core busy.
  if (c.busy_poll < absl::ZeroDuration() || c.busy_poll > absl::Milliseconds(10))
    return FieldError("busy_poll", "must be between 0s and 10ms");
  if (c.data_plane_workers > 64)
    return FieldError("data_plane_workers", "must be between 0 (automatic) and 64");
  if (c.limits.max_namespaces < 1) return FieldError("limits.max_namespaces", "must be >= 1");
  // A namespace released between a Reserve and its Commit would strand the committed blocks.
  if (c.limits.namespace_idle_timeout < c.host.reservation_timeout)
    return FieldError("limits.namespace_idle_timeout",
                      absl::StrCat("must be >= reservation_timeout (",
                                   absl::FormatDuration(c.host.reservation_timeout), ")"));
  // NaN fails both comparisons.
  if (!(c.limits.tenant_max_share > 0 && c.limits.tenant_max_share <= 1))
    return FieldError("limits.tenant_max_share",
                      "must be a fraction of host_tier.capacity, > 0 and <= 1 (1: no bound)");
  const uint64_t reserved_cap = c.limits.tenant_max_reserved_bytes;
  if (reserved_cap > c.host.capacity)
    return FieldError("limits.tenant_max_reserved_bytes",
                      "must be <= host_tier.capacity (0: no bound)");
  if (c.limits.max_calibrations_per_namespace < 1)
    return FieldError("limits.max_calibrations_per_namespace", "must be >= 1");

  static const char* levels[] = {"trace", "debug", "info", "warn", "error"};
  bool ok = false;
  for (const char* l : levels) ok |= c.log_level == l;
  if (!ok) return FieldError("log_level", "must be trace, debug, info, warn or error");
  if (c.log_format != "text" && c.log_format != "json")
    return FieldError("log_format", "must be text or json");
  if (c.data_dir.empty()) return FieldError("data_dir", "must be set");
  const ClusterConfig& k = c.cluster;
  if (k.membership != "static" && k.membership != "etcd")
    return FieldError("cluster.membership", "must be static or etcd");
  if (k.membership == "etcd" && k.etcd_endpoints.empty())
    return FieldError("cluster.etcd_endpoints", "must list at least one endpoint for etcd");
  if (k.etcd_lease_ttl < absl::Seconds(1))
    return FieldError("cluster.etcd_lease_ttl", "must be >= 1s");
  if (k.directory_owners < 1 || k.directory_owners > 8)
    return FieldError("cluster.directory_owners", "must be between 1 and 8");
  if (k.directory_ttl < absl::Seconds(1))
    return FieldError("cluster.directory_ttl", "must be >= 1s");
  if (k.replicas < 1 || k.replicas > 8) return FieldError("cluster.replicas", "must be 1 to 8");
  if (!k.advertise_address.empty() && k.advertise_address.rfind(':') == std::string::npos)
    return FieldError("cluster.advertise_address", "must be HOST:PORT (or empty)");
  if (k.peer_timeout < absl::Milliseconds(10))
    return FieldError("cluster.peer_timeout", "must be >= 10ms");
  if (k.max_directory_entries_per_node < 1)
    return FieldError("cluster.max_directory_entries_per_node", "must be >= 1");
  for (size_t i = 0; i < k.static_nodes.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (k.static_nodes[i].id == k.static_nodes[j].id)
        return FieldError(absl::StrCat("cluster.static_nodes[", i, "]"),
                          absl::StrCat("node id '", k.static_nodes[i].id, "' is listed twice"));
  return absl::OkStatus();
}

bool IsLoopbackListen(std::string_view listen) {
  if (listen.rfind("unix:", 0) == 0) return true;
  std::string_view host = listen.substr(0, listen.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  // Names other than localhost could resolve anywhere: only literal loopback addresses count.
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::string NvmeCatalogDir(const DaemonConfig& c) {
  return c.nvme.catalog_dir.empty() ? c.data_dir + "/nvme-catalog" : c.nvme.catalog_dir;
}

}  // namespace strata
