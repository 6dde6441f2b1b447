#include "strata/kv_layout.h"

#include "absl/strings/str_cat.h"
#include "common/strings.h"

namespace strata {

size_t DTypeBytes(DType t) {
  switch (t) {
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat32: return 4;
    case DType::kFloat8E4M3: return 1;
  }
  return 0;
}

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat32: return "fp32";
    case DType::kFloat8E4M3: return "fp8_e4m3";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat8E4M3})
    if (DTypeName(t) == name) return t;
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '",
                                                 absl::string_view(name.data(), name.size()),
                                                 "' (expected fp16, bf16, fp32 or fp8_e4m3)"));
}

uint64_t KvLayout::BlockBytes() const {
  return uint64_t{num_layers} * TensorsPerLayer() * tokens_per_block * ValuesPerTokenPerTensor() *
         DTypeBytes(dtype);
}

absl::Status KvLayout::Validate() const {
  if (num_layers == 0) return absl::InvalidArgumentError("layout.num_layers must be > 0");
  if (num_kv_heads == 0) return absl::InvalidArgumentError("layout.num_kv_heads must be > 0");
  if (head_dim == 0) return absl::InvalidArgumentError("layout.head_dim must be > 0");
  if (tokens_per_block == 0)
    return absl::InvalidArgumentError("layout.tokens_per_block must be > 0");
  if (DTypeBytes(dtype) == 0) return absl::InvalidArgumentError("layout.dtype is unknown");
  if (kind != KvKind::kSeparateKV && kind != KvKind::kMlaLatent)
    return absl::InvalidArgumentError("layout.kind is unknown");
  if (kind == KvKind::kMlaLatent && num_kv_heads != 1)
    return absl::InvalidArgumentError("layout.num_kv_heads must be 1 for an MLA latent");
  if (BlockBytes() >= (uint64_t{1} << 32))
    return absl::InvalidArgumentError(
        absl::StrCat("layout gives ", BlockBytes(), "-byte blocks; the limit is 4 GiB"));
  return absl::OkStatus();
}

std::string KvLayout::DebugString() const {
  return absl::StrCat(num_layers, "L x ", num_kv_heads, "H x ", head_dim, "D ",
                      AsAbsl(DTypeName(dtype)), " ", tokens_per_block, " tok/block ",
                      kind == KvKind::kSeparateKV ? "kv" : "mla");
}

}  // namespace strata
