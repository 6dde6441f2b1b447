#include "common/crc32c.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace strata {
namespace {

// Bit-at-a-time reference straight from the definition (reflected polynomial 0x82F63B78).
uint32_t ReferenceCrc32c(const uint8_t* p, size_t n) {
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

TEST(Crc32cTest, KnownAnswers) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(Crc32c("", 0), 0u);
}

TEST(Crc32cTest, MatchesReferenceAtEverySizeAndAlignment) {
  std::mt19937_64 rng(42);
  std::vector<uint8_t> buf(200000 + 16);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t n : {1ul, 7ul, 8ul, 63ul, 4096ul, 24575ul, 24576ul, 24577ul, 49160ul, 200000ul}) {
    for (size_t off : {0ul, 1ul, 5ul}) {
      EXPECT_EQ(Crc32c(buf.data() + off, n), ReferenceCrc32c(buf.data() + off, n))
          << "n=" << n << " off=" << off;
    }
  }
}

TEST(Crc32cTest, CopyWithCrcCopiesAndMatches) {
  std::mt19937_64 rng(9);
  std::vector<uint8_t> src(300000), dst(300000);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (size_t n : {0ul, 5ul, 1023ul, 1024ul, 4096ul, 65537ul, 299999ul}) {
    std::fill(dst.begin(), dst.end(), 0);
    uint32_t c = CopyWithCrc32c(dst.data(), src.data() + 1, n, 0x1234);
    EXPECT_EQ(c, Crc32c(src.data() + 1, n, 0x1234)) << n;
    EXPECT_TRUE(std::equal(src.begin() + 1, src.begin() + 1 + n, dst.begin())) << n;
    EXPECT_EQ(dst[n], 0) << n;  // nothing written past the end
  }
}

// The non-temporal variant writes and checksums exactly as the cached one, on an aligned
// destination and on unaligned ones (a cached head up to the first whole line, then streamed),
// around the sizes where it starts streaming.
TEST(Crc32cTest, StreamingCopyCopiesAndMatches) {
  std::mt19937_64 rng(11);
  std::vector<uint8_t> src(300000 + 3);
  std::vector<uint8_t> storage(300000 + 128);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  uint8_t* const aligned = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64);
  for (uint8_t* dst : {aligned, aligned + 1, aligned + 8, aligned + 63}) {
    for (size_t n : {0ul, 5ul, 1023ul, 1024ul, 1079ul, 1080ul, 1086ul, 1087ul, 1280ul, 4096ul,
                     65537ul, 262144ul, 299935ul}) {
      std::fill(storage.begin(), storage.end(), 0);
      const uint32_t c = CopyWithCrc32cStreaming(dst, src.data() + 3, n, 0x5678);
      EXPECT_EQ(c, Crc32c(src.data() + 3, n, 0x5678)) << n;
      EXPECT_TRUE(std::equal(src.begin() + 3, src.begin() + 3 + n, dst)) << n;
      EXPECT_EQ(dst[n], 0) << n;
      EXPECT_TRUE(std::all_of(storage.data(), dst, [](uint8_t v) { return v == 0; })) << n;
    }
  }
}

TEST(Crc32cTest, ExtendAndCombine) {
  std::string a(100003, 'a'), b(77777, 'b');
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<char>(i * 31);
  uint32_t whole = Crc32c((a + b).data(), a.size() + b.size());
  uint32_t ca = Crc32c(a.data(), a.size());
  EXPECT_EQ(Crc32c(b.data(), b.size(), ca), whole);
  EXPECT_EQ(Crc32cCombine(ca, Crc32c(b.data(), b.size()), b.size()), whole);
}

}  // namespace
}  // namespace strata
