// Shared by the tests of engines' lent device buffers (device_fetch_test, device_publish_test):
// the GPU tier they give stratad and the KV they put in those buffers.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace strata::device_fixture {

// A GPU tier of host memory standing in for the device, that never demotes on its own.
inline constexpr char kGpu[] = "gpu:\n  capacity: 4MiB\n  memory: host-stand-in\n"
                               "  high_watermark: 1.0\n  low_watermark: 1.0\n";

// `bytes` of finite fp16 values in (-4, 4): sign, exponent 12..16, random mantissa.
inline std::vector<uint8_t> FiniteHalfBlock(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> b(bytes);
  uint32_t x = seed;
  for (size_t k = 0; k + 1 < bytes; k += 2) {
    x = x * 1664525u + 1013904223u;
    const uint16_t h = static_cast<uint16_t>(((x >> 31) << 15) | ((12 + (x >> 10) % 5) << 10) |
                                             ((x >> 12) & 0x3FF));
    std::memcpy(b.data() + k, &h, 2);
  }
  return b;
}

}  // namespace strata::device_fixture
