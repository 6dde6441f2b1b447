// How far decoded fp16 values lie from the originals, for codec tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>

#include "codec/half.h"

namespace strata::codec::test {

// Sum of squared errors over sum of squares of `want` (fp16 values, byte for byte as stored).
inline double RelMse(std::span<const uint8_t> want, std::span<const uint8_t> got) {
  double num = 0, den = 0;
  for (size_t i = 0; i + 1 < want.size(); i += 2) {
    uint16_t x, y;
    std::memcpy(&x, want.data() + i, 2);
    std::memcpy(&y, got.data() + i, 2);
    const double fx = HalfToFloat(x), fy = HalfToFloat(y);
    num += (fx - fy) * (fx - fy);
    den += fx * fx;
  }
  return num / den;
}

}  // namespace strata::codec::test
