// Helpers shared by the NVMe tier tests: temp dirs under /tmp, deterministic payloads, aligned
// buffers.
#pragma once

#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "strata/block_id.h"
#include "strata/digest.h"

namespace strata::testing_nvme {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/strata_nvme_test.XXXXXX";
    char* p = mkdtemp(tmpl.data());
    path_ = p ? p : "";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::vector<std::byte> Payload(uint64_t seed, size_t n) {
  std::vector<std::byte> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<std::byte>(x);
  }
  return v;
}

inline BlockId IdOf(uint64_t i) {
  Sha256 h;
  h.U64(i);
  return h.Finish();
}

struct AlignedBuf {
  explicit AlignedBuf(size_t n) : size((n + 4095) & ~size_t{4095}) {
    ptr = static_cast<std::byte*>(std::aligned_alloc(4096, size == 0 ? 4096 : size));
  }
  ~AlignedBuf() { std::free(ptr); }
  std::byte* ptr;
  size_t size;
};

}  // namespace strata::testing_nvme
