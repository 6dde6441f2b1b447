// libstrata's public Client, composed of the parts in client/internal: a DaemonLink to the
// local daemon (control channel + data mover), RemoteFetch for blocks held on other nodes, and
// the codec of each namespace this client opened (blocks are encoded and decoded here).
#include "strata/client.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "client/block_calls.h"
#include "client/calibrations.h"
#include "client/control_channel.h"
#include "client/daemon_link.h"
#include "client/device_calls.h"
#include "client/internal/remote_fetch.h"
#include "codec/codec.h"
#include "codec/cross_layer.h"
#include "common/packed_ids.h"
#include "common/status_macros.h"
#include "strata/vllm_ids.h"

namespace strata {
namespace {

absl::Status NotOpened(const NamespaceId& ns) {
  return absl::FailedPreconditionError(
      absl::StrCat("namespace ", ns.ShortHex(), " was not opened by this client"));
}

}  // namespace

struct Client::Impl {
  explicit Impl(const ClientOptions& o) : options(o), remote(o) {
    // vLLM's own rule: PYTHONHASHSEED when set, a fixed seed otherwise.
    vllm_hash_seed = o.vllm_hash_seed;
    if (const char* env = std::getenv("PYTHONHASHSEED"); vllm_hash_seed.empty() && env != nullptr)
      vllm_hash_seed = env;
    if (vllm_hash_seed.empty()) vllm_hash_seed = std::string(kVllmDefaultHashSeed);
  }

  // The codec of a namespace this client opened; nullopt when its blobs are opaque.
  absl::StatusOr<std::optional<codec::CodecParams>> CodecOf(const NamespaceId& ns) {
    std::lock_guard<std::mutex> lock(codecs_mu);
    auto it = codecs.find(ns);
    if (it == codecs.end()) return NotOpened(ns);
    return it->second;
  }

  KvLayout LayoutOf(const NamespaceId& ns) {
    auto open = control().Opened(ns);
    return open ? open->spec.layout : KvLayout{};
  }

  // Where fetched blocks of `ns` land in `buffers`: decoded there under a codec.
  absl::StatusOr<client::FetchLanding> LandingFor(const NamespaceId& ns,
                                                  std::span<const MutableBuffer> buffers) {
    STRATA_ASSIGN_OR_RETURN(auto params, CodecOf(ns));
    client::FetchLanding into;
    into.buffers = buffers;
    into.decode = params.has_value();
    if (into.decode) into.decoded_bytes = LayoutOf(ns).BlockBytes();
    if (into.decode && codec::UsesCalibration(params->mode)) {
      into.calibrations = &calibrations->set();
      into.ensure_calibrations = [cache = calibrations.get(), ns](std::span<const uint64_t> ids) {
        return cache->Ensure(ns, ids);
      };
    }
    return into;
  }

  client::ControlChannel& control() { return local->control(); }

