// libstrata: the C++ API a serving engine links to publish, look up, fetch, pin and evict
// KV-cache blocks on its node's stratad.
//
// Control calls go over gRPC with a deadline each; block bytes move with UCX one-sided RMA
// directly between the engine's buffers and the daemon's host arena. Register long-lived engine
// buffers once with RegisterBuffer so transfers skip per-call registration.
//
// A Client is thread-safe. Per-block outcomes are reported per block: a miss or a corrupt block
// never fails the whole call, so the engine recomputes exactly those tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "strata/block_id.h"
#include "strata/block_status.h"
#include "strata/device_buffer.h"

namespace strata {

enum class LogLevel { kDebug, kInfo, kWarning, kError };

// Receives libstrata's diagnostics (rare: e.g. the lookup fast path switching itself off). It
// may be called from any thread that calls into the Client, so it must be thread-safe and quick.
using LogSink = std::function<void(LogLevel, std::string_view)>;

// TLS to a daemon whose config has a `tls:` section (docs/operations.md#tls). PEM files, read
// when the client connects; a missing or malformed one fails Connect naming the field.
struct TlsOptions {
  // CA certificates the daemons' certificates are verified against. Set: TLS on; empty:
  // plaintext (the other fields are then ignored).
  std::string ca_file;
  // A client certificate and its key, both or neither: the daemon verifies it against its
  // tls.client_ca_file and may map it to a tenant and role instead of a bearer token.
  std::string cert_file;
  std::string key_file;
  // The name the daemon's certificate must carry, instead of the endpoint's host (a certificate
  // for a DNS name reached by IP, tests). Empty: the endpoint's host.
  std::string server_name;
  bool enabled() const { return !ca_file.empty(); }
};

struct ClientOptions {
  std::string endpoint = "127.0.0.1:7420";
  std::string client_name = "libstrata";
  // Bearer token (the daemon's auth.tokens_file maps it to a tenant and a role), sent on every
  // call to this daemon and to the other nodes remote fetches reach. Empty: none (a daemon
  // without authentication).
  std::string auth_token;
  // TLS on every gRPC call, to this daemon and to the other nodes remote fetches reach. The
  // token, when set, travels inside it.
  TlsOptions tls;
  absl::Duration rpc_timeout = absl::Seconds(5);
  // Bound on one batch of RMA transfers; kept below the daemon's reservation timeout so a slow
  // client never writes into space the daemon has already reclaimed.
  absl::Duration transfer_timeout = absl::Seconds(10);
  // Check every fetched block against the CRC32C recorded at commit.
  bool verify_crc = true;
  // Blocks the local daemon lacks are fetched straight from the node holding them (found
  // through the local daemon's directory), trying each replica in turn. The node that served
  // most of a namespace's last remote fetch is asked first, before the directory: a client fed
  // by one node (a decode node behind its prefill node) skips the directory's round trips.
  bool remote_fetch = true;
  // Lookups of up to 1,024 blocks as a UCX active message on the data-plane endpoint (falls back
  // to gRPC by itself; false: always gRPC).
  bool lookup_fast_path = true;
  // Reserve and Commit of a publish (and Acquire of a fetch) as UCX active messages too, where
  // the daemon offers it (false: gRPC, for comparisons and for daemons under investigation).
  bool control_by_message = true;
  // How fetched bytes move when the daemon's arena is not mapped into this process: "rma"
  // (one-sided get), "push" (the daemon sends each block as an active message, received
  // straight into the engine's buffer), or "auto": push when this host has no RDMA device
  // (UCX then emulates RMA in software, at a fraction of what TCP carries), rma otherwise.
  // Publishes follow the same choice ("push": each block is sent as an active message that the
  // daemon writes into the reservation). A daemon that authenticates callers hands out no
  // remote key: then both always go by message, whatever this says.
  std::string fetch_transfer = "auto";
  // Fetched bytes are written into the engine's buffers around the CPU caches (non-temporal
  // stores, on CPUs with AVX-512): a KV pool is larger than the caches and its blocks are read
  // next by a copy to the GPU or by attention over the whole prefix, so caching them evicts
  // lines the engine uses, and the copy skips reading each destination line from memory first
  // (a cold destination: 1.5x the copy's speed from cold memory, 2.5x from a cache-hot message).
  // False: fetched blocks land in the caches, for an engine that reads each one on the CPU right
  // after its fetch returns. Blocks the transport writes itself (RMA, a large pushed block
  // received in place) land as it writes them either way, and blobs fetched to be decoded (a
  // namespace with a codec) or handed back (FetchBlobs) always land in the caches: they are read
  // at once.
  bool fetch_bypasses_cache = true;
  // Where a fetch goes by push over tcp (a daemon on another node, or fetch_transfer "push"
  // without a mapped arena), blocks larger than this come in pieces of at most this many bytes,
  // each copied into place and checked as it arrives, instead of landing as one rendezvous at
  // the end of the batch (docs/cluster.md: a remote fetch of 1 MiB blocks 1.3x, of 8 MiB ones
  // 1.5x faster over loopback). Publishes by message over tcp send blocks over 256 KiB in such
  // pieces too (1 MiB 1.2x, 8 MiB 1.3x faster). 0: whole blocks. Unset: what fits one of UCX's
  // tcp receive segments (UCX_TCP_RX_SEG_SIZE, 64 KiB by default, less 256 bytes of headers).
  // Environment override: STRATA_CLIENT_PUSH_PIECE_BYTES. Daemons that do not offer pieces get
  // and send whole blocks.
  std::optional<uint32_t> push_piece_bytes;
  // How a call waiting for the daemon (a transfer, a reply) spends the wait: it polls for
  // `wait_spin` after the last event, then polls between yields of its core (sched_yield) for
  // `wait_yield`, then sleeps until the next event. A yield costs nothing while a core is free
  // (it returns at once), and when waiting threads outnumber the cores it hands theirs to the
  // daemon's progress thread and the other clients, which produce the events: with pure
  // polling, four clients on two cores made p99 latencies of 4-25 ms, and even 10 us of it
  // before the first yield cost those clients 10-15 % of their 64 KiB throughput over tcp and
  // half of it over shared memory (bench/peers/README.md). Sleeping also frees the core when
  // nobody else wants it, at the price of a wake-up (tens of us; sleeping after 50 us of spin
  // halved the same clients' throughput), and it is the only way to leave the core to a daemon
  // in another session or cgroup, which a yield does not reach: against stratad in its own
  // session, yielding for 30 us and then sleeping gave four clients 5-20 % more than yielding
  // for ever (three alternating bench/peers runs; one client: within the noise, up to 10-20 %
  // less on some rows). A call does not sleep while its own transfers are in flight and moving
  // (they move only while it polls; 10 ms without progress and it sleeps). wait_spin infinite:
  // poll only (before 0.2). Environment overrides, in microseconds or "inf":
  // STRATA_CLIENT_WAIT_SPIN_US, STRATA_CLIENT_WAIT_YIELD_US.
  absl::Duration wait_spin = absl::ZeroDuration();
  absl::Duration wait_yield = absl::Microseconds(30);
  // The daemon runs on this machine: keep shared-memory transports (a second, idle endpoint over
  // tcp reports the daemon's death; without tcp, deadlines do). False: another node, reached
  // the same way over tcp and by an endpoint that detects a dead peer itself over RDMA.
  bool same_node = true;
  // Namespaces with a vLLM id scheme: the engine's PYTHONHASHSEED, from which vLLM derives the
  // parent of every first block. Empty: this process's PYTHONHASHSEED (the engine's own, when
  // libstrata runs inside it), or vLLM's fixed default seed when that is unset too.
  std::string vllm_hash_seed;
  // How much memory the calibrations this client parsed (codec modes pca and xl) may keep: the
  // least recently used ones beyond it are dropped and asked of the daemon again when a blob
  // names them (a parsed xl calibration of a 1.5B model takes ~80 MB; a namespace recalibrated
  // every hour would otherwise grow the engine by that much per version). The ones in use stay,
  // so one larger than the budget still serves. 0: no bound.
  uint64_t calibration_cache_bytes = uint64_t{256} << 20;
  // Where diagnostics go. Unset: warnings and errors are written to stderr, prefixed
  // "libstrata: ", and the rest is dropped; a sink that ignores everything silences the library.
  LogSink log;
};

struct ConstBuffer {
  const void* data;
  size_t size;
};

struct MutableBuffer {
  void* data;
  size_t size;
};

struct PublishResult {
  std::vector<BlockId> ids;
  std::vector<BlockStatus> status;  // kOk = stored now, kExists = already there (no bytes sent)
  size_t stored = 0;
  size_t deduplicated = 0;
  uint64_t bytes_sent = 0;
};

struct LookupResult {
  std::vector<BlockId> ids;  // ids of every full block of the query
  size_t prefix_blocks = 0;  // leading blocks cached
  size_t prefix_tokens = 0;
  std::string node_id;
  // In a cluster: the node holding each prefix block (this node when it holds it); empty when
  // the daemon runs alone.
  std::vector<std::string> nodes;
};

// Where a block is: node id, its gRPC address, and tier ("gpu", "host", "nvme").
struct BlockHolder {
  std::string node;
  std::string address;
  std::string tier;
};

struct RepositionOutcome {
  std::vector<BlockStatus> status;  // kOk: on the target now; kNotFound: no holder answered
  uint64_t copied = 0;
  uint64_t already_there = 0;
  uint64_t removed_sources = 0;
};

struct FetchResult {
  std::vector<BlockStatus> status;  // kOk, kNotFound, kCrcMismatch, kInvalid (buffer too small)
  std::vector<uint64_t> sizes;      // bytes written to each buffer (decoded size under a codec)
  size_t fetched = 0;
  uint64_t bytes_received = 0;  // bytes that travelled (encoded size under a codec)
  size_t remote = 0;            // blocks fetched from another node's daemon
};

// What Client::FetchToDevice copied into a lent device buffer, per id in request order.
struct DeviceFetchResult {
  // kOk (copied), kNotFound, kInvalid (does not fit where its offset puts it: nothing written).
  std::vector<BlockStatus> status;
  std::vector<uint64_t> sizes;     // bytes written (the block as stored: a blob under a codec)
  std::vector<uint32_t> crcs;      // their CRC32C, as the daemon's tiers verified them
  std::vector<std::string> sources;  // "gpu" (device to device) or "host" (host to device)
  size_t fetched = 0;
  uint64_t bytes = 0;
  uint64_t daemon_micros = 0;  // of the call's time, what the daemon spent leasing and copying
};

struct DeviceFetchOptions {
  // Blocks only host memory or NVMe holds are promoted into the GPU tier first (false: copied
  // straight from host memory, leaving the GPU tier as it is).
  bool promote = true;
  // Under a codec policy, each block is decoded into the buffer (BlockBytes() each): on the
  // device by the daemon's CUDA decoder, or on its CPU where the tier is a stand-in. False: the
  // blob as stored.
  bool decode = false;
};

// What Client::PublishFromDevice stored, per id in request order.
struct DevicePublishResult {
  // kOk (stored), kExists, kInProgress, kNoSpace (as Reserve answers), kInvalid (outside the lent
  // range, of the wrong size, or not encodable: a non-finite value under a lossy codec).
  std::vector<BlockStatus> status;
  std::vector<uint64_t> stored_bytes;  // bytes stored (the blob under a codec)
  size_t stored = 0;
  uint64_t bytes_read = 0;         // bytes read out of the lent buffer
  bool encoded_on_device = false;  // the codec's quantiser ran on the device
};

struct EvictOutcome {
  std::vector<BlockStatus> status;
  uint64_t removed_blocks = 0;
};

struct DaemonStats {
  std::string node_id;
  std::string version;
  uint64_t uptime_ms = 0;
  uint64_t host_capacity_bytes = 0;
  uint64_t host_used_bytes = 0;
  uint64_t host_blocks = 0;
  uint64_t host_reserved_bytes = 0;
  uint64_t open_reservations = 0;
  uint64_t open_leases = 0;
  uint64_t pinned_blocks = 0;
  uint64_t namespaces = 0;
  std::string transport;
  std::vector<std::pair<std::string, uint64_t>> counters;
};

// A namespace's calibration (codec policy "pca:..." or "xl:..."): the learned transform its blobs
// are coded with, stored by the daemons. docs/codec.md, "Calibrations".
struct CalibrationInfo {
  uint64_t id = 0;        // what blobs name it by (a hash of its bytes)
  uint32_t version = 0;   // the namespace's counter; the highest is current
  uint64_t bytes = 0;
  float target_bits = 0;  // bits per value it aimed for
  float sample_bits = 0;  // and reached on its samples
  float rope_theta = 0;   // > 0: keys coded with RoPE undone
  std::string mode;       // the codec mode it serves: "pca" or "xl"
  float step = 0;         // xl: the quantiser step it was made with (target_bits is 0)
  bool current = false;   // what new blobs are coded with
  uint32_t replicated_to = 0;  // after a Calibrate or PutCalibration: daemons that took a copy
};

// The client's own cache of parsed calibrations (ClientOptions::calibration_cache_bytes).
struct CalibrationCacheStats {
  uint64_t calibrations = 0;  // held now
  uint64_t bytes = 0;         // what they take in memory (over the budget while all are in use)
  uint64_t budget_bytes = 0;  // 0: no bound
  uint64_t evictions = 0;     // dropped to stay within the budget, since the client started
  uint64_t fetches = 0;       // artefacts asked of the daemon and parsed
};

struct CalibrationRequest {
  // pca: bits per value to aim for; 0: the rate of the namespace's codec policy ("pca:b1.5", or
  // C of "pca:rC").
  double bits_per_value = 0;
  // xl: the quantiser step (in units of each head's rms); 0: the step of the namespace's codec
  // policy ("xl:s0.7").
  double step = 0;
  // > 0: undo RoPE with this theta (the model's rope_theta) on the keys before the transform.
  double rope_theta = 0;
  // With rope_theta: the position of each sample block's first token (default: sample i starts
  // at i * tokens_per_block, a prefix published from its first token).
  std::vector<uint64_t> first_positions;
  // How much the model minds each layer's relative error, per (layer, tensor) or (pca only) per
  // (layer, tensor, kv head), layer-major; empty: all alike. Measured by running the model on
  // decoded KV (bench/codec/real_kv/model_quality.py sensitivity; docs/codec.md): layers differ by
  // 100x; from 2 bits/value up, spending the bits where the model looks lowered its KL 1.5-2.7x
  // at equal rate on two models, while at 1 bit/value it did worse.
  std::vector<double> importance;
};

// How a namespace's blocks are kept; not part of its identity (its id and blocks' ids).
struct NamespaceOptions {
  uint32_t replicas = 0;  // copies of each block across the cluster; 0: the daemon's default
  // A codec namespace's cold blocks are rewritten with this codec spec (quant or groupwise,
  // e.g. "quant:k2v2:ol") on the daemon instead of being evicted when its host memory is under
  // pressure; fetches then decode them at that lower rate. Empty: evicted as usual.
  std::string cold_codec;
};

class Client {
 public:
  // Connects the control plane, then the data plane (UCX endpoint to the daemon's worker).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();

