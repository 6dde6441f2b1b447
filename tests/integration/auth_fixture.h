// Shared by the tests of authentication and tenant isolation: a daemon with a tokens file
// (tenants a and b, an admin, a peer) and raw gRPC helpers that carry a chosen token.
#pragma once

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "proto/convert.h"
#include "strata/client.h"
#include "strata/v1/cache.grpc.pb.h"

// $STRATA_TEST_STRATAD runs these tests against another stratad binary, e.g. one built before
// the fixes, to see them fail there.
inline std::string StratadUnderTest() {
  const char* other = std::getenv("STRATA_TEST_STRATAD");
  return other != nullptr && *other != '\0' ? other : STRATAD_BUILT_BIN;
}
#define STRATAD_BIN StratadUnderTest()
#include "tests/integration/daemon_process.h"
#include "tests/support/free_port.h"
#include "tests/support/test_data.h"

namespace strata::auth_fixture {

using testing::DaemonProcess;

inline constexpr uint32_t kTokensPerBlock = 16;
inline const std::string kTokenA = "tenant-a-token-0123456789";
inline const std::string kTokenB = "tenant-b-token-0123456789";
inline const std::string kAdminToken = "admin-token-0123456789abc";
inline const std::string kPeerToken = "peer-token-0123456789abcd";

inline NamespaceSpec Spec() {
  NamespaceSpec s;
  s.model_id = "auth-model";
  s.model_revision = "r1";
  s.layout = KvLayout{2, 1, 64, DType::kFloat16, kTokensPerBlock, KvKind::kSeparateKV};
  return s;
}

// A daemon with a tokens file: tenants a and b, an admin and a peer. `auth_lines`: more keys of
// the auth section, each "  key: value\n"; `extra_args` follow on stratad's command line.
inline std::unique_ptr<DaemonProcess> AuthDaemon(const std::string& auth_lines = "",
                                                 std::vector<std::string> extra_args = {}) {
  std::string dir = testing::MakeTempDir("auth");
  std::ofstream(dir + "/tokens") << "# token tenant role\n"
                                 << kTokenA << " a tenant\n"
                                 << kTokenB << " b tenant\n"
                                 << kAdminToken << " ops admin\n"
                                 << kPeerToken << " - peer\n";
  return std::make_unique<DaemonProcess>(
      "host_tier:\n  capacity: 64MiB\nauth:\n  tokens_file: " + dir + "/tokens\n" + auth_lines,
      std::move(extra_args));
}

// A call context with a deadline and, unless `token` is empty, the bearer token.
inline std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (!token.empty()) c->AddMetadata("authorization", "Bearer " + token);
  return c;
}

inline std::shared_ptr<grpc::Channel> Channel(const DaemonProcess& d) {
  return grpc::CreateChannel(d.endpoint(), grpc::InsecureChannelCredentials());
}

// `c` fetches `ids` of `ns` and gets exactly `blocks` (all of one size).
inline void ExpectFetched(Client& c, const NamespaceId& ns, const std::vector<BlockId>& ids,
                          const std::vector<std::vector<uint8_t>>& blocks) {
  ASSERT_FALSE(blocks.empty());
  std::vector<std::vector<uint8_t>> out(blocks.size(), std::vector<uint8_t>(blocks[0].size()));
  std::vector<MutableBuffer> bufs;
  for (auto& o : out) bufs.push_back({o.data(), o.size()});
  auto f = c.Fetch(ns, ids, bufs);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->fetched, blocks.size());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], blocks[i]) << "block " << i;
}

inline std::string Packed(const std::vector<BlockId>& ids) {
  std::string out;
  for (const BlockId& id : ids) out.append(id.AsBytes());
  return out;
}

inline std::unique_ptr<Client> ConnectAs(const DaemonProcess& d, const std::string& token) {
  ClientOptions o;
  o.endpoint = d.endpoint();
  o.auth_token = token;
  o.log = [](LogLevel, std::string_view) {};
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

inline std::string OpenRaw(v1::Cache::Stub& stub, const std::string& token, const std::string& tenant,
                    grpc::Status* status = nullptr) {
  v1::OpenNamespaceRequest req;
  *req.mutable_spec() = ToProto(Spec());
  req.set_tenant(tenant);
  v1::OpenNamespaceResponse resp;
  grpc::Status s = stub.OpenNamespace(Ctx(token).get(), req, &resp);
  if (status) *status = s;
  return resp.namespace_id();
}

}  // namespace strata::auth_fixture
