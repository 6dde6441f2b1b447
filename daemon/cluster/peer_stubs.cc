#include "daemon/cluster/peer_stubs.h"

#include <grpcpp/grpcpp.h>

#include "client/channel.h"

namespace strata::daemon {

std::shared_ptr<v1::Peer::Stub> PeerStubs::Get(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& stub = stubs_[address];
  if (!stub) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetMaxSendMessageSize(64 << 20);
    // Fail fast on a dead peer instead of backing off for seconds between reconnects.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    stub = v1::Peer::NewStub(client::MakeChannel(address, security_, std::move(args)));
  }
  return stub;
}

}  // namespace strata::daemon
