// Small readable block ids for eviction tests.
#pragma once

#include <cstdint>

#include "strata/block_id.h"

namespace strata::testing {

inline BlockId Id(uint32_t n) {
  BlockId id;
  for (int i = 0; i < 4; ++i) id.bytes[i] = static_cast<uint8_t>(n >> (8 * i));
  id.bytes[31] = 0xA5;  // never the zero id
  return id;
}

}  // namespace strata::testing
