// The few etcd v3 calls membership needs, over etcd's JSON gRPC-gateway (HTTP/1.1, cpp-httplib).
// etcd 3.4 (Debian bookworm) serves the gateway at /v3/ (and the older /v3beta/). Keys and
// values travel base64-encoded; 64-bit integers travel as decimal strings.
//
// Every call has the deadline given at construction (connect, read and write timeouts). One
// client serves one thread at a time; StopWatch is the exception (any thread may call it to
// end a Watch in progress). Endpoints are tried in order, starting with the last one that
// answered.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace httplib {
class Client;
}

namespace strata::placement::internal {

struct EtcdKv {
  std::string key;
  std::string value;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

struct EtcdRange {
  std::vector<EtcdKv> kvs;
  int64_t revision = 0;  // the store revision the answer reflects
};

struct EtcdEvent {
  bool is_delete = false;
  EtcdKv kv;
};

// One response of a watch stream.
struct EtcdWatchResponse {
  bool created = false;
  bool canceled = false;
  int64_t compact_revision = 0;  // > 0: the requested start revision was compacted away
  int64_t revision = 0;
  std::vector<EtcdEvent> events;
};

class EtcdClient {
 public:
  EtcdClient(std::vector<std::string> endpoints, absl::Duration call_timeout);
  ~EtcdClient();

  // Lease id and the TTL etcd granted (it may raise a TTL below its minimum).
  absl::StatusOr<std::pair<int64_t, int64_t>> Grant(int64_t ttl_seconds);
  // Remaining TTL in seconds; 0 means the lease no longer exists.
  absl::StatusOr<int64_t> KeepAlive(int64_t lease);
  absl::Status Revoke(int64_t lease);
  absl::Status Put(const std::string& key, const std::string& value, int64_t lease);
  absl::StatusOr<EtcdRange> RangePrefix(const std::string& prefix);

  // Watches `prefix` from `start_revision`, calling `on_response` for each response until it
  // returns false, the stream ends, StopWatch is called or nothing arrives for `idle_timeout`.
  // Returns OK when the stream was established (a `created` response arrived) and then ended
  // for any of those reasons; an error when it could not be established.
  absl::Status Watch(const std::string& prefix, int64_t start_revision, absl::Duration idle_timeout,
                     const std::function<bool(const EtcdWatchResponse&)>& on_response);
  void StopWatch();

  // The endpoint that answered last (for messages).
  std::string endpoint() const;

 private:
  absl::StatusOr<std::string> Post(const std::string& path, const std::string& body);

  std::vector<std::string> endpoints_;
  absl::Duration timeout_;
  size_t current_ = 0;
  std::atomic<bool> stop_watch_{false};
  mutable std::mutex watch_mu_;
  httplib::Client* watch_client_ = nullptr;  // guarded by watch_mu_
};

// The smallest key greater than every key starting with `prefix` (etcd's range_end).
std::string PrefixEnd(const std::string& prefix);

}  // namespace strata::placement::internal
