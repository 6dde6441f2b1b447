// The daemon's TLS from its `tls:` config section: credentials for the gRPC server on `listen`,
// and for the calls it makes to other nodes. Files are read and checked here, once, at start: a
// missing or malformed one stops the daemon with the config field's name.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/channel.h"
#include "config/daemon_config.h"

namespace strata::daemon {

// TLS with this node's certificate when tls.cert_file is set (client certificates asked for,
// verified and maybe required per tls.client_ca_file / require_client_cert); plaintext else.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> LoadServerCredentials(
    const TlsConfig& tls);

// What calls to other nodes carry: `peer_token`, and TLS verified against tls.peer_ca_file,
// presenting this node's certificate as a client certificate, when peer_ca_file is set.
absl::StatusOr<client::ChannelSecurity> LoadPeerSecurity(const TlsConfig& tls,
                                                         std::string peer_token);

}  // namespace strata::daemon
