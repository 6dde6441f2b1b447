#include "daemon/cluster/block_mover.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/packed_ids.h"
#include "daemon/cluster/call_group.h"
#include "proto/convert.h"
#include "storage/gpu/gpu_tiered_store.h"

namespace strata::daemon {
namespace {

constexpr size_t kIdsPerMessage = 16384;  // 512 KiB of ids: well under gRPC's message limit

bool Copied(BlockStatus s) { return s == BlockStatus::kOk || s == BlockStatus::kExists; }

}  // namespace

BlockMover::BlockMover(ClusterContext& ctx, BlockStore& store, NamespaceRegistry& namespaces,
                       Locator& locator, Announcer& announcer, BlockPuller& puller,
                       GpuTieredStore* gpu)
    : ctx_(ctx),
      store_(store),
      namespaces_(namespaces),
      locator_(locator),
      announcer_(announcer),
      puller_(puller),
      gpu_(gpu) {}

BlockMover::~BlockMover() { StopRepairs(); }

uint32_t BlockMover::ReplicasFor(const NamespaceRegistry::Entry& ns) const {
  return ns.replicas > 0 ? ns.replicas : ctx_.config.replicas;
}

v1::PullRequest BlockMover::MakePullRequest(const NamespaceRegistry::Entry& ns,
                                            std::span<const BlockId> ids,
                                            std::span<const BlockId> parents,
                                            const std::string& source_node,
                                            const std::string& source_address) const {
  v1::PullRequest req;
  *req.mutable_spec() = ToProto(ns.spec);
  req.set_tenant(ns.tenant);
  req.set_ids(PackIds(ids));
  if (!parents.empty()) req.set_parent_ids(PackIds(parents));
  req.set_source_node(source_node);
  req.set_source_address(source_address);
  req.set_replicas(ns.replicas);
  return req;
}

std::vector<BlockStatus> BlockMover::PullStatuses(const grpc::Status& s,
                                                  const v1::PullResponse& resp, size_t n,
                                                  const std::string& target_address,
                                                  const std::string& source_node) {
  std::vector<BlockStatus> status(n, BlockStatus::kNotFound);
  if (!s.ok() || resp.status_size() != static_cast<int>(n)) {
    ctx_.counters.peer_failures.fetch_add(1);
    spdlog::warn("Pull of {} blocks at {} from '{}' failed: {}", n, target_address, source_node,
                 s.ok() ? "wrong number of statuses" : s.error_message());
    return status;
  }
  for (size_t i = 0; i < n; ++i)
    status[i] = static_cast<BlockStatus>(resp.status(static_cast<int>(i)));
  return status;
}

std::vector<BlockStatus> BlockMover::AskToPull(
    const std::string& target_address, const NamespaceRegistry::Entry& ns,
    std::span<const BlockId> ids, std::span<const BlockId> parents, const std::string& source_node,
    const std::string& source_address, absl::Time deadline, PullInto into) {
  v1::PullRequest req = MakePullRequest(ns, ids, parents, source_node, source_address);
  req.set_to_device(into == PullInto::kDevice);
  req.set_device_if_any(into == PullInto::kDeviceIfAny);
  v1::PullResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  grpc::Status s = ctx_.peers.Get(target_address)->Pull(&ctx, req, &resp);
  return PullStatuses(s, resp, ids.size(), target_address, source_node);
}

void BlockMover::Replicate(const NamespaceRegistry::Entry& ns, std::span<const BlockId> ids,
                           std::span<const BlockId> parents, absl::Time deadline) {
  const uint32_t copies = ReplicasFor(ns);
  auto r = ctx_.ring.Get();
  if (copies <= 1 || !r || r->view.nodes.size() <= 1 || ids.empty()) return;
  std::map<uint32_t, std::vector<size_t>> per_target;
  std::vector<uint32_t> ranked;
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t placed = 0;
    // The best `copies` nodes always hold copies - 1 others than this one.
    r->rendezvous.TopR(placement::KeyOf(ids[i]), copies, &ranked);
    for (uint32_t n : ranked) {
      if (placed + 1 >= copies) break;
      if (static_cast<int>(n) == r->self) continue;
      per_target[n].push_back(i);
      ++placed;
    }
  }
  // All targets at once, on gRPC's callback threads: no thread of our own per commit.
  struct Call {
    grpc::ClientContext ctx;
    v1::PullRequest req;
    v1::PullResponse resp;
    grpc::Status status;
    std::string address;
    size_t n = 0;
  };
  std::vector<std::shared_ptr<Call>> pulls;
  CallGroup group;
  for (auto& [target, which] : per_target) {
    std::vector<BlockId> sub, sub_parents;
    for (size_t i : which) {
      sub.push_back(ids[i]);
      if (!parents.empty()) sub_parents.push_back(parents[i]);
    }
    auto call = std::make_shared<Call>();
    call->address = r->NodeAt(target).address;
    call->n = sub.size();
    call->req = MakePullRequest(ns, sub, sub_parents, ctx_.self.id, ctx_.self.address);
    call->ctx.set_deadline(absl::ToChronoTime(deadline));
    group.Add();
    ctx_.peers.Get(call->address)
        ->async()
        ->Pull(&call->ctx, &call->req, &call->resp, [call, &group](grpc::Status s) {
          call->status = std::move(s);
          group.Done();
        });
    pulls.push_back(call);
  }
  group.Wait();
  for (const auto& call : pulls)
    for (BlockStatus s :
         PullStatuses(call->status, call->resp, call->n, call->address, ctx_.self.id))
      (Copied(s) ? ctx_.counters.replicated : ctx_.counters.replication_failed).fetch_add(1);
}

