#include "strata/block_id.h"

#include <bit>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace strata {
namespace {
// Domain tags keep the three hashes from ever colliding with each other; the trailing NUL is
// part of the tag.
constexpr std::string_view kTenantTag{"strata-tenant-v1\0", 17};
constexpr std::string_view kNamespaceTag{"strata-ns-v1\0", 13};
constexpr std::string_view kBlockTag{"strata-blk-v1\0", 14};
}  // namespace

absl::Status NamespaceSpec::Validate() const {
  if (model_id.empty()) return absl::InvalidArgumentError("namespace.model_id must be set");
  STRATA_RETURN_IF_ERROR(layout.Validate());
  if (tp_size == 0) return absl::InvalidArgumentError("namespace.tp_size must be > 0");
  if (tp_rank >= tp_size)
    return absl::InvalidArgumentError(
        absl::StrCat("namespace.tp_rank ", tp_rank, " must be < tp_size ", tp_size));
  if (codec_policy.empty()) return absl::InvalidArgumentError("namespace.codec_policy must be set");
  if (id_scheme != IdScheme::kStrata && id_scheme != IdScheme::kVllm &&
      id_scheme != IdScheme::kVllmCbor)
    return absl::InvalidArgumentError(absl::StrCat("namespace.id_scheme ",
                                                   static_cast<int>(id_scheme), " is unknown"));
  return absl::OkStatus();
}

std::string_view IdSchemeName(IdScheme s) {
  switch (s) {
    case IdScheme::kStrata: return "strata";
    case IdScheme::kVllm: return "vllm";
    case IdScheme::kVllmCbor: return "vllm_cbor";
  }
  return "unknown";
}

absl::StatusOr<IdScheme> ParseIdScheme(std::string_view name) {
  if (name.empty() || name == "strata") return IdScheme::kStrata;
  if (name == "vllm") return IdScheme::kVllm;
  if (name == "vllm_cbor") return IdScheme::kVllmCbor;
  return absl::InvalidArgumentError(absl::StrCat(
      "namespace.id_scheme '", std::string(name), "' is not strata, vllm or vllm_cbor"));
}

TenantSalt ComputeTenantSalt(std::string_view cluster_secret, std::string_view tenant_id) {
  std::string msg(kTenantTag);
  msg.append(tenant_id);
  return HmacSha256(cluster_secret, msg);
}

NamespaceId ComputeNamespaceId(const NamespaceSpec& spec, const TenantSalt& salt) {
  Sha256 h;
  h.Bytes(kNamespaceTag.data(), kNamespaceTag.size())
      .Field(spec.model_id)
      .Field(spec.model_revision)
      .U32(spec.layout.num_layers)
      .U32(spec.layout.num_kv_heads)
      .U32(spec.layout.head_dim)
      .U8(static_cast<uint8_t>(spec.layout.dtype))
      .U32(spec.layout.tokens_per_block)
      .U8(static_cast<uint8_t>(spec.layout.kind))
      .U32(spec.tp_rank)
      .U32(spec.tp_size)
      .Field(spec.lora_id)
      .Field(spec.codec_policy);
  // Appended only for other schemes, so ids of existing namespaces stay what they were.
  if (spec.id_scheme != IdScheme::kStrata) h.U8(static_cast<uint8_t>(spec.id_scheme));
  h.Raw(salt);
  return h.Finish();
}

namespace {
BlockId HashBlock(Sha256& h, const Digest& parent, std::span<const uint32_t> block_tokens,
                  std::string_view extra_keys) {
  h.Bytes(kBlockTag.data(), kBlockTag.size())
      .Raw(parent)
      .U32(static_cast<uint32_t>(block_tokens.size()));
  if constexpr (std::endian::native == std::endian::little) {
    h.Bytes(block_tokens.data(), block_tokens.size_bytes());
  } else {
    for (uint32_t t : block_tokens) h.U32(t);
  }
  h.Field(extra_keys);
  return h.Finish();
}
}  // namespace

BlockId ComputeBlockId(const Digest& parent, std::span<const uint32_t> block_tokens,
                       std::string_view extra_keys) {
  Sha256 h;
  return HashBlock(h, parent, block_tokens, extra_keys);
}

std::vector<BlockId> ComputeBlockIds(const NamespaceId& ns, uint32_t tokens_per_block,
                                     std::span<const uint32_t> tokens,
                                     std::string_view extra_keys) {
  std::vector<BlockId> ids;
  if (tokens_per_block == 0) return ids;
  size_t full = tokens.size() / tokens_per_block;
  ids.reserve(full);
  Sha256 h;
  Digest parent = ns;
  for (size_t i = 0; i < full; ++i) {
    parent =
        HashBlock(h, parent, tokens.subspan(i * tokens_per_block, tokens_per_block), extra_keys);
    ids.push_back(parent);
  }
  return ids;
}

}  // namespace strata
