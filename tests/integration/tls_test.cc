// Issue 14, item "Identity": TLS on the gRPC listen address, clients known by their certificate
// (mTLS), and TLS between daemons, against real stratad processes. The CAs and certificates are
// made afresh by the openssl CLI for each run; none is committed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "strata/admin_client.h"
#include "strata/client.h"

#define STRATAD_BIN std::string(STRATAD_BUILT_BIN)
#include "tests/integration/daemon_process.h"
#include "tests/support/free_port.h"
#include "tests/support/test_data.h"

namespace strata {
namespace {

using testing::DaemonProcess;
using testing::RandomBlocks;
using testing::Tokens;

constexpr uint32_t kTokensPerBlock = 16;
const std::string kTokenA = "tenant-a-token-0123456789";

NamespaceSpec Spec() {
  NamespaceSpec s;
  s.model_id = "tls-model";
  s.model_revision = "r1";
  s.layout = KvLayout{2, 1, 64, DType::kFloat16, kTokensPerBlock, KvKind::kSeparateKV};
  return s;
}

// A throwaway PKI: the cluster CA, a second CA nobody trusts, and certificates signed by them.
class Pki {
 public:
  Pki() : dir_(testing::MakeTempDir("tls-pki")) {
    std::ofstream(dir_ + "/ca.cnf") << "[req]\ndistinguished_name=dn\nx509_extensions=v3\n"
                                       "prompt=no\n[dn]\nCN=strata-test-ca\n[v3]\n"
                                       "basicConstraints=critical,CA:TRUE\n"
                                       "keyUsage=critical,keyCertSign,cRLSign\n"
                                       "subjectKeyIdentifier=hash\n";
    ok_ = MakeCa("ca") && MakeCa("other-ca");
  }
  ~Pki() { std::filesystem::remove_all(dir_); }

  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  std::string ca() const { return dir_ + "/ca.pem"; }
  std::string other_ca() const { return dir_ + "/other-ca.pem"; }
  std::string cert(const std::string& name) const { return dir_ + "/" + name + ".pem"; }
  std::string key(const std::string& name) const { return dir_ + "/" + name + ".key"; }
  std::string dir() const { return dir_; }

  // A certificate `name` with subject CN `cn`, signed by `ca` ("ca" or "other-ca"); `san` is an
  // openssl subjectAltName value ("" for none), `usage` an extendedKeyUsage.
  bool Issue(const std::string& name, const std::string& cn, const std::string& san,
             const std::string& usage, const std::string& ca = "ca") {
    std::ofstream ext(dir_ + "/" + name + ".ext");
    ext << "basicConstraints=CA:FALSE\nextendedKeyUsage=" << usage << "\n";
    if (!san.empty()) ext << "subjectAltName=" << san << "\n";
    ext.close();
    return Run("openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout " +
               key(name) + " -out " + dir_ + "/" + name + ".csr -subj /CN=" + cn) &&
           Run("openssl x509 -req -in " + dir_ + "/" + name + ".csr -CA " + dir_ + "/" + ca +
               ".pem -CAkey " + dir_ + "/" + ca + ".key -set_serial " + std::to_string(++serial_) +
               " -days 2 -out " + cert(name) + " -extfile " + dir_ + "/" + name + ".ext");
  }
  // A daemon's certificate: a server for 127.0.0.1 and localhost, and a client to its peers.
  bool IssueNode(const std::string& name, const std::string& ca = "ca") {
    return Issue(name, name, "IP:127.0.0.1,DNS:localhost", "serverAuth,clientAuth", ca);
  }
  bool IssueClient(const std::string& name, const std::string& san = "",
                   const std::string& ca = "ca") {
    return Issue(name, name, san, "clientAuth", ca);
  }

