#include "storage/catalog_record.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"

namespace strata {
namespace {

void Put16(uint8_t* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = uint8_t(v >> (8 * i));
}
void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (8 * i));
}
void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}
uint16_t Get16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

void EncodeCatalogEntry(const CatalogEntry& e, uint8_t out[kCatalogValueBytes]) {
  std::memset(out, 0, kCatalogValueBytes);
  out[0] = kCatalogValueVersion;
  out[1] = e.tier;
  Put16(out + 2, e.codec_id);
  Put32(out + 4, e.file_index);
  Put64(out + 8, e.offset);
  Put64(out + 16, e.size);
  Put32(out + 24, e.crc32c);
  std::memcpy(out + 32, e.ns.bytes.data(), 32);
  std::memcpy(out + 64, e.parent.bytes.data(), 32);
  Put64(out + 96, static_cast<uint64_t>(e.last_access_us));
  Put64(out + 104, static_cast<uint64_t>(e.pin_until_us));
  Put32(out + 112, Crc32c(out, 112));
}

absl::StatusOr<CatalogEntry> DecodeCatalogEntry(std::span<const uint8_t> v) {
  if (v.size() != kCatalogValueBytes) {
    return absl::DataLossError(
        absl::StrCat("catalog value has ", v.size(), " bytes, want ", kCatalogValueBytes));
  }
  const uint8_t* p = v.data();
  if (p[0] != kCatalogValueVersion) {
    return absl::DataLossError(absl::StrCat("catalog value version ", p[0], " unknown"));
  }
  if (Get32(p + 112) != Crc32c(p, 112)) return absl::DataLossError("catalog value checksum");
  CatalogEntry e;
  e.tier = p[1];
  e.codec_id = Get16(p + 2);
  e.file_index = Get32(p + 4);
  e.offset = Get64(p + 8);
  e.size = Get64(p + 16);
  e.crc32c = Get32(p + 24);
  std::memcpy(e.ns.bytes.data(), p + 32, 32);
  std::memcpy(e.parent.bytes.data(), p + 64, 32);
  e.last_access_us = static_cast<int64_t>(Get64(p + 96));
  e.pin_until_us = static_cast<int64_t>(Get64(p + 104));
  return e;
}

}  // namespace strata
