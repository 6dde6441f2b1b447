// stratad: wires the host tier, the UCX data plane and the gRPC control plane of one node.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "config/daemon_config.h"

namespace strata::daemon {

class Daemon {
 public:
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonConfig& config);
  ~Daemon();

  // "HOST:PORT" actually bound (resolves port 0).
  const std::string& endpoint() const;
  // HTTP endpoint (/metrics, /healthz, /readyz) actually bound; empty when 'http_listen' is empty.
  const std::string& http_endpoint() const;
  // KV event endpoints actually bound; empty when events are off (or there is no replay).
  const std::string& events_endpoint() const;
  const std::string& events_replay_endpoint() const;
  // Stops accepting calls, lets in-flight ones finish within config.shutdown_grace, then tears
  // down the data plane. Idempotent.
  void Shutdown();

  struct Impl;

 private:
  explicit Daemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::daemon
