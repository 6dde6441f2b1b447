// The shape of one block's KV tensors. Part of the namespace: blocks of different layouts are
// never interchangeable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace strata {

enum class DType : uint8_t { kFloat16 = 1, kBFloat16 = 2, kFloat32 = 3, kFloat8E4M3 = 4 };
// kSeparateKV: a K and a V tensor per layer. kMlaLatent: one compressed latent per layer.
enum class KvKind : uint8_t { kSeparateKV = 1, kMlaLatent = 2 };

size_t DTypeBytes(DType t);
std::string_view DTypeName(DType t);
absl::StatusOr<DType> ParseDType(std::string_view name);

struct KvLayout {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  DType dtype = DType::kFloat16;
  uint32_t tokens_per_block = 0;
  KvKind kind = KvKind::kSeparateKV;

  // Values per token per layer per tensor.
  uint64_t ValuesPerTokenPerTensor() const { return uint64_t{num_kv_heads} * head_dim; }
  uint32_t TensorsPerLayer() const { return kind == KvKind::kSeparateKV ? 2 : 1; }
  // Uncompressed bytes of one full block.
  uint64_t BlockBytes() const;
  // Every field set and the block under 4 GiB.
  absl::Status Validate() const;
  std::string DebugString() const;

  bool operator==(const KvLayout&) const = default;
};

}  // namespace strata