 private:
  bool MakeCa(const std::string& name) {
    return Run("openssl req -x509 -config " + dir_ + "/ca.cnf -newkey ec -pkeyopt " +
               "ec_paramgen_curve:prime256v1 -nodes -days 2 -keyout " + key(name) + " -out " +
               cert(name));
  }
  bool Run(const std::string& cmd) {
    auto [code, out] = testing::RunCommand(cmd);
    if (code != 0) error_ += cmd + ":\n" + out;
    return code == 0;
  }

  std::string dir_;
  std::string error_;
  bool ok_ = false;
  int serial_ = 0;
};

// One PKI for the whole suite: generating keys is the slow part.
class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pki_ = new Pki();
    bool ok = pki_->ok() && pki_->IssueNode("n0") && pki_->IssueNode("n1") &&
              pki_->IssueNode("rogue-node", "other-ca") && pki_->IssueClient("engine-a") &&
              pki_->IssueClient("engine-b", "URI:spiffe://strata.test/engine-b") &&
              pki_->IssueClient("ops") && pki_->IssueClient("stranger") &&
              pki_->IssueClient("forged-a", "", "other-ca");
    if (!ok) error_ = new std::string(pki_->error());
  }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }
  void SetUp() override {
    if (error_ != nullptr) GTEST_FAIL() << "cannot make test certificates:\n" << *error_;
  }

  // A daemon serving TLS with node certificate n0; `extra` adds config (its own `tls:` lines go
  // under the section).
  static std::unique_ptr<DaemonProcess> TlsDaemon(const std::string& tls_extra = "",
                                                  const std::string& extra = "") {
    return std::make_unique<DaemonProcess>(
        "host_tier:\n  capacity: 64MiB\ntls:\n  cert_file: " + pki_->cert("n0") +
        "\n  key_file: " + pki_->key("n0") + "\n" + tls_extra + extra);
  }
  // mTLS with client certificates required, and a tokens file mapping them: engine-a (by CN)
  // to tenant a, engine-b (by its URI SAN) to tenant b, ops to admin, plus tenant a's token.
  static std::unique_ptr<DaemonProcess> MtlsDaemon() {
    const std::string tokens = pki_->dir() + "/mtls-tokens";
    std::ofstream(tokens) << "cn:engine-a a tenant\n"
                          << "san:spiffe://strata.test/engine-b b tenant\n"
                          << "cn:ops ops admin\n"
                          << kTokenA << " a tenant\n";
    return TlsDaemon("  client_ca_file: " + pki_->ca() + "\n  require_client_cert: true\n",
                     "auth:\n  tokens_file: " + tokens + "\n");
  }

  static ClientOptions Options(const DaemonProcess& d, const std::string& ca = "",
                               const std::string& client = "") {
    ClientOptions o;
    o.endpoint = d.endpoint();
    o.rpc_timeout = absl::Seconds(3);
    o.tls.ca_file = ca;
    if (!client.empty()) {
      o.tls.cert_file = pki_->cert(client);
      o.tls.key_file = pki_->key(client);
    }
    o.log = [](LogLevel, std::string_view) {};
    return o;
  }

  static Pki* pki_;
  static std::string* error_;
};
Pki* TlsTest::pki_ = nullptr;
std::string* TlsTest::error_ = nullptr;

// Publishes 3 blocks and reads them back through `c`, byte for byte.
void Roundtrip(Client& c, const NamespaceId& ns, uint32_t seed) {
  auto tokens = Tokens(3 * kTokensPerBlock, seed);
  auto blocks = RandomBlocks(3, 4096, seed);
  auto pub = c.Publish(ns, tokens, testing::BufferViews(blocks));
  ASSERT_TRUE(pub.ok()) << pub.status();
  EXPECT_EQ(pub->stored, 3u);
  auto look = c.Lookup(ns, tokens);
  ASSERT_TRUE(look.ok()) << look.status();
  ASSERT_EQ(look->prefix_blocks, 3u);
  std::vector<std::vector<uint8_t>> out(3, std::vector<uint8_t>(4096));
  std::vector<MutableBuffer> bufs;
  for (auto& b : out) bufs.push_back({b.data(), b.size()});
  auto fetched = c.Fetch(ns, look->ids, bufs);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->fetched, 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(out[i], blocks[i]) << i;
}

