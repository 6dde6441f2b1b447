#include "daemon/tls_setup.h"

#include "client/tls_files.h"
#include "common/status_macros.h"

namespace strata::daemon {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> LoadServerCredentials(
    const TlsConfig& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  STRATA_ASSIGN_OR_RETURN(
      pair.cert_chain, client::ReadCertificatesPem(tls.cert_file, "config field 'tls.cert_file'"));
  STRATA_ASSIGN_OR_RETURN(pair.private_key,
                          client::ReadPrivateKeyPem(tls.key_file, "config field 'tls.key_file'"));
  STRATA_RETURN_IF_ERROR(client::CheckKeyMatchesCertificate(pair.cert_chain, pair.private_key,
                                                            "config field 'tls.key_file'"));
  // Without a client CA no certificate is asked for; with one, a presented certificate must
  // verify (an unverifiable one fails the handshake), so a certificate Authenticator::Check sees
  // is always one the CA signed.
  grpc::SslServerCredentialsOptions o(
      tls.client_ca_file.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
      : tls.require_client_cert  ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                 : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!tls.client_ca_file.empty()) {
    STRATA_ASSIGN_OR_RETURN(
        o.pem_root_certs,
        client::ReadCertificatesPem(tls.client_ca_file, "config field 'tls.client_ca_file'"));
  }
  o.pem_key_cert_pairs.push_back(std::move(pair));
  return grpc::SslServerCredentials(o);
}

absl::StatusOr<client::ChannelSecurity> LoadPeerSecurity(const TlsConfig& tls,
                                                         std::string peer_token) {
  TlsOptions peer;
  peer.ca_file = tls.peer_ca_file;
  peer.cert_file = tls.cert_file;
  peer.key_file = tls.key_file;
  peer.server_name = tls.peer_server_name;
  return client::LoadChannelSecurity(
      peer, peer_token,
      {"config field 'tls.peer_ca_file'", "config field 'tls.cert_file'",
       "config field 'tls.key_file'"});
}

}  // namespace strata::daemon
