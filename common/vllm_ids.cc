#include "strata/vllm_ids.h"

namespace strata {
namespace {

// Canonical CBOR heads (RFC 8949 §4.2.1): the argument in the fewest bytes.
void Head(std::string& out, uint8_t major, uint64_t value) {
  const uint8_t m = static_cast<uint8_t>(major << 5);
  if (value < 24) {
    out.push_back(static_cast<char>(m | value));
    return;
  }
  int bytes = value <= 0xff ? 1 : value <= 0xffff ? 2 : value <= 0xffffffff ? 4 : 8;
  out.push_back(static_cast<char>(m | (bytes == 1 ? 24 : bytes == 2 ? 25 : bytes == 4 ? 26 : 27)));
  for (int i = bytes - 1; i >= 0; --i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

constexpr uint8_t kUnsigned = 0, kByteString = 2, kTextString = 3, kArray = 4;
constexpr char kNull = static_cast<char>(0xf6);

void Text(std::string& out, std::string_view s) {
  Head(out, kTextString, s.size());
  out.append(s);
}

Digest Sha256Of(const std::string& bytes) {
  Sha256 h;
  h.Bytes(bytes.data(), bytes.size());
  return h.Finish();
}

}  // namespace

Digest VllmNoneHash(std::string_view hash_seed) {
  std::string cbor;
  Text(cbor, hash_seed);
  return Sha256Of(cbor);
}

Digest VllmBlockHash(const Digest& parent, std::span<const uint32_t> block_tokens,
                     std::span<const std::string> extra_keys) {
  std::string cbor;
  cbor.reserve(48 + block_tokens.size() * 5);
  Head(cbor, kArray, 3);
  Head(cbor, kByteString, parent.bytes.size());
  cbor.append(parent.AsBytes());
  Head(cbor, kArray, block_tokens.size());
  for (uint32_t t : block_tokens) Head(cbor, kUnsigned, t);
  if (extra_keys.empty()) {
    cbor.push_back(kNull);
  } else {
    Head(cbor, kArray, extra_keys.size());
    for (const std::string& k : extra_keys) Text(cbor, k);
  }
  return Sha256Of(cbor);
}

std::vector<Digest> ComputeVllmBlockIds(uint32_t tokens_per_block,
                                        std::span<const uint32_t> tokens,
                                        const VllmHashInputs& inputs) {
  std::vector<Digest> ids;
  if (tokens_per_block == 0) return ids;
  const size_t full = tokens.size() / tokens_per_block;
  ids.reserve(full);
  Digest parent = VllmNoneHash(inputs.hash_seed);
  std::vector<std::string> keys;
  for (size_t i = 0; i < full; ++i) {
    keys.clear();
    if (!inputs.lora_name.empty()) keys.push_back(inputs.lora_name);
    if (i == 0 && !inputs.cache_salt.empty()) keys.push_back(inputs.cache_salt);
    parent = VllmBlockHash(parent, tokens.subspan(i * tokens_per_block, tokens_per_block), keys);
    ids.push_back(parent);
  }
  return ids;
}

}  // namespace strata