// ---- TLS on listen ---------------------------------------------------------------------------

TEST_F(TlsTest, ClientWithTheRightCaPublishesAndFetches) {
  auto d = TlsDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  EXPECT_NE(d->log().find("TLS on"), std::string::npos) << d->log();
  auto c = Client::Connect(Options(*d, pki_->ca()));
  ASSERT_TRUE(c.ok()) << c.status();
  auto ns = (*c)->OpenNamespace(Spec(), "t");
  ASSERT_TRUE(ns.ok()) << ns.status();
  Roundtrip(**c, *ns, 1);
  // The operator's client too.
  AdminClientOptions ao;
  ao.endpoint = d->endpoint();
  ao.tls.ca_file = pki_->ca();
  auto admin = AdminClient::Connect(ao);
  ASSERT_TRUE(admin.ok()) << admin.status();
  auto listed = (*admin)->ListNamespaces();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 1u);
}

TEST_F(TlsTest, PlaintextClientIsRefused) {
  auto d = TlsDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  auto c = Client::Connect(Options(*d));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_NE(c.status().message().find(d->endpoint()), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("tls.ca_file"), std::string::npos) << c.status();
}

TEST_F(TlsTest, WrongCaIsRefused) {
  auto d = TlsDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  auto c = Client::Connect(Options(*d, pki_->other_ca()));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  // A certificate for another name: refused too, unless the client says which name to expect.
  ClientOptions o = Options(*d, pki_->ca());
  o.tls.server_name = "n1.strata.test";
  EXPECT_FALSE(Client::Connect(o).ok());
}

TEST_F(TlsTest, BearerTokensTravelInsideTls) {
  const std::string tokens = pki_->dir() + "/tokens";
  std::ofstream(tokens) << kTokenA << " a tenant\n";
  auto d = TlsDaemon("", "auth:\n  tokens_file: " + tokens + "\n");
  ASSERT_TRUE(d->ok()) << d->log();
  ClientOptions o = Options(*d, pki_->ca());
  auto anonymous = Client::Connect(o);
  ASSERT_FALSE(anonymous.ok());
  EXPECT_EQ(anonymous.status().code(), absl::StatusCode::kUnauthenticated) << anonymous.status();
  o.auth_token = kTokenA;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto ns = (*c)->OpenNamespace(Spec(), "");
  ASSERT_TRUE(ns.ok()) << ns.status();
  Roundtrip(**c, *ns, 2);
}

// ---- mTLS: identity from the client certificate ---------------------------------------------

TEST_F(TlsTest, RequiredClientCertificateRefusesClientsWithout) {
  auto d = MtlsDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  // No certificate, even with a valid token: the handshake fails.
  ClientOptions o = Options(*d, pki_->ca());
  o.auth_token = kTokenA;
  auto none = Client::Connect(o);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable) << none.status();
  // A certificate another CA signed, naming a known CN: refused by the handshake.
  auto forged = Client::Connect(Options(*d, pki_->ca(), "forged-a"));
  ASSERT_FALSE(forged.ok());
  EXPECT_EQ(forged.status().code(), absl::StatusCode::kUnavailable) << forged.status();
  // A certificate the CA signed but the tokens file does not map, without a token.
  auto stranger = Client::Connect(Options(*d, pki_->ca(), "stranger"));
  ASSERT_FALSE(stranger.ok());
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kUnauthenticated) << stranger.status();
  EXPECT_NE(stranger.status().message().find("CN=stranger"), std::string::npos)
      << stranger.status();
  // ... which a token still identifies.
  o = Options(*d, pki_->ca(), "stranger");
  o.auth_token = kTokenA;
  EXPECT_TRUE(Client::Connect(o).ok());
}

