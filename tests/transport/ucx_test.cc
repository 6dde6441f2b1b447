#include "transport/ucx.h"

#include <cstring>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

namespace strata::transport {
namespace {

// A "daemon" side (allocated region, progress thread) and a "client" side (own context and
// worker, registered buffer) in one process: exercises the same calls stratad and libstrata make.
TEST(UcxTest, PutThenGetThroughAllocatedRegion) {
  auto server_ctx = Context::Create(/*wakeup=*/true);
  ASSERT_TRUE(server_ctx.ok()) << server_ctx.status();
  auto server = Worker::Create(*server_ctx);
  ASSERT_TRUE(server.ok()) << server.status();
  auto region = (*server_ctx)->Allocate(4 << 20);
  ASSERT_TRUE(region.ok()) << region.status();
  ProgressThread progress(server->get());
  auto rkey = (*region)->PackRkey();
  ASSERT_TRUE(rkey.ok());

  auto client_ctx = Context::Create(false);
  ASSERT_TRUE(client_ctx.ok());
  auto client = Worker::Create(*client_ctx);
  ASSERT_TRUE(client.ok());
  auto ep = (*client)->Connect((*server)->address());
  ASSERT_TRUE(ep.ok()) << ep.status();
  ASSERT_TRUE((*ep)->SetRemoteKey(*rkey).ok());

  std::vector<uint8_t> src(3 << 20), dst(3 << 20, 0);
  std::iota(src.begin(), src.end(), 0);
  auto src_mr = (*client_ctx)->Register(src.data(), src.size());
  ASSERT_TRUE(src_mr.ok());
  uint64_t remote = reinterpret_cast<uint64_t>((*region)->data()) + 4096;
  RmaOp put{RmaOp::kPut, src.data(), src.size(), remote, (*src_mr)->handle()};
  ASSERT_TRUE((*ep)->Transfer({&put, 1}, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(std::memcmp((*region)->data() + 4096, src.data(), src.size()), 0);

  // Two gets in one batch, unregistered destination.
  RmaOp gets[2] = {{RmaOp::kGet, dst.data(), 1 << 20, remote},
                   {RmaOp::kGet, dst.data() + (1 << 20), 2 << 20, remote + (1 << 20)}};
  ASSERT_TRUE((*ep)->Transfer(gets, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(src, dst);
}

TEST(UcxTest, TransferWithoutRemoteKeyIsRefused) {
  auto ctx = Context::Create(true);
  ASSERT_TRUE(ctx.ok());
  auto a = Worker::Create(*ctx);
  auto b = Worker::Create(*ctx);
  ProgressThread progress(a->get());
  auto ep = (*b)->Connect((*a)->address());
  ASSERT_TRUE(ep.ok());
  char buf[8];
  RmaOp op{RmaOp::kGet, buf, 8, 0};
  EXPECT_EQ((*ep)->Transfer({&op, 1}, absl::Now() + absl::Seconds(1)).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace strata::transport
