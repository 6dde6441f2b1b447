// Membership backed by etcd v3 through its JSON gRPC-gateway (see placement/internal/etcd_client.h
// and docs/cluster.md).
//
// Two threads of our own:
//  - session: keeps the lease alive every TTL/3; re-grants a lease and re-puts the key when the
//    lease is gone (etcd lost it, or we were cut off longer than the TTL) and re-puts it after any
//    outage or when the key vanished under a live lease.
//  - watcher: owns the view. A range over the prefix gives the full set and a revision; a watch
//    from revision+1 streams puts and deletes. A watch that cannot be established (etcd down),
//    a compacted start revision, or a kick from the session thread after an outage makes it
//    start over with a fresh range. The listener is called from this thread only.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "placement/internal/etcd_client.h"
#include "placement/internal/json.h"
#include "placement/internal/node_record.h"
#include "placement/internal/view_holder.h"
#include "placement/membership.h"

namespace strata::placement {
namespace internal {

std::string EncodeNodeRecord(const NodeRecord& r) {
  return absl::StrCat("{\"id\":", JsonQuote(r.id), ",\"address\":", JsonQuote(r.address),
                      ",\"host_capacity\":", r.host_capacity,
                      ",\"nvme_capacity\":", r.nvme_capacity, ",\"version\":", JsonQuote(r.version),
                      "}");
}

absl::StatusOr<NodeRecord> DecodeNodeRecord(std::string_view text) {
  auto j = Json::Parse(text);
  if (!j.ok()) return j.status();
  if (!j->is_object()) return absl::InvalidArgumentError("node record is not a JSON object");
  NodeRecord r;
  r.id = j->StringOr("id");
  if (r.id.empty()) return absl::InvalidArgumentError("node record has no id");
  r.address = j->StringOr("address");
  r.version = j->StringOr("version");
  if (const Json* v = j->Get("host_capacity")) r.host_capacity = v->AsUint().value_or(0);
  if (const Json* v = j->Get("nvme_capacity")) r.nvme_capacity = v->AsUint().value_or(0);
  return r;
}

}  // namespace internal

namespace {

using internal::EtcdClient;

class EtcdMembership final : public internal::ViewHolder {
 public:
  explicit EtcdMembership(EtcdMembershipOptions o)
      : options_(std::move(o)),
        session_(options_.endpoints, options_.call_timeout),
        watch_(options_.endpoints, options_.call_timeout) {}

  ~EtcdMembership() override { Stop(); }

  absl::Status Start(const NodeRecord& self) override {
    if (options_.endpoints.empty()) return absl::InvalidArgumentError("etcd: no endpoints");
    if (options_.prefix.empty()) return absl::InvalidArgumentError("etcd: empty key prefix");
    if (self.id.empty()) return absl::InvalidArgumentError("etcd: self id is empty");
    if (options_.lease_ttl < absl::Seconds(1)) {
      return absl::InvalidArgumentError("etcd: lease_ttl must be at least 1s");
    }
    {
      absl::MutexLock lock(&mu_);
      if (started_) return absl::FailedPreconditionError("etcd membership: already started");
      started_ = true;
    }
    key_ = options_.prefix + self.id;
    value_ = internal::EncodeNodeRecord(self);
    const absl::Time give_up = absl::Now() + options_.start_timeout;
    for (absl::Duration pause = absl::Milliseconds(50);;
         pause = std::min(2 * pause, absl::Seconds(1))) {
      absl::Status st = Register();
      if (st.ok()) break;
      if (!absl::IsUnavailable(st) && !absl::IsDeadlineExceeded(st)) {
        return absl::Status(
            st.code(), absl::StrCat("etcd membership: cannot register ", key_, ": ", st.message()));
      }
      if (absl::Now() + pause > give_up) {
        return absl::Status(
            st.code(),
            absl::StrCat("etcd membership: cannot register ", key_, " within ",
                         absl::FormatDuration(options_.start_timeout), ": ", st.message()));
      }
      if (SleepFor(pause)) {
        return absl::CancelledError(
            absl::StrCat("etcd membership: stopped while waiting to "
                         "register ",
                         key_));
      }
    }
    auto range = watch_.RangePrefix(options_.prefix);
    if (!range.ok()) {
      (void)session_.Revoke(lease_);
      return absl::Status(range.status().code(),
                          absl::StrCat("etcd membership: cannot list ", options_.prefix, ": ",
                                       range.status().message()));
    }
    ReplaceAll(*range);
    revision_ = range->revision;
    {
      absl::MutexLock lock(&mu_);
      view_.epoch = 1;
      view_.nodes = SortedNodes();
      session_ok_ = watch_ok_ = true;
    }
    session_thread_ = std::thread([this] { SessionLoop(); });
    watch_thread_ = std::thread([this] { WatchLoop(); });
    return absl::OkStatus();
  }

