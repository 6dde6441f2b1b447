#include "client/channel.h"

#include <grpcpp/support/client_interceptor.h>

#include <utility>
#include <vector>

namespace strata::client {
namespace {

namespace gx = grpc::experimental;

// Adds `authorization: Bearer TOKEN` to each call's initial metadata.
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

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& endpoint,
                                           const std::string& auth_token,
                                           const grpc::ChannelArguments& args) {
  // Plaintext: see docs/security.md for what that leaves open on a shared network.
  auto creds = grpc::InsecureChannelCredentials();
  if (auth_token.empty()) return grpc::CreateCustomChannel(endpoint, creds, args);
  std::vector<std::unique_ptr<gx::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<BearerFactory>(auth_token));
  return gx::CreateCustomChannelWithInterceptors(endpoint, creds, args, std::move(interceptors));
}

}  // namespace strata::client
