#include "daemon/cluster.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/am_wire.h"
#include "common/crc32c.h"
#include "common/packed_ids.h"
#include "proto/convert.h"
#include "strata/client.h"
#include "strata/v1/cache.grpc.pb.h"

namespace strata::daemon {
namespace {

constexpr size_t kIdsPerMessage = 16384;  // 512 KiB of ids: well under gRPC's message limit

// Waits for a set of callback-API calls, each of which must call Done() exactly once.
class CallGroup {
 public:
  void Add() {
    std::lock_guard<std::mutex> lock(mu_);
    ++pending_;
  }
  void Done() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) cv_.notify_all();
  }
  // Every call carries a deadline, so its callback always comes; this only waits for them.
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return pending_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int pending_ = 0;
};

placement::LocationTier TierOf(int proto_tier) {
  switch (proto_tier) {
    case v1::TIER_GPU:
      return placement::LocationTier::kGpu;
    case v1::TIER_HOST:
      return placement::LocationTier::kHost;
    case v1::TIER_NVME:
      return placement::LocationTier::kNvme;
    default:
      return placement::LocationTier::kUnknown;
  }
}

}  // namespace

const placement::NodeRecord& Cluster::NodeAt(const Ring& r, uint32_t index) {
  return *r.view.Find(r.rendezvous.node(index));
}

Cluster::Cluster(Options options, BlockStore& store, NamespaceRegistry* namespaces)
    : options_(std::move(options)), store_(store), namespaces_(namespaces) {}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(Options options, BlockStore& store,
                                                        NamespaceRegistry* namespaces) {
  std::unique_ptr<Cluster> c(new Cluster(std::move(options), store, namespaces));
  const ClusterConfig& cfg = c->options_.config;
  absl::Duration etcd_start_timeout;
  if (cfg.membership == "etcd") {
    placement::EtcdMembershipOptions eo;
    etcd_start_timeout = eo.start_timeout;
    eo.endpoints = cfg.etcd_endpoints;
    eo.prefix = cfg.etcd_prefix;
    eo.lease_ttl = cfg.etcd_lease_ttl;
    eo.call_timeout = std::max(cfg.peer_timeout, absl::Seconds(1));
    c->membership_ = placement::NewEtcdMembership(std::move(eo));
  } else {
    std::vector<placement::NodeRecord> nodes;
    for (const auto& n : cfg.static_nodes)
      if (n.id != c->options_.self.id) nodes.push_back({n.id, n.address, 0, 0, ""});
    c->membership_ = placement::NewStaticMembership(std::move(nodes));
  }
  Cluster* raw = c.get();
  c->membership_->SetListener([raw](const placement::MembershipView& v) { raw->OnView(v); });
  if (cfg.membership == "etcd") {
    spdlog::info(
        "joining the cluster through etcd ({}); waiting up to {} if it is not answering "
        "yet",
        absl::StrJoin(cfg.etcd_endpoints, ", "), absl::FormatDuration(etcd_start_timeout));
  }
  if (absl::Status s = c->membership_->Start(c->options_.self); !s.ok())
    return absl::Status(s.code(),
                        absl::StrCat("cluster membership (", cfg.membership, "): ", s.message()));
  c->OnView(c->membership_->View());
  store.SetChangeHook([raw](const BlockEvent& e) { raw->OnBlockEvent(e); });
  c->announcer_ = std::thread([raw] { raw->AnnounceLoop(); });
  if (cfg.rereplicate) c->repairer_ = std::thread([raw] { raw->RepairLoop(); });
  return c;
}

Cluster::~Cluster() { Stop(); }

void Cluster::Stop() {
  if (stopped_.exchange(true)) return;
  store_.SetChangeHook(nullptr);
  {
    std::lock_guard<std::mutex> lock(ev_mu_);
    stop_ = true;
  }
  ev_cv_.notify_all();
  repair_cv_.notify_all();
  if (announcer_.joinable()) announcer_.join();
  if (repairer_.joinable()) repairer_.join();
  if (absl::Status s = membership_->Leave(); !s.ok())
    spdlog::warn("leaving the cluster: {}", s.ToString());
  {
    std::lock_guard<std::mutex> lock(am_mu_);
    am_links_.clear();
    am_worker_.reset();
  }
  std::lock_guard<std::mutex> lock(sources_mu_);
  sources_.clear();
}

std::shared_ptr<const Cluster::Ring> Cluster::ring() const {
  std::lock_guard<std::mutex> lock(ring_mu_);
  return ring_;
}

size_t Cluster::size() const {
  auto r = ring();
  return r ? r->view.nodes.size() : 1;
}

placement::MembershipView Cluster::View() const {
  auto r = ring();
  return r ? r->view : placement::MembershipView{};
}

bool Cluster::healthy(std::string* detail) const { return membership_->healthy(detail); }

