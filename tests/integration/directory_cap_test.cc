// Regression test for issue 14, finding 5 ("Peer.Announce grows the directory without limit"),
// against a real stratad: one announcing node holds at most
// cluster.max_directory_entries_per_node entries, the rest are refused and counted in
// strata_directory_refused_total, refreshes of held entries still pass, and another node has its
// own allowance.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "strata/v1/peer.grpc.pb.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/free_port.h"

namespace strata {
namespace {

using testing::DaemonProcess;

// GET http://endpoint/metrics (HTTP/1.1, the daemon closes after answering); the body.
std::string Metrics(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(endpoint.substr(colon + 1))));
  inet_pton(AF_INET, endpoint.substr(0, colon).c_str(), &a.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return "";
  }
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

// The value of an unlabelled sample, or -1.
double Sample(const std::string& metrics, const std::string& name) {
  const auto p = metrics.find("\n" + name + " ");
  if (p == std::string::npos) return -1;
  return std::stod(metrics.substr(p + name.size() + 2));
}

std::string Ids(uint32_t first, uint32_t count) {
  std::string ids(32 * count, '\0');
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t v = first + i;
    std::memcpy(&ids[32 * i], &v, sizeof v);
  }
  return ids;
}

grpc::Status Announce(v1::Peer::Stub& stub, const std::string& node, const std::string& ids) {
  v1::AnnounceRequest req;
  req.set_node_id(node);
  req.set_ids(ids);
  req.set_ttl_ms(600000);
  v1::AnnounceResponse resp;
  grpc::ClientContext ctx;
  return stub.Announce(&ctx, req, &resp);
}

TEST(DirectoryCapTest, OneAnnouncerCannotGrowTheDirectoryBeyondItsCap) {
  // "flood" and "other" are members of the view (Announce refuses anyone else) that never
  // start: only their announcements reach this daemon.
  const std::string others = "\"flood@127.0.0.1:" + std::to_string(testing::FreePort()) +
                             "\", \"other@127.0.0.1:" + std::to_string(testing::FreePort()) +
                             "\"]";
  std::vector<std::string> listen;
  auto start = [&](const std::vector<std::string>& l) {
    return std::make_unique<DaemonProcess>(
        "node_id: self\nhost_tier:\n  capacity: 16MiB\ncluster:\n"
        "  membership: static\n  static_nodes: [\"self@" + l[1] + "\", " + others + "\n"
        "  peer_timeout: 300ms\n  max_directory_entries_per_node: 100\n",
        std::vector<std::string>{"--http-listen", "127.0.0.1:0", l[0], l[1]});
  };
  auto owned = testing::OnFreePort(&listen, start);
  DaemonProcess& d = *owned;
  ASSERT_TRUE(d.ok()) << d.log();
  const std::string http = d.ReadyField("http_endpoint");
  auto stub =
      v1::Peer::NewStub(grpc::CreateChannel(d.endpoint(), grpc::InsecureChannelCredentials()));

  // Ten calls of 1,000 new ids each from one node: 100 kept, 9,900 refused.
  for (uint32_t call = 0; call < 10; ++call)
    ASSERT_TRUE(Announce(*stub, "flood", Ids(call * 1000, 1000)).ok());
  std::string m = Metrics(http);
  EXPECT_EQ(Sample(m, "strata_directory_entries"), 100) << m;
  EXPECT_EQ(Sample(m, "strata_directory_refused_total"), 9900);

  // Refreshing held entries is not growth.
  ASSERT_TRUE(Announce(*stub, "flood", Ids(0, 100)).ok());
  // Another node has its own allowance.
  ASSERT_TRUE(Announce(*stub, "other", Ids(50000, 150)).ok());
  m = Metrics(http);
  EXPECT_EQ(Sample(m, "strata_directory_entries"), 200);
  EXPECT_EQ(Sample(m, "strata_directory_refused_total"), 9950);
  EXPECT_NE(d.log().find("cluster.max_directory_entries_per_node"), std::string::npos) << d.log();
}

}  // namespace
}  // namespace strata
