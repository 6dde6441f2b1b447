#include "daemon/cluster/block_puller.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/block_calls.h"
#include "client/daemon_link.h"
#include "common/crc32c.h"
#include "daemon/cluster/device_transfers.h"
#include "daemon/logging.h"
#include "strata/client.h"

namespace strata::daemon {

BlockPuller::BlockPuller(ClusterContext& ctx, BlockStore& store, NamespaceRegistry& namespaces,
                         Announcer& announcer, GpuTieredStore* gpu, DeviceTransfers* device)
    : ctx_(ctx),
      store_(store),
      namespaces_(namespaces),
      announcer_(announcer),
      gpu_(gpu),
      device_(device) {}

BlockPuller::~BlockPuller() { Stop(); }

void BlockPuller::Stop() {
  std::lock_guard<std::mutex> lock(sources_mu_);
  sources_.clear();
}

std::vector<BlockStatus> BlockPuller::Pull(const NamespaceSpec& spec, const std::string& tenant,
                                           uint32_t replicas, std::span<const BlockId> ids,
                                           std::span<const BlockId> parents,
                                           const std::string& source_node,
                                           const std::string& source_address, absl::Time deadline,
                                           PullInto into) {
  std::vector<BlockStatus> status(ids.size(), BlockStatus::kNotFound);
  if (into == PullInto::kDeviceIfAny && gpu_ == nullptr) into = PullInto::kHost;
  const bool to_device = into != PullInto::kHost;
  if (into == PullInto::kDevice && gpu_ == nullptr) {
    spdlog::warn("Pull into the GPU tier: this node has none");
    status.assign(ids.size(), BlockStatus::kInvalid);
    return status;
  }
  auto ns = namespaces_.Open(spec, tenant);
  if (!ns.ok()) {
    spdlog::warn("Pull from '{}': cannot open the namespace here: {}", LogSafe(source_node),
                 LogSafe(ns.status().ToString(), 512));
    status.assign(ids.size(), BlockStatus::kInvalid);
    return status;
  }
  if (replicas > 0) namespaces_.SetReplicas(*ns, replicas);
  // Skip what is already here, in this namespace: an id another namespace holds (ids of the
  // vllm scheme carry no namespace) is not this block, and the copy is then refused as the
  // reservation refuses it, so that a drain or move keeps the source's copy.
  std::vector<size_t> need;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (HeldIn(store_, *ns, ids[i]))
      status[i] = BlockStatus::kExists;
    else
      need.push_back(i);
  }
  // Into the GPU tier: what the source's device holds comes device to device.
  if (to_device && device_ != nullptr && !need.empty()) {
    std::vector<BlockId> need_ids;
    for (size_t i : need) need_ids.push_back(ids[i]);
    // Half the time left at most: what the device link does not bring still comes over UCX.
    const absl::Time device_deadline = absl::Now() + (deadline - absl::Now()) / 2;
    const std::vector<BlockStatus> got =
        device_->Pull(spec, tenant, *ns, need_ids, source_node, source_address, device_deadline);
    std::vector<size_t> rest;
    for (size_t k = 0; k < need.size(); ++k) {
      if (got[k] == BlockStatus::kOk) ctx_.counters.pulled.fetch_add(1);
      if (got[k] == BlockStatus::kOk || got[k] == BlockStatus::kExists)
        status[need[k]] = got[k];
      else
        rest.push_back(need[k]);
    }
    need.swap(rest);
  }
  if (!need.empty()) {
    std::vector<BlockId> need_ids;
    for (size_t i : need) need_ids.push_back(ids[i]);
    auto fetched = FetchFromSource(spec, tenant, *ns, need_ids, source_node, source_address);
    if (fetched.ok()) Commit(*ns, ids, parents, need, *fetched, status);
  }
  const bool copied = std::count(status.begin(), status.end(), BlockStatus::kOk) > 0;
  if (to_device) {
    // Every block that is here now goes up (those that came device to device are there).
    const std::vector<BlockStatus> up = gpu_->Promote(*ns, ids);
    for (size_t i = 0; i < ids.size() && into == PullInto::kDevice; ++i)
      if ((status[i] == BlockStatus::kOk || status[i] == BlockStatus::kExists) &&
          up[i] != BlockStatus::kOk)
        status[i] = up[i];
  }
  // The copy is findable before the caller hears it exists (a replica must be, once the
  // publisher's Commit returns).
  if (copied)
    announcer_.FlushAnnouncements(std::min(deadline, absl::Now() + ctx_.config.peer_timeout));
  return status;
}

