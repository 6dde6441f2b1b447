// gRPC stubs to other daemons' Peer services: one channel per address, kept while the cluster
// layer runs (channels reconnect on their own).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "strata/v1/peer.grpc.pb.h"

namespace strata::daemon {

class PeerStubs {
 public:
  // `token`: this node's peer token, sent on every call; empty: none.
  explicit PeerStubs(std::string token = "") : token_(std::move(token)) {}
  std::shared_ptr<v1::Peer::Stub> Get(const std::string& address);

 private:
  const std::string token_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<v1::Peer::Stub>> stubs_;
};

}  // namespace strata::daemon