std::vector<BlockStatus> BlockMover::AskToPullKeepingTiers(const std::string& target_address,
                                                       const NamespaceRegistry::Entry& ns,
                                                       std::span<const BlockId> ids,
                                                       std::span<const BlockId> parents,
                                                       absl::Time deadline) {
  const absl::flat_hash_set<BlockId> on_device =
      gpu_ ? gpu_->HeldOnDevice(ns.id, ids) : absl::flat_hash_set<BlockId>{};
  if (on_device.empty())
    return AskToPull(target_address, ns, ids, parents, ctx_.self.id, ctx_.self.address, deadline);
  std::vector<BlockStatus> out(ids.size(), BlockStatus::kNotFound);
  for (const bool device : {true, false}) {
    std::vector<size_t> which;
    std::vector<BlockId> sub, sub_parents;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (on_device.contains(ids[i]) != device) continue;
      which.push_back(i);
      sub.push_back(ids[i]);
      if (!parents.empty()) sub_parents.push_back(parents[i]);
    }
    if (sub.empty()) continue;
    auto st = AskToPull(target_address, ns, sub, sub_parents, ctx_.self.id, ctx_.self.address,
                        deadline, device ? PullInto::kDeviceIfAny : PullInto::kHost);
    for (size_t k = 0; k < which.size(); ++k) out[which[k]] = st[k];
  }
  return out;
}

