// gRPC stubs to other daemons' Peer services: one channel per address, kept while the cluster
// layer runs (channels reconnect on their own).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "client/channel.h"
#include "strata/v1/peer.grpc.pb.h"

namespace strata::daemon {

class PeerStubs {
 public:
  // `security`: this node's peer token and TLS, used on every call.
  explicit PeerStubs(client::ChannelSecurity security = {}) : security_(std::move(security)) {}
  std::shared_ptr<v1::Peer::Stub> Get(const std::string& address);

 private:
  const client::ChannelSecurity security_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<v1::Peer::Stub>> stubs_;
};

}  // namespace strata::daemon
