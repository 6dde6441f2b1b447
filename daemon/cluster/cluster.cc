#include "daemon/cluster/cluster.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata::daemon {
namespace {

std::unique_ptr<placement::Membership> NewMembership(const ClusterConfig& cfg,
                                                     const std::string& self_id) {
  if (cfg.membership == "etcd") {
    placement::EtcdMembershipOptions eo;
    eo.endpoints = cfg.etcd_endpoints;
    eo.prefix = cfg.etcd_prefix;
    eo.lease_ttl = cfg.etcd_lease_ttl;
    eo.call_timeout = std::max(cfg.peer_timeout, absl::Seconds(1));
    spdlog::info(
        "joining the cluster through etcd ({}); waiting up to {} if it is not answering yet",
        absl::StrJoin(cfg.etcd_endpoints, ", "), absl::FormatDuration(eo.start_timeout));
    return placement::NewEtcdMembership(std::move(eo));
  }
  std::vector<placement::NodeRecord> nodes;
  for (const auto& n : cfg.static_nodes)
    if (n.id != self_id) nodes.push_back({n.id, n.address, 0, 0, ""});
  return placement::NewStaticMembership(std::move(nodes));
}

}  // namespace

Cluster::Cluster(Options options, BlockStore& store, NamespaceRegistry& namespaces)
    : ctx_(std::move(options.config), std::move(options.self), std::move(options.peer_security)),
      store_(store) {
  membership_ = NewMembership(ctx_.config, ctx_.self.id);
  Announcer::DeviceHeld on_device;
  if (GpuTieredStore* gpu = options.gpu)
    on_device = [gpu](std::span<const BlockId> ids) {
      absl::flat_hash_set<BlockId> held;
      for (const BlockInfo& b : gpu->InspectOnDevice(ids)) held.insert(b.id);
      return held;
    };
  announcer_ = std::make_unique<Announcer>(ctx_, directory_, store, std::move(on_device));
  locator_ = std::make_unique<Locator>(ctx_, directory_, std::move(options.ucx));
  if (options.gpu != nullptr && options.device_links != nullptr)
    device_ = std::make_unique<DeviceTransfers>(ctx_, *options.gpu, namespaces,
                                                std::move(options.device_links));
  puller_ = std::make_unique<BlockPuller>(ctx_, store, namespaces, *announcer_, options.gpu,
                                          device_.get());
  mover_ = std::make_unique<BlockMover>(ctx_, store, namespaces, *locator_, *announcer_, *puller_,
                                        options.gpu);
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(Options options, BlockStore& store,
                                                        NamespaceRegistry& namespaces) {
  std::unique_ptr<Cluster> c(new Cluster(std::move(options), store, namespaces));
  Cluster* raw = c.get();
  c->membership_->SetListener([raw](const placement::MembershipView& v) { raw->OnView(v); });
  if (absl::Status s = c->membership_->Start(c->ctx_.self); !s.ok())
    return absl::Status(s.code(), absl::StrCat("cluster membership (", c->ctx_.config.membership,
                                               "): ", s.message()));
  c->OnView(c->membership_->View());
  c->announcer_->Start();
  c->mover_->StartRepairs();
  return c;
}

Cluster::~Cluster() { Stop(); }

void Cluster::OnBlockEvent(const BlockEvent& event) {
  if (!stopped_.load(std::memory_order_acquire)) announcer_->OnBlockEvent(event);
}

void Cluster::Stop() {
  if (stopped_.exchange(true)) return;
  announcer_->Stop();
  mover_->StopRepairs();
  if (absl::Status s = membership_->Leave(); !s.ok())
    spdlog::warn("leaving the cluster: {}", s.ToString());
  locator_->Stop();
  puller_->Stop();
  if (device_) device_->Stop();
}

BlockMover::DrainResult Cluster::Drain(absl::Time deadline) {
  BlockMover::DrainResult out = mover_->Drain(deadline);
  announcer_->Stop();
  mover_->StopRepairs();
  if (absl::Status s = membership_->Leave(); !s.ok())
    spdlog::warn("drain: leaving: {}", s.ToString());
  spdlog::info("drain: {} blocks, {} moved to {} nodes, {} could not be moved", out.blocks,
               out.moved, out.targets.size(), out.failed);
  return out;
}

size_t Cluster::size() const {
  auto r = ctx_.ring.Get();
  return r ? r->view.nodes.size() : 1;
}

placement::MembershipView Cluster::View() const {
  auto r = ctx_.ring.Get();
  return r ? r->view : placement::MembershipView{};
}

void Cluster::OnView(const placement::MembershipView& view) {
  auto next = Ring::Make(view, ctx_.self.id);
  std::shared_ptr<const Ring> prev;
  if (!ctx_.ring.Replace(next, &prev)) return;
  if (prev) {
    bool departed = false;
    for (const auto& n : prev->view.nodes)
      if (!view.Find(n.id)) {
        size_t dropped = directory_.RemoveNode(n.id);
        spdlog::info("node '{}' left the cluster; dropped its {} directory entries", n.id, dropped);
        departed = true;
      }
    for (const auto& n : view.nodes)
      if (!prev->view.Find(n.id))
        spdlog::info("node '{}' ({}) joined the cluster", n.id, n.address);
    if (departed) mover_->ScheduleRepair();
  }
  if (device_) device_->Retain(view);
  // Entries this node no longer owns go; holders re-announce to the new owners.
  announcer_->RetainOwned(*next);
}

}  // namespace strata::daemon
