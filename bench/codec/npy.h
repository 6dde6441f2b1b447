// Minimal .npy (NumPy format 1.0-3.0) reader and writer for float16/float32 little-endian,
// C-order arrays.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::codec_bench {

struct NpyArray {
  std::vector<uint64_t> shape;
  std::string descr;          // "<f2" or "<f4"
  std::vector<uint8_t> data;  // raw little-endian elements
};

absl::StatusOr<NpyArray> ReadNpy(const std::string& path);
absl::Status WriteNpy(const std::string& path, const NpyArray& a);

}  // namespace strata::codec_bench
