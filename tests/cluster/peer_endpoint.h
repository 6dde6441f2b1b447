// A loopback gRPC server that stands in for another daemon's network surface in tests that
// drive one part of the cluster layer directly: Peer.Announce and Peer.Locate go to the
// handlers given (the real Announcer or Locator of that test node), and Cache.Connect tells the
// node's UCX worker address (how a Locator learns where to send active messages).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/packed_ids.h"
#include "strata/v1/cache.grpc.pb.h"
#include "strata/v1/peer.grpc.pb.h"

namespace strata::testing {

// gRPC 1.51 runs callback-API completions on a thread pool that it tears down with the last
// channel that used it. A test that drops its channels right after a callback returned races
// that pool's threads still finishing the call (an abort in grpc_cq_internal_unref; see
// grpc/grpc#32584). One such channel kept for the whole run keeps the pool up.
inline void KeepGrpcCallbackPoolAlive() {
  static const bool kept = [] {
    // Static, so the channel stays reachable (and LeakSanitizer quiet) until the process ends.
    static auto* channel = new std::shared_ptr<grpc::Channel>(
        grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials()));
    auto stub = v1::Peer::NewStub(*channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    v1::AnnounceRequest req;
    v1::AnnounceResponse resp;
    std::promise<void> done;
    stub->async()->Announce(&ctx, &req, &resp, [&done](grpc::Status) { done.set_value(); });
    done.get_future().wait();
    return channel != nullptr;
  }();
  (void)kept;
}

class PeerEndpoint {
 public:
  struct Handlers {
    std::function<void(const v1::AnnounceRequest&, std::span<const BlockId>)> announce;
    std::function<void(std::span<const BlockId>, v1::PeerLocateResponse*)> locate;
    std::function<std::string()> worker_address;  // for Cache.Connect; null: empty
  };

  explicit PeerEndpoint(Handlers handlers) : peer_(this), cache_(this), h_(std::move(handlers)) {
    KeepGrpcCallbackPoolAlive();
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    builder.RegisterService(&peer_);
    builder.RegisterService(&cache_);
    server_ = builder.BuildAndStart();
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  ~PeerEndpoint() { Shutdown(); }

  const std::string& address() const { return address_; }
  int announce_calls() const { return announce_calls_.load(); }
  int locate_calls() const { return locate_calls_.load(); }
  // The node goes dead: calls to it fail from now on.
  void Shutdown() {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
  }

 private:
  class Peer final : public v1::Peer::Service {
   public:
    explicit Peer(PeerEndpoint* e) : e_(e) {}
    grpc::Status Announce(grpc::ServerContext*, const v1::AnnounceRequest* req,
                          v1::AnnounceResponse*) override {
      ++e_->announce_calls_;
      auto ids = UnpackIds(req->ids(), "ids", SIZE_MAX);
      if (!ids.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "ids");
      if (e_->h_.announce) e_->h_.announce(*req, *ids);
      return grpc::Status::OK;
    }
    grpc::Status Locate(grpc::ServerContext*, const v1::PeerLocateRequest* req,
                        v1::PeerLocateResponse* resp) override {
      ++e_->locate_calls_;
      auto ids = UnpackIds(req->ids(), "ids", SIZE_MAX);
      if (!ids.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "ids");
      if (e_->h_.locate) e_->h_.locate(*ids, resp);
      return grpc::Status::OK;
    }

   private:
    PeerEndpoint* e_;
  };
  class Cache final : public v1::Cache::Service {
   public:
    explicit Cache(PeerEndpoint* e) : e_(e) {}
    grpc::Status Connect(grpc::ServerContext*, const v1::ConnectRequest*,
                         v1::ConnectResponse* resp) override {
      if (e_->h_.worker_address) resp->set_worker_address(e_->h_.worker_address());
      return grpc::Status::OK;
    }

   private:
    PeerEndpoint* e_;
  };

  Peer peer_;
  Cache cache_;
  Handlers h_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::atomic<int> announce_calls_{0}, locate_calls_{0};
};

}  // namespace strata::testing
