#include "storage/arena.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

namespace strata {
namespace {

uint64_t FreeHugePages() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    unsigned long long n = 0;
    if (std::sscanf(line.c_str(), "HugePages_Free: %llu", &n) == 1) return n;
  }
  return 0;
}

TEST(Arena, DescribesTheMappingBehindAnAddress) {
  constexpr size_t kBytes = 8 << 20;
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  madvise(p, kBytes, MADV_NOHUGEPAGE);
  std::memset(p, 1, kBytes);
  MappingPages m = DescribeMapping(static_cast<char*>(p) + kBytes / 2);
  EXPECT_EQ(m.page_bytes, 4096u);
  EXPECT_GE(m.mapping_bytes, kBytes);
  EXPECT_EQ(m.thp_bytes, 0u);
  munmap(p, kBytes);
  // An address nobody mapped describes nothing.
  EXPECT_EQ(DescribeMapping(reinterpret_cast<void*>(uintptr_t{16})).page_bytes, 0u);
}

TEST(Arena, HugeTlbArenaReportsTwoMebibytePages) {
  if (FreeHugePages() < 2) GTEST_SKIP() << "no free reserved huge pages (vm.nr_hugepages)";
  auto arena = MmapArena::Create(4 << 20, /*huge_pages=*/true);
  ASSERT_TRUE(arena.ok()) << arena.status();
  ASSERT_TRUE((*arena)->huge_pages());
  EXPECT_EQ(DescribeMapping((*arena)->data()).page_bytes, uint64_t{2} << 20);
}

}  // namespace
}  // namespace strata
