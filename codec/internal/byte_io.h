// Little-endian byte writer and a bounds-checked reader. The reader never touches memory past
// the span it was given; every failed read leaves it in an error state and returns a Status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::codec::internal {

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>* out) : out_(out) {}

  void U8(uint8_t v) { out_->push_back(v); }
  void U16(uint16_t v) { Raw(&v, 2); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void Varint(uint32_t v) {
    while (v >= 0x80) {
      out_->push_back(static_cast<uint8_t>(v | 0x80));
      v >>= 7;
    }
    out_->push_back(static_cast<uint8_t>(v));
  }
  void Raw(const void* p, size_t n) {
    size_t at = out_->size();
    out_->resize(at + n);
    if (n) std::memcpy(out_->data() + at, p, n);
  }
  // Reserves n bytes and returns their offset (for fields patched later, or bulk payloads).
  size_t Skip(size_t n) {
    size_t at = out_->size();
    out_->resize(at + n);
    return at;
  }
  size_t size() const { return out_->size(); }
  std::vector<uint8_t>* buffer() { return out_; }

 private:
  std::vector<uint8_t>* out_;
};

// Host is little-endian (x86-64, aarch64); the format is little-endian.
static_assert(std::endian::native == std::endian::little, "Strata codec assumes little-endian");

class ByteReader {
 public:
  ByteReader(const uint8_t* p, size_t n, const char* what) : p_(p), end_(p + n), what_(what) {}
  explicit ByteReader(std::span<const uint8_t> s, const char* what)
      : ByteReader(s.data(), s.size(), what) {}

  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  const uint8_t* pos() const { return p_; }

  absl::Status Need(size_t n) const {
    if (n > remaining())
      return absl::DataLossError(
          absl::StrCat(what_, ": truncated (need ", n, " bytes, have ", remaining(), ")"));
    return absl::OkStatus();
  }
  template <typename T>
  absl::Status Read(T* v) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (auto s = Need(sizeof(T)); !s.ok()) return s;
    std::memcpy(v, p_, sizeof(T));
    p_ += sizeof(T);
    return absl::OkStatus();
  }
  absl::Status Varint(uint32_t* v) {
    uint32_t r = 0;
    for (int shift = 0; shift < 35; shift += 7) {
      if (p_ >= end_) return absl::DataLossError(absl::StrCat(what_, ": truncated varint"));
      uint8_t b = *p_++;
      if (shift == 28 && (b & 0xF0) != 0)
        return absl::DataLossError(absl::StrCat(what_, ": varint overflows 32 bits"));
      r |= uint32_t{b & 0x7Fu} << shift;
      if (!(b & 0x80)) {
        *v = r;
        return absl::OkStatus();
      }
    }
    return absl::DataLossError(absl::StrCat(what_, ": varint too long"));
  }
  // Returns a view of the next n bytes and advances past them.
  absl::Status Take(size_t n, const uint8_t** out) {
    if (auto s = Need(n); !s.ok()) return s;
    *out = p_;
    p_ += n;
    return absl::OkStatus();
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  const char* what_;
};

}  // namespace strata::codec::internal
