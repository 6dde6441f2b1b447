// stratad's operator HTTP endpoint: /metrics (Prometheus text format 0.0.4), /healthz (the process
// serves HTTP) and /readyz (the daemon can take traffic). Plain HTTP on two threads of its own, so
// a slow scraper never competes with the gRPC server's threads, and idle or trickling
// connections can neither starve a probe nor grow the thread count (docs/operations.md#limits).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace strata::daemon {

class HttpServer {
 public:
  struct Handlers {
    // Body of /metrics.
    std::function<std::string()> metrics;
    // /readyz answers 200 when this returns true, else 503 with `*why` as the body. True with a
    // non-empty `*why`: ready but degraded (200, body "ready (degraded: <why>)"), e.g. serving
    // from host memory while the NVMe tier cannot write.
    std::function<bool(std::string* why)> ready;
  };

  // Binds `listen` ("HOST:PORT", "[V6]:PORT"; port 0 picks a free port) and serves until Stop.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& listen,
                                                           Handlers handlers);
  ~HttpServer();

  // "HOST:PORT" actually bound.
  const std::string& endpoint() const;
  // Stops serving and joins the server thread. Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::daemon