  const ClientOptions options;
  std::string vllm_hash_seed;
  std::unique_ptr<client::DaemonLink> local;
  std::unique_ptr<client::CalibrationCache> calibrations;  // over `local`'s control channel
  std::unique_ptr<v1::DeviceCopies::Stub> device;          // the same channel's DeviceCopies
  client::RemoteFetch remote;
  std::mutex codecs_mu;
  // AllocatePublishBuffer's memory where no zone window lends it.
  std::mutex plain_publish_buffers_mu;
  std::vector<std::unique_ptr<uint8_t[]>> plain_publish_buffers;
  absl::flat_hash_map<NamespaceId, std::optional<codec::CodecParams>> codecs;
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  STRATA_ASSIGN_OR_RETURN(impl->local, client::DaemonLink::Connect(options));
  impl->calibrations = std::make_unique<client::CalibrationCache>(
      &impl->local->control(), options.calibration_cache_bytes);
  impl->device = v1::DeviceCopies::NewStub(impl->local->control().channel());
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

const std::string& Client::node_id() const { return impl_->control().node_id(); }

uint32_t Client::tokens_per_block(const NamespaceId& ns) const {
  auto open = impl_->control().Opened(ns);
  return open ? open->spec.layout.tokens_per_block : 0;
}

absl::StatusOr<std::vector<BlockId>> Client::BlockIds(const NamespaceId& ns,
                                                      std::span<const uint32_t> tokens,
                                                      std::string_view cache_salt) const {
  auto open = impl_->control().Opened(ns);
  if (!open) return NotOpened(ns);
  const NamespaceSpec& spec = open->spec;
  if (spec.id_scheme == IdScheme::kStrata) {
    if (!cache_salt.empty())
      return absl::InvalidArgumentError("a cache salt applies to vllm-scheme namespaces only");
    return ComputeBlockIds(ns, spec.layout.tokens_per_block, tokens);
  }
  if (!spec.lora_id.empty())
    return absl::FailedPreconditionError(
        "vLLM names LoRA blocks by adapter name and path: publish and look up such blocks by id");
  VllmHashInputs inputs;
  inputs.scheme = spec.id_scheme;
  inputs.hash_seed = impl_->vllm_hash_seed;
  inputs.cache_salt = std::string(cache_salt);
  return ComputeVllmBlockIds(spec.layout.tokens_per_block, tokens, inputs);
}

absl::StatusOr<NamespaceId> Client::OpenNamespace(const NamespaceSpec& spec,
                                                  const std::string& tenant) {
  return OpenNamespace(spec, tenant, 0);
}

absl::StatusOr<NamespaceId> Client::OpenNamespace(const NamespaceSpec& spec,
                                                  const std::string& tenant, uint32_t replicas) {
  NamespaceOptions options;
  options.replicas = replicas;
  return OpenNamespace(spec, tenant, options);
}

absl::StatusOr<NamespaceId> Client::OpenNamespace(const NamespaceSpec& spec,
                                                  const std::string& tenant,
                                                  const NamespaceOptions& options) {
  STRATA_RETURN_IF_ERROR(spec.Validate());
  std::optional<codec::CodecParams> params;
  if (spec.codec_policy != kOpaqueCodecPolicy) {
    auto parsed = codec::ParseCodecSpec(spec.codec_policy);
    if (!parsed.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("namespace.codec_policy: ", parsed.status().message()));
    codec::CodecParams check = *parsed;
    // "pca:bR" asks for a rate, "xl:sS" for a step: the namespace's calibration is made later,
    // and each blob names the one it was coded with.
    if (codec::UsesCalibration(check.mode) && check.calibration_id == 0) check.calibration_id = 1;
    if (auto s = check.Validate(spec.layout); !s.ok())
      return absl::InvalidArgumentError(absl::StrCat("namespace.codec_policy: ", s.message()));
    params = *parsed;
  }
  STRATA_ASSIGN_OR_RETURN(NamespaceId id, impl_->control().OpenNamespace(spec, tenant, options));
  std::lock_guard<std::mutex> lock(impl_->codecs_mu);
  impl_->codecs[id] = params;
  return id;
}

absl::Status Client::RegisterBuffer(void* data, size_t size) {
  return impl_->local->mover().RegisterBuffer(data, size);
}

absl::Status Client::UnregisterBuffer(void* data) {
  return impl_->local->mover().UnregisterBuffer(data);
}

absl::StatusOr<MutableBuffer> Client::AllocatePublishBuffer(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("a publish buffer of 0 bytes");
  auto lent = impl_->local->mover().AllocatePublishBuffer(bytes);
  if (lent.ok()) return MutableBuffer{*lent, bytes};
  if (!absl::IsFailedPrecondition(lent.status())) return lent.status();
  // No read-only zone here: publishes from any memory cost the same.
  std::lock_guard<std::mutex> lock(impl_->plain_publish_buffers_mu);
  impl_->plain_publish_buffers.push_back(std::make_unique<uint8_t[]>(bytes));
  return MutableBuffer{impl_->plain_publish_buffers.back().get(), bytes};
}

absl::StatusOr<PublishResult> Client::Publish(const NamespaceId& ns,
                                              std::span<const uint32_t> tokens,
                                              std::span<const ConstBuffer> blocks) {
  STRATA_ASSIGN_OR_RETURN(std::vector<BlockId> ids, BlockIds(ns, tokens));
  if (blocks.size() > ids.size())
    return absl::InvalidArgumentError(absl::StrCat(blocks.size(), " buffers for ", tokens.size(),
                                                   " tokens (", ids.size(), " full blocks)"));
  ids.resize(blocks.size());
  std::vector<BlockId> parents(ids.size());
  for (size_t i = 1; i < ids.size(); ++i) parents[i] = ids[i - 1];
  std::vector<uint64_t> positions(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) positions[i] = i * uint64_t{tokens_per_block(ns)};
  return PublishIds(ns, ids, parents, blocks, positions);
}

absl::StatusOr<PublishResult> Client::PublishIds(const NamespaceId& ns,
                                                 std::span<const BlockId> ids,
                                                 std::span<const BlockId> parents,
                                                 std::span<const ConstBuffer> blocks) {
  return PublishIds(ns, ids, parents, blocks, {});
}

absl::StatusOr<PublishResult> Client::PublishIds(const NamespaceId& ns,
                                                 std::span<const BlockId> ids,
                                                 std::span<const BlockId> parents,
                                                 std::span<const ConstBuffer> blocks,
                                                 std::span<const uint64_t> first_positions) {
  if (ids.size() != blocks.size() || (!parents.empty() && parents.size() != ids.size()) ||
      (!first_positions.empty() && first_positions.size() != ids.size()))
    return absl::InvalidArgumentError(
        "ids, parents, blocks and first positions must have the same length");
  if (ids.empty()) return PublishResult{};
  for (const ConstBuffer& b : blocks)
    if (b.size == 0 || b.data == nullptr)
      return absl::InvalidArgumentError("every block buffer must be non-empty");
  STRATA_ASSIGN_OR_RETURN(auto codec_params, impl_->CodecOf(ns));
  if (!codec_params) return impl_->local->PublishBlobs(ns, ids, parents, blocks);

  // With a codec, what travels and is stored is each block's encoded blob.
  const KvLayout layout = impl_->LayoutOf(ns);
  for (size_t i = 0; i < blocks.size(); ++i)
    if (blocks[i].size != layout.BlockBytes())
      return absl::InvalidArgumentError(
          absl::StrCat("block ", i, " has ", blocks[i].size, " bytes; namespace layout ",
                       layout.DebugString(), " needs ", layout.BlockBytes()));
  codec::CodecParams params = *codec_params;
  // Held until every block is encoded: the client's cache keeps what somebody holds.
  std::shared_ptr<const codec::Calibration> calibration;
  if (codec::UsesCalibration(params.mode)) {
    STRATA_ASSIGN_OR_RETURN(calibration,
                            impl_->calibrations->ForEncoding(ns, params.calibration_id));
    params.calibration_id = calibration->Id();
    if (calibration->rope_theta > 0 && first_positions.empty())
      return absl::FailedPreconditionError(absl::StrCat(
          "namespace ", ns.ShortHex(), "'s calibration ",
          codec::CalibrationIdString(params.calibration_id),
          " undoes RoPE, which needs each block's position: use Publish, or PublishIds with "
          "first positions"));
  }
  std::vector<std::vector<uint8_t>> blobs(blocks.size());
  std::vector<absl::Status> encoded(blocks.size());
  impl_->local->mover().helper().ParallelFor(blocks.size(), [&](size_t i) {
    thread_local codec::Encoder encoder;
    encoder.set_calibrations(&impl_->calibrations->set());
    codec::CodecParams block_params = params;
    if (!first_positions.empty()) {
      block_params.first_position = first_positions[i];
    } else if (parents.empty() || !parents[i].IsZero()) {
      // Position unknown (a calibration without RoPE): say only that the block does not begin
      // its sequence, so the encoder does not keep its first token as the sequence's sink.
      block_params.first_position = layout.tokens_per_block;
    }
    encoded[i] =
        encoder.Encode(layout, block_params,
                       {static_cast<const uint8_t*>(blocks[i].data), blocks[i].size}, &blobs[i]);
  });
  std::vector<ConstBuffer> blob_views;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (!encoded[i].ok())
      return absl::Status(encoded[i].code(),
                          absl::StrCat("encoding block ", i, ": ", encoded[i].message()));
    blob_views.push_back({blobs[i].data(), blobs[i].size()});
  }
  return impl_->local->PublishBlobs(ns, ids, parents, blob_views);
}

namespace {

CalibrationInfo InfoOf(const v1::CalibrationInfo& w) {
  CalibrationInfo c;
  c.id = w.id();
  c.version = w.version();
  c.bytes = w.bytes();
  c.target_bits = w.target_bits();
  c.sample_bits = w.sample_bits();
  c.rope_theta = w.rope_theta();
  c.mode = w.codec_mode();
  c.step = w.step();
  c.current = w.current();
  return c;
}

}  // namespace

absl::StatusOr<CalibrationInfo> Client::Calibrate(const NamespaceId& ns,
                                                  std::span<const ConstBuffer> samples,
                                                  const CalibrationRequest& request) {
  STRATA_ASSIGN_OR_RETURN(auto params, impl_->CodecOf(ns));
  if (!params || !codec::UsesCalibration(params->mode))
    return absl::FailedPreconditionError(
        absl::StrCat("namespace ", ns.ShortHex(), " does not use a calibrated codec (pca, xl)"));
  const bool xl = params->mode == codec::Mode::kCrossLayer;
  if (xl ? request.bits_per_value != 0 : request.step != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "namespace ", ns.ShortHex(), " uses mode ", std::string(codec::ModeName(params->mode)),
        xl ? ", whose calibrations take a step, not bits per value"
           : ", whose calibrations take bits per value, not a step"));
  const KvLayout layout = impl_->LayoutOf(ns);
  std::vector<std::span<const uint8_t>> blocks;
  for (size_t i = 0; i < samples.size(); ++i) {
    if (samples[i].size != layout.BlockBytes() || samples[i].data == nullptr)
      return absl::InvalidArgumentError(absl::StrCat("sample ", i, " has ", samples[i].size,
                                                     " bytes; the namespace's blocks have ",
                                                     layout.BlockBytes()));
    blocks.push_back({static_cast<const uint8_t*>(samples[i].data), samples[i].size});
  }
  // The next version: one past the highest this daemon (and so the cluster it asked) knows.
  STRATA_ASSIGN_OR_RETURN(auto listed, impl_->calibrations->List(ns));
  uint32_t highest = 0;
  for (const auto& c : listed.calibrations()) highest = std::max(highest, c.version());
  // What both modes' options share: the request's RoPE, positions, importances; the version.
  auto with_request = [&](auto opts) {
    opts.rope_theta = request.rope_theta;
    opts.first_positions = request.first_positions;
    opts.importance = request.importance;
    opts.version = highest + 1;
    return opts;
  };
  std::vector<uint8_t> bytes;
  if (xl) {
    codec::CrossLayerOptions opts = with_request(codec::CrossLayerOptions{});
    // xl:rC names no step: a fine one (more coordinates coded), the budget coarsens it per block.
    opts.step = request.step > 0 ? request.step : params->xl_step > 0 ? params->xl_step : 0.5;
    STRATA_ASSIGN_OR_RETURN(codec::CrossLayerCalibration calibration,
                            codec::CalibrateCrossLayer(layout, blocks, opts));
    bytes = calibration.Serialize();
  } else {
    codec::CalibrateOptions opts = with_request(codec::CalibrateOptions{});
    opts.bits_per_value = request.bits_per_value > 0          ? request.bits_per_value
                          : params->PcaCalibrationBits() > 0 ? params->PcaCalibrationBits()
                                                             : 1.5;
    STRATA_ASSIGN_OR_RETURN(codec::Calibration calibration,
                            codec::Calibrate(layout, blocks, opts));
    bytes = calibration.Serialize();
  }
  if (bytes.size() > codec::kMaxCalibrationArtefactBytes)
    return absl::FailedPreconditionError(
        absl::StrCat("namespace ", ns.ShortHex(), ": the calibration takes ", bytes.size() >> 20,
                     " MiB, over the ", codec::kMaxCalibrationArtefactBytes >> 20,
                     " MiB a daemon stores"));
  return PutCalibration(ns, bytes);
}