  bool healthy(std::string* detail) const override {
    absl::MutexLock lock(&mu_);
    if (detail) {
      detail->clear();
      if (!session_ok_) absl::StrAppend(detail, "lease: ", session_detail_);
      if (!watch_ok_)
        absl::StrAppend(detail, detail->empty() ? "" : "; ", "watch: ", watch_detail_);
    }
    return session_ok_ && watch_ok_;
  }

  absl::Status Leave() override {
    {
      absl::MutexLock lock(&mu_);
      if (!started_ || left_) return absl::OkStatus();
      left_ = true;
    }
    StopThreads();
    // The session thread has stopped: its client is ours now.
    absl::Status st = session_.Revoke(lease_);
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat("etcd membership: leave (revoke lease of ", key_,
                                                  "): ", st.message()));
    }
    return absl::OkStatus();
  }

  std::string kind() const override { return "etcd"; }

 private:
  void Stop() { StopThreads(); }

  void StopThreads() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    watch_.StopWatch();
    if (session_thread_.joinable()) session_thread_.join();
    if (watch_thread_.joinable()) watch_thread_.join();
  }

  // Sleeps up to `d`; true when asked to stop.
  bool SleepFor(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), d);
    return stopping_;
  }

  // Grants a lease and puts our key under it (session thread, or Start before it exists).
  absl::Status Register() {
    int64_t ttl = std::max<int64_t>(
        1, static_cast<int64_t>(std::ceil(absl::ToDoubleSeconds(options_.lease_ttl))));
    auto lease = session_.Grant(ttl);
    if (!lease.ok()) return lease.status();
    if (auto st = session_.Put(key_, value_, lease->first); !st.ok()) {
      (void)session_.Revoke(lease->first);
      return st;
    }
    lease_ = lease->first;
    granted_ttl_ = absl::Seconds(std::max<int64_t>(1, lease->second));
    return absl::OkStatus();
  }

  void SetSession(bool ok, std::string detail) {
    absl::MutexLock lock(&mu_);
    session_ok_ = ok;
    session_detail_ = std::move(detail);
  }

  void SessionLoop() {
    bool ok = true;
    for (;;) {
      absl::Duration interval = granted_ttl_ / 3;
      if (!ok) interval = std::min(interval, absl::Milliseconds(500));
      if (SleepFor(interval)) return;
      auto ttl = session_.KeepAlive(lease_);
      if (!ttl.ok()) {
        ok = false;
        SetSession(false, std::string(ttl.status().message()));
        continue;
      }
      if (*ttl <= 0) {
        // The lease is gone (etcd lost it, or we were cut off past the TTL): register anew.
        if (auto st = Register(); !st.ok()) {
          ok = false;
          SetSession(false, absl::StrCat("lease ", lease_, " lost; re-register: ", st.message()));
          continue;
        }
      } else if (!ok || reput_.exchange(false)) {
        // Back after an outage (or our key vanished): make sure the key is there.
        if (auto st = session_.Put(key_, value_, lease_); !st.ok()) {
          ok = false;
          SetSession(false, absl::StrCat("re-put ", key_, ": ", st.message()));
          continue;
        }
      }
      if (!ok) {
        ok = true;
        SetSession(true, "");
        resync_ = true;  // the watcher may have missed events: start over with a range
        watch_.StopWatch();
      } else {
        SetSession(true, "");
      }
    }
  }

  void ReplaceAll(const internal::EtcdRange& range) {
    nodes_.clear();
    for (const auto& kv : range.kvs) Apply(false, kv);
  }

  void Apply(bool is_delete, const internal::EtcdKv& kv) {
    if (is_delete) {
      nodes_.erase(kv.key);
      return;
    }
    auto r = internal::DecodeNodeRecord(kv.value);
    if (r.ok()) {
      nodes_[kv.key] = std::move(*r);
    } else {
      nodes_.erase(kv.key);  // a record we cannot read is not a member
    }
  }

  std::vector<NodeRecord> SortedNodes() const {
    std::vector<NodeRecord> out;
    out.reserve(nodes_.size());
    for (const auto& [key, rec] : nodes_) out.push_back(rec);
    std::sort(out.begin(), out.end(),
              [](const NodeRecord& a, const NodeRecord& b) { return a.id < b.id; });
    out.erase(std::unique(out.begin(), out.end(),
                          [](const NodeRecord& a, const NodeRecord& b) { return a.id == b.id; }),
              out.end());
    return out;
  }

  // Publishes nodes_ as the view if it changed, then tells the listener (no lock held).
  void Publish(bool force_notify) {
    Listener listener;
    MembershipView view;
    {
      absl::MutexLock lock(&mu_);
      auto nodes = SortedNodes();
      bool changed = nodes != view_.nodes;
      if (changed) {
        view_.nodes = std::move(nodes);
        ++view_.epoch;
      }
      if (!(changed || force_notify) || stopping_) return;
      listener = listener_;
      view = view_;
    }
    if (listener) listener(view);
  }

  void SetWatch(bool ok, std::string detail) {
    absl::MutexLock lock(&mu_);
    watch_ok_ = ok;
    watch_detail_ = std::move(detail);
  }

  void WatchLoop() {
    Publish(/*force_notify=*/true);  // the initial view
    const absl::Duration idle = std::max(options_.lease_ttl, options_.call_timeout);
    absl::Duration backoff = absl::Milliseconds(100);
    while (!Stopping()) {
      if (resync_.exchange(false)) {
        auto range = watch_.RangePrefix(options_.prefix);
        if (!range.ok()) {
          resync_ = true;
          SetWatch(false, std::string(range.status().message()));
          if (SleepFor(backoff)) return;
          backoff = std::min(backoff * 2, absl::Seconds(1));
          continue;
        }
        ReplaceAll(*range);
        revision_ = range->revision;
        SetWatch(true, "");
        Publish(false);
      }
      const absl::Time opened = absl::Now();
      absl::Status st = watch_.Watch(
          options_.prefix, revision_ + 1, idle, [this](const internal::EtcdWatchResponse& r) {
            if (r.compact_revision > 0 || r.canceled) {
              resync_ = true;
              return false;
            }
            if (r.created) SetWatch(true, "");
            bool self_deleted = false;
            for (const auto& e : r.events) {
              Apply(e.is_delete, e.kv);
              revision_ = std::max(revision_, e.kv.mod_revision);
              if (e.is_delete && e.kv.key == key_) self_deleted = true;
            }
            if (!r.events.empty()) Publish(false);
            if (self_deleted) reput_ = true;  // the session puts it back (new lease if needed)
            return !Stopping();
          });
      if (st.ok()) {
        backoff = absl::Milliseconds(100);
        // A stream that ends as soon as it opens (a proxy closing it, say) must not spin.
        if (absl::Now() - opened < absl::Milliseconds(20) && SleepFor(absl::Milliseconds(50))) {
          return;
        }
        continue;
      }
      resync_ = true;
      SetWatch(false, std::string(st.message()));
      if (SleepFor(backoff)) return;
      backoff = std::min(backoff * 2, absl::Seconds(1));
    }
  }

  bool Stopping() {
    absl::MutexLock lock(&mu_);
    return stopping_;
  }

  const EtcdMembershipOptions options_;
  EtcdClient session_;  // session thread (and Start / Leave when it is not running)
  EtcdClient watch_;    // watcher thread (and Start)
  std::string key_;
  std::string value_;
  int64_t lease_ = 0;                              // session thread
  absl::Duration granted_ttl_ = absl::Seconds(1);  // session thread
  std::map<std::string, NodeRecord> nodes_;        // watcher thread: key -> record
  int64_t revision_ = 0;                           // watcher thread
  std::atomic<bool> resync_{false};
  std::atomic<bool> reput_{false};
  std::thread session_thread_;
  std::thread watch_thread_;

  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool left_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool session_ok_ ABSL_GUARDED_BY(mu_) = false;
  bool watch_ok_ ABSL_GUARDED_BY(mu_) = false;
  std::string session_detail_ ABSL_GUARDED_BY(mu_);
  std::string watch_detail_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Membership> NewEtcdMembership(EtcdMembershipOptions options) {
  return std::make_unique<EtcdMembership>(std::move(options));
}

}  // namespace strata::placement