  // Opens (idempotently) a namespace for `tenant`; the returned id seeds the block ids.
  absl::StatusOr<NamespaceId> OpenNamespace(const NamespaceSpec& spec, const std::string& tenant);
  // As above, asking the cluster to keep `replicas` copies of each block (0: the daemon's
  // default). Not part of the namespace's identity.
  absl::StatusOr<NamespaceId> OpenNamespace(const NamespaceSpec& spec, const std::string& tenant,
                                            uint32_t replicas);
  // As above, with every option of how the namespace is kept (NamespaceOptions).
  absl::StatusOr<NamespaceId> OpenNamespace(const NamespaceSpec& spec, const std::string& tenant,
                                            const NamespaceOptions& options);

  // Registers [data, data+size) for zero-copy transfers until UnregisterBuffer or destruction.
  absl::Status RegisterBuffer(void* data, size_t size);
  absl::Status UnregisterBuffer(void* data);

  // Publishes blocks[i] as the i-th full block of `tokens` (blocks.size() <= full blocks).
  // Under a codec policy each block is the layout-shaped KV of the block (BlockBytes() bytes),
  // encoded here before it is sent; under "opaque" the bytes are stored as given.
  absl::StatusOr<PublishResult> Publish(const NamespaceId& ns, std::span<const uint32_t> tokens,
                                        std::span<const ConstBuffer> blocks);
  // Lower level: publishes blobs under known ids; parents[i] is ids[i-1] of the chain.
  absl::StatusOr<PublishResult> PublishIds(const NamespaceId& ns, std::span<const BlockId> ids,
                                           std::span<const BlockId> parents,
                                           std::span<const ConstBuffer> blocks);
  // The same, saying where each block's first token sits in its sequence: what a calibration
  // that undoes RoPE needs (Publish knows it from the tokens).
  absl::StatusOr<PublishResult> PublishIds(const NamespaceId& ns, std::span<const BlockId> ids,
                                           std::span<const BlockId> parents,
                                           std::span<const ConstBuffer> blocks,
                                           std::span<const uint64_t> first_positions);

