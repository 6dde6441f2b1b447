// HttpServer in-process: routes, /readyz turning 503 with its reason, refusal of a taken port,
// idempotent Stop.
#include "daemon/http_server.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>

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

// A client that shuts down its writing once its request is sent (`nc -N`, some probes) still
// gets the answer; the server used to take the end of its input for a client gone.
TEST(HttpServerTest, AClientThatEndsItsWritingAfterTheRequestIsAnswered) {
  HttpServer::Handlers h;
  h.metrics = [] { return std::string("# TYPE x gauge\nx 1\n"); };
  h.ready = [](std::string*) { return true; };
  auto s = HttpServer::Start("127.0.0.1:0", h);
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string ep = (*s)->endpoint();
  const int port = std::stoi(ep.substr(ep.rfind(':') + 1));
  for (int round = 0; round < 10; ++round) {
    for (const char* path : {"/healthz", "/metrics"}) {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      ASSERT_GE(fd, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
      const std::string req = std::string("GET ") + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
      ASSERT_EQ(send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
      shutdown(fd, SHUT_WR);
      timeval tv{5, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      std::string got;
      char buf[4096];
      for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, n);
      close(fd);
      EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << path << " round " << round << ": " << got;
    }
  }
  (*s)->Stop();
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
