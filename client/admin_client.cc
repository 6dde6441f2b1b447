#include "strata/admin_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/block_calls.h"
#include "client/channel.h"
#include "common/packed_ids.h"
#include "common/status_macros.h"
#include "proto/convert.h"
#include "proto/grpc_status.h"
#include "strata/v1/admin.grpc.pb.h"
#include "strata/v1/cache.grpc.pb.h"
#include "strata/v1/calibration.grpc.pb.h"

namespace strata {

class AdminClient::Rpcs {
 public:
  Rpcs(const AdminClientOptions& options, client::ChannelSecurity security,
       std::shared_ptr<grpc::Channel> channel)
      : options_(options),
        security_(std::move(security)),
        cache_(v1::Cache::NewStub(channel)),
        admin_(v1::Admin::NewStub(channel)),
        calibrations_(v1::Calibrations::NewStub(channel)) {}

  const AdminClientOptions& options() const { return options_; }
  v1::Cache::Stub& cache() { return *cache_; }
  v1::Admin::Stub& admin() { return *admin_; }
  v1::Calibrations::Stub& calibrations() { return *calibrations_; }

  // Runs one call under `timeout`; the status says what failed and where.
  template <typename Call>
  absl::Status Run(const char* what, absl::Duration timeout, Call&& call) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
    grpc::Status s = call(&ctx);
    if (s.ok()) return absl::OkStatus();
    absl::Status st = FromGrpcStatus(s);
    return absl::Status(st.code(), absl::StrCat(what, " at ", options_.endpoint, ": ", st.message(),
                                                client::TlsHint(security_, st.message())));
  }
  client::CallRunner Runner(absl::Duration timeout) {
    return [this, timeout](const char* what, const client::GrpcCall& call) {
      return Run(what, timeout, call);
    };
  }
  absl::Duration long_timeout() const { return std::max(options_.timeout, options_.long_timeout); }

 private:
  const AdminClientOptions options_;
  const client::ChannelSecurity security_;
  std::unique_ptr<v1::Cache::Stub> cache_;
  std::unique_ptr<v1::Admin::Stub> admin_;
  std::unique_ptr<v1::Calibrations::Stub> calibrations_;
};

namespace {

// A zero digest for malformed or absent ids (a chain's first block has no parent).
Digest DigestOrZero(const std::string& raw) {
  auto d = Digest::FromBytes(raw);
  return d.ok() ? *d : Digest{};
}

BlockDetail FromProto(const v1::BlockInfo& b) {
  BlockDetail d;
  d.id = DigestOrZero(b.id());
  d.ns = DigestOrZero(b.namespace_id());
  d.parent = DigestOrZero(b.parent_id());
  d.size_bytes = b.size_bytes();
  d.crc32c = b.crc32c();
  d.leases = b.leases();
  d.pinned_for_ms = b.pinned_for_ms();
  d.idle_ms = b.idle_ms();
  return d;
}

CalibrationSummary FromProto(const v1::CalibrationInfo& c) {
  CalibrationSummary s;
  s.ns = DigestOrZero(c.namespace_id());
  s.id = c.id();
  s.version = c.version();
  s.bytes = c.bytes();
  s.num_layers = c.num_layers();
  s.num_kv_heads = c.num_kv_heads();
  s.head_dim = c.head_dim();
  s.target_bits = c.target_bits();
  s.sample_bits = c.sample_bits();
  s.rope_theta = c.rope_theta();
  s.mode = c.codec_mode();
  s.step = c.step();
  s.added_unix_ms = c.added_unix_ms();
  s.current = c.current();
  return s;
}

}  // namespace

const TierUsage* NodeStatus::Tier(const std::string& name) const {
  for (const TierUsage& t : tiers)
    if (t.tier == name) return &t;
  return nullptr;
}

absl::StatusOr<std::unique_ptr<AdminClient>> AdminClient::Connect(
    const AdminClientOptions& options) {
  if (options.endpoint.empty()) return absl::InvalidArgumentError("endpoint is empty");
  if (options.timeout <= absl::ZeroDuration())
    return absl::InvalidArgumentError("timeout must be positive");
  STRATA_ASSIGN_OR_RETURN(client::ChannelSecurity security,
                          client::LoadChannelSecurity(options.tls, options.auth_token));
  auto channel = client::MakeChannel(options.endpoint, security);
  return std::unique_ptr<AdminClient>(
      new AdminClient(std::make_unique<Rpcs>(options, std::move(security), std::move(channel))));
}

AdminClient::AdminClient(std::unique_ptr<Rpcs> rpcs) : rpcs_(std::move(rpcs)) {}
AdminClient::~AdminClient() = default;

const std::string& AdminClient::endpoint() const { return rpcs_->options().endpoint; }

absl::StatusOr<NodeStatus> AdminClient::Status() {
  return client::ReadNodeStatus(rpcs_->cache(), rpcs_->Runner(rpcs_->options().timeout));
}

absl::StatusOr<ClusterView> AdminClient::ListNodes() {
  v1::ListNodesResponse r;
  STRATA_RETURN_IF_ERROR(rpcs_->Run("ListNodes", rpcs_->options().timeout, [&](auto* ctx) {
    return rpcs_->admin().ListNodes(ctx, v1::ListNodesRequest(), &r);
  }));
  ClusterView v;
  v.membership = r.membership();
  v.healthy = r.healthy();
  v.detail = r.detail();
  v.epoch = r.epoch();
  v.directory_ids = r.directory_ids();
  v.directory_bytes = r.directory_bytes();
  for (const auto& n : r.nodes())
    v.nodes.push_back({n.id(), n.address(), n.version(), n.host_capacity(), n.self()});
  return v;
}

