#include "storage/catalog.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace strata {
namespace {

using testing_nvme::IdOf;
using testing_nvme::TempDir;

CatalogEntry Sample(uint64_t i) {
  CatalogEntry e;
  e.ns = IdOf(1000 + i);
  e.tier = 2;
  e.codec_id = static_cast<uint16_t>(i + 3);
  e.file_index = static_cast<uint32_t>(i % 3);
  e.offset = i * 8192;
  e.size = 5000 + i;
  e.crc32c = 0xDEADBEEF ^ static_cast<uint32_t>(i);
  e.parent = IdOf(2000 + i);
  e.last_access_us = -5 + static_cast<int64_t>(i);
  e.pin_until_us = 1234567890123 + static_cast<int64_t>(i);
  return e;
}

TEST(CatalogEncoding, RoundTripsEveryField) {
  uint8_t buf[kCatalogValueBytes];
  CatalogEntry e = Sample(7);
  EncodeCatalogEntry(e, buf);
  auto d = DecodeCatalogEntry({buf, sizeof(buf)});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, e);
}

TEST(CatalogEncoding, RejectsTornOrForeignValues) {
  uint8_t buf[kCatalogValueBytes];
  EncodeCatalogEntry(Sample(1), buf);
  EXPECT_EQ(DecodeCatalogEntry({buf, sizeof(buf) - 1}).status().code(),
            absl::StatusCode::kDataLoss);
  buf[40] ^= 1;
  EXPECT_EQ(DecodeCatalogEntry({buf, sizeof(buf)}).status().code(), absl::StatusCode::kDataLoss);
  buf[40] ^= 1;
  buf[0] = 9;
  EXPECT_EQ(DecodeCatalogEntry({buf, sizeof(buf)}).status().code(), absl::StatusCode::kDataLoss);
}

TEST(Catalog, PutGetDeleteSurviveReopen) {
  TempDir dir;
  {
    auto cat = Catalog::Open(dir.Sub("cat"));
    ASSERT_TRUE(cat.ok()) << cat.status();
    std::vector<std::pair<BlockId, CatalogEntry>> batch;
    for (uint64_t i = 0; i < 100; ++i) batch.emplace_back(IdOf(i), Sample(i));
    ASSERT_TRUE((*cat)->PutBatch(batch).ok());
    ASSERT_TRUE((*cat)->Delete(IdOf(5)).ok());
  }
  auto cat = Catalog::Open(dir.Sub("cat"));
  ASSERT_TRUE(cat.ok()) << cat.status();
  auto e = (*cat)->Get(IdOf(6));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(*e, Sample(6));
  EXPECT_EQ((*cat)->Get(IdOf(5)).status().code(), absl::StatusCode::kNotFound);
  size_t n = 0;
  ASSERT_TRUE(
      (*cat)
          ->ForEach([&](const BlockId&, const std::string&, const absl::StatusOr<CatalogEntry>& e) {
            EXPECT_TRUE(e.ok());
            ++n;
          })
          .ok());
  EXPECT_EQ(n, 99u);
}

}  // namespace
}  // namespace strata
