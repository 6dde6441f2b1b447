// The value of a block catalog entry (storage/catalog.h): where a committed block lives and what
// it is. Pure encoding, apart from RocksDB, so tests/fuzz/catalog_record_fuzzer reaches it.
//
// A fixed 116-byte little-endian record (kCatalogValueBytes), version 1:
//
//   off  size  field
//     0     1  version (1)
//     1     1  tier (storage Tier value: 1 host, 2 nvme)
//     2     2  codec id
//     4     4  file index (which NVMe file)
//     8     8  offset in the file (bytes, 4 KiB aligned for NVMe)
//    16     8  payload size (bytes)
//    24     4  CRC32C of the payload
//    28     4  reserved (0)
//    32    32  namespace id
//    64    32  parent block id (zero for the first block of a chain)
//    96     8  last access (unix microseconds, signed)
//   104     8  pin until (unix microseconds, signed; 0: not pinned)
//   112     4  CRC32C of bytes [0, 112): a torn or bit-rotted record is rejected on load
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "strata/block_id.h"

namespace strata {

inline constexpr size_t kCatalogValueBytes = 116;
inline constexpr uint8_t kCatalogValueVersion = 1;

struct CatalogEntry {
  NamespaceId ns;
  uint8_t tier = 2;  // Tier::kNvme
  uint16_t codec_id = 0;
  uint32_t file_index = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t crc32c = 0;
  BlockId parent;
  int64_t last_access_us = 0;
  int64_t pin_until_us = 0;

  bool operator==(const CatalogEntry&) const = default;
};

// The fixed-size value encoding above.
void EncodeCatalogEntry(const CatalogEntry& e, uint8_t out[kCatalogValueBytes]);
absl::StatusOr<CatalogEntry> DecodeCatalogEntry(std::span<const uint8_t> value);

}  // namespace strata
