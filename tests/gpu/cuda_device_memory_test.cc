// The GPU tier on a real CUDA device: the pool, batched copies both ways, the host arena's
// registration, and the tier's promotion / demotion round trip in device memory. Skips with the
// reason where this build has no CUDA or no device is visible (scripts/device-check.sh runs it
// on a GPU node).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/crc32c.h"
#include "storage/arena.h"
#include "storage/gpu/gpu_tiered_store.h"
#include "storage/host_block_store.h"

namespace strata {
namespace {

#define SKIP_WITHOUT_DEVICE()                                          \
  do {                                                                 \
    if (absl::Status s = CudaDeviceAvailable(); !s.ok())               \
      GTEST_SKIP() << "no CUDA device here: " << s.message();          \
  } while (0)

TEST(CudaDeviceMemory, WithoutADeviceOpeningFailsWithTheReason) {
  if (CudaDeviceAvailable().ok()) GTEST_SKIP() << "a device is visible";
  auto m = OpenCudaDeviceMemory(0, 1 << 20);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(m.status().message().empty());
}

TEST(CudaDeviceMemory, CopiesRoundTripInBatches) {
  SKIP_WITHOUT_DEVICE();
  auto m = OpenCudaDeviceMemory(0, 64 << 20);
  ASSERT_TRUE(m.ok()) << m.status();
  auto arena = *MmapArena::Create(16 << 20, false);
  ASSERT_TRUE((*m)->RegisterHost(arena->data(), arena->size()).ok());
  for (size_t k = 0; k < (8u << 20); ++k) arena->data()[k] = static_cast<uint8_t>(k * 13 + 7);
  std::vector<DeviceCopy> up, down;
  for (uint64_t b = 0; b < 8; ++b) {
    up.push_back({b * (4 << 20), arena->data() + b * (1 << 20), 1 << 20});
    down.push_back({b * (4 << 20), arena->data() + (8 << 20) + b * (1 << 20), 1 << 20});
  }
  ASSERT_TRUE((*m)->ToDevice(up).ok());
  ASSERT_TRUE((*m)->ToHost(down).ok());
  EXPECT_EQ(std::memcmp(arena->data(), arena->data() + (8 << 20), 8 << 20), 0);
  const DeviceCopy past_the_end{(64 << 20) - 10, arena->data(), 11};
  EXPECT_EQ((*m)->ToDevice({&past_the_end, 1}).code(), absl::StatusCode::kOutOfRange);
}

TEST(CudaDeviceMemory, RefusesMoreThanTheDeviceHasFree) {
  SKIP_WITHOUT_DEVICE();
  auto m = OpenCudaDeviceMemory(0, uint64_t{1} << 50);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kResourceExhausted) << m.status();
}

TEST(CudaDeviceMemory, TheTierPromotesStagesDownAndDemotesInDeviceMemory) {
  SKIP_WITHOUT_DEVICE();
  constexpr size_t kBlock = 1 << 20;
  auto arena = *MmapArena::Create(16 * kBlock, false);
  HostTier host(arena->data(), arena->size());
  HostBlockStore below(&host);
  auto m = OpenCudaDeviceMemory(0, 4 * kBlock);
  ASSERT_TRUE(m.ok()) << m.status();
  GpuTieredStoreOptions o;
  o.device.high_watermark = o.device.low_watermark = 1.0;
  auto store = GpuTieredStore::Open(&below, std::move(*m), o);
  ASSERT_TRUE(store.ok()) << store.status();
  const NamespaceId ns = ComputeBlockId(Digest{}, std::vector<uint32_t>{999});
  std::vector<BlockId> ids;
  for (uint32_t i = 0; i < 8; ++i) {
    ids.push_back(ComputeBlockId(Digest{}, std::vector<uint32_t>{i}));
    ReserveItem item{ids.back(), {}, kBlock};
    ReserveResult r = (*store)->Reserve(ns, {&item, 1});
    ASSERT_EQ(r.status[0], BlockStatus::kOk);
    std::memset(arena->data() + r.offsets[0], static_cast<int>(i + 1), kBlock);
    const uint32_t crc = Crc32c(arena->data() + r.offsets[0], kBlock);
    ASSERT_TRUE((*store)->Commit(r.reservation_id, {&crc, 1}).ok());
  }
  ASSERT_EQ((*store)->Promote(ns, {ids.data(), 4}), std::vector<BlockStatus>(4, BlockStatus::kOk));
  for (int i = 0; i < 4; ++i) below.Evict(ns, {&ids[i], 1}, false, true);
  AcquireResult a = (*store)->Acquire(ns, {ids.data(), 2});  // staged down from the device
  ASSERT_EQ(a.status, std::vector<BlockStatus>(2, BlockStatus::kOk));
  EXPECT_EQ(arena->data()[a.offsets[1] + kBlock - 1], 2);
  ASSERT_TRUE((*store)->Release(a.lease_id).ok());
  ASSERT_EQ((*store)->Promote(ns, {ids.data() + 4, 4}),
            std::vector<BlockStatus>(4, BlockStatus::kOk));
  for (int k = 0; k < 200 && (*store)->Counters().demotions < 2; ++k)
    absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ((*store)->Counters().demotions, 2u) << "blocks 2 and 3 lived only on the device";
  EXPECT_EQ((*store)->Counters().crc_failures, 0u);
  for (int i = 0; i < 8; ++i) EXPECT_TRUE((*store)->Holds(ids[i])) << i;
}

}  // namespace
}  // namespace strata
