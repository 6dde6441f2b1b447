// Which block layouts mode xl can code with a calibration of a given geometry
// (codec/cross_layer_artefact.cc); shared by the calibration, the artefact and the coder.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "strata/kv_layout.h"

namespace strata::codec::internal {

// Whether blocks of `l` can be coded with a calibration of this geometry and RoPE: separate K
// and V of fp16, bf16 or fp32, the same layers, heads and head_dim, tokens per block a multiple
// of 16 (at most 65520), an even head_dim with RoPE. InvalidArgument saying which otherwise.
absl::Status CrossLayerLayoutFits(const KvLayout& l, uint32_t layers, uint32_t heads,
                                  uint32_t dim, float rope_theta);

}  // namespace strata::codec::internal