absl::StatusOr<BlockMover::RepositionResult> BlockMover::Reposition(
    const NamespaceRegistry::Entry& ns, std::span<const BlockId> ids,
    const std::string& target_node, bool move, absl::Time deadline, bool to_device) {
  auto r = ctx_.ring.Get();
  const std::string target = target_node.empty() ? ctx_.self.id : target_node;
  const placement::NodeRecord* tnode = r ? r->view.Find(target) : nullptr;
  if (!tnode)
    return absl::NotFoundError(
        absl::StrCat("node '", target, "' is not in this node's cluster view"));
  RepositionResult out;
  out.status.assign(ids.size(), BlockStatus::kNotFound);
  // Holders: this node's store, then the directory.
  absl::flat_hash_set<BlockId> local;
  for (const auto& id : ids)
    if (HeldIn(store_, ns.id, id)) local.insert(id);
  auto located = locator_.Locate(ids, std::min(deadline, absl::Now() + ctx_.config.peer_timeout));
  std::map<std::string, std::vector<size_t>> by_source;
  // Into another node's GPU tier, blocks it holds already go up there too: asked as if
  // pulled from this node, which it then never contacts for them (nor removes them here).
  const bool promote_there = to_device && target != ctx_.self.id;
  absl::flat_hash_set<size_t> nominal;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<std::string> holders;
    if (local.contains(ids[i])) holders.push_back(ctx_.self.id);
    // Into a GPU tier: a holder with the block on its device first (device to device).
    if (to_device)
      for (const auto& l : located[i])
        if (l.tier == placement::LocationTier::kGpu && l.node != target && l.node != ctx_.self.id &&
            std::find(holders.begin(), holders.end(), l.node) == holders.end())
          holders.insert(holders.begin(), l.node);
    // The directory knows ids, not namespaces: this node is a holder only where it holds the
    // block in this namespace (`local`, above).
    for (const auto& l : located[i])
      if (l.node != ctx_.self.id &&
          std::find(holders.begin(), holders.end(), l.node) == holders.end())
        holders.push_back(l.node);
    const bool there = std::find(holders.begin(), holders.end(), target) != holders.end();
    if (there && promote_there) {
      by_source[ctx_.self.id].push_back(i);
      nominal.insert(i);
      continue;
    }
    if (there) {
      out.status[i] = BlockStatus::kOk;
      ++out.already_there;
      continue;
    }
    if (!holders.empty()) by_source[holders.front()].push_back(i);
  }
  std::vector<std::pair<std::string, std::vector<BlockId>>> to_remove;
  for (auto& [source, which] : by_source) {
    const placement::NodeRecord* snode = r->view.Find(source);
    if (!snode) continue;
    std::vector<BlockId> sub;
    for (size_t i : which) sub.push_back(ids[i]);
    std::vector<BlockStatus> st =
        target == ctx_.self.id
            ? puller_.Pull(ns.spec, ns.tenant, ns.replicas, sub, {}, source, snode->address,
                           deadline, to_device ? PullInto::kDevice : PullInto::kHost)
            : AskToPull(tnode->address, ns, sub, {}, source, snode->address, deadline,
                        to_device ? PullInto::kDevice : PullInto::kHost);
    std::vector<BlockId> moved;
    for (size_t k = 0; k < which.size(); ++k) {
      out.status[which[k]] = Copied(st[k]) ? BlockStatus::kOk : st[k];
      if (st[k] == BlockStatus::kOk) ++out.copied;
      if (st[k] == BlockStatus::kExists) ++out.already_there;
      if (Copied(st[k]) && !nominal.contains(which[k])) moved.push_back(sub[k]);
    }
    if (move && !moved.empty()) to_remove.emplace_back(source, std::move(moved));
  }
  for (auto& [source, moved] : to_remove) {
    if (source == ctx_.self.id)
      out.removed_sources += store_.Evict(ns.id, moved, false, false).removed_blocks;
    else
      out.removed_sources +=
          puller_.EvictAtSource(source, r->view.Find(source)->address, ns, moved);
  }
  return out;
}

