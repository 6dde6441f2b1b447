// gRPC channels to a stratad, carrying the caller's bearer token (ClientOptions::auth_token) on
// every call. libstrata, stratactl and daemons calling each other (with the peer token) all
// dial through here, so no call site can forget the token.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace strata::client {

// `auth_token` empty: no authorization metadata (a daemon without auth.tokens_file).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& endpoint,
                                           const std::string& auth_token,
                                           const grpc::ChannelArguments& args = {});

}  // namespace strata::client