  // Calibrates a namespace whose codec policy is pca from sample blocks (layout-shaped KV,
  // BlockBytes() each; at least a few thousand tokens' worth) and stores the result on the
  // daemon as the namespace's next version, which the cluster's clients code new blocks with
  // from then on (each client within ~10 s). Blobs of earlier versions still decode.
  absl::StatusOr<CalibrationInfo> Calibrate(const NamespaceId& ns,
                                            std::span<const ConstBuffer> samples,
                                            const CalibrationRequest& request = {});
  // Stores a calibration made elsewhere (a serialized codec::Calibration, such as what
  // `stratactl calibration get` saves).
  absl::StatusOr<CalibrationInfo> PutCalibration(const NamespaceId& ns,
                                                 std::span<const uint8_t> artefact);
  // The namespace's calibrations on the local daemon, oldest version first.
  absl::StatusOr<std::vector<CalibrationInfo>> ListCalibrations(const NamespaceId& ns);
  // This client's parsed calibrations (every namespace's): a budget too small for the versions
  // in use shows as evictions and fetches that keep growing.
  CalibrationCacheStats calibration_cache_stats() const;

  // Ids of every full block of `tokens` under the namespace's id scheme. `cache_salt` is the
  // request's salt in a namespace with a vLLM id scheme (it enters the first block's id).
  absl::StatusOr<std::vector<BlockId>> BlockIds(const NamespaceId& ns,
                                                std::span<const uint32_t> tokens,
                                                std::string_view cache_salt = {}) const;

