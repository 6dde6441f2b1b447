// 32-byte SHA-256 values: block ids, namespace seeds, tenant salts. Hashing uses OpenSSL and no
// process-seeded state, so every node and process derives the same ids from the same input.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace strata {

struct Digest {
  std::array<uint8_t, 32> bytes{};

  bool operator==(const Digest& o) const { return bytes == o.bytes; }
  bool operator!=(const Digest& o) const { return bytes != o.bytes; }
  bool operator<(const Digest& o) const { return bytes < o.bytes; }
  bool IsZero() const;

  std::string ToHex() const;
  // The first 8 bytes in hex, for logs and tables.
  std::string ShortHex() const;
  static absl::StatusOr<Digest> FromHex(std::string_view hex);
  // Exactly 32 raw bytes (a protobuf `bytes` field).
  static absl::StatusOr<Digest> FromBytes(std::string_view raw);
  std::string_view AsBytes() const {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
  }

  template <typename H>
  friend H AbslHashValue(H h, const Digest& d) {
    // The value is already a uniform hash; its first word is enough for table placement.
    uint64_t w;
    std::memcpy(&w, d.bytes.data(), sizeof(w));
    return H::combine(std::move(h), w);
  }
};

// Incremental SHA-256 with the canonical little-endian encodings used by the id scheme.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  Sha256& Bytes(const void* data, size_t n);
  Sha256& U8(uint8_t v) { return Bytes(&v, 1); }
  Sha256& U32(uint32_t v);
  Sha256& U64(uint64_t v);
  // u32 little-endian length, then the bytes.
  Sha256& Field(std::string_view s);
  Sha256& Raw(const Digest& d) { return Bytes(d.bytes.data(), d.bytes.size()); }
  Digest Finish();

 private:
  void* ctx_;
};

Digest HmacSha256(std::string_view key, std::string_view message);

}  // namespace strata
