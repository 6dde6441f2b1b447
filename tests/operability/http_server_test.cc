// HttpServer in-process: routes, /readyz turning 503 with its reason, refusal of a taken port,
// idempotent Stop.
#include "daemon/http_server.h"

#include <gtest/gtest.h>

#include <atomic>

#include "tests/operability/ops_helpers.h"

namespace strata::daemon {
namespace {

TEST(HttpServerTest, ServesMetricsHealthAndReadinessWithReason) {
  std::atomic<bool> ready{false};
  HttpServer::Handlers h;
  h.metrics = [] { return std::string("# TYPE x gauge\nx 1\n"); };
  h.ready = [&](std::string* why) {
    if (!ready) *why = "starting";
    return ready.load();
  };
  auto s = HttpServer::Start("127.0.0.1:0", h);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string ep = (*s)->endpoint();
  ASSERT_EQ(ep.rfind("127.0.0.1:", 0), 0u) << ep;
  EXPECT_NE(ep, "127.0.0.1:0");

  auto m = testing::HttpGet(ep, "/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_EQ(m.body, "# TYPE x gauge\nx 1\n");
  EXPECT_EQ(testing::HttpGet(ep, "/healthz").status, 200);
  auto r = testing::HttpGet(ep, "/readyz");
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.body, "not ready: starting\n");
  ready = true;
  EXPECT_EQ(testing::HttpGet(ep, "/readyz").status, 200);

  // The same port cannot be bound twice (no SO_REUSEPORT sharing).
  auto again = HttpServer::Start(ep, h);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(std::string(again.status().message()).find("http_listen"), std::string::npos);

  (*s)->Stop();
  (*s)->Stop();
  EXPECT_EQ(testing::HttpGet(ep, "/healthz", 1).status, -1);
}

TEST(HttpServerTest, MalformedAddressesAreRefused) {
  HttpServer::Handlers h;
  h.metrics = [] { return std::string(); };
  h.ready = [](std::string*) { return true; };
  for (const char* bad : {"nonsense", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:x1"})
    EXPECT_FALSE(HttpServer::Start(bad, h).ok()) << bad;
}

}  // namespace
}  // namespace strata::daemon