void Cluster::OnView(const placement::MembershipView& view) {
  auto next = std::make_shared<Ring>(Ring{view, placement::Rendezvous(view.Ids()), -1});
  next->self = next->rendezvous.IndexOf(options_.self.id);
  std::shared_ptr<const Ring> prev;
  {
    std::lock_guard<std::mutex> lock(ring_mu_);
    if (ring_ && ring_->view.epoch == view.epoch && ring_->view.nodes == view.nodes) return;
    // The membership's thread may deliver an older view after a newer one was read directly.
    if (ring_ && view.epoch < ring_->view.epoch) return;
    prev = ring_;
    ring_ = next;
  }
  if (prev) {
    for (const auto& n : prev->view.nodes)
      if (!view.Find(n.id)) {
        size_t dropped = directory_.RemoveNode(n.id);
        spdlog::info("node '{}' left the cluster; dropped its {} directory entries", n.id, dropped);
        std::lock_guard<std::mutex> lock(ev_mu_);
        repair_due_ = true;
        repair_cv_.notify_all();
      }
    for (const auto& n : view.nodes)
      if (!prev->view.Find(n.id))
        spdlog::info("node '{}' ({}) joined the cluster", n.id, n.address);
  }
  // Entries this node no longer owns go; holders re-announce to the new owners.
  const size_t r = options_.config.directory_owners;
  const int self = next->self;
  std::vector<uint32_t> owners;
  directory_.Retain([&](const BlockId& id) {
    next->rendezvous.TopR(placement::KeyOf(id), r, &owners);
    return std::find(owners.begin(), owners.end(), static_cast<uint32_t>(self)) != owners.end();
  });
  {
    std::lock_guard<std::mutex> lock(ev_mu_);
    full_refresh_ = true;
  }
  ev_cv_.notify_all();
}

void Cluster::OnBlockEvent(const BlockEvent& event) {
  bool first;
  {
    std::lock_guard<std::mutex> lock(ev_mu_);
    first = events_.empty();
    events_.push_back(event);
    ++events_queued_;
  }
  if (first) ev_cv_.notify_one();
}

void Cluster::AnnounceLoop() {
  const absl::Duration refresh = options_.config.directory_ttl / 3;
  absl::Time next_refresh = absl::Now() + refresh;
  std::unique_lock<std::mutex> lock(ev_mu_);
  while (!stop_) {
    ev_cv_.wait_for(lock, std::chrono::milliseconds(200),
                    [&] { return stop_ || full_refresh_ || !events_.empty(); });
    if (stop_) break;
    const absl::Time now = absl::Now();
    const bool refresh_all = full_refresh_ || now >= next_refresh;
    full_refresh_ = false;
    std::vector<BlockEvent> events;
    events.swap(events_);
    const uint64_t batch_end = events_queued_;
    lock.unlock();
    // Events first: commits wait for them (FlushAnnouncements), never for a full refresh.
    // The last event of an id decides whether it is held.
    absl::flat_hash_map<BlockId, BlockEvent::Kind> last;
    for (const auto& e : events) last[e.id] = e.kind;
    std::vector<BlockId> stored, removed;
    for (const auto& [id, kind] : last) {
      // A block demoted to NVMe left the host tier but not this node.
      if (kind == BlockEvent::kRemoved && store_.Holds(id)) continue;
      (kind == BlockEvent::kStored ? stored : removed).push_back(id);
    }
    if (!stored.empty()) Announce(stored, false);
    if (!removed.empty()) Announce(removed, true);
    lock.lock();
    events_announced_ = batch_end;
    flushed_cv_.notify_all();
    if (refresh_all) {
      // Everything held, to every owner: covers new owners after a membership change and keeps
      // entries from expiring.
      lock.unlock();
      Announce(store_.AllIds(), false);
      next_refresh = now + refresh;
      directory_.Expire(now);
      lock.lock();
    }
  }
  flushed_cv_.notify_all();
}

void Cluster::RepairLoop() {
  std::unique_lock<std::mutex> lock(ev_mu_);
  while (!stop_) {
    repair_cv_.wait(lock, [&] { return stop_ || repair_due_; });
    if (stop_) break;
    // Let every holder re-announce to the new owners first: the repair reads the directory.
    full_refresh_ = true;
    ev_cv_.notify_all();
    lock.unlock();
    absl::SleepFor(std::min(absl::Seconds(1), options_.config.peer_timeout * 2));
    lock.lock();
    if (stop_) break;
    repair_due_ = false;
    lock.unlock();
    Repair();
    lock.lock();
  }
}

