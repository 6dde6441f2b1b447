// Reads a fuzzer's input as a sequence of fields; past the end every read yields zeros or empty
// bytes, so any input maps to some field values and no input is wasted on framing errors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace strata::fuzz {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : bytes_(reinterpret_cast<const char*>(data), size) {}

  uint64_t Uint(int width) {
    uint64_t v = 0;
    for (int i = 0; i < width && pos_ < bytes_.size(); ++i)
      v |= uint64_t{static_cast<uint8_t>(bytes_[pos_++])} << (8 * i);
    return v;
  }
  uint8_t U8() { return static_cast<uint8_t>(Uint(1)); }
  uint16_t U16() { return static_cast<uint16_t>(Uint(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Uint(4)); }
  uint64_t U64() { return Uint(8); }
  std::string_view Bytes(size_t n) {
    std::string_view out = bytes_.substr(pos_, n);
    pos_ += out.size();
    return out;
  }
  // A field whose length comes first, as a u16.
  std::string_view Sized() { return Bytes(U16()); }
  std::string_view Rest() { return Bytes(bytes_.size()); }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
};

// A broken invariant of a decoder: reported as a crash, like a sanitizer finding.
[[noreturn]] inline void Fail(const char* what) {
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
  std::abort();
}

}  // namespace strata::fuzz
