// The NVMe tier's catalog record (storage/catalog_record.h) as it is read back from RocksDB at
// start: any value must decode or be refused, and a decoded one must encode to a value that
// decodes to the same entry.
//
// Input: u8 flags (bit 0: store the right CRC at bytes [112, 116), so mutations reach the
// fields behind the checksum) | the rest as the stored value.
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "common/crc32c.h"
#include "storage/catalog_record.h"
#include "tests/fuzz/fuzz_input.h"

using strata::fuzz::Fail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::vector<uint8_t> value(data + 1, data + size);
  if ((data[0] & 1) && value.size() == strata::kCatalogValueBytes) {
    const uint32_t crc = strata::Crc32c(value.data(), 112);
    for (int i = 0; i < 4; ++i) value[112 + i] = static_cast<uint8_t>(crc >> (8 * i));
  }
  auto entry = strata::DecodeCatalogEntry(value);
  if (!entry.ok()) return 0;
  uint8_t again[strata::kCatalogValueBytes];
  strata::EncodeCatalogEntry(*entry, again);
  auto decoded = strata::DecodeCatalogEntry(std::span<const uint8_t>(again, sizeof(again)));
  if (!decoded.ok() || !(*decoded == *entry)) Fail("catalog record does not round-trip");
  return 0;
}
