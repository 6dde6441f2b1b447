// Namespaces and content-addressed block ids.
//
// Canonical encodings (all integers little-endian; "field" = u32 byte length, then the bytes):
//
//   tenant salt    = HMAC-SHA256(key = cluster secret,
//                                msg = "strata-tenant-v1\0" || tenant id)
//   namespace seed = SHA-256("strata-ns-v1\0" || field(model_id) || field(model_revision)
//                            || u32 num_layers || u32 num_kv_heads || u32 head_dim
//                            || u8 dtype || u32 tokens_per_block || u8 kind
//                            || u32 tp_rank || u32 tp_size || field(lora_id)
//                            || field(codec_policy) [|| u8 id_scheme, when not kStrata]
//                            || salt[32])
//   block id[i]    = SHA-256("strata-blk-v1\0" || parent[32] || u32 n_tokens
//                            || n_tokens x u32 token || field(extra_keys))
//                    where parent is id[i-1], or the namespace seed for i = 0.
//
// Only full blocks get ids; trailing tokens that do not fill a block are not addressed.
// tests/common/block_id_test.cc pins these encodings with known answers.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "strata/digest.h"
#include "strata/kv_layout.h"

namespace strata {

// Codec policy under which blocks are stored exactly as the client hands them over, with no
// codec framing (any size). Every other policy is a codec spec (codec/codec.h): the client
// encodes each layout-shaped block on publish and decodes it on fetch.
inline constexpr std::string_view kOpaqueCodecPolicy = "opaque";

// How a namespace names its blocks. kStrata ("strata"): the chain above. kVllm ("vllm") and
// kVllmCbor ("vllm_cbor"): exactly as vLLM names the blocks of its prefix cache with
// prefix_caching_hash_algo "sha256" (its default) or "sha256_cbor" (strata/vllm_ids.h), so an
// engine, a router and Strata agree on ids. The namespace, which carries the tenant salt, still
// scopes every call: another tenant's namespace never sees these blocks, though it names them
// alike (docs/engines.md says how the two combine).
enum class IdScheme : uint8_t { kStrata = 0, kVllm = 1, kVllmCbor = 2 };
std::string_view IdSchemeName(IdScheme s);
absl::StatusOr<IdScheme> ParseIdScheme(std::string_view name);

using BlockId = Digest;
using NamespaceId = Digest;
using TenantSalt = Digest;

struct NamespaceSpec {
  std::string model_id;
  std::string model_revision;
  KvLayout layout;
  uint32_t tp_rank = 0;
  uint32_t tp_size = 1;
  std::string lora_id;
  std::string codec_policy{kOpaqueCodecPolicy};
  IdScheme id_scheme = IdScheme::kStrata;

  absl::Status Validate() const;
};

TenantSalt ComputeTenantSalt(std::string_view cluster_secret, std::string_view tenant_id);

NamespaceId ComputeNamespaceId(const NamespaceSpec& spec, const TenantSalt& salt);

// id of one block given its parent (previous id or the namespace seed).
BlockId ComputeBlockId(const Digest& parent, std::span<const uint32_t> block_tokens,
                       std::string_view extra_keys = {});

// ids of every full block of `tokens`, chained from `ns`.
std::vector<BlockId> ComputeBlockIds(const NamespaceId& ns, uint32_t tokens_per_block,
                                     std::span<const uint32_t> tokens,
                                     std::string_view extra_keys = {});

}  // namespace strata
