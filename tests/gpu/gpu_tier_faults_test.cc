// The GPU tier when the device misbehaves: failed copies up or down lose nothing and leak no
// extent, a damaged device copy is never served, and concurrent promotion, device leases, host
// fetches and eviction keep every byte and every counter straight.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "gpu_tier_fixture.h"

namespace strata::testing_gpu {
namespace {

class GpuTierFaultTest : public GpuTierTest {
 protected:
  void OpenFaulty(size_t device_blocks) {
    HostStandInOptions f;
    f.fault = [this](bool to_device, const DeviceCopy&) {
      if ((to_device ? fail_up_ : fail_down_).load())
        return absl::InternalError("injected device copy failure");
      return absl::OkStatus();
    };
    Open(device_blocks, 64, std::move(f));
  }
  std::atomic<bool> fail_up_{false}, fail_down_{false};
};

TEST_F(GpuTierFaultTest, AFailedPromotionLosesNothingAndLeaksNothing) {
  OpenFaulty(4);
  Publish(0);
  Publish(1);
  const BlockId ids[] = {Id(0), Id(1)};
  fail_up_ = true;
  EXPECT_EQ(store_->Promote(ns_, ids), std::vector<BlockStatus>(2, BlockStatus::kInvalid));
  GpuTierCounters c = Counters();
  EXPECT_EQ(c.copy_errors, 1u);
  EXPECT_EQ(c.device.allocated_bytes, 0u) << "the device reservation was given back";
  EXPECT_EQ(c.device.blocks, 0u);
  EXPECT_GE(Warnings(), 1u);
  EXPECT_EQ(FetchFromHost(0), BlockStatus::kOk);
  EXPECT_EQ(FetchFromHost(1), BlockStatus::kOk);
  EXPECT_EQ(host_->Stats().open_leases, 0u) << "the host lease of the copy ended";
  fail_up_ = false;
  EXPECT_EQ(store_->Promote(ns_, ids), std::vector<BlockStatus>(2, BlockStatus::kOk));
  EXPECT_TRUE(DeviceBytesMatch(0));
}

TEST_F(GpuTierFaultTest, AFailedDemotionDropsTheVictimAndLeaksNothing) {
  OpenFaulty(2);
  for (int i = 0; i < 4; ++i) Publish(i);
  const BlockId first[] = {Id(0), Id(1)};
  ASSERT_EQ(store_->Promote(ns_, first), std::vector<BlockStatus>(2, BlockStatus::kOk));
  DropFromHost(0);
  DropFromHost(1);
  fail_down_ = true;
  const BlockId next[] = {Id(2), Id(3)};
  EXPECT_EQ(store_->Promote(ns_, next), std::vector<BlockStatus>(2, BlockStatus::kOk));
  ASSERT_TRUE(Eventually([&] { return Counters().victims_dropped == 2; }));
  GpuTierCounters c = Counters();
  EXPECT_EQ(c.demotions, 0u);
  EXPECT_GE(c.copy_errors, 1u);
  EXPECT_EQ(c.device.allocated_bytes, 2 * kBlock);
  HostTierStats h = host_->Stats();
  EXPECT_EQ(h.open_reservations, 0u) << "the host reservations of the failed copy were aborted";
  EXPECT_EQ(h.reserved_bytes, 0u);
  EXPECT_FALSE(store_->Holds(Id(0)));
  EXPECT_EQ(FetchFromHost(0), BlockStatus::kNotFound) << "a miss, never garbage";
  EXPECT_EQ(FetchFromHost(2), BlockStatus::kOk);
}

TEST_F(GpuTierFaultTest, ADamagedDeviceCopyIsNeverServed) {
  OpenFaulty(4);
  Publish(0);
  const BlockId id = Id(0);
  AcquireResult a = store_->AcquireOnDevice(ns_, {&id, 1});
  ASSERT_EQ(a.status[0], BlockStatus::kOk);
  const uint64_t offset = a.offsets[0];
  ASSERT_TRUE(store_->ReleaseOnDevice(a.lease_id).ok());
  DropFromHost(0);
  pool_[offset + 100] ^= 0x40;  // a bit flips in device memory
  EXPECT_EQ(FetchFromHost(0), BlockStatus::kNotFound);
  GpuTierCounters c = Counters();
  EXPECT_EQ(c.crc_failures, 1u);
  EXPECT_EQ(c.staged_down, 0u);
  EXPECT_FALSE(store_->HoldsOnDevice(id)) << "the damaged copy is dropped from the device";
  EXPECT_FALSE(store_->Holds(id));
  EXPECT_EQ(host_->Stats().allocated_bytes, 0u);
}

TEST_F(GpuTierFaultTest, ADamagedDeviceVictimIsDroppedNotDemoted) {
  OpenFaulty(1);
  Publish(0);
  Publish(1);
  const BlockId zero = Id(0), one = Id(1);
  AcquireResult a = store_->AcquireOnDevice(ns_, {&zero, 1});
  ASSERT_EQ(a.status[0], BlockStatus::kOk);
  pool_[a.offsets[0]] ^= 1;
  ASSERT_TRUE(store_->ReleaseOnDevice(a.lease_id).ok());
  DropFromHost(0);
  EXPECT_EQ(store_->Promote(ns_, {&one, 1})[0], BlockStatus::kOk);
  ASSERT_TRUE(Eventually([&] { return Counters().victims_dropped == 1; }));
  EXPECT_EQ(Counters().crc_failures, 1u);
  EXPECT_EQ(Counters().demotions, 0u);
  EXPECT_FALSE(store_->Holds(zero));
  EXPECT_EQ(host_->Stats().open_reservations, 0u);
}

TEST_F(GpuTierFaultTest, ConcurrentUseKeepsEveryByteAndEveryCounter) {
  constexpr int kBlocks = 48;
  OpenFaulty(6);
  for (int i = 0; i < kBlocks; ++i) Publish(i);
  std::atomic<int> wrong{0}, device_reads{0}, host_reads{0};
  std::atomic<bool> stop{false};
  auto worker = [&](int seed) {
    std::mt19937 rng(seed);
    while (!stop.load()) {
      const int i = static_cast<int>(rng() % kBlocks);
      const BlockId id = Id(i);
      switch (rng() % 4) {
        case 0: {  // a consumer on the device
          AcquireResult a = store_->AcquireOnDevice(ns_, {&id, 1});
          if (a.status[0] == BlockStatus::kOk) {
            ++device_reads;
            if (std::memcmp(pool_ + a.offsets[0], Bytes(i, kBlock).data(), kBlock) != 0) ++wrong;
          }
          if (a.lease_id) (void)store_->ReleaseOnDevice(a.lease_id);
          break;
        }
        case 1: {  // a CPU client
          AcquireResult a = store_->Acquire(ns_, {&id, 1});
          if (a.status[0] == BlockStatus::kOk) {
            ++host_reads;
            if (std::memcmp(store_->arena_base() + a.offsets[0], Bytes(i, kBlock).data(),
                            kBlock) != 0)
              ++wrong;
          }
          if (a.lease_id) (void)store_->Release(a.lease_id);
          break;
        }
        case 2:  // host memory under pressure forgets a block
          below_->Evict(ns_, {&id, 1}, false, false);
          break;
        default:
          (void)store_->Promote(ns_, {&id, 1});
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, 17 + t);
  absl::SleepFor(absl::Milliseconds(1500));
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(device_reads.load(), 0);
  EXPECT_GT(host_reads.load(), 0);
  // Quiet: every extent is a committed block's (no leaked reservation, lease or victim).
  ASSERT_TRUE(Eventually([&] { return Counters().device.demoting_blocks == 0; }));
  GpuTierCounters c = Counters();
  EXPECT_EQ(c.device.allocated_bytes, c.device.committed_bytes);
  EXPECT_EQ(c.device.open_leases, 0u);
  EXPECT_EQ(c.device.open_reservations, 0u);
  EXPECT_EQ(c.copy_errors, 0u);
  EXPECT_EQ(c.crc_failures, 0u);
  HostTierStats h = host_->Stats();
  EXPECT_EQ(h.allocated_bytes, h.committed_bytes);
  EXPECT_EQ(h.open_leases, 0u);
  // Every block any tier still holds is whole.
  for (int i = 0; i < kBlocks; ++i)
    if (store_->Holds(Id(i))) {
      EXPECT_EQ(FetchFromHost(i), BlockStatus::kOk) << i;
    }
}

}  // namespace
}  // namespace strata::testing_gpu