TEST_F(TlsTest, CertificateDecidesTheTenant) {
  auto d = MtlsDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  auto a = Client::Connect(Options(*d, pki_->ca(), "engine-a"));
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = Client::Connect(Options(*d, pki_->ca(), "engine-b"));  // known by its URI SAN
  ASSERT_TRUE(b.ok()) << b.status();
  auto ns_a = (*a)->OpenNamespace(Spec(), "a");
  ASSERT_TRUE(ns_a.ok()) << ns_a.status();
  Roundtrip(**a, *ns_a, 3);
  // The request's tenant may only repeat the certificate's.
  auto as_b = (*a)->OpenNamespace(Spec(), "b");
  ASSERT_FALSE(as_b.ok());
  EXPECT_EQ(as_b.status().code(), absl::StatusCode::kPermissionDenied) << as_b.status();
  auto ns_b = (*b)->OpenNamespace(Spec(), "");
  ASSERT_TRUE(ns_b.ok()) << ns_b.status();
  EXPECT_NE(*ns_b, *ns_a);
  Roundtrip(**b, *ns_b, 4);
  // Tenant a cannot reach tenant b's blocks, nor b a's.
  auto tokens = Tokens(3 * kTokensPerBlock, 4);
  auto ids = (*b)->BlockIds(*ns_b, tokens);
  ASSERT_TRUE(ids.ok()) << ids.status();
  auto peek = (*a)->LookupIds(*ns_b, *ids);
  ASSERT_FALSE(peek.ok());
  EXPECT_EQ(peek.status().code(), absl::StatusCode::kPermissionDenied) << peek.status();
  auto evict = (*b)->Evict(*ns_a, (*a)->BlockIds(*ns_a, Tokens(3 * kTokensPerBlock, 3)).value());
  ASSERT_FALSE(evict.ok());
  EXPECT_EQ(evict.status().code(), absl::StatusCode::kPermissionDenied) << evict.status();

  // The admin certificate reaches Admin; a tenant's does not.
  AdminClientOptions ao;
  ao.endpoint = d->endpoint();
  ao.tls.ca_file = pki_->ca();
  ao.tls.cert_file = pki_->cert("engine-a");
  ao.tls.key_file = pki_->key("engine-a");
  auto tenant_admin = AdminClient::Connect(ao);
  ASSERT_TRUE(tenant_admin.ok()) << tenant_admin.status();
  EXPECT_EQ((*tenant_admin)->ListNamespaces().status().code(), absl::StatusCode::kPermissionDenied);
  ao.tls.cert_file = pki_->cert("ops");
  ao.tls.key_file = pki_->key("ops");
  auto admin = AdminClient::Connect(ao);
  ASSERT_TRUE(admin.ok()) << admin.status();
  auto listed = (*admin)->ListNamespaces();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 2u);
}

// ---- Between daemons --------------------------------------------------------------------------