absl::StatusOr<BlockPuller::Fetched> BlockPuller::FetchFromSource(
    const NamespaceSpec& spec, const std::string& tenant, const NamespaceId& ns,
    std::span<const BlockId> ids, const std::string& source_node,
    const std::string& source_address) {
  auto source = SourceLink(source_node, source_address);
  if (!source.ok()) {
    ctx_.counters.peer_failures.fetch_add(1);
    spdlog::warn("Pull: {}", LogSafe(source.status().ToString(), 512));
    return source.status();
  }
  auto there = (*source)->control().OpenNamespace(spec, tenant);
  if (!there.ok() || *there != ns) {
    spdlog::warn(
        "Pull from '{}': namespace not usable there ({})", LogSafe(source_node),
        there.ok() ? "its cluster secret differs" : LogSafe(there.status().ToString(), 512));
    return absl::FailedPreconditionError("namespace not usable at the source");
  }
  Fetched out;
  client::FetchLanding into;
  into.blobs = &out.blobs;
  auto got = (*source)->Fetch(ns, ids, into);
  if (!got.ok()) {
    ctx_.counters.peer_failures.fetch_add(1);
    spdlog::warn("Pull from '{}': {}", LogSafe(source_node), LogSafe(got.status().ToString(), 512));
    return got.status();
  }
  out.status = std::move(got->status);
  return out;
}

void BlockPuller::Commit(const NamespaceId& ns, std::span<const BlockId> ids,
                         std::span<const BlockId> parents, const std::vector<size_t>& need,
                         const Fetched& fetched, std::vector<BlockStatus>& status) {
  std::vector<ReserveItem> items;
  std::vector<size_t> placed;  // index into need
  for (size_t k = 0; k < need.size(); ++k) {
    status[need[k]] = fetched.status[k];
    if (fetched.status[k] != BlockStatus::kOk) continue;
    ReserveItem it;
    it.id = ids[need[k]];
    if (!parents.empty()) it.parent = parents[need[k]];
    it.size = fetched.blobs[k].size();
    items.push_back(it);
    placed.push_back(k);
  }
  if (items.empty()) return;
  ReserveResult res = store_.Reserve(ns, items);
  std::vector<uint32_t> crcs;
  std::vector<size_t> reserved;  // index into items
  for (size_t j = 0; j < items.size(); ++j) {
    size_t i = need[placed[j]];
    status[i] = res.status[j];
    if (res.status[j] != BlockStatus::kOk) continue;
    const auto& blob = fetched.blobs[placed[j]];
    const uint64_t offset = res.offsets[j];  // per item, not per reserved item
    std::memcpy(store_.arena_base() + offset, blob.data(), blob.size());
    crcs.push_back(Crc32c(blob.data(), blob.size()));
    reserved.push_back(j);
  }
  if (reserved.empty()) return;
  auto committed = store_.Commit(res.reservation_id, crcs);
  if (!committed.ok()) {
    for (size_t j : reserved) status[need[placed[j]]] = BlockStatus::kExpired;
    return;
  }
  for (size_t q = 0; q < reserved.size(); ++q) {
    status[need[placed[reserved[q]]]] = (*committed)[q];
    if ((*committed)[q] == BlockStatus::kOk) ctx_.counters.pulled.fetch_add(1);
  }
}

uint64_t BlockPuller::EvictAtSource(const std::string& node, const std::string& address,
                                    const NamespaceRegistry::Entry& ns,
                                    std::span<const BlockId> ids) {
  auto link = SourceLink(node, address);
  if (!link.ok()) return 0;
  client::ControlChannel& control = (*link)->control();
  auto opened = control.OpenNamespace(ns.spec, ns.tenant);
  if (!opened.ok()) return 0;
  auto ev = client::EvictBlocks(
      control.stub(),
      [&](const char* name, const client::GrpcCall& call) {
        return control.NsRpc(name, *opened, call);
      },
      *opened, ids, /*cascade=*/false, /*force=*/false);
  return ev.ok() ? ev->removed_blocks : 0;
}

absl::StatusOr<std::shared_ptr<client::DaemonLink>> BlockPuller::SourceLink(
    const std::string& node, const std::string& address) {
  {
    std::lock_guard<std::mutex> lock(sources_mu_);
    auto it = sources_.find(address);
    if (it != sources_.end()) return it->second;
  }
  // Connecting is a network call: no lock held, so a dead source never stalls pulls from others.
  ClientOptions o;
  o.endpoint = address;
  o.client_name = absl::StrCat("stratad:", ctx_.self.id);
  o.rpc_timeout = std::max(ctx_.config.peer_timeout, absl::Seconds(2));
  o.remote_fetch = false;
  o.same_node = false;
  auto made = client::DaemonLink::Connect(o, ctx_.peer_security);
  if (!made.ok())
    return absl::Status(made.status().code(), absl::StrCat("connecting to node '", node, "' at ",
                                                           address, ": ", made.status().message()));
  std::lock_guard<std::mutex> lock(sources_mu_);
  // A concurrent pull may have connected meanwhile: keep the first link, drop ours.
  auto [it, fresh] = sources_.try_emplace(address, std::move(*made));
  return it->second;
}

}  // namespace strata::daemon