  absl::StatusOr<LookupResult> Lookup(const NamespaceId& ns, std::span<const uint32_t> tokens);
  absl::StatusOr<size_t> LookupIds(const NamespaceId& ns, std::span<const BlockId> ids);

  // Under a codec policy, fetched blobs are decoded into the buffers (BlockBytes() each).
  absl::StatusOr<FetchResult> Fetch(const NamespaceId& ns, std::span<const BlockId> ids,
                                    std::span<const MutableBuffer> buffers);

  // Blocks exactly as stored (encoded blobs under a codec, never decoded): blobs[i] is empty
  // unless status[i] is kOk. What daemons use to copy blocks between nodes.
  absl::StatusOr<FetchResult> FetchBlobs(const NamespaceId& ns, std::span<const BlockId> ids,
                                         std::vector<std::vector<uint8_t>>* blobs);

  // Every node known to hold each id, best first (the local daemon, then host before nvme).
  absl::StatusOr<std::vector<std::vector<BlockHolder>>> Locate(const NamespaceId& ns,
                                                               std::span<const BlockId> ids);

  // Memory for the engine to write blocks into before publishing them from it: where the
  // daemon's tenant zone is read-only to this client (several tenants on one node), blocks
  // published from here skip the client's copy into the staging window (the daemon copies each
  // block once, straight into the zone). Elsewhere it is ordinary memory of this client that
  // publishes like any other. Valid until the client is destroyed. At least 1 MiB is set aside
  // (the smallest window a daemon takes), of which the first `bytes` are returned.
  absl::StatusOr<MutableBuffer> AllocatePublishBuffer(size_t bytes);

