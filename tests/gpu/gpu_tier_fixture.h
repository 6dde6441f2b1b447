// A GPU tier over one host tier, with host memory standing in for the device.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "common/crc32c.h"
#include "storage/arena.h"
#include "storage/gpu/gpu_tiered_store.h"
#include "storage/host_block_store.h"

namespace strata::testing_gpu {

inline BlockId Id(int i) {
  return ComputeBlockId(Digest{}, std::vector<uint32_t>{static_cast<uint32_t>(i)});
}

// The bytes of block i: distinct per block and per position.
inline std::vector<uint8_t> Bytes(int i, size_t n) {
  std::vector<uint8_t> b(n);
  for (size_t k = 0; k < n; ++k) b[k] = static_cast<uint8_t>(i * 31 + k * 7 + (k >> 8));
  return b;
}

class GpuTierTest : public ::testing::Test {
 protected:
  static constexpr size_t kBlock = 4096;

  // `device_blocks` blocks of kBlock fit on the device, `host_blocks` in host memory.
  void Open(size_t device_blocks, size_t host_blocks = 64, HostStandInOptions faults = {},
            double tenant_max_share = 1.0) {
    arena_ = *MmapArena::Create(host_blocks * kBlock, false);
    HostTierOptions h;
    h.alignment = 256;
    host_ = std::make_unique<HostTier>(arena_->data(), arena_->size(), h);
    below_ = std::make_unique<HostBlockStore>(host_.get());
    auto memory = HostStandInMemory::Create(device_blocks * kBlock, std::move(faults));
    ASSERT_TRUE(memory.ok()) << memory.status();
    pool_ = (*memory)->pool();
    GpuTieredStoreOptions o;
    o.device.alignment = 256;
    o.device.high_watermark = 1.0;
    o.device.low_watermark = 1.0;
    o.device.tenant_max_share = tenant_max_share;
    o.warn = [this](const std::string& m) {
      absl::MutexLock l(&warn_mu_);
      warnings_.push_back(m);
    };
    auto store = GpuTieredStore::Open(below_.get(), std::move(*memory), o);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  // Publishes block i (parent: block `parent`, or none) through the store, as clients do.
  void Publish(int i, int parent = -1) {
    ReserveItem item{Id(i), parent < 0 ? BlockId{} : Id(parent), kBlock};
    ReserveResult r = store_->Reserve(ns_, {&item, 1});
    ASSERT_EQ(r.status[0], BlockStatus::kOk);
    const auto bytes = Bytes(i, kBlock);
    std::memcpy(store_->arena_base() + r.offsets[0], bytes.data(), kBlock);
    const uint32_t crc = Crc32c(bytes.data(), kBlock);
    auto c = store_->Commit(r.reservation_id, {&crc, 1});
    ASSERT_TRUE(c.ok() && (*c)[0] == BlockStatus::kOk);
  }

  // Host memory forgets block i (as its own eviction would), the device keeps its copy.
  void DropFromHost(int i) {
    const BlockId id = Id(i);
    ASSERT_EQ(below_->Evict(ns_, {&id, 1}, false, true).status[0], BlockStatus::kOk);
  }

  // Fetches block i from host memory, as a CPU client does: its status, and its bytes checked.
  BlockStatus FetchFromHost(int i) {
    const BlockId id = Id(i);
    AcquireResult a = store_->Acquire(ns_, {&id, 1});
    if (a.status[0] == BlockStatus::kOk) {
      const auto want = Bytes(i, kBlock);
      EXPECT_EQ(a.sizes[0], kBlock);
      EXPECT_EQ(std::memcmp(store_->arena_base() + a.offsets[0], want.data(), kBlock), 0);
      EXPECT_EQ(a.crcs[0], Crc32c(want.data(), kBlock));
    }
    if (a.lease_id != 0) {
      EXPECT_TRUE(store_->Release(a.lease_id).ok());
    }
    return a.status[0];
  }

  // Whether block i's device copy holds its bytes (read through the stand-in's pool).
  bool DeviceBytesMatch(int i) {
    const BlockId id = Id(i);
    AcquireResult a = store_->AcquireOnDevice(ns_, {&id, 1});
    bool ok = a.status[0] == BlockStatus::kOk &&
              std::memcmp(pool_ + a.offsets[0], Bytes(i, kBlock).data(), kBlock) == 0;
    if (a.lease_id != 0) {
      EXPECT_TRUE(store_->ReleaseOnDevice(a.lease_id).ok());
    }
    return ok;
  }

  GpuTierCounters Counters() { return store_->Counters(); }
  size_t Warnings() {
    absl::MutexLock l(&warn_mu_);
    return warnings_.size();
  }

  std::unique_ptr<MmapArena> arena_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<HostBlockStore> below_;
  std::unique_ptr<GpuTieredStore> store_;
  uint8_t* pool_ = nullptr;
  absl::Mutex warn_mu_;
  std::vector<std::string> warnings_ ABSL_GUARDED_BY(warn_mu_);
  NamespaceId ns_ = Id(100000);
};

// Waits (bounded) for the demotion thread to make `done` true.
template <typename F>
bool Eventually(F done) {
  for (int k = 0; k < 400; ++k) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return done();
}

}  // namespace strata::testing_gpu