void Cluster::Repair() {
  auto r = ring();
  if (!r || r->self < 0) return;
  std::map<NamespaceId, std::vector<BlockInfo>> by_ns;
  for (auto& b : store_.AllBlocks()) by_ns[b.ns].push_back(b);
  uint64_t made = 0, failed = 0;
  for (auto& [ns_id, blocks] : by_ns) {
    auto ns = namespaces_->Find(ns_id);
    if (!ns) continue;
    const uint32_t copies = ReplicasFor(*ns);
    if (copies <= 1) continue;
    std::vector<BlockId> ids;
    for (const auto& b : blocks) ids.push_back(b.id);
    auto located = Locate(ids, absl::Now() + options_.config.peer_timeout, LocateMode::kAllOwners);
    std::map<uint32_t, std::vector<size_t>> per_target;
    for (size_t i = 0; i < ids.size(); ++i) {
      std::vector<std::string> holders = {options_.self.id};
      for (const auto& l : located[i])
        if (std::find(holders.begin(), holders.end(), l.node) == holders.end())
          holders.push_back(l.node);
      if (holders.size() >= copies) continue;
      // One holder acts: the smallest id among them.
      if (*std::min_element(holders.begin(), holders.end()) != options_.self.id) continue;
      size_t missing = copies - holders.size();
      for (uint32_t n : r->rendezvous.Rank(ids[i])) {
        if (missing == 0) break;
        const std::string& id = r->rendezvous.node(n);
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
      auto st = AskToPull(NodeAt(*r, target).address, *ns, sub, parents, options_.self.id,
                          options_.self.address, absl::Now() + absl::Seconds(30));
      for (BlockStatus s : st) {
        if (s == BlockStatus::kOk || s == BlockStatus::kExists)
          ++made;
        else
          ++failed;
      }
    }
  }
  counters_.rereplicated.fetch_add(made);
  if (made + failed > 0)
    spdlog::info("re-replication after a node left: {} copies made, {} failed", made, failed);
}

void Cluster::FlushAnnouncements(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(ev_mu_);
  const uint64_t target = events_queued_;
  flushed_cv_.wait_until(lock, absl::ToChronoTime(deadline),
                         [&] { return stop_ || events_announced_ >= target; });
}

std::shared_ptr<v1::Peer::Stub> Cluster::PeerStub(const std::string& address) {
  std::lock_guard<std::mutex> lock(stubs_mu_);
  auto& stub = stubs_[address];
  if (!stub) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetMaxSendMessageSize(64 << 20);
    // Fail fast on a dead peer instead of backing off for seconds between reconnects.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    stub = v1::Peer::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  }
  return stub;
}

void Cluster::Announce(std::span<const BlockId> ids, bool withdraw) {
  if (ids.empty()) return;
  auto r = ring();
  // Alone, this node is its own directory: its tiers answer every lookup already.
  if (!r || r->self < 0 || r->rendezvous.size() <= 1) return;
  const size_t owners_per_id = options_.config.directory_owners;
  std::vector<std::vector<BlockId>> per_owner(r->rendezvous.size());
  std::vector<uint32_t> owners;
  for (const auto& id : ids) {
    r->rendezvous.TopR(placement::KeyOf(id), owners_per_id, &owners);
    for (uint32_t o : owners) per_owner[o].push_back(id);
  }
  const absl::Time expires = absl::Now() + options_.config.directory_ttl;
  const placement::LocationTier host[] = {placement::LocationTier::kHost};
  CallGroup calls;
  for (size_t o = 0; o < per_owner.size(); ++o) {
    auto& mine = per_owner[o];
    if (mine.empty()) continue;
    if (static_cast<int>(o) == r->self) {
      if (withdraw)
        directory_.Withdraw(options_.self.id, mine);
      else
        directory_.Announce(options_.self.id, mine, host, expires);
      continue;
    }
    auto stub = PeerStub(NodeAt(*r, o).address);
    for (size_t begin = 0; begin < mine.size(); begin += kIdsPerMessage) {
      size_t end = std::min(mine.size(), begin + kIdsPerMessage);
      struct Call {
        grpc::ClientContext ctx;
        v1::AnnounceRequest req;
        v1::AnnounceResponse resp;
      };
      auto call = std::make_shared<Call>();
      call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.config.peer_timeout));
      call->req.set_node_id(options_.self.id);
      call->req.set_ids(PackIds(std::span<const BlockId>(mine).subspan(begin, end - begin)));
      call->req.add_tiers(v1::TIER_HOST);
      call->req.set_withdraw(withdraw);
      call->req.set_ttl_ms(absl::ToInt64Milliseconds(options_.config.directory_ttl));
      calls.Add();
      stub->async()->Announce(&call->ctx, &call->req, &call->resp,
                              [this, call, &calls](grpc::Status s) {
                                if (!s.ok()) counters_.peer_failures.fetch_add(1);
                                calls.Done();
                              });
    }
  }
  calls.Wait();
  (withdraw ? counters_.withdrawn : counters_.announced).fetch_add(ids.size());
}

void Cluster::HandleAnnounce(const v1::AnnounceRequest& req, std::span<const BlockId> ids) {
  if (req.withdraw()) {
    directory_.Withdraw(req.node_id(), ids);
    return;
  }
  std::vector<placement::LocationTier> tiers;
  for (int t : req.tiers()) tiers.push_back(TierOf(t));
  if (tiers.empty()) tiers.push_back(placement::LocationTier::kHost);
  if (tiers.size() != 1 && tiers.size() != ids.size()) tiers.resize(1);
  absl::Duration ttl =
      req.ttl_ms() > 0 ? absl::Milliseconds(req.ttl_ms()) : options_.config.directory_ttl;
  directory_.Announce(req.node_id(), ids, tiers, absl::Now() + ttl);
}