BlockMover::DrainResult BlockMover::Drain(absl::Time deadline) {
  DrainResult out;
  auto r = ctx_.ring.Get();
  // Every tier alike: a pull from here stages lower-tier blocks like any fetch.
  std::vector<BlockInfo> blocks = store_.AllBlocks();
  out.blocks = blocks.size();
  // (namespace, target node) -> blocks
  using Plan = std::map<std::pair<NamespaceId, uint32_t>, std::vector<const BlockInfo*>>;
  Plan plan;
  for (const auto& b : blocks) {
    int target = -1;
    for (uint32_t n : r->rendezvous.Rank(b.id))
      if (static_cast<int>(n) != r->self) {
        target = static_cast<int>(n);
        break;
      }
    if (target < 0 || !namespaces_.Find(b.ns)) {
      ++out.failed;  // nowhere to go, or a namespace nobody opened since this daemon started
      continue;
    }
    plan[{b.ns, static_cast<uint32_t>(target)}].push_back(&b);
  }
  std::vector<BlockId> moved;
  std::map<NamespaceId, std::vector<BlockId>> moved_by_ns;
  // Two passes: batches small enough that this node can stage a batch's lower-tier blocks into
  // host memory while the batch's other blocks are leased, then one block at a time for what
  // the first pass could not place (host memory was busy demoting, say).
  for (int pass = 0; pass < 2 && !plan.empty(); ++pass) {
    const uint64_t batch_bytes = pass == 0 ? std::max<uint64_t>(store_.arena_bytes() / 4, 1) : 1;
    Plan retry;
    for (auto& [key, list] : plan) {
      auto ns = namespaces_.Find(key.first);
      const auto& node = r->NodeAt(key.second);
      for (size_t begin = 0, end = 0; begin < list.size(); begin = end) {
        uint64_t bytes = 0;
        end = begin;
        while (end < list.size() && end - begin < kIdsPerMessage &&
               (end == begin || bytes + list[end]->size <= batch_bytes))
          bytes += list[end++]->size;
        std::vector<BlockId> ids, parents;
        for (size_t k = begin; k < end; ++k) {
          ids.push_back(list[k]->id);
          parents.push_back(list[k]->parent);
        }
        auto st = AskToPullKeepingTiers(node.address, *ns, ids, parents, deadline);
        bool any = false;
        for (size_t k = 0; k < ids.size(); ++k) {
          if (Copied(st[k])) {
            ++out.moved;
            moved.push_back(ids[k]);
            moved_by_ns[key.first].push_back(ids[k]);
            any = true;
          } else if (pass == 0) {
            retry[key].push_back(list[begin + k]);
          } else {
            ++out.failed;
          }
        }
        if (any && std::find(out.targets.begin(), out.targets.end(), node.id) == out.targets.end())
          out.targets.push_back(node.id);
      }
    }
    plan = std::move(retry);
  }
  // The copies elsewhere are now the ones to find: stop advertising ours, then drop them.
  announcer_.Announce(moved, true);
  for (const auto& [ns, ids] : moved_by_ns) store_.Evict(ns, ids, false, /*force=*/true);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Repair

void BlockMover::StartRepairs() {
  if (ctx_.config.rereplicate) repairer_ = std::thread([this] { RepairLoop(); });
}

void BlockMover::StopRepairs() {
  {
    std::lock_guard<std::mutex> lock(repair_mu_);
    stop_ = true;
  }
  repair_cv_.notify_all();
  std::lock_guard<std::mutex> join(join_mu_);
  if (repairer_.joinable()) repairer_.join();
}

void BlockMover::ScheduleRepair() {
  {
    std::lock_guard<std::mutex> lock(repair_mu_);
    repair_due_ = true;
  }
  repair_cv_.notify_all();
}

void BlockMover::RepairLoop() {
  std::unique_lock<std::mutex> lock(repair_mu_);
  while (!stop_) {
    repair_cv_.wait(lock, [&] { return stop_ || repair_due_; });
    if (stop_) break;
    // Let every holder re-announce to the new owners first: the repair reads the directory.
    announcer_.RequestFullRefresh();
    const absl::Duration settle = std::min(absl::Seconds(1), ctx_.config.peer_timeout * 2);
    repair_cv_.wait_for(lock, absl::ToChronoNanoseconds(settle), [&] { return stop_; });
    if (stop_) break;
    repair_due_ = false;
    lock.unlock();
    Repair();
    lock.lock();
  }
}

void BlockMover::Repair() {
  auto r = ctx_.ring.Get();
  if (!r || r->self < 0) return;
  std::map<NamespaceId, std::vector<BlockInfo>> by_ns;
  for (auto& b : store_.AllBlocks()) by_ns[b.ns].push_back(b);
  uint64_t made = 0, failed = 0;
  for (auto& [ns_id, blocks] : by_ns) {
    auto ns = namespaces_.Find(ns_id);
    if (ns && ReplicasFor(*ns) > 1) RepairNamespace(*r, *ns, blocks, &made, &failed);
  }
  ctx_.counters.rereplicated.fetch_add(made);
  if (made + failed > 0)
    spdlog::info("re-replication after a node left: {} copies made, {} failed", made, failed);
}

void BlockMover::RepairNamespace(const Ring& ring, const NamespaceRegistry::Entry& ns,
                                 const std::vector<BlockInfo>& blocks, uint64_t* made,
                                 uint64_t* failed) {
  const uint32_t copies = ReplicasFor(ns);
  std::vector<BlockId> ids;
  for (const auto& b : blocks) ids.push_back(b.id);
  auto located =
      locator_.Locate(ids, absl::Now() + ctx_.config.peer_timeout, Locator::Mode::kAllOwners);
  std::map<uint32_t, std::vector<size_t>> per_target;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<std::string> holders = {ctx_.self.id};
    for (const auto& l : located[i])
      if (std::find(holders.begin(), holders.end(), l.node) == holders.end())
        holders.push_back(l.node);
    if (holders.size() >= copies) continue;
    // One holder acts: the smallest id among them.
    if (*std::min_element(holders.begin(), holders.end()) != ctx_.self.id) continue;
    size_t missing = copies - holders.size();
    for (uint32_t n : ring.rendezvous.Rank(ids[i])) {
      if (missing == 0) break;
      const std::string& id = ring.rendezvous.node(n);
      if (std::find(holders.begin(), holders.end(), id) != holders.end()) continue;
      per_target[n].push_back(i);
      --missing;
    }
  }
  for (auto& [target, which] : per_target) {
    std::vector<BlockId> sub, parents;
    for (size_t i : which) {
      sub.push_back(ids[i]);
      parents.push_back(blocks[i].parent);
    }
    auto st = AskToPullKeepingTiers(ring.NodeAt(target).address, ns, sub, parents,
                                    absl::Now() + absl::Seconds(30));
    for (BlockStatus s : st) ++*(Copied(s) ? made : failed);
  }
}

}  // namespace strata::daemon
