// The metrics registry renders valid Prometheus text: types, cumulative buckets, escaping.
#include "daemon/metrics.h"

#include <gtest/gtest.h>

#include <thread>

namespace strata::daemon {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(MetricsTest, CountersAndGaugesRenderWithHelpTypeAndLabels) {
  MetricsRegistry r;
  r.AddCounter("x_total", "Things.", {{"kind", "a"}})->Add(3);
  r.AddCounter("x_total", "ignored", {{"kind", "b"}})->Add();
  r.AddGauge("y_bytes", "Bytes.")->Set(1.5);
  std::string t = r.Render();
  EXPECT_TRUE(Has(t, "# HELP x_total Things.")) << t;
  EXPECT_TRUE(Has(t, "# TYPE x_total counter")) << t;
  EXPECT_TRUE(Has(t, "x_total{kind=\"a\"} 3")) << t;
  EXPECT_TRUE(Has(t, "x_total{kind=\"b\"} 1")) << t;
  EXPECT_TRUE(Has(t, "# TYPE y_bytes gauge")) << t;
  EXPECT_TRUE(Has(t, "y_bytes 1.5")) << t;
  // The same name and labels give the same series.
  EXPECT_EQ(r.AddCounter("x_total", "", {{"kind", "a"}})->value(), 3u);
}

TEST(MetricsTest, HistogramBucketsAreCumulativeWithInfSumAndCount) {
  MetricsRegistry r;
  Histogram* h = r.AddHistogram("lat_seconds", "Latency.", {0.1, 1}, {{"op", "get"}});
  h->Observe(0.05);
  h->Observe(0.1);  // upper bounds are inclusive
  h->Observe(0.5);
  h->Observe(7);
  std::string t = r.Render();
  EXPECT_TRUE(Has(t, "lat_seconds_bucket{op=\"get\",le=\"0.1\"} 2")) << t;
  EXPECT_TRUE(Has(t, "lat_seconds_bucket{op=\"get\",le=\"1\"} 3")) << t;
  EXPECT_TRUE(Has(t, "lat_seconds_bucket{op=\"get\",le=\"+Inf\"} 4")) << t;
  EXPECT_TRUE(Has(t, "lat_seconds_sum{op=\"get\"} 7.65")) << t;
  EXPECT_TRUE(Has(t, "lat_seconds_count{op=\"get\"} 4")) << t;
}

TEST(MetricsTest, LabelValuesAndHelpAreEscaped) {
  MetricsRegistry r;
  r.AddGauge("g", "a\\b\nc", {{"v", "q\"x\\y\nz"}})->Set(1);
  std::string t = r.Render();
  EXPECT_TRUE(Has(t, "# HELP g a\\\\b\\nc")) << t;
  EXPECT_TRUE(Has(t, "g{v=\"q\\\"x\\\\y\\nz\"} 1")) << t;
}

TEST(MetricsTest, CollectorsRunBeforeRender) {
  MetricsRegistry r;
  Gauge* g = r.AddGauge("g", "G.");
  int calls = 0;
  r.AddCollector([&] { g->Set(++calls); });
  EXPECT_TRUE(Has(r.Render(), "g 1"));
  EXPECT_TRUE(Has(r.Render(), "g 2"));
}

TEST(MetricsTest, RpcMetricsCountRequestsLatencyAndErrorsByCode) {
  MetricsRegistry r;
  RpcMetrics m(&r);
  m.Record(RpcMetrics::kCommit, 0, 0.0001);
  m.Record(RpcMetrics::kCommit, 5, 0.0002);
  m.Record(RpcMetrics::kCommit, 5, 0.0002);
  std::string t = r.Render();
  EXPECT_TRUE(Has(t, "strata_rpc_requests_total{method=\"Commit\"} 3")) << t;
  EXPECT_TRUE(Has(t, "strata_rpc_duration_seconds_count{method=\"Commit\"} 3")) << t;
  EXPECT_TRUE(Has(t, "strata_rpc_errors_total{method=\"Commit\",code=\"NOT_FOUND\"} 2")) << t;
}

TEST(MetricsTest, ConcurrentUpdatesAreNotLost) {
  MetricsRegistry r;
  Counter* c = r.AddCounter("c_total", "C.");
  Histogram* h = r.AddHistogram("h", "H.", {1});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 100000; ++i) {
        c->Add();
        h->Observe(0.5);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(c->value(), 400000u);
  EXPECT_EQ(h->BucketCounts()[0], 400000u);
  EXPECT_DOUBLE_EQ(h->sum(), 200000.0);
}

}  // namespace
}  // namespace strata::daemon
