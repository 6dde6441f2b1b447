#include "client/tls_files.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace strata::client {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;

absl::Status Refused(absl::string_view setting, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(setting, ": ", why));
}

absl::StatusOr<std::string> ReadWhole(const std::string& path, absl::string_view setting) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(setting, ": cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Bio MemBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

std::unique_ptr<X509, X509Free> FirstCertificate(const std::string& pem) {
  Bio bio = MemBio(pem);
  return std::unique_ptr<X509, X509Free>(
      bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
}

std::unique_ptr<EVP_PKEY, KeyFree> PrivateKey(const std::string& pem) {
  Bio bio = MemBio(pem);
  // No passphrase callback: an encrypted key fails here rather than prompting on a terminal.
  return std::unique_ptr<EVP_PKEY, KeyFree>(
      bio ? PEM_read_bio_PrivateKey(
                bio.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr)
          : nullptr);
}

}  // namespace

absl::StatusOr<std::string> ReadCertificatesPem(const std::string& path,
                                                absl::string_view setting) {
  auto pem = ReadWhole(path, setting);
  if (!pem.ok()) return pem.status();
  if (!FirstCertificate(*pem)) {
    ERR_clear_error();  // OpenSSL's queue is per thread; leave it clean for gRPC's handshakes
    return Refused(setting, absl::StrCat(path, " holds no PEM certificate"));
  }
  return pem;
}

absl::StatusOr<std::string> ReadPrivateKeyPem(const std::string& path, absl::string_view setting) {
  auto pem = ReadWhole(path, setting);
  if (!pem.ok()) return pem.status();
  if (!PrivateKey(*pem)) {
    ERR_clear_error();
    return Refused(setting, absl::StrCat(path, " holds no PEM private key (or an encrypted one)"));
  }
  return pem;
}

absl::Status CheckKeyMatchesCertificate(const std::string& cert_pem, const std::string& key_pem,
                                        absl::string_view setting) {
  auto cert = FirstCertificate(cert_pem);
  auto key = PrivateKey(key_pem);
  const bool match = cert && key && X509_check_private_key(cert.get(), key.get()) == 1;
  ERR_clear_error();
  if (!match) return Refused(setting, "is not the private key of the certificate");
  return absl::OkStatus();
}

}  // namespace strata::client
