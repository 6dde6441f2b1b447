// PEM files for TLS, read and checked when a client connects or a daemon starts: a wrong path, a
// file of the wrong kind or a key that does not belong to its certificate is refused there,
// naming the setting, instead of surfacing later as a handshake that fails on every call.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata::client {

// One or more PEM certificates (a chain, or a bundle of CAs). `setting` names the option in
// errors, e.g. "config field 'tls.cert_file'".
absl::StatusOr<std::string> ReadCertificatesPem(const std::string& path, absl::string_view setting);
// A PEM private key.
absl::StatusOr<std::string> ReadPrivateKeyPem(const std::string& path, absl::string_view setting);
// Whether `key_pem` is the key of the first certificate of `cert_pem` (`setting`: the key's).
absl::Status CheckKeyMatchesCertificate(const std::string& cert_pem, const std::string& key_pem,
                                        absl::string_view setting);

}  // namespace strata::client
