// Regression tests for issue 14, finding 5: client requests to a real stratad can neither flood
// its log (one line per call, rate-limited) nor forge lines in it (client strings escaped).
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


std::unique_ptr<v1::Cache::Stub> Stub(const DaemonProcess& d) {
  return v1::Cache::NewStub(grpc::CreateChannel(d.endpoint(), grpc::InsecureChannelCredentials()));
}

size_t Lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

// One Reserve of 65,536 blocks that do not fit wrote 65,536 warning lines; now one.
TEST(LogVolumeTest, ReserveOfManyBlocksWithoutSpaceLogsOneLine) {
  DaemonProcess d("host_tier:\n  capacity: 1MiB\n");
  ASSERT_TRUE(d.ok()) << d.log();
  auto stub = Stub(d);
  v1::OpenNamespaceRequest open;
  *open.mutable_spec() = ToProto(testing::SmallSpec("log-volume"));
  open.set_tenant("t");
  v1::OpenNamespaceResponse opened;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->OpenNamespace(&ctx, open, &opened).ok());
  }
  const size_t lines_before = Lines(d.log());
  v1::ReserveRequest req;
  req.set_namespace_id(opened.namespace_id());
  constexpr int kBlocks = 65536;
  std::string ids(32 * kBlocks, '\0');
  for (int i = 0; i < kBlocks; ++i) std::memcpy(&ids[32 * i], &i, sizeof i);
  req.set_ids(ids);
  for (int i = 0; i < kBlocks; ++i) req.add_sizes(4096);
  v1::ReserveResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->Reserve(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.status_size(), kBlocks);
  ASSERT_EQ(resp.status(kBlocks - 1), v1::BLOCK_NO_SPACE);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::string log = d.log();
  EXPECT_LE(Lines(log) - lines_before, 2u)
      << log.substr(log.size() - std::min<size_t>(2000, log.size()));
  EXPECT_NE(log.find("no space for"), std::string::npos);
}

// A tenant string carrying a newline and a fake log prefix stays inside its own line, escaped.
TEST(LogVolumeTest, TenantWithNewlineForgesNoLine) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto stub = Stub(d);
  NamespaceSpec bad = testing::SmallSpec("log-forge");
  bad.layout.tokens_per_block = 0;  // refused, and the refusal is logged with the tenant
  v1::OpenNamespaceRequest open;
  *open.mutable_spec() = ToProto(bad);
  open.set_tenant("evil\n2099-01-01T00:00:00.000 error stratad[1] FORGED\r\x1b[31m");
  v1::OpenNamespaceResponse opened;
  grpc::ClientContext ctx;
  EXPECT_FALSE(stub->OpenNamespace(&ctx, open, &opened).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::string log = d.log();
  EXPECT_EQ(log.find("\n2099-01-01"), std::string::npos) << log;
  EXPECT_EQ(log.find('\x1b'), std::string::npos) << log;
  EXPECT_NE(log.find("evil\\n2099-01-01"), std::string::npos) << log;
}

// A flood of refused OpenNamespace calls writes a bounded number of lines, and says how many it
// held back.
TEST(LogVolumeTest, RefusalFloodIsRateLimited) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto stub = Stub(d);
  NamespaceSpec bad = testing::SmallSpec("log-flood");
  bad.layout.tokens_per_block = 0;
  v1::OpenNamespaceRequest open;
  *open.mutable_spec() = ToProto(bad);
  open.set_tenant("t");
  const size_t lines_before = Lines(d.log());
  for (int i = 0; i < 500; ++i) {
    v1::OpenNamespaceResponse opened;
    grpc::ClientContext ctx;
    EXPECT_FALSE(stub->OpenNamespace(&ctx, open, &opened).ok());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  {
    v1::OpenNamespaceResponse opened;
    grpc::ClientContext ctx;
    EXPECT_FALSE(stub->OpenNamespace(&ctx, open, &opened).ok());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::string log = d.log();
  EXPECT_LT(Lines(log) - lines_before, 100u);
  EXPECT_NE(log.find("similar lines suppressed"), std::string::npos) << log;
}

}  // namespace
}  // namespace strata