absl::StatusOr<std::vector<NamespaceSummary>> AdminClient::ListNamespaces() {
  v1::ListNamespacesResponse r;
  STRATA_RETURN_IF_ERROR(rpcs_->Run("ListNamespaces", rpcs_->options().timeout, [&](auto* ctx) {
    return rpcs_->admin().ListNamespaces(ctx, v1::ListNamespacesRequest(), &r);
  }));
  std::vector<NamespaceSummary> out;
  for (const auto& n : r.namespaces())
    out.push_back({DigestOrZero(n.namespace_id()), n.tenant(), n.spec().model_id(),
                   n.spec().codec_policy(), n.blocks(), n.bytes()});
  return out;
}

absl::StatusOr<BlockPage> AdminClient::ListBlocks(const NamespaceId& ns, uint32_t page_size,
                                                  uint64_t page_token) {
  v1::ListBlocksRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_page_size(page_size);
  req.set_page_token(page_token);
  v1::ListBlocksResponse r;
  STRATA_RETURN_IF_ERROR(rpcs_->Run("ListBlocks", rpcs_->options().timeout, [&](auto* ctx) {
    return rpcs_->admin().ListBlocks(ctx, req, &r);
  }));
  BlockPage page;
  for (const auto& b : r.blocks()) page.blocks.push_back(FromProto(b));
  page.next_page_token = r.next_page_token();
  return page;
}

absl::StatusOr<std::vector<BlockDetail>> AdminClient::InspectBlocks(std::span<const BlockId> ids) {
  v1::InspectBlocksRequest req;
  req.set_ids(PackIds(ids));
  v1::InspectBlocksResponse r;
  STRATA_RETURN_IF_ERROR(rpcs_->Run("InspectBlocks", rpcs_->options().timeout, [&](auto* ctx) {
    return rpcs_->admin().InspectBlocks(ctx, req, &r);
  }));
  std::vector<BlockDetail> out;
  for (const auto& b : r.blocks()) out.push_back(FromProto(b));
  return out;
}

absl::StatusOr<std::vector<BlockStatus>> AdminClient::Pin(const NamespaceId& ns,
                                                          std::span<const BlockId> ids,
                                                          absl::Duration ttl) {
  return client::PinBlocks(rpcs_->cache(), rpcs_->Runner(rpcs_->options().timeout), ns, ids, ttl);
}

absl::StatusOr<std::vector<BlockStatus>> AdminClient::Unpin(const NamespaceId& ns,
                                                            std::span<const BlockId> ids) {
  return client::UnpinBlocks(rpcs_->cache(), rpcs_->Runner(rpcs_->options().timeout), ns, ids);
}

absl::StatusOr<EvictOutcome> AdminClient::Evict(const NamespaceId& ns, std::span<const BlockId> ids,
                                                bool cascade, bool force) {
  return client::EvictBlocks(rpcs_->cache(), rpcs_->Runner(rpcs_->options().timeout), ns, ids,
                             cascade, force);
}

absl::StatusOr<RepositionOutcome> AdminClient::Reposition(const NamespaceId& ns,
                                                          std::span<const BlockId> ids,
                                                          const std::string& target_node,
                                                          bool move, std::string_view target_tier) {
  return client::RepositionBlocks(rpcs_->cache(), rpcs_->Runner(rpcs_->long_timeout()), ns, ids,
                                  target_node, move, target_tier);
}

absl::StatusOr<DrainReport> AdminClient::Drain() {
  v1::DrainResponse r;
  STRATA_RETURN_IF_ERROR(rpcs_->Run("Drain", rpcs_->long_timeout(), [&](auto* ctx) {
    return rpcs_->admin().Drain(ctx, v1::DrainRequest(), &r);
  }));
  return DrainReport{r.blocks(), r.moved(), r.failed(),
                     std::vector<std::string>(r.targets().begin(), r.targets().end())};
}

absl::StatusOr<std::vector<CalibrationSummary>> AdminClient::ListCalibrations(
    std::optional<NamespaceId> ns) {
  v1::ListCalibrationsRequest req;
  if (ns) req.set_namespace_id(std::string(ns->AsBytes()));
  v1::ListCalibrationsResponse r;
  STRATA_RETURN_IF_ERROR(rpcs_->Run("Calibrations.List", rpcs_->options().timeout, [&](auto* ctx) {
    return rpcs_->calibrations().List(ctx, req, &r);
  }));
  std::vector<CalibrationSummary> out;
  for (const auto& c : r.calibrations()) out.push_back(FromProto(c));
  return out;
}

absl::StatusOr<std::string> AdminClient::GetCalibration(const NamespaceId& ns, uint64_t id,
                                                        CalibrationSummary* summary) {
  v1::GetCalibrationRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_id(id);
  v1::GetCalibrationResponse r;
  STRATA_RETURN_IF_ERROR(rpcs_->Run("Calibrations.Get", rpcs_->long_timeout(), [&](auto* ctx) {
    return rpcs_->calibrations().Get(ctx, req, &r);
  }));
  if (summary) *summary = FromProto(r.info());
  return std::move(*r.mutable_artefact());
}

absl::StatusOr<CalibrationSummary> AdminClient::PutCalibration(const NamespaceId& ns,
                                                               std::string artefact) {
  v1::PutCalibrationRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_artefact(std::move(artefact));
  v1::PutCalibrationResponse r;
  STRATA_RETURN_IF_ERROR(rpcs_->Run("Calibrations.Put", rpcs_->long_timeout(), [&](auto* ctx) {
    return rpcs_->calibrations().Put(ctx, req, &r);
  }));
  return FromProto(r.info());
}

}  // namespace strata
