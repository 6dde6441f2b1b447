// Fixed-capacity memory that backs the host tier. The tier itself only sees a base pointer and a
// size; who provides the memory (an anonymous mapping here, or the transport's registered
// allocation in stratad) is the caller's choice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace strata {

// What backs the mapping that holds `addr` (from /proc/self/smaps): its page size (2 MiB for
// reserved huge pages), its size, and how much of it is transparent huge pages. All zero when
// it cannot be read. For operators: on a virtual disk NVMe reads into 4 KiB pages ran at half
// the speed of reads into huge pages (docs/tiers.md).
struct MappingPages {
  uint64_t page_bytes = 0;
  uint64_t mapping_bytes = 0;
  uint64_t thp_bytes = 0;
};
MappingPages DescribeMapping(const void* addr);

class MmapArena {
 public:
  // Tries MAP_HUGETLB first when `huge_pages` is set, then falls back to normal pages with
  // transparent-huge-page advice. Memory is pre-faulted so first writes do not page-fault.
  static absl::StatusOr<std::unique_ptr<MmapArena>> Create(uint64_t bytes, bool huge_pages,
                                                           bool prefault = true);
  ~MmapArena();
  MmapArena(const MmapArena&) = delete;
  MmapArena& operator=(const MmapArena&) = delete;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool huge_pages() const { return huge_pages_; }

 private:
  MmapArena(uint8_t* data, uint64_t size, bool huge)
      : data_(data), size_(size), huge_pages_(huge) {}
  uint8_t* data_;
  uint64_t size_;
  bool huge_pages_;
};

}  // namespace strata
