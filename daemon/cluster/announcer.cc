#include "daemon/cluster/announcer.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "common/packed_ids.h"
#include "daemon/cluster/call_group.h"
#include "daemon/logging.h"

namespace strata::daemon {
namespace {

constexpr size_t kIdsPerMessage = 16384;  // 512 KiB of ids: well under gRPC's message limit
// How long block events wait to be announced together when no flush asks for them sooner.
constexpr auto kEventBatchWindow = std::chrono::milliseconds(2);

}  // namespace

Announcer::Announcer(ClusterContext& ctx, placement::Directory& directory, const BlockStore& store,
                     DeviceHeld on_device)
    : ctx_(ctx), directory_(directory), store_(store), on_device_(std::move(on_device)) {}

Announcer::~Announcer() { Stop(); }

void Announcer::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Announcer::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  flushed_.notify_all();
  std::lock_guard<std::mutex> join(join_mu_);
  if (thread_.joinable()) thread_.join();
}

void Announcer::OnBlockEvent(const BlockEvent& event) {
  // The thread wakes for the first event of a batch, then collects for kEventBatchWindow (or
  // until a flush asks for them): waking it for every block cost each small publish two thread
  // switches.
  bool first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    first = events_.empty();
    if (first) first_event_at_ = std::chrono::steady_clock::now();
    events_.push_back(event);
    ++events_queued_;
  }
  if (first) wake_.notify_one();
}

size_t Announcer::QueuedEvents() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.size();
}

void Announcer::RequestFullRefresh() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    full_refresh_ = true;
  }
  wake_.notify_all();
}

void Announcer::RetainOwned(const Ring& ring) {
  const size_t r = ctx_.config.directory_owners;
  std::vector<uint32_t> owners;
  directory_.Retain([&](const BlockId& id) {
    ring.rendezvous.TopR(placement::KeyOf(id), r, &owners);
    return std::find(owners.begin(), owners.end(), static_cast<uint32_t>(ring.self)) !=
           owners.end();
  });
  RequestFullRefresh();
}

void Announcer::FlushAnnouncements(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = events_queued_;
  if (events_announced_ >= target) return;
  ++flushes_waiting_;
  wake_.notify_one();
  flushed_.wait_until(lock, absl::ToChronoTime(deadline),
                      [&] { return stop_ || events_announced_ >= target; });
  --flushes_waiting_;
}

void Announcer::Loop() {
  const absl::Duration refresh = ctx_.config.directory_ttl / 3;
  absl::Time next_refresh = absl::Now() + refresh;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const bool idle = events_.empty();
    const bool due = full_refresh_ ||
                     (!idle && (flushes_waiting_ > 0 || std::chrono::steady_clock::now() >=
                                                            first_event_at_ + kEventBatchWindow));
    if (!due) {
      if (!idle) {
        // Until the batch is due, or a flush (or a stop) wakes it sooner; then checked again.
        wake_.wait_until(lock, first_event_at_ + kEventBatchWindow);
        continue;
      }
      // Woken: something to check; timed out: a periodic refresh may be due.
      if (wake_.wait_for(lock, std::chrono::milliseconds(200)) == std::cv_status::no_timeout)
        continue;
    }
    if (stop_) break;
    const absl::Time now = absl::Now();
    const bool refresh_all = full_refresh_ || now >= next_refresh;
    full_refresh_ = false;
    std::vector<BlockEvent> events;
    events.swap(events_);
    const uint64_t batch_end = events_queued_;
    lock.unlock();
    // Events first: commits wait for them (FlushAnnouncements), never for a full refresh.
    AnnounceEvents(events);
    lock.lock();
    events_announced_ = batch_end;
    flushed_.notify_all();
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
  flushed_.notify_all();
}

void Announcer::AnnounceEvents(const std::vector<BlockEvent>& events) {
  // The last event of an id decides whether it is held.
  absl::flat_hash_map<BlockId, const BlockEvent*> last;
  for (const auto& e : events) last[e.id] = &e;
  std::vector<BlockId> stored, removed;
  for (const auto& [id, e] : last) {
    if (e->kind == BlockEvent::kRemoved && store_.Holds(id)) {
      // A block demoted to a lower tier left host memory but not this node; one whose device
      // copy left is announced again, as held below.
      if (e->tier == Tier::kGpu) stored.push_back(id);
      continue;
    }
    (e->kind == BlockEvent::kStored ? stored : removed).push_back(id);
  }
  if (!stored.empty()) Announce(stored, false);
  if (!removed.empty()) Announce(removed, true);
}