absl::StatusOr<CalibrationInfo> Client::PutCalibration(const NamespaceId& ns,
                                                       std::span<const uint8_t> artefact) {
  STRATA_ASSIGN_OR_RETURN(
      auto resp, impl_->calibrations->Put(
                     ns, std::string(reinterpret_cast<const char*>(artefact.data()), artefact.size())));
  CalibrationInfo info = InfoOf(resp.info());
  info.replicated_to = resp.replicated_to();
  return info;
}

absl::StatusOr<std::vector<CalibrationInfo>> Client::ListCalibrations(const NamespaceId& ns) {
  STRATA_ASSIGN_OR_RETURN(auto resp, impl_->calibrations->List(ns));
  std::vector<CalibrationInfo> out;
  for (const auto& c : resp.calibrations()) out.push_back(InfoOf(c));
  return out;
}

CalibrationCacheStats Client::calibration_cache_stats() const {
  const codec::CalibrationSet& set = impl_->calibrations->set();
  CalibrationCacheStats s;
  s.calibrations = set.Ids().size();
  s.bytes = set.bytes();
  s.budget_bytes = set.max_bytes();
  s.evictions = set.evictions();
  s.fetches = impl_->calibrations->fetches();
  return s;
}

absl::StatusOr<LookupResult> Client::Lookup(const NamespaceId& ns,
                                            std::span<const uint32_t> tokens) {
  LookupResult r;
  STRATA_ASSIGN_OR_RETURN(r.ids, BlockIds(ns, tokens));
  const uint32_t tpb = tokens_per_block(ns);
  STRATA_ASSIGN_OR_RETURN(v1::LookupResponse resp, impl_->control().Lookup(ns, r.ids));
  r.prefix_blocks = std::min<size_t>(resp.prefix_blocks(), r.ids.size());
  if (resp.nodes_size() > 0 && resp.holder_size() >= static_cast<int>(r.prefix_blocks)) {
    for (size_t i = 0; i < r.prefix_blocks; ++i) {
      uint32_t h = resp.holder(static_cast<int>(i));
      r.nodes.push_back(h < static_cast<uint32_t>(resp.nodes_size())
                            ? resp.nodes(static_cast<int>(h)).id()
                            : std::string());
    }
  }
  r.prefix_tokens = r.prefix_blocks * tpb;
  r.node_id = node_id();
  return r;
}

