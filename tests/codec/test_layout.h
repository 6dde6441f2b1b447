// A KvLayout for codec tests, named argument by argument (the aggregate's field order puts
// dtype before tokens_per_block, easy to get wrong inline).
#pragma once

#include <cstdint>

#include "strata/kv_layout.h"

namespace strata::codec::test {

inline KvLayout Layout(uint32_t layers, uint32_t heads, uint32_t dim, uint32_t tokens,
                       DType dt = DType::kFloat16, KvKind kind = KvKind::kSeparateKV) {
  KvLayout l;
  l.num_layers = layers;
  l.num_kv_heads = heads;
  l.head_dim = dim;
  l.tokens_per_block = tokens;
  l.dtype = dt;
  l.kind = kind;
  return l;
}

}  // namespace strata::codec::test