  // --- Fetches into the engine's device memory (same node; docs/gpu.md) ---
  // Lends the local daemon a buffer of this process's device memory (ExportCudaBuffer; a
  // StandInDeviceBuffer's handle where the daemon's GPU tier is host memory standing in). The
  // loan's id: the daemon keeps the memory open until ReturnDeviceBuffer, or until the loan has
  // been unused for its idle limit (10 minutes). FailedPrecondition when the daemon has no GPU
  // tier; InvalidArgument for a handle its device memory cannot open.
  absl::StatusOr<uint64_t> LendDeviceBuffer(const DeviceBufferHandle& buffer);
  // Copies blocks of `ns` into the lent buffer, ids[i] at offsets[i] of the lent range: from
  // the daemon's GPU tier device to device, or from its host memory; as stored, or decoded
  // (options).
  absl::StatusOr<DeviceFetchResult> FetchToDevice(const NamespaceId& ns, uint64_t loan,
                                                  std::span<const BlockId> ids,
                                                  std::span<const uint64_t> offsets,
                                                  DeviceFetchOptions options = {});
  // Publishes blocks straight out of the lent buffer: ids[i] is the sizes[i] bytes at
  // offsets[i] of the lent range, with parents[i] (empty: no parents, as PublishIds). Under a
  // codec the daemon encodes each block (BlockBytes() each) where it lies, on the device when it
  // can; the blob is the one Publish would store. FailedPrecondition for a pca namespace
  // (publish those from host memory).
  absl::StatusOr<DevicePublishResult> PublishFromDevice(const NamespaceId& ns, uint64_t loan,
                                                        std::span<const BlockId> ids,
                                                        std::span<const BlockId> parents,
                                                        std::span<const uint64_t> offsets,
                                                        std::span<const uint64_t> sizes);
  absl::Status ReturnDeviceBuffer(uint64_t loan);

