// Regression test for issue 14, finding 5 ("50,000 tenant namespaces are never released"),
// against a real stratad: opening beyond limits.max_namespaces is refused with
// RESOURCE_EXHAUSTED, and namespaces without blocks that nobody uses are released after
// limits.namespace_idle_timeout while one holding a block stays.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/crc32c.h"
#include "proto/convert.h"
#include "strata/v1/cache.grpc.pb.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/test_data.h"

namespace strata {
namespace {

using testing::DaemonProcess;

class NamespaceLimitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<DaemonProcess>(
        "host_tier:\n  capacity: 16MiB\nreservation_timeout: 1s\n"
        "limits:\n  max_namespaces: 3\n  namespace_idle_timeout: 1s\n");
    ASSERT_TRUE(daemon_->ok()) << daemon_->log();
    stub_ = v1::Cache::NewStub(
        grpc::CreateChannel(daemon_->endpoint(), grpc::InsecureChannelCredentials()));
  }

  grpc::Status Open(const std::string& tenant, std::string* id = nullptr, uint32_t replicas = 0) {
    v1::OpenNamespaceRequest req;
    *req.mutable_spec() = ToProto(testing::SmallSpec("ns-limit"));
    req.set_tenant(tenant);
    req.set_replicas(replicas);
    v1::OpenNamespaceResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->OpenNamespace(&ctx, req, &resp);
    if (id) *id = resp.namespace_id();
    return s;
  }

  // Publishes one 4 KiB block of zeros (the fresh arena already holds them) into `ns`.
  void PublishOne(const std::string& ns) {
    v1::ReserveRequest req;
    req.set_namespace_id(ns);
    req.set_ids(std::string(32, '\x07'));
    req.add_sizes(4096);
    v1::ReserveResponse resp;
    {
      grpc::ClientContext ctx;
      ASSERT_TRUE(stub_->Reserve(&ctx, req, &resp).ok());
    }
    ASSERT_EQ(resp.status(0), v1::BLOCK_OK);
    const std::string zeros(4096, '\0');
    v1::CommitRequest commit;
    commit.set_reservation_id(resp.reservation_id());
    commit.add_crc32c(Crc32c(zeros.data(), zeros.size()));
    v1::CommitResponse done;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Commit(&ctx, commit, &done).ok());
    ASSERT_EQ(done.status(0), v1::BLOCK_OK);
  }

  grpc::Status Lookup(const std::string& ns) {
    v1::LookupRequest req;
    req.set_namespace_id(ns);
    req.set_ids(std::string(32, '\x07'));
    v1::LookupResponse resp;
    grpc::ClientContext ctx;
    return stub_->Lookup(&ctx, req, &resp);
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<v1::Cache::Stub> stub_;
};

TEST_F(NamespaceLimitTest, OpeningBeyondTheLimitIsRefusedAndIdleOnesAreReleased) {
  std::string kept, idle;
  // A request refused for what it asks (replicas past 8) opens nothing, so takes no slot.
  for (int i = 0; i < 4; ++i)
    EXPECT_EQ(Open("refused-" + std::to_string(i), nullptr, 9).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(Open("t0", &kept).ok());
  ASSERT_TRUE(Open("t1", &idle).ok());
  ASSERT_TRUE(Open("t2").ok());
  grpc::Status refused = Open("t3");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("limits.max_namespaces"), std::string::npos)
      << refused.error_message();
  // Opening one already open is not a new namespace.
  EXPECT_TRUE(Open("t1").ok());

  PublishOne(kept);
  // t1 and t2 hold no block and nobody names them: released after the idle timeout. t0 holds a
  // block and stays.
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  EXPECT_EQ(Lookup(idle).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(Lookup(kept).ok());
  // A released namespace opens again, with the same id.
  std::string again;
  ASSERT_TRUE(Open("t1", &again).ok());
  EXPECT_EQ(again, idle);
  EXPECT_TRUE(Lookup(idle).ok());
  EXPECT_TRUE(Open("t3").ok());
  EXPECT_EQ(Open("t4").error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

}  // namespace
}  // namespace strata
