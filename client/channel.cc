#include "client/channel.h"

#include <grpcpp/support/client_interceptor.h>

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/tls_files.h"
#include "common/status_macros.h"

namespace strata::client {
namespace {

namespace gx = grpc::experimental;

// Adds `authorization: Bearer TOKEN` to each call's initial metadata. An interceptor rather than
// gRPC call credentials: those are refused on plaintext channels, and a daemon without TLS (on
// loopback or a Unix socket) still takes tokens.
class BearerInterceptor final : public gx::Interceptor {
 public:
  explicit BearerInterceptor(const std::string* value) : value_(value) {}
  void Intercept(gx::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(gx::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA))
      methods->GetSendInitialMetadata()->insert({"authorization", *value_});
    methods->Proceed();
  }

 private:
  const std::string* value_;
};

class BearerFactory final : public gx::ClientInterceptorFactoryInterface {
 public:
  explicit BearerFactory(const std::string& token) : value_("Bearer " + token) {}
  gx::Interceptor* CreateClientInterceptor(gx::ClientRpcInfo*) override {
    return new BearerInterceptor(&value_);  // the channel owns the factory, hence value_
  }

 private:
  const std::string value_;
};

}  // namespace

absl::StatusOr<ChannelSecurity> LoadChannelSecurity(const TlsOptions& tls,
                                                    const std::string& auth_token,
                                                    const TlsSettingNames& names) {
  ChannelSecurity security;
  security.auth_token = auth_token;
  if (!tls.enabled()) return security;
  if (tls.cert_file.empty() != tls.key_file.empty())
    return absl::InvalidArgumentError(
        absl::StrCat(tls.cert_file.empty() ? names.key_file : names.cert_file, ": needs ",
                     tls.cert_file.empty() ? names.cert_file : names.key_file));
  grpc::SslCredentialsOptions o;
  STRATA_ASSIGN_OR_RETURN(o.pem_root_certs, ReadCertificatesPem(tls.ca_file, names.ca_file));
  if (!tls.cert_file.empty()) {
    STRATA_ASSIGN_OR_RETURN(o.pem_cert_chain, ReadCertificatesPem(tls.cert_file, names.cert_file));
    STRATA_ASSIGN_OR_RETURN(o.pem_private_key, ReadPrivateKeyPem(tls.key_file, names.key_file));
    STRATA_RETURN_IF_ERROR(
        CheckKeyMatchesCertificate(o.pem_cert_chain, o.pem_private_key, names.key_file));
  }
  security.tls = grpc::SslCredentials(o);
  security.server_name = tls.server_name;
  return security;
}

std::string TlsHint(const ChannelSecurity& security, absl::string_view grpc_message) {
  if (security.tls || !(absl::StrContains(grpc_message, "Socket closed") ||
                        absl::StrContains(grpc_message, "Connection reset")))
    return "";
  return " (a daemon that serves TLS closes plaintext connections: set the TLS CA option, "
         "tls.ca_file)";
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& endpoint,
                                           const ChannelSecurity& security,
                                           grpc::ChannelArguments args) {
  // Plaintext unless TLS is configured: see docs/security.md for what that leaves open.
  std::shared_ptr<grpc::ChannelCredentials> creds =
      security.tls ? security.tls : grpc::InsecureChannelCredentials();
  if (security.tls && !security.server_name.empty())
    args.SetSslTargetNameOverride(security.server_name);
  if (security.auth_token.empty()) return grpc::CreateCustomChannel(endpoint, creds, args);
  std::vector<std::unique_ptr<gx::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<BearerFactory>(security.auth_token));
  return gx::CreateCustomChannelWithInterceptors(endpoint, creds, args, std::move(interceptors));
}

}  // namespace strata::client
