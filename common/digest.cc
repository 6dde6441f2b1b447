#include "strata/digest.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace strata {

bool Digest::IsZero() const {
  for (uint8_t b : bytes)
    if (b) return false;
  return true;
}

std::string Digest::ToHex() const {
  return absl::BytesToHexString(absl::string_view(AsBytes().data(), bytes.size()));
}

std::string Digest::ShortHex() const { return ToHex().substr(0, 16); }

absl::StatusOr<Digest> Digest::FromHex(std::string_view hex) {
  if (hex.size() != 64)
    return absl::InvalidArgumentError(
        absl::StrCat("id must be 64 hex characters, got ", hex.size()));
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)))
      return absl::InvalidArgumentError(
          absl::StrCat("id '", absl::string_view(hex.data(), hex.size()), "' is not hex"));
  }
  std::string raw = absl::HexStringToBytes(absl::string_view(hex.data(), hex.size()));
  return FromBytes(raw);
}

absl::StatusOr<Digest> Digest::FromBytes(std::string_view raw) {
  if (raw.size() != 32)
    return absl::InvalidArgumentError(absl::StrCat("digest must be 32 bytes, got ", raw.size()));
  Digest d;
  std::memcpy(d.bytes.data(), raw.data(), 32);
  return d;
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr);
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

Sha256& Sha256::Bytes(const void* data, size_t n) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, n);
  return *this;
}

Sha256& Sha256::U32(uint32_t v) {
  uint8_t b[4] = {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
  return Bytes(b, 4);
}

Sha256& Sha256::U64(uint64_t v) {
  U32(static_cast<uint32_t>(v));
  return U32(static_cast<uint32_t>(v >> 32));
}

Sha256& Sha256::Field(std::string_view s) {
  U32(static_cast<uint32_t>(s.size()));
  return Bytes(s.data(), s.size());
}

Digest Sha256::Finish() {
  Digest d;
  unsigned int len = 0;
  auto* ctx = static_cast<EVP_MD_CTX*>(ctx_);
  EVP_DigestFinal_ex(ctx, d.bytes.data(), &len);
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);  // ready for reuse
  return d;
}

Digest HmacSha256(std::string_view key, std::string_view message) {
  Digest d;
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), d.bytes.data(),
       &len);
  return d;
}

}  // namespace strata
