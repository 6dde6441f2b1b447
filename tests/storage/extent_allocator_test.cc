#include "storage/extent_allocator.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace strata {
namespace {

TEST(ExtentAllocatorTest, AllocatesAlignedAndCoalesces) {
  ExtentAllocator a(1 << 20, 256);
  auto x = a.Allocate(100), y = a.Allocate(300), z = a.Allocate(256);
  ASSERT_TRUE(x && y && z);
  EXPECT_EQ(*x % 256, 0u);
  EXPECT_EQ(*y % 256, 0u);
  EXPECT_EQ(a.allocated_bytes(), 256u + 512 + 256);
  a.Free(*y, 300);
  a.Free(*x, 100);
  a.Free(*z, 256);
  EXPECT_EQ(a.free_extent_count(), 1u);  // everything merged back
  EXPECT_EQ(a.largest_free_extent(), 1u << 20);
}

TEST(ExtentAllocatorTest, FullAndBestFit) {
  ExtentAllocator a(4096, 1024);
  auto b0 = a.Allocate(1024), b1 = a.Allocate(1024), b2 = a.Allocate(2048);
  ASSERT_TRUE(b0 && b1 && b2);
  EXPECT_FALSE(a.Allocate(1));
  a.Free(*b0, 1024);
  a.Free(*b2, 2048);
  auto small = a.Allocate(1000);
  ASSERT_TRUE(small);
  EXPECT_EQ(*small, *b0);  // best fit picks the 1 KiB hole, not the 2 KiB one
  EXPECT_FALSE(a.Allocate(0));
}

TEST(ExtentAllocatorTest, RandomizedNoOverlapAndFullRecovery) {
  ExtentAllocator a(64 << 20, 256);
  std::mt19937 rng(7);
  std::map<uint64_t, uint64_t> live;  // offset -> rounded size
  for (int step = 0; step < 20000; ++step) {
    if (live.empty() || rng() % 3) {
      uint64_t size = 1 + rng() % (512 << 10);
      if (auto off = a.Allocate(size)) {
        uint64_t r = a.RoundUp(size);
        auto next = live.lower_bound(*off);
        if (next != live.end()) {
          ASSERT_LE(*off + r, next->first);
        }
        if (next != live.begin()) {
          auto prev = std::prev(next);
          ASSERT_LE(prev->first + prev->second, *off);
        }
        live[*off] = r;
      }
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      a.Free(it->first, it->second);
      live.erase(it);
    }
  }
  for (auto& [off, size] : live) a.Free(off, size);
  EXPECT_EQ(a.free_bytes(), a.capacity());
  EXPECT_EQ(a.free_extent_count(), 1u);
}

}  // namespace
}  // namespace strata