absl::StatusOr<size_t> Client::LookupIds(const NamespaceId& ns, std::span<const BlockId> ids) {
  STRATA_ASSIGN_OR_RETURN(v1::LookupResponse resp, impl_->control().Lookup(ns, ids));
  return std::min<size_t>(resp.prefix_blocks(), ids.size());
}

absl::StatusOr<FetchResult> Client::Fetch(const NamespaceId& ns, std::span<const BlockId> ids,
                                          std::span<const MutableBuffer> buffers) {
  if (ids.size() != buffers.size())
    return absl::InvalidArgumentError(
        absl::StrCat(ids.size(), " ids but ", buffers.size(), " buffers"));
  if (ids.empty()) return impl_->local->Fetch(ns, ids, {});
  for (const MutableBuffer& b : buffers)
    if (b.data == nullptr && b.size != 0)
      return absl::InvalidArgumentError("a fetch buffer of non-zero size has no address");
  STRATA_ASSIGN_OR_RETURN(client::FetchLanding into, impl_->LandingFor(ns, buffers));
  STRATA_ASSIGN_OR_RETURN(FetchResult r, impl_->local->Fetch(ns, ids, into));
  if (impl_->options.remote_fetch && impl_->control().clustered() && r.fetched < ids.size())
    impl_->remote.FetchMissing(*impl_->local, ns, ids, into, &r);
  return r;
}