void Cluster::HandleAmLocate(const transport::AmMessage& m, transport::Worker* worker) {
  namespace w = am_wire;
  if (m.reply_ep == nullptr || m.header.size() != 8) return;
  std::string header(w::kReplyHeaderBytes, '\0');
  w::PutU64(header.data(), w::GetU64(m.header.data()));
  std::string data;
  auto ids = UnpackIds(m.data, "ids", SIZE_MAX);
  if (!ids.ok()) {
    w::PutU32(header.data() + 8, static_cast<uint32_t>(ids.status().code()));
  } else {
    auto found = directory_.Locate(*ids, absl::Now());
    absl::flat_hash_map<std::string, uint16_t> index;
    std::string table, holders;
    for (const auto& hs : found) {
      holders.push_back(static_cast<char>(std::min<size_t>(hs.size(), 255)));
      for (size_t k = 0; k < hs.size() && k < 255; ++k) {
        auto [it, fresh] = index.try_emplace(hs[k].node, static_cast<uint16_t>(index.size()));
        if (fresh) {
          uint16_t len = static_cast<uint16_t>(std::min<size_t>(hs[k].node.size(), 65535));
          table.push_back(static_cast<char>(len & 0xff));
          table.push_back(static_cast<char>(len >> 8));
          table.append(hs[k].node, 0, len);
        }
        holders.push_back(static_cast<char>(it->second & 0xff));
        holders.push_back(static_cast<char>(it->second >> 8));
        holders.push_back(static_cast<char>(hs[k].tier));
      }
    }
    w::PutU32(header.data() + 12, static_cast<uint32_t>(index.size()));
    data = table + holders;
  }
  worker->AmReply(m.reply_ep, w::kPeerLocateReplyAm, std::move(header), std::move(data));
}

transport::Endpoint* Cluster::AmLink(const std::string& address) {
  if (!options_.ucx) return nullptr;
  if (!am_worker_) {
    auto worker = transport::Worker::Create(options_.ucx);
    if (!worker.ok()) return nullptr;
    am_worker_ = std::move(*worker);
    auto* pending = &am_pending_;
    auto status = am_worker_->SetAmHandler(
        am_wire::kPeerLocateReplyAm, [pending](const transport::AmMessage& m) {
          if (m.header.size() != am_wire::kReplyHeaderBytes) return;
          auto it = pending->find(am_wire::GetU64(m.header.data()));
          if (it == pending->end()) return;  // a late answer to a query that moved on
          it->second->code = am_wire::GetU32(m.header.data() + 8);
          it->second->nodes = am_wire::GetU32(m.header.data() + 12);
          it->second->data.assign(m.data);
          it->second->done = true;
        });
    if (!status.ok()) {
      am_worker_.reset();
      return nullptr;
    }
  }
  auto& link = am_links_[address];
  if (link && !link->failed()) return link.get();
  link.reset();
  // The worker address comes from ResolveWorkerAddresses, outside this lock.
  auto known = am_worker_addrs_.find(address);
  if (known == am_worker_addrs_.end()) return nullptr;
  auto ep = am_worker_->Connect(known->second, transport::Worker::PeerFailure::kDetect);
  if (!ep.ok()) {
    am_worker_addrs_.erase(known);  // the peer may have restarted: ask it again next time
    return nullptr;
  }
  link = std::move(*ep);
  return link.get();
}

