// Minimal safetensors reader and writer: the header (u64 little-endian length, then a JSON
// object naming each tensor's dtype, shape and byte range) followed by the raw data. Reads one
// tensor (F16, BF16 or F32) into the same in-memory form as a .npy array.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "bench/codec/npy.h"

namespace strata::codec_bench {

// `name` empty: the file must hold exactly one tensor (metadata aside). BF16 is widened to
// float32 ("<f4"); F16 stays "<f2".
absl::StatusOr<NpyArray> ReadSafetensors(const std::string& path, const std::string& name);
// Writes `a` ("<f2" or "<f4") as the single tensor `name`.
absl::Status WriteSafetensors(const std::string& path, const std::string& name, const NpyArray& a);

}  // namespace strata::codec_bench
