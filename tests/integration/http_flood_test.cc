// Regression tests for issue 14, finding 5: idle and trickling HTTP connections to a real
// stratad can neither delay /healthz nor grow the daemon's threads.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "proto/convert.h"
#include "strata/v1/cache.grpc.pb.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/test_data.h"

namespace strata {
namespace {

using testing::DaemonProcess;
using Clock = std::chrono::steady_clock;


int ConnectTcp(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(endpoint.substr(colon + 1))));
  inet_pton(AF_INET, endpoint.substr(0, colon).c_str(), &a.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// GET `path` on a fresh connection; the status code, or -1 without an answer within `timeout`.
int Get(const std::string& endpoint, const std::string& path, std::chrono::milliseconds timeout) {
  int fd = ConnectTcp(endpoint);
  if (fd < 0) return -1;
  timeval tv{static_cast<time_t>(timeout.count() / 1000),
             static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
  send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  char buf[256];
  ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
  close(fd);
  if (n < 12) return -1;
  buf[n] = '\0';
  return std::atoi(buf + 9);  // "HTTP/1.1 200"
}

size_t Threads(pid_t pid) {
  size_t n = 0;
  for (const auto& e :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task"))
    n += e.is_directory();
  return n;
}

std::unique_ptr<DaemonProcess> HttpDaemon() {
  return std::make_unique<DaemonProcess>("host_tier:\n  capacity: 64MiB\n",
                                         std::vector<std::string>{"--http-listen", "127.0.0.1:0"});
}

// The finding: two idle connections delayed /healthz to 9.7 s. More idle connections than the
// old pool had workers, plus one trickling a request a byte at a time (slowloris).
TEST(HttpFloodTest, IdleConnectionsDoNotDelayHealthz) {
  auto d = HttpDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  const std::string http = d->ReadyField("http_endpoint");
  ASSERT_FALSE(http.empty());
  std::vector<int> idle;
  for (int i = 0; i < 16; ++i) idle.push_back(ConnectTcp(http));
  int trickle = ConnectTcp(http);
  send(trickle, "G", 1, MSG_NOSIGNAL);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (int i = 0; i < 5; ++i) {
    send(trickle, "E", 1, MSG_NOSIGNAL);
    const auto t0 = Clock::now();
    EXPECT_EQ(Get(http, "/healthz", std::chrono::milliseconds(1000)), 200) << "probe " << i;
    EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(1000));
    EXPECT_EQ(Get(http, "/readyz", std::chrono::milliseconds(1000)), 200);
  }
  for (int fd : idle) close(fd);
  close(trickle);
}

// 200 idle connections neither grow the daemon's threads nor lock the probe out; and the server
// closes connections that never send a request.
TEST(HttpFloodTest, TwoHundredIdleConnectionsKeepThreadsBounded) {
  auto d = HttpDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  const std::string http = d->ReadyField("http_endpoint");
  const size_t before = Threads(d->pid());
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) idle.push_back(ConnectTcp(http));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LE(Threads(d->pid()), before + 2);
  const auto t0 = Clock::now();
  EXPECT_EQ(Get(http, "/healthz", std::chrono::milliseconds(1000)), 200);
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(1000));
  // The daemon hung up on the idle ones (request deadline): a read sees EOF, not a timeout.
  timeval tv{5, 0};
  setsockopt(idle[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char c;
  EXPECT_EQ(recv(idle[0], &c, 1, 0), 0);
  for (int fd : idle) close(fd);
  EXPECT_EQ(Get(http, "/metrics", std::chrono::milliseconds(2000)), 200);
}

}  // namespace
}  // namespace strata