absl::StatusOr<FetchResult> Client::FetchBlobs(const NamespaceId& ns, std::span<const BlockId> ids,
                                               std::vector<std::vector<uint8_t>>* blobs) {
  if (!ids.empty()) STRATA_RETURN_IF_ERROR(impl_->CodecOf(ns).status());
  client::FetchLanding into;
  into.blobs = blobs;
  return impl_->local->Fetch(ns, ids, into);
}

absl::StatusOr<std::vector<std::vector<BlockHolder>>> Client::Locate(const NamespaceId& ns,
                                                                     std::span<const BlockId> ids) {
  return impl_->control().Locate(ns, ids);
}

namespace {

// Runs a call on `ns`, re-opening the namespace once if the daemon forgot it (a restart).
client::CallRunner NamespaceRunner(client::ControlChannel& control, const NamespaceId& ns) {
  return [&control, ns](const char* name, const client::GrpcCall& call) {
    return control.NsRpc(name, ns, call);
  };
}

client::CallRunner ControlRunner(client::ControlChannel& control) {
  return [&control](const char* name, const client::GrpcCall& call) {
    return control.Rpc(name, call);
  };
}

}  // namespace

absl::StatusOr<RepositionOutcome> Client::Reposition(const NamespaceId& ns,
                                                     std::span<const BlockId> ids,
                                                     const std::string& target_node, bool move,
                                                     std::string_view target_tier) {
  client::ControlChannel& control = impl_->control();
  return client::RepositionBlocks(control.stub(), NamespaceRunner(control, ns), ns, ids,
                                  target_node, move, target_tier);
}

