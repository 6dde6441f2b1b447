// /metrics latency against resident blocks: starts its own stratad with HTTP on, publishes N
// small blocks, then times K sequential scrapes over a fresh connection each (as Prometheus
// would after an idle interval) and reports p50/p99/max, beside the daemon's own render time.
//
// It first times the RPC hot path's metrics work, RpcMetrics::Record (one counter, one histogram
// observation), on one thread and on two threads hitting the same series.
//
//   metrics_scrape_bench [blocks=100000] [scrapes=200]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "daemon/metrics.h"
#include "strata/client.h"
#include "tests/integration/daemon_process.h"
#include "tests/operability/ops_helpers.h"

int main(int argc, char** argv) {
  using namespace strata;
  size_t blocks = argc > 1 ? std::stoul(argv[1]) : 100000;
  int scrapes = argc > 2 ? std::stoi(argv[2]) : 200;
  {
    using strata::daemon::MetricsRegistry;
    using strata::daemon::RpcMetrics;
    MetricsRegistry registry;
    RpcMetrics rpc(&registry);
    constexpr int kCalls = 5000000;
    for (int threads : {1, 2}) {
      auto s = std::chrono::steady_clock::now();
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t)
        pool.emplace_back([&rpc, t] {
          for (int i = 0; i < kCalls; ++i) rpc.Record(RpcMetrics::kLookup, 0, 1e-4 * (i % 7 + t));
        });
      for (auto& t : pool) t.join();
      double ns =
          std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - s).count() /
          kCalls;
      std::printf("RpcMetrics::Record   %.1f ns per call per thread (%d thread%s, same series)\n",
                  ns, threads, threads > 1 ? "s" : "");
    }
  }
  strata::testing::DaemonProcess d("host_tier:\n  capacity: 256MiB\n",
                           {"--http-listen", "127.0.0.1:0", "--log-level", "warn"});
  if (!d.ok()) {
    std::fprintf(stderr, "stratad did not start:\n%s\n", d.log().c_str());
    return 1;
  }
  std::string http =
      strata::testing::JsonField(strata::testing::ReadFile(d.dir() + "/ready.json"), "http_endpoint");
  ClientOptions o;
  o.endpoint = d.endpoint();
  auto client = Client::Connect(o);
  if (!client.ok()) return 1;
  auto ns = (*client)->OpenNamespace(strata::testing::OpsSpec(), "bench");
  if (!ns.ok()) return 1;
  auto t0 = std::chrono::steady_clock::now();
  auto ids = strata::testing::PublishMany(**client, *ns, blocks, 64);
  if (!ids.ok()) {
    std::fprintf(stderr, "publish: %s\n", ids.status().ToString().c_str());
    return 1;
  }
  double publish_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::vector<double> ms;
  size_t body = 0;
  std::string last;
  for (int i = 0; i < scrapes; ++i) {
    auto s = std::chrono::steady_clock::now();
    auto r = strata::testing::HttpGet(http, "/metrics");
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s).count());
    if (r.status != 200) {
      std::fprintf(stderr, "scrape %d failed (status %d)\n", i, r.status);
      return 1;
    }
    body = r.body.size();
    last = std::move(r.body);
  }
  std::sort(ms.begin(), ms.end());
  auto pct = [&](double p) { return ms[std::min(ms.size() - 1, size_t(p * ms.size()))]; };
  auto resident = strata::testing::SampleValue(last, "strata_tier_blocks{tier=\"host\"}");
  auto render_sum = strata::testing::SampleValue(last, "strata_metrics_render_duration_seconds_sum");
  auto render_n = strata::testing::SampleValue(last, "strata_metrics_render_duration_seconds_count");
  std::printf("blocks resident      %.0f (published %zu in %.2f s)\n", resident.value_or(-1),
              blocks, publish_s);
  std::printf("scrapes              %d, body %zu bytes\n", scrapes, body);
  std::printf("client GET /metrics  p50 %.3f ms  p99 %.3f ms  max %.3f ms\n", pct(0.5), pct(0.99),
              ms.back());
  if (render_sum && render_n && *render_n > 0)
    std::printf("daemon render mean   %.3f ms over %.0f renders\n", *render_sum / *render_n * 1e3,
                *render_n);
  return 0;
}
