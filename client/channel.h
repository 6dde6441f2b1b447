// gRPC channels to a stratad: TLS when configured, and the caller's bearer token on every call.
// libstrata, stratactl and daemons calling each other (with the peer token and the cluster CA)
// all dial through here, so no call site can forget either.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "strata/client.h"

namespace strata::client {

// How a caller reaches daemons: loaded once (files read and checked), then used for every
// channel it opens.
struct ChannelSecurity {
  // Sent as `authorization: Bearer TOKEN`; empty: none (a daemon without auth.tokens_file, or
  // one that knows the caller by its client certificate).
  std::string auth_token;
  // TLS credentials (CA, optional client certificate); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> tls;
  // TLS: the name the daemon's certificate must carry; empty: the endpoint's host.
  std::string server_name;
};

// Names of the TLS settings in error messages, e.g. "config field 'tls.peer_ca_file'".
struct TlsSettingNames {
  std::string ca_file = "tls.ca_file";
  std::string cert_file = "tls.cert_file";
  std::string key_file = "tls.key_file";
};

// Reads `tls`'s files (nothing when it is not enabled) and adds `auth_token`.
absl::StatusOr<ChannelSecurity> LoadChannelSecurity(const TlsOptions& tls,
                                                    const std::string& auth_token,
                                                    const TlsSettingNames& names = {});

// What to add to an UNAVAILABLE call's message: a daemon serving TLS drops a plaintext
// connection without a word ("Socket closed"), which reads like a daemon that is down.
std::string TlsHint(const ChannelSecurity& security, absl::string_view grpc_message);

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& endpoint,
                                           const ChannelSecurity& security,
                                           grpc::ChannelArguments args = {});

}  // namespace strata::client