  // Copies (move: moves) blocks to `target_node` (this client's daemon when empty), from wherever
  // they are in the cluster, into its `target_tier`: "host", or "gpu" (the node's GPU tier:
  // blocks another node holds on its device come device to device over NCCL, the others over
  // UCX and are promoted there; kOk then means on that node's device).
  absl::StatusOr<RepositionOutcome> Reposition(const NamespaceId& ns, std::span<const BlockId> ids,
                                               const std::string& target_node, bool move = false,
                                               std::string_view target_tier = "host");
  // Pulls blocks held elsewhere into the local daemon's host tier ahead of a fetch (a decode
  // node prefetching what its prefill node computed).
  absl::StatusOr<RepositionOutcome> Prefetch(const NamespaceId& ns, std::span<const BlockId> ids) {
    return Reposition(ns, ids, "", false);
  }

  absl::StatusOr<EvictOutcome> Evict(const NamespaceId& ns, std::span<const BlockId> ids,
                                     bool cascade = false, bool force = false);
  absl::StatusOr<std::vector<BlockStatus>> Pin(const NamespaceId& ns, std::span<const BlockId> ids,
                                               absl::Duration ttl);
  absl::StatusOr<std::vector<BlockStatus>> Unpin(const NamespaceId& ns,
                                                 std::span<const BlockId> ids);
  absl::StatusOr<DaemonStats> Stats();

  const std::string& node_id() const;
  uint32_t tokens_per_block(const NamespaceId& ns) const;

 private:
  struct Impl;

  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
