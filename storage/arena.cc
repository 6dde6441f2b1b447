#include "storage/arena.h"

#include <sys/mman.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace strata {

absl::StatusOr<std::unique_ptr<MmapArena>> MmapArena::Create(uint64_t bytes, bool huge_pages,
                                                             bool prefault) {
  if (bytes == 0) return absl::InvalidArgumentError("arena size must be > 0");
  constexpr uint64_t kHuge = 2ull << 20;
  int populate = prefault ? MAP_POPULATE : 0;
  if (huge_pages) {
    uint64_t rounded = (bytes + kHuge - 1) & ~(kHuge - 1);
    void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | populate, -1, 0);
    if (p != MAP_FAILED)
      return std::unique_ptr<MmapArena>(new MmapArena(static_cast<uint8_t*>(p), rounded, true));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of ", bytes, " bytes failed: ", std::strerror(errno)));
  if (huge_pages) madvise(p, bytes, MADV_HUGEPAGE);
  if (prefault) madvise(p, bytes, MADV_WILLNEED);
  return std::unique_ptr<MmapArena>(new MmapArena(static_cast<uint8_t*>(p), bytes, false));
}

MmapArena::~MmapArena() { munmap(data_, size_); }

MappingPages DescribeMapping(const void* addr) {
  MappingPages m;
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  std::string line;
  bool in = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    // Mapping header: "lo-hi perms offset dev inode [path]"; field lines start "Name:".
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " ", &lo, &hi) == 2 &&
        line.find(':') > line.find(' ')) {
      if (in) break;
      in = a >= lo && a < hi;
      if (in) m.mapping_bytes = hi - lo;
      continue;
    }
    if (!in) continue;
    unsigned long long kb = 0;
    if (std::sscanf(line.c_str(), "KernelPageSize: %llu kB", &kb) == 1) m.page_bytes = kb << 10;
    if (std::sscanf(line.c_str(), "AnonHugePages: %llu kB", &kb) == 1) m.thp_bytes = kb << 10;
  }
  return m;
}

}  // namespace strata
