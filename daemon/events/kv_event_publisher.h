// Publishes the host tier's block events as vLLM KV events over ZMQ (kv_event_encoder.h has the
// format): a PUB socket sends [topic, seq, batch] where seq is an 8-byte big-endian counter per
// daemon, and a ROUTER socket replays kept batches to a subscriber that reconnects, as vLLM's
// ZmqEventPublisher does (request [empty, start seq]; replies [empty, topic, seq, batch] ...,
// then [empty, empty, seq = -1, empty]).
//
// One topic per namespace, "kv@<node id>@<model id>@<namespace id, first 16 hex digits>": a
// router subscribes to "kv@" for everything, or to a prefix for one node or model. The first
// event of every topic in a daemon's life is AllBlocksCleared: what a router knew of that
// (node, namespace) before is stale.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "config/daemon_config.h"
#include "daemon/namespace_registry.h"
#include "storage/host_tier.h"

namespace strata::daemon {

class KvEventPublisher {
 public:
  struct Options {
    EventsConfig config;
    std::string node_id;
  };
  // Binds both sockets (a "*" port picks a free one; endpoint() says which).
  static absl::StatusOr<std::unique_ptr<KvEventPublisher>> Start(
      Options options, const NamespaceRegistry& namespaces);
  ~KvEventPublisher();

  // Queues one event. Cheap and lock-light: the store calls it with its tier's lock held.
  void OnBlockEvent(const BlockEvent& event);
  void Stop();

  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }
  uint64_t batches_published() const { return batches_.load(std::memory_order_relaxed); }
  uint64_t events_dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  struct Sockets;
  KvEventPublisher(Options options, const NamespaceRegistry& namespaces);
  void Run();
  void PublishPending();
  void ServeReplays();
  void Send(const std::string& topic, const std::string& payload);

  const Options options_;
  const NamespaceRegistry& namespaces_;
  std::unique_ptr<Sockets> sockets_;
  std::string endpoint_, replay_endpoint_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> batches_{0}, dropped_{0};

  absl::Mutex mu_;
  std::vector<BlockEvent> pending_ ABSL_GUARDED_BY(mu_);

  // Publisher thread only.
  uint64_t next_seq_ = 0;
  struct Kept {
    uint64_t seq;
    std::string topic, payload;
  };
  std::deque<Kept> kept_;
  absl::flat_hash_map<NamespaceId, std::string> topics_;
};

}  // namespace strata::daemon