// Two nodes with mTLS everywhere and no peer tokens: each node's certificate (CN n0, n1) is its
// peer identity. Replication (n1 pulls from n0 through n0's Cache service), directory locates
// and a client's remote fetch all cross TLS.
TEST_F(TlsTest, ClusterOfTwoWithMutualTls) {
  const std::string dir = testing::MakeTempDir("tls-cluster");
  std::ofstream(dir + "/tokens") << "cn:n0 - peer\ncn:n1 - peer\ncn:engine-a a tenant\n";
  std::ofstream(dir + "/secret") << "tls-cluster-secret-0123456789\n";
  std::vector<std::unique_ptr<DaemonProcess>> nodes;
  for (int attempt = 0; attempt < 3 && !(nodes.size() == 2 && testing::AllServing(nodes));
       ++attempt) {
    nodes.clear();
    std::string addrs[2] = {"127.0.0.1:" + std::to_string(testing::FreePort()),
                            "127.0.0.1:" + std::to_string(testing::FreePort())};
    for (int i = 0; i < 2; ++i) {
      const std::string n = "n" + std::to_string(i);
      nodes.push_back(std::make_unique<DaemonProcess>(
          "node_id: " + n + "\ncluster_secret_file: " + dir +
              "/secret\nhost_tier:\n  capacity: 64MiB\nauth:\n  tokens_file: " + dir +
              "/tokens\ntls:\n  cert_file: " + pki_->cert(n) + "\n  key_file: " + pki_->key(n) +
              "\n  client_ca_file: " + pki_->ca() + "\n  require_client_cert: true\n" +
              "  peer_ca_file: " + pki_->ca() +
              "\ncluster:\n  membership: static\n  static_nodes: [\"n0@" + addrs[0] + "\", \"n1@" +
              addrs[1] + "\"]\n  peer_timeout: 500ms\n",
          std::vector<std::string>{"--listen", addrs[i]}));
    }
  }
  ASSERT_TRUE(testing::AllServing(nodes)) << testing::AllLogs(nodes);
  auto a0 = Client::Connect(Options(*nodes[0], pki_->ca(), "engine-a"));
  ASSERT_TRUE(a0.ok()) << a0.status();
  auto a1 = Client::Connect(Options(*nodes[1], pki_->ca(), "engine-a"));
  ASSERT_TRUE(a1.ok()) << a1.status();
  auto blocks = RandomBlocks(3, 4096, 8);
  std::vector<std::vector<uint8_t>> out(3, std::vector<uint8_t>(4096));
  std::vector<MutableBuffer> bufs;
  for (auto& b : out) bufs.push_back({b.data(), b.size()});

  // Replicated: n1 pulls each block from n0 before Commit returns; n1 then holds them itself.
  auto rep = (*a0)->OpenNamespace(Spec(), "", /*replicas=*/2);
  ASSERT_TRUE(rep.ok()) << rep.status();
  auto rep_tokens = Tokens(3 * kTokensPerBlock, 8);
  auto pub = (*a0)->Publish(*rep, rep_tokens, testing::BufferViews(blocks));
  ASSERT_TRUE(pub.ok()) << pub.status();
  ASSERT_EQ(*(*a1)->OpenNamespace(Spec(), "a"), *rep);
  auto look = (*a1)->Lookup(*rep, rep_tokens);
  ASSERT_TRUE(look.ok()) << look.status();
  ASSERT_EQ(look->prefix_blocks, 3u) << testing::AllLogs(nodes);
  auto fetched = (*a1)->Fetch(*rep, look->ids, bufs);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->fetched, 3u) << testing::AllLogs(nodes);
  EXPECT_EQ(fetched->remote, 0u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(out[i], blocks[i]) << i;

  // One copy, on n0: n1 finds it through the directory (announced and located over TLS) and
  // the client fetches it from n0 with its own certificate.
  NamespaceSpec single = Spec();
  single.model_id = "tls-model-single";
  auto one = (*a0)->OpenNamespace(single, "", /*replicas=*/1);
  ASSERT_TRUE(one.ok()) << one.status();
  auto one_tokens = Tokens(3 * kTokensPerBlock, 9);
  ASSERT_TRUE((*a0)->Publish(*one, one_tokens, testing::BufferViews(blocks)).ok());
  ASSERT_EQ(*(*a1)->OpenNamespace(single, ""), *one);
  absl::StatusOr<LookupResult> found;
  for (int i = 0; i < 100; ++i) {  // announcements are asynchronous
    found = (*a1)->Lookup(*one, one_tokens);
    if (found.ok() && found->prefix_blocks == 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(found.ok()) << found.status();
  ASSERT_EQ(found->prefix_blocks, 3u) << testing::AllLogs(nodes);
  for (const std::string& node : found->nodes) EXPECT_EQ(node, "n0");
  for (auto& b : out) std::fill(b.begin(), b.end(), 0);
  fetched = (*a1)->Fetch(*one, found->ids, bufs);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->fetched, 3u) << testing::AllLogs(nodes);
  EXPECT_EQ(fetched->remote, 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(out[i], blocks[i]) << i;
  std::filesystem::remove_all(dir);
}

// A node whose certificate another CA signed cannot join: its calls fail the handshake.
TEST_F(TlsTest, NodeWithAForeignCertificateIsNotAPeer) {
  auto d = MtlsDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  ClientOptions o = Options(*d, pki_->ca(), "rogue-node");
  auto c = Client::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
}

// ---- Configuration errors name the field ------------------------------------------------------

TEST_F(TlsTest, BadFilesStopTheDaemonNamingTheField) {
  const std::string garbage = pki_->dir() + "/garbage.pem";
  std::ofstream(garbage) << "not a certificate\n";
  struct Case {
    std::string tls;
    std::string field;
    int exit_code;
  };
  const std::string cert = "  cert_file: " + pki_->cert("n0") + "\n";
  const std::string key = "  key_file: " + pki_->key("n0") + "\n";
  const std::vector<Case> cases = {
      {"  cert_file: /nonexistent/n0.pem\n" + key, "tls.cert_file", 1},
      {"  cert_file: " + garbage + "\n" + key, "tls.cert_file", 1},
      {cert + "  key_file: /nonexistent/n0.key\n", "tls.key_file", 1},
      {cert + "  key_file: " + garbage + "\n", "tls.key_file", 1},
      {cert + "  key_file: " + pki_->key("n1") + "\n", "tls.key_file", 1},  // not n0's key
      {cert + key + "  client_ca_file: " + garbage + "\n", "tls.client_ca_file", 1},
      {cert + key + "  peer_ca_file: /nonexistent/ca.pem\n", "tls.peer_ca_file", 1},
      {cert, "tls.cert_file", 2},
      {cert + key + "  require_client_cert: true\n", "tls.require_client_cert", 2},
      {"  client_ca_file: " + pki_->ca() + "\n", "tls.client_ca_file", 2},
  };
  for (const Case& c : cases) {
    DaemonProcess d("host_tier:\n  capacity: 64MiB\ntls:\n" + c.tls);
    EXPECT_FALSE(d.ok()) << c.tls;
    EXPECT_EQ(d.WaitExit(std::chrono::seconds(10)), std::optional<int>(c.exit_code))
        << c.tls << d.log();
    EXPECT_NE(d.log().find("'" + c.field + "'"), std::string::npos) << c.tls << d.log();
  }
  // Certificate lines in the tokens file without a client CA: no certificate would ever be
  // verified, so the file is refused rather than silently never matching.
  const std::string tokens = pki_->dir() + "/cn-tokens";
  std::ofstream(tokens) << "cn:engine-a a tenant\n";
  DaemonProcess d("host_tier:\n  capacity: 64MiB\nauth:\n  tokens_file: " + tokens + "\ntls:\n" +
                  cert + key);
  EXPECT_EQ(d.WaitExit(std::chrono::seconds(10)), std::optional<int>(1)) << d.log();
  EXPECT_NE(d.log().find("'auth.tokens_file'"), std::string::npos) << d.log();
}

TEST_F(TlsTest, BadClientFilesFailConnectNamingTheField) {
  auto d = TlsDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  auto missing = Client::Connect(Options(*d, "/nonexistent/ca.pem"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("tls.ca_file"), std::string::npos) << missing.status();
  ClientOptions o = Options(*d, pki_->ca(), "engine-a");
  o.tls.key_file = pki_->key("engine-b");
  auto mismatched = Client::Connect(o);
  ASSERT_FALSE(mismatched.ok());
  EXPECT_NE(mismatched.status().message().find("tls.key_file"), std::string::npos)
      << mismatched.status();
  o.tls.key_file.clear();
  auto half = Client::Connect(o);
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.status().message().find("tls.cert_file"), std::string::npos) << half.status();
}

}  // namespace
}  // namespace strata
