// Device links between two ends in one process: the TCP stand-in on every machine, NCCL where
// a GPU is visible (two communicators on one device, as two daemons on one node would have).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <future>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#if STRATA_TEST_NCCL
#include <cuda_runtime_api.h>
#endif
#include "gtest/gtest.h"
#include "transport/device_link.h"

namespace strata::transport {
namespace {

struct Pair {
  std::unique_ptr<DeviceLink> zero, one;
};

Pair Connect(DeviceLinkFactory& f0, DeviceLinkFactory& f1, absl::Duration within = absl::Seconds(10)) {
  auto id = f0.NewLinkId();
  EXPECT_TRUE(id.ok()) << id.status();
  auto one = std::async(std::launch::async,
                        [&] { return f1.Connect(*id, 1, absl::Now() + within); });
  auto zero = f0.Connect(*id, 0, absl::Now() + within);
  auto one_end = one.get();
  EXPECT_TRUE(zero.ok()) << zero.status();
  EXPECT_TRUE(one_end.ok()) << one_end.status();
  Pair p;
  if (zero.ok()) p.zero = std::move(*zero);
  if (one_end.ok()) p.one = std::move(*one_end);
  return p;
}

DeviceRange Range(std::vector<uint8_t>& v, size_t at, size_t n) {
  return DeviceRange{reinterpret_cast<uint64_t>(v.data() + at), n};
}

std::vector<DeviceRange> One(DeviceRange r) { return {r}; }

TEST(StandInDeviceLink, RangesArriveInOrderBothWays) {
  auto f0 = NewStandInLinkFactory("127.0.0.1");
  auto f1 = NewStandInLinkFactory("127.0.0.1");
  Pair p = Connect(*f0, *f1);
  ASSERT_TRUE(p.zero && p.one);
  EXPECT_EQ(p.zero->rank(), 0);
  EXPECT_EQ(p.one->rank(), 1);
  // Larger than a socket buffer, so both ends must make progress together.
  std::vector<uint8_t> src(24 << 20), dst(24 << 20, 0);
  std::iota(src.begin(), src.end(), 7);
  const std::vector<DeviceRange> out = {Range(src, 0, 5 << 20), Range(src, 9 << 20, 13 << 20),
                                        Range(src, 5 << 20, 1)};
  const std::vector<DeviceRange> in = {Range(dst, 0, 5 << 20), Range(dst, 5 << 20, 13 << 20),
                                       Range(dst, 18 << 20, 1)};
  for (int round = 0; round < 2; ++round) {
    DeviceLink& sender = round == 0 ? *p.zero : *p.one;
    DeviceLink& receiver = round == 0 ? *p.one : *p.zero;
    std::fill(dst.begin(), dst.end(), 0);
    auto recv = std::async(std::launch::async,
                           [&] { return receiver.Recv(in, absl::Now() + absl::Seconds(20)); });
    ASSERT_TRUE(sender.Send(out, absl::Now() + absl::Seconds(20)).ok());
    ASSERT_TRUE(recv.get().ok());
    EXPECT_TRUE(std::equal(dst.begin(), dst.begin() + (5 << 20), src.begin()));
    EXPECT_TRUE(std::equal(dst.begin() + (5 << 20), dst.begin() + (18 << 20),
                           src.begin() + (9 << 20)));
    EXPECT_EQ(dst[18 << 20], src[5 << 20]);
  }
}

TEST(StandInDeviceLink, AReceiveWithoutASenderEndsAtItsDeadlineAndBreaksTheLink) {
  auto f = NewStandInLinkFactory("127.0.0.1");
  Pair p = Connect(*f, *f);
  ASSERT_TRUE(p.zero && p.one);
  std::vector<uint8_t> buf(4096);
  const absl::Time t0 = absl::Now();
  absl::Status s = p.zero->Recv(One(Range(buf, 0, buf.size())), absl::Now() + absl::Milliseconds(300));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  // Broken for good: a late sender cannot shift every later transfer by one range.
  EXPECT_FALSE(p.zero->Recv(One(Range(buf, 0, 1)), absl::Now() + absl::Seconds(1)).ok());
}

TEST(StandInDeviceLink, AbortWakesACallInProgressAndTheOtherEndSeesTheLinkClose) {
  auto f = NewStandInLinkFactory("127.0.0.1");
  Pair p = Connect(*f, *f);
  ASSERT_TRUE(p.zero && p.one);
  std::vector<uint8_t> buf(1 << 20);
  auto recv = std::async(std::launch::async, [&] {
    return p.one->Recv(One(Range(buf, 0, buf.size())), absl::Now() + absl::Seconds(30));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const absl::Time t0 = absl::Now();
  p.one->Abort();
  EXPECT_FALSE(recv.get().ok());
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  p.one.reset();
  EXPECT_FALSE(p.zero->Recv(One(Range(buf, 0, 16)), absl::Now() + absl::Seconds(5)).ok());
}

TEST(StandInDeviceLink, OnlyTheHolderOfTheLinkIdJoins) {
  auto f0 = NewStandInLinkFactory("127.0.0.1");
  auto f1 = NewStandInLinkFactory("127.0.0.1");
  auto id = f0->NewLinkId();
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<std::string> parts = absl::StrSplit(*id, ' ');
  ASSERT_EQ(parts.size(), 3u);
  // A stranger connects to the port first and presents a wrong token: refused, and the real
  // rank 1 still joins.
  std::string forged = parts[0] + " " + parts[1] + " " + std::string(32, '0');
  auto stranger = f1->Connect(forged, 1, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(stranger.ok()) << stranger.status();  // the dialer cannot tell; rank 0 can
  auto one = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return f1->Connect(*id, 1, absl::Now() + absl::Seconds(10));
  });
  auto zero = f0->Connect(*id, 0, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(zero.ok()) << zero.status();
  auto one_end = one.get();
  ASSERT_TRUE(one_end.ok()) << one_end.status();
  std::vector<uint8_t> a = {1, 2, 3}, b(3, 0);
  auto r = std::async(std::launch::async,
                      [&] { return (*one_end)->Recv(One(Range(b, 0, 3)), absl::Now() + absl::Seconds(5)); });
  ASSERT_TRUE((*zero)->Send(One(Range(a, 0, 3)), absl::Now() + absl::Seconds(5)).ok());
  ASSERT_TRUE(r.get().ok());
  EXPECT_EQ(a, b);
  // The stranger's connection was closed by rank 0.
  EXPECT_FALSE((*stranger)->Recv(One(Range(b, 0, 1)), absl::Now() + absl::Seconds(5)).ok());
  // An id is used once; ids of another factory, malformed ones and bad ranks are refused.
  EXPECT_EQ(f0->Connect(*id, 0, absl::Now() + absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto other = f1->NewLinkId();
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(f0->Connect(*other, 0, absl::Now() + absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f0->Connect("garbage", 1, absl::Now() + absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f0->Connect(*other, 2, absl::Now() + absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StandInDeviceLink, RankZeroGivesUpWhenNobodyJoins) {
  auto f = NewStandInLinkFactory("127.0.0.1");
  auto id = f->NewLinkId();
  ASSERT_TRUE(id.ok());
  const absl::Time t0 = absl::Now();
  auto zero = f->Connect(*id, 0, absl::Now() + absl::Milliseconds(300));
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
}

// NCCL refuses two ranks of one communicator on one GPU: a link needs two devices (two nodes,
// or two GPUs of one node as here).
TEST(NcclDeviceLink, DeviceMemoryGoesFromOneGpuToAnother) {
  auto f0 = NewNcclLinkFactory(0);
  if (!f0.ok()) {
    EXPECT_EQ(f0.status().code(), absl::StatusCode::kFailedPrecondition) << f0.status();
    GTEST_SKIP() << "no NCCL links here: " << f0.status();
  }
#if STRATA_TEST_NCCL
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2)
    GTEST_SKIP() << "an NCCL link needs two GPUs; " << devices << " visible";
  auto f1 = NewNcclLinkFactory(1);
  ASSERT_TRUE(f1.ok()) << f1.status();
  Pair p = Connect(**f0, **f1, absl::Seconds(60));
  ASSERT_TRUE(p.zero && p.one);
  EXPECT_EQ(p.zero->kind(), "nccl");
  constexpr size_t kBytes = 64 << 20;
  std::vector<uint8_t> host(kBytes), back(kBytes, 0);
  std::iota(host.begin(), host.end(), 3);
  uint8_t *d0 = nullptr, *d1 = nullptr;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d0), kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d0, host.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d1), kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(d1, 0, kBytes), cudaSuccess);
  // Two ranges each way round: the halves swap places.
  const uint64_t a0 = reinterpret_cast<uint64_t>(d0), a1 = reinterpret_cast<uint64_t>(d1);
  const std::vector<DeviceRange> out = {{a0, kBytes / 2}, {a0 + kBytes / 2, kBytes / 2}};
  const std::vector<DeviceRange> in = {{a1 + kBytes / 2, kBytes / 2}, {a1, kBytes / 2}};
  auto recv = std::async(std::launch::async,
                         [&] { return p.one->Recv(in, absl::Now() + absl::Seconds(30)); });
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE(p.zero->Send(out, absl::Now() + absl::Seconds(30)).ok());
  ASSERT_TRUE(recv.get().ok());
  const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  std::printf("nccl link: %zu MiB GPU 0 -> GPU 1 in %.3f ms (%.1f GB/s)\n", kBytes >> 20,
              secs * 1e3, kBytes / secs / 1e9);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), d1, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(std::equal(back.begin(), back.begin() + kBytes / 2, host.begin() + kBytes / 2));
  EXPECT_TRUE(std::equal(back.begin() + kBytes / 2, back.end(), host.begin()));
  // A receive nobody sends to ends at its deadline, and the link is broken after it.
  EXPECT_FALSE(p.one->Recv(One({a1, 4096}), absl::Now() + absl::Milliseconds(500)).ok());
  EXPECT_FALSE(p.one->Recv(One({a1, 4096}), absl::Now() + absl::Milliseconds(500)).ok());
  cudaFree(d1);
  cudaSetDevice(0);
  cudaFree(d0);
#else
  GTEST_SKIP() << "this test binary was built without CUDA";
#endif
}

}  // namespace
}  // namespace strata::transport