void Cluster::ResolveWorkerAddresses(const std::vector<std::string>& addresses,
                                     absl::Time deadline) {
  std::vector<std::string> unknown;
  {
    std::lock_guard<std::mutex> lock(am_mu_);
    const absl::Time now = absl::Now();
    for (const auto& a : addresses) {
      auto link = am_links_.find(a);
      if (link != am_links_.end() && link->second && !link->second->failed()) continue;
      if (am_worker_addrs_.contains(a)) continue;
      // A peer that could not be reached is not asked again for a second (gRPC answers).
      auto retry = am_retry_after_.find(a);
      if (retry != am_retry_after_.end() && now < retry->second) continue;
      am_retry_after_[a] = now + absl::Seconds(1);
      unknown.push_back(a);
    }
  }
  for (const auto& a : unknown) {  // no lock held across these calls
    auto stub = v1::Cache::NewStub(grpc::CreateChannel(a, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    v1::ConnectRequest req;
    req.set_client_name(absl::StrCat("stratad:", options_.self.id, ":directory"));
    v1::ConnectResponse resp;
    if (!stub->Connect(&ctx, req, &resp).ok()) continue;
    std::lock_guard<std::mutex> lock(am_mu_);
    am_worker_addrs_[a] = resp.worker_address();
    am_retry_after_.erase(a);
  }
}

std::vector<size_t> Cluster::AskOwnersOverAm(
    const Ring& ring, const std::vector<std::pair<size_t, std::vector<uint32_t>>>& calls,
    std::span<const BlockId> ids, absl::Time deadline,
    const std::function<void(uint32_t, placement::Location)>& merge) {
  std::vector<size_t> unanswered;
  std::vector<std::string> addresses;
  for (const auto& c : calls) addresses.push_back(NodeAt(ring, c.first).address);
  ResolveWorkerAddresses(addresses, deadline);
  std::lock_guard<std::mutex> lock(am_mu_);
  std::vector<AmPending> slots(calls.size());
  std::vector<uint64_t> request_ids(calls.size(), 0);
  for (size_t c = 0; c < calls.size(); ++c) {
    const auto& [owner, which] = calls[c];
    transport::Endpoint* ep = AmLink(NodeAt(ring, owner).address);
    if (!ep) continue;
    std::string header(8, '\0');
    request_ids[c] = am_next_++;
    am_wire::PutU64(header.data(), request_ids[c]);
    std::vector<BlockId> asked;
    asked.reserve(which.size());
    for (uint32_t k : which) asked.push_back(ids[k]);
    std::string data = PackIds(asked);
    am_pending_[request_ids[c]] = &slots[c];
    if (!ep->AmPost(am_wire::kPeerLocateAm, std::move(header), std::move(data)).ok()) {
      am_pending_.erase(request_ids[c]);
      request_ids[c] = 0;
    }
  }
  auto all_done = [&] {
    for (size_t c = 0; c < calls.size(); ++c)
      if (request_ids[c] != 0 && !slots[c].done) return false;
    return true;
  };
  unsigned spins = 0;
  while (am_worker_ && !all_done()) {
    am_worker_->Progress();
    if ((++spins & 63) == 0 && absl::Now() >= deadline) break;
  }
  for (size_t c = 0; c < calls.size(); ++c) {
    if (request_ids[c] != 0) am_pending_.erase(request_ids[c]);
    const AmPending& a = slots[c];
    if (request_ids[c] == 0 || !a.done || a.code != 0) {
      unanswered.push_back(c);
      continue;
    }
    // Decode: node table, then the holders of each id in order.
    std::vector<std::string> names;
    size_t pos = 0;
    bool bad = false;
    for (uint32_t n = 0; n < a.nodes && !bad; ++n) {
      if (pos + 2 > a.data.size()) {
        bad = true;
        break;
      }
      size_t len = static_cast<uint8_t>(a.data[pos]) | (static_cast<uint8_t>(a.data[pos + 1]) << 8);
      pos += 2;
      if (pos + len > a.data.size()) {
        bad = true;
        break;
      }
      names.push_back(a.data.substr(pos, len));
      pos += len;
    }
    const auto& which = calls[c].second;
    for (size_t k = 0; k < which.size() && !bad; ++k) {
      if (pos >= a.data.size()) {
        bad = true;
        break;
      }
      size_t count = static_cast<uint8_t>(a.data[pos++]);
      for (size_t h = 0; h < count; ++h) {
        if (pos + 3 > a.data.size()) {
          bad = true;
          break;
        }
        size_t node =
            static_cast<uint8_t>(a.data[pos]) | (static_cast<uint8_t>(a.data[pos + 1]) << 8);
        int tier = static_cast<uint8_t>(a.data[pos + 2]);
        pos += 3;
        if (node >= names.size() || !ring.view.Find(names[node])) continue;
        merge(which[k], {names[node], TierOf(tier)});
      }
    }
    if (bad) unanswered.push_back(c);
  }
  return unanswered;
}

void Cluster::HandleLocate(std::span<const BlockId> ids, v1::PeerLocateResponse* resp) {
  auto found = directory_.Locate(ids, absl::Now());
  absl::flat_hash_map<std::string, uint32_t> index;
  for (const auto& holders : found) {
    resp->add_holders_per_id(static_cast<uint32_t>(holders.size()));
    for (const auto& h : holders) {
      auto [it, fresh] = index.try_emplace(h.node, static_cast<uint32_t>(index.size()));
      if (fresh) resp->add_node_ids(h.node);
      resp->add_holder_node(it->second);
      resp->add_holder_tier(static_cast<v1::Tier>(h.tier));
    }
  }
}

std::vector<std::vector<placement::Location>> Cluster::Locate(std::span<const BlockId> ids,
                                                              absl::Time deadline,
                                                              LocateMode mode) {
  std::vector<std::vector<placement::Location>> out(ids.size());
  auto r = ring();
  if (!r || ids.empty()) return out;
  const size_t owners_per_id = options_.config.directory_owners;
  // Owners of each id, best first; a round asks the owners of rank [first, last).
  std::vector<std::vector<uint32_t>> owners(ids.size());
  for (size_t i = 0; i < ids.size(); ++i)
    r->rendezvous.TopR(placement::KeyOf(ids[i]), owners_per_id, &owners[i]);
  auto round = [&](size_t first, size_t last, const std::vector<uint32_t>& which) {
    std::vector<std::vector<uint32_t>> per_owner(r->rendezvous.size());
    for (uint32_t i : which)
      for (size_t k = first; k < std::min(last, owners[i].size()); ++k)
        per_owner[owners[i][k]].push_back(i);
    AskOwners(*r, ids, std::move(per_owner), deadline, &out);
  };
  std::vector<uint32_t> all(ids.size());
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  if (mode == LocateMode::kAllOwners) {
    round(0, owners_per_id, all);
    return out;
  }
  // Every owner holds the same entries in steady state: ask the first, and the others only for
  // what it did not know (it may be dead, or new since a membership change).
  round(0, 1, all);
  std::vector<uint32_t> unknown;
  for (uint32_t i : all)
    if (out[i].empty()) unknown.push_back(i);
  if (!unknown.empty() && owners_per_id > 1) round(1, owners_per_id, unknown);
  return out;
}

void Cluster::AskOwners(const Ring& ring, std::span<const BlockId> ids,
                        std::vector<std::vector<uint32_t>> per_owner, absl::Time deadline,
                        std::vector<std::vector<placement::Location>>* out_ptr) {
  auto& out = *out_ptr;
  std::mutex merge_mu;
  auto merge = [&](uint32_t i, placement::Location loc) {
    std::lock_guard<std::mutex> lock(merge_mu);
    for (const auto& have : out[i])
      if (have.node == loc.node) return;
    out[i].push_back(std::move(loc));
  };
  // This node's share is answered from its own directory.
  std::vector<std::pair<size_t, std::vector<uint32_t>>> remote;
  for (size_t o = 0; o < per_owner.size(); ++o) {
    if (per_owner[o].empty()) continue;
    if (static_cast<int>(o) != ring.self) {
      remote.emplace_back(o, std::move(per_owner[o]));
      continue;
    }
    std::vector<BlockId> own_ids;
    for (uint32_t i : per_owner[o]) own_ids.push_back(ids[i]);
    auto found = directory_.Locate(own_ids, absl::Now());
    for (size_t k = 0; k < per_owner[o].size(); ++k)
      for (auto& loc : found[k]) merge(per_owner[o][k], std::move(loc));
  }
  if (remote.empty()) return;
  // Active messages first (tens of microseconds a round trip); owners they do not reach in
  // time are asked over gRPC.
  std::vector<size_t> grpc_calls;
  if (options_.ucx) {
    const absl::Time am_deadline = std::min(
        deadline, absl::Now() + std::min(options_.config.peer_timeout, absl::Milliseconds(200)));
    grpc_calls = AskOwnersOverAm(ring, remote, ids, am_deadline, merge);
  } else {
    for (size_t c = 0; c < remote.size(); ++c) grpc_calls.push_back(c);
  }
  if (grpc_calls.empty() || absl::Now() >= deadline) return;
  CallGroup calls;
  struct Call {
    grpc::ClientContext ctx;
    v1::PeerLocateRequest req;
    v1::PeerLocateResponse resp;
    const std::vector<uint32_t>* which = nullptr;
  };
  std::vector<std::shared_ptr<Call>> pending;
  for (size_t c : grpc_calls) {
    const auto& [owner, which] = remote[c];
    std::vector<BlockId> sub;
    sub.reserve(which.size());
    for (uint32_t i : which) sub.push_back(ids[i]);
    auto call = std::make_shared<Call>();
    call->ctx.set_deadline(absl::ToChronoTime(deadline));
    call->req.set_ids(PackIds(sub));
    call->which = &which;
    calls.Add();
    PeerStub(NodeAt(ring, owner).address)
        ->async()
        ->Locate(&call->ctx, &call->req, &call->resp, [this, call, &calls](grpc::Status s) {
          if (!s.ok()) counters_.peer_failures.fetch_add(1);
          calls.Done();
        });
    pending.push_back(call);
  }
  calls.Wait();
  for (const auto& call : pending) {
    const auto& resp = call->resp;
    const auto& which = *call->which;
    if (resp.holders_per_id_size() != static_cast<int>(which.size())) continue;
    int next = 0;
    for (size_t k = 0; k < which.size(); ++k) {
      for (uint32_t h = 0; h < resp.holders_per_id(static_cast<int>(k)); ++h, ++next) {
        if (next >= resp.holder_node_size() || next >= resp.holder_tier_size()) break;
        uint32_t node = resp.holder_node(next);
        if (node >= static_cast<uint32_t>(resp.node_ids_size())) continue;
        const std::string& id = resp.node_ids(static_cast<int>(node));
        if (!ring.view.Find(id)) continue;  // a node that has left since
        merge(which[k], {id, TierOf(resp.holder_tier(next))});
      }
    }
  }
}

absl::StatusOr<std::shared_ptr<Client>> Cluster::SourceClient(const std::string& node,
                                                              const std::string& address) {
  std::lock_guard<std::mutex> lock(sources_mu_);
  auto it = sources_.find(address);
  if (it != sources_.end()) return it->second;
  ClientOptions o;
  o.endpoint = address;
  o.client_name = absl::StrCat("stratad:", options_.self.id);
  o.rpc_timeout = std::max(options_.config.peer_timeout, absl::Seconds(2));
  o.remote_fetch = false;
  o.same_node = false;
  auto made = Client::Connect(o);
  if (!made.ok())
    return absl::Status(made.status().code(), absl::StrCat("connecting to node '", node, "' at ",
                                                           address, ": ", made.status().message()));
  std::shared_ptr<Client> c = std::move(*made);
  sources_[address] = c;
  return c;
}

std::vector<BlockStatus> Cluster::Pull(const NamespaceSpec& spec, const std::string& tenant,
                                       uint32_t replicas, std::span<const BlockId> ids,
                                       std::span<const BlockId> parents,
                                       const std::string& source_node,
                                       const std::string& source_address, absl::Time deadline) {
  std::vector<BlockStatus> status(ids.size(), BlockStatus::kNotFound);
  auto ns = namespaces_->Open(spec, tenant);
  if (!ns.ok()) {
    spdlog::warn("Pull from '{}': cannot open the namespace here: {}", source_node,
                 ns.status().ToString());
    status.assign(ids.size(), BlockStatus::kInvalid);
    return status;
  }
  if (replicas > 0) namespaces_->SetReplicas(*ns, replicas);
  // Skip what is already here.
  std::vector<size_t> need;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (store_.Holds(ids[i]))
      status[i] = BlockStatus::kExists;
    else
      need.push_back(i);
  }
  if (need.empty()) return status;
  auto source = SourceClient(source_node, source_address);
  if (!source.ok()) {
    counters_.peer_failures.fetch_add(1);
    spdlog::warn("Pull: {}", source.status().ToString());
    return status;
  }
  auto there = (*source)->OpenNamespace(spec, tenant);
  if (!there.ok() || *there != *ns) {
    spdlog::warn("Pull from '{}': namespace not usable there ({})", source_node,
                 there.ok() ? "its cluster secret differs" : there.status().ToString());
    return status;
  }
  std::vector<BlockId> need_ids;
  for (size_t i : need) need_ids.push_back(ids[i]);
  std::vector<std::vector<uint8_t>> blobs;
  auto got = (*source)->FetchBlobs(*ns, need_ids, &blobs);
  if (!got.ok()) {
    counters_.peer_failures.fetch_add(1);
    spdlog::warn("Pull from '{}': {}", source_node, got.status().ToString());
    return status;
  }
  std::vector<ReserveItem> items;
  std::vector<size_t> placed;  // index into need
  for (size_t k = 0; k < need.size(); ++k) {
    status[need[k]] = got->status[k];
    if (got->status[k] != BlockStatus::kOk) continue;
    ReserveItem it;
    it.id = need_ids[k];
    if (!parents.empty()) it.parent = parents[need[k]];
    it.size = blobs[k].size();
    items.push_back(it);
    placed.push_back(k);
  }
  if (items.empty()) return status;
  ReserveResult res = store_.Reserve(*ns, items);
  std::vector<uint32_t> crcs;
  std::vector<size_t> reserved;  // index into items
  for (size_t j = 0; j < items.size(); ++j) {
    size_t i = need[placed[j]];
    status[i] = res.status[j];
    if (res.status[j] != BlockStatus::kOk) continue;
    const auto& blob = blobs[placed[j]];
    uint64_t offset = res.offsets[reserved.size()];
    std::memcpy(store_.arena_base() + offset, blob.data(), blob.size());
    crcs.push_back(Crc32c(blob.data(), blob.size()));
    reserved.push_back(j);
  }
  if (reserved.empty()) return status;
  auto committed = store_.Commit(res.reservation_id, crcs);
  if (!committed.ok()) {
    for (size_t j : reserved) status[need[placed[j]]] = BlockStatus::kExpired;
    return status;
  }
  for (size_t q = 0; q < reserved.size(); ++q) {
    status[need[placed[reserved[q]]]] = (*committed)[q];
    if ((*committed)[q] == BlockStatus::kOk) counters_.pulled.fetch_add(1);
  }
  // The copy is findable before the caller hears it exists (a replica must be, once the
  // publisher's Commit returns).
  FlushAnnouncements(std::min(deadline, absl::Now() + options_.config.peer_timeout));
  return status;
}

v1::PullRequest Cluster::MakePullRequest(const NamespaceRegistry::Entry& ns,
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

std::vector<BlockStatus> Cluster::PullStatuses(const grpc::Status& s, const v1::PullResponse& resp,
                                               size_t n, const std::string& target_address,
                                               const std::string& source_node) {
  std::vector<BlockStatus> status(n, BlockStatus::kNotFound);
  if (!s.ok() || resp.status_size() != static_cast<int>(n)) {
    counters_.peer_failures.fetch_add(1);
    spdlog::warn("Pull of {} blocks at {} from '{}' failed: {}", n, target_address, source_node,
                 s.ok() ? "wrong number of statuses" : s.error_message());
    return status;
  }
  for (size_t i = 0; i < n; ++i)
    status[i] = static_cast<BlockStatus>(resp.status(static_cast<int>(i)));
  return status;
}

std::vector<BlockStatus> Cluster::AskToPull(
    const std::string& target_address, const NamespaceRegistry::Entry& ns,
    std::span<const BlockId> ids, std::span<const BlockId> parents, const std::string& source_node,
    const std::string& source_address, absl::Time deadline) {
  v1::PullRequest req = MakePullRequest(ns, ids, parents, source_node, source_address);
  v1::PullResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  grpc::Status s = PeerStub(target_address)->Pull(&ctx, req, &resp);
  return PullStatuses(s, resp, ids.size(), target_address, source_node);
}

uint32_t Cluster::ReplicasFor(const NamespaceRegistry::Entry& ns) const {
  return ns.replicas > 0 ? ns.replicas : options_.config.replicas;
}

void Cluster::Replicate(const NamespaceRegistry::Entry& ns, std::span<const BlockId> ids,
                        std::span<const BlockId> parents, absl::Time deadline) {
  const uint32_t copies = ReplicasFor(ns);
  auto r = ring();
  if (copies <= 1 || !r || r->view.nodes.size() <= 1 || ids.empty()) return;
  // Replica k of a block goes to the k-th node of its ranking, skipping this one: every node
  // can tell where a block's replicas belong without asking.
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
    call->address = NodeAt(*r, target).address;
    call->n = sub.size();
    call->req = MakePullRequest(ns, sub, sub_parents, options_.self.id, options_.self.address);
    call->ctx.set_deadline(absl::ToChronoTime(deadline));
    group.Add();
    PeerStub(call->address)
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
         PullStatuses(call->status, call->resp, call->n, call->address, options_.self.id)) {
      if (s == BlockStatus::kOk || s == BlockStatus::kExists)
        counters_.replicated.fetch_add(1);
      else
        counters_.replication_failed.fetch_add(1);
    }
}

absl::StatusOr<Cluster::RepositionResult> Cluster::Reposition(const NamespaceRegistry::Entry& ns,
                                                              std::span<const BlockId> ids,
                                                              const std::string& target_node,
                                                              bool move, absl::Time deadline) {
  auto r = ring();
  const std::string target = target_node.empty() ? options_.self.id : target_node;
  const placement::NodeRecord* tnode = r ? r->view.Find(target) : nullptr;
  if (!tnode)
    return absl::NotFoundError(
        absl::StrCat("node '", target, "' is not in this node's cluster view"));
  RepositionResult out;
  out.status.assign(ids.size(), BlockStatus::kNotFound);
  // Holders: this node's tier, then the directory.
  absl::flat_hash_set<BlockId> local;
  for (const auto& id : ids)
    if (store_.Holds(id)) local.insert(id);
  auto located = Locate(ids, std::min(deadline, absl::Now() + options_.config.peer_timeout));
  std::map<std::string, std::vector<size_t>> by_source;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::vector<std::string> holders;
    if (local.contains(ids[i])) holders.push_back(options_.self.id);
    for (const auto& l : located[i])
      if (std::find(holders.begin(), holders.end(), l.node) == holders.end())
        holders.push_back(l.node);
    if (std::find(holders.begin(), holders.end(), target) != holders.end()) {
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
        target == options_.self.id
            ? Pull(ns.spec, ns.tenant, ns.replicas, sub, {}, source, snode->address, deadline)
            : AskToPull(tnode->address, ns, sub, {}, source, snode->address, deadline);
    std::vector<BlockId> moved;
    for (size_t k = 0; k < which.size(); ++k) {
      bool ok = st[k] == BlockStatus::kOk || st[k] == BlockStatus::kExists;
      out.status[which[k]] = ok ? BlockStatus::kOk : st[k];
      if (st[k] == BlockStatus::kOk) ++out.copied;
      if (st[k] == BlockStatus::kExists) ++out.already_there;
      if (ok) moved.push_back(sub[k]);
    }
    if (move && !moved.empty()) to_remove.emplace_back(source, std::move(moved));
  }
  for (auto& [source, moved] : to_remove) {
    if (source == options_.self.id) {
      out.removed_sources += store_.Evict(ns.id, moved, false, false).removed_blocks;
      continue;
    }
    const placement::NodeRecord* snode = r->view.Find(source);
    auto c = SourceClient(source, snode->address);
    if (!c.ok()) continue;
    auto opened = (*c)->OpenNamespace(ns.spec, ns.tenant);
    if (!opened.ok()) continue;
    auto ev = (*c)->Evict(*opened, moved);
    if (ev.ok()) out.removed_sources += ev->removed_blocks;
  }
  return out;
}

Cluster::DrainResult Cluster::Drain(absl::Time deadline) {
  DrainResult out;
  auto r = ring();
  // Host and NVMe blocks alike: a pull from here stages NVMe blocks like any fetch.
  std::vector<BlockInfo> blocks = store_.AllBlocks();
  out.blocks = blocks.size();
  // (namespace, target node) -> blocks
  std::map<std::pair<NamespaceId, uint32_t>, std::vector<const BlockInfo*>> plan;
  for (const auto& b : blocks) {
    int target = -1;
    for (uint32_t n : r->rendezvous.Rank(b.id))
      if (static_cast<int>(n) != r->self) {
        target = static_cast<int>(n);
        break;
      }
    if (target < 0 || !namespaces_->Find(b.ns)) {
      ++out.failed;  // nowhere to go, or a namespace nobody opened since this daemon started
      continue;
    }
    plan[{b.ns, static_cast<uint32_t>(target)}].push_back(&b);
  }
  std::vector<BlockId> moved;
  std::map<NamespaceId, std::vector<BlockId>> moved_by_ns;
  // Two passes: batches small enough that this node can stage a batch's NVMe blocks into its
  // host tier while the batch's other blocks are leased, then one block at a time for what the
  // first pass could not place (the host tier was busy demoting, say).
  for (int pass = 0; pass < 2 && !plan.empty(); ++pass) {
    const uint64_t batch_bytes = pass == 0 ? std::max<uint64_t>(store_.arena_bytes() / 4, 1) : 1;
    std::map<std::pair<NamespaceId, uint32_t>, std::vector<const BlockInfo*>> retry;
    for (auto& [key, list] : plan) {
      auto ns = namespaces_->Find(key.first);
      const auto& node = NodeAt(*r, key.second);
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
        auto st = AskToPull(node.address, *ns, ids, parents, options_.self.id,
                            options_.self.address, deadline);
        bool any = false;
        for (size_t k = 0; k < ids.size(); ++k) {
          if (st[k] == BlockStatus::kOk || st[k] == BlockStatus::kExists) {
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
  // The copies elsewhere are now the ones to find: stop advertising ours, drop them, leave.
  Announce(moved, true);
  for (const auto& [ns, ids] : moved_by_ns) store_.Evict(ns, ids, false, /*force=*/true);
  {
    std::lock_guard<std::mutex> lock(ev_mu_);
    stop_ = true;
  }
  ev_cv_.notify_all();
  if (absl::Status s = membership_->Leave(); !s.ok())
    spdlog::warn("drain: leaving: {}", s.ToString());
  spdlog::info("drain: {} blocks, {} moved to {} nodes, {} could not be moved", out.blocks,
               out.moved, out.targets.size(), out.failed);
  return out;
}

}  // namespace strata::daemon
