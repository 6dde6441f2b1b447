#include "storage/arena.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

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

}  // namespace strata