absl::StatusOr<uint64_t> Client::LendDeviceBuffer(const DeviceBufferHandle& buffer) {
  client::ControlChannel& control = impl_->control();
  return client::LendDeviceBuffer(*impl_->device, ControlRunner(control), buffer);
}

absl::StatusOr<DeviceFetchResult> Client::FetchToDevice(const NamespaceId& ns, uint64_t loan,
                                                        std::span<const BlockId> ids,
                                                        std::span<const uint64_t> offsets,
                                                        DeviceFetchOptions options) {
  client::ControlChannel& control = impl_->control();
  return client::FetchToDevice(
      *impl_->device, NamespaceRunner(control, ns), ns, loan, ids, offsets, options,
      [&control, &ns](std::string request) { return control.DeviceFetch(ns, std::move(request)); });
}

absl::StatusOr<DevicePublishResult> Client::PublishFromDevice(const NamespaceId& ns,
                                                              uint64_t loan,
                                                              std::span<const BlockId> ids,
                                                              std::span<const BlockId> parents,
                                                              std::span<const uint64_t> offsets,
                                                              std::span<const uint64_t> sizes) {
  client::ControlChannel& control = impl_->control();
  return client::PublishFromDevice(*impl_->device, NamespaceRunner(control, ns), ns, loan, ids,
                                   parents, offsets, sizes);
}

absl::Status Client::ReturnDeviceBuffer(uint64_t loan) {
  client::ControlChannel& control = impl_->control();
  return client::ReturnDeviceBuffer(*impl_->device, ControlRunner(control), loan);
}

absl::StatusOr<EvictOutcome> Client::Evict(const NamespaceId& ns, std::span<const BlockId> ids,
                                           bool cascade, bool force) {
  client::ControlChannel& control = impl_->control();
  return client::EvictBlocks(control.stub(), NamespaceRunner(control, ns), ns, ids, cascade, force);
}

absl::StatusOr<std::vector<BlockStatus>> Client::Pin(const NamespaceId& ns,
                                                     std::span<const BlockId> ids,
                                                     absl::Duration ttl) {
  client::ControlChannel& control = impl_->control();
  return client::PinBlocks(control.stub(), NamespaceRunner(control, ns), ns, ids, ttl);
}

absl::StatusOr<std::vector<BlockStatus>> Client::Unpin(const NamespaceId& ns,
                                                       std::span<const BlockId> ids) {
  client::ControlChannel& control = impl_->control();
  return client::UnpinBlocks(control.stub(), NamespaceRunner(control, ns), ns, ids);
}

absl::StatusOr<DaemonStats> Client::Stats() {
  client::ControlChannel& control = impl_->control();
  STRATA_ASSIGN_OR_RETURN(
      NodeStatus node,
      client::ReadNodeStatus(control.stub(), [&](const char* name, const client::GrpcCall& call) {
        return control.Rpc(name, call);
      }));
  DaemonStats s;
  s.node_id = std::move(node.node_id);
  s.version = std::move(node.version);
  s.uptime_ms = node.uptime_ms;
  if (const TierUsage* host = node.Tier("host")) {
    s.host_capacity_bytes = host->capacity_bytes;
    s.host_used_bytes = host->used_bytes;
    s.host_blocks = host->blocks;
    s.host_reserved_bytes = host->reserved_bytes;
  }
  s.open_reservations = node.open_reservations;
  s.open_leases = node.open_leases;
  s.pinned_blocks = node.pinned_blocks;
  s.namespaces = node.namespaces;
  s.transport = std::move(node.transport);
  s.counters.assign(node.counters.begin(), node.counters.end());
  return s;
}

}  // namespace strata