void Announcer::Announce(std::span<const BlockId> ids, bool withdraw) {
  if (ids.empty()) return;
  auto r = ctx_.ring.Get();
  // Alone, this node is its own directory: its tiers answer every lookup already.
  if (!r || r->self < 0 || r->rendezvous.size() <= 1) return;
  std::vector<std::vector<BlockId>> per_owner(r->rendezvous.size());
  std::vector<std::vector<placement::LocationTier>> tiers(r->rendezvous.size());
  std::vector<uint32_t> owners;
  // One look at the device's index for the whole batch (a full refresh is every id held).
  const absl::flat_hash_set<BlockId> held_on_device =
      !withdraw && on_device_ ? on_device_(ids) : absl::flat_hash_set<BlockId>{};
  for (const auto& id : ids) {
    const placement::LocationTier tier = held_on_device.contains(id)
                                             ? placement::LocationTier::kGpu
                                             : placement::LocationTier::kHost;
    r->rendezvous.TopR(placement::KeyOf(id), ctx_.config.directory_owners, &owners);
    for (uint32_t o : owners) {
      per_owner[o].push_back(id);
      tiers[o].push_back(tier);
    }
  }
  const absl::Time expires = absl::Now() + ctx_.config.directory_ttl;
  CallGroup calls;
  for (size_t o = 0; o < per_owner.size(); ++o) {
    auto& mine = per_owner[o];
    if (mine.empty()) continue;
    if (static_cast<int>(o) != r->self) {
      SendToOwner(r->NodeAt(o).address, mine, tiers[o], withdraw, calls);
    } else if (withdraw) {
      directory_.Withdraw(ctx_.self.id, mine);
    } else {
      directory_.Announce(ctx_.self.id, mine, tiers[o], expires);
    }
  }
  calls.Wait();
  (withdraw ? ctx_.counters.withdrawn : ctx_.counters.announced).fetch_add(ids.size());
}

void Announcer::SendToOwner(const std::string& address, std::span<const BlockId> ids,
                            std::span<const placement::LocationTier> tiers, bool withdraw,
                            CallGroup& calls) {
  auto stub = ctx_.peers.Get(address);
  for (size_t begin = 0; begin < ids.size(); begin += kIdsPerMessage) {
    const size_t end = std::min(ids.size(), begin + kIdsPerMessage);
    struct Call {
      grpc::ClientContext ctx;
      v1::AnnounceRequest req;
      v1::AnnounceResponse resp;
    };
    auto call = std::make_shared<Call>();
    call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + ctx_.config.peer_timeout));
    call->req.set_node_id(ctx_.self.id);
    call->req.set_ids(PackIds(ids.subspan(begin, end - begin)));
    // One tier for all when they agree (the common case), else one per id.
    const auto part = tiers.subspan(begin, end - begin);
    const bool one = std::all_of(part.begin(), part.end(), [&](auto t) { return t == part[0]; });
    for (size_t k = 0; k < (one ? 1 : part.size()); ++k)
      call->req.add_tiers(part[k] == placement::LocationTier::kGpu ? v1::TIER_GPU : v1::TIER_HOST);
    call->req.set_withdraw(withdraw);
    call->req.set_ttl_ms(absl::ToInt64Milliseconds(ctx_.config.directory_ttl));
    calls.Add();
    stub->async()->Announce(&call->ctx, &call->req, &call->resp,
                            [this, call, &calls](grpc::Status s) {
                              if (!s.ok()) ctx_.counters.peer_failures.fetch_add(1);
                              calls.Done();
                            });
  }
}

void Announcer::HandleAnnounce(const v1::AnnounceRequest& req, std::span<const BlockId> ids) {
  if (req.withdraw()) {
    directory_.Withdraw(req.node_id(), ids);
    return;
  }
  std::vector<placement::LocationTier> tiers;
  for (int t : req.tiers()) tiers.push_back(LocationTierOf(t));
  if (tiers.empty()) tiers.push_back(placement::LocationTier::kHost);
  if (tiers.size() != 1 && tiers.size() != ids.size()) tiers.resize(1);
  // A peer's TTL is capped at twice ours: an entry announced "forever" would never expire.
  absl::Duration ttl =
      std::min(req.ttl_ms() > 0 ? absl::Milliseconds(req.ttl_ms()) : ctx_.config.directory_ttl,
               2 * ctx_.config.directory_ttl);
  const size_t refused = directory_.Announce(req.node_id(), ids, tiers, absl::Now() + ttl,
                                             ctx_.config.max_directory_entries_per_node);
  if (refused == 0) return;
  ctx_.counters.directory_refused.fetch_add(refused, std::memory_order_relaxed);
  static LogRateLimiter limit;
  if (uint64_t suppressed = 0; limit.Allow(&suppressed))
    spdlog::warn(
        "Announce from node '{}': {} of {} ids refused, the node holds {} directory entries here "
        "(cluster.max_directory_entries_per_node){}",
        LogSafe(req.node_id()), refused, ids.size(), directory_.entries_of(req.node_id()),
        SuppressedNote(suppressed));
}

}  // namespace strata::daemon
