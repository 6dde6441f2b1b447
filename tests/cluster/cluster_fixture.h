// A cluster of real stratad processes on loopback (static membership) and what its tests do
// with it: connect, publish, fetch and compare, wait for the directory.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "strata/client.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/free_port.h"
#include "tests/support/test_data.h"

namespace strata::cluster_fixture {

using testing::DaemonProcess;
using testing::FreePort;
using testing::MakeTempDir;
using testing::Tokens;

constexpr uint32_t kTokensPerBlock = 16;
constexpr size_t kBlockBytes = 64 << 10;

inline NamespaceSpec Spec() { return testing::SmallSpec("cluster-test"); }

class Cluster {
 public:
  // `node0_yaml` is appended to node 0's config (e.g. a small host tier and an NVMe tier).
  // `every_yaml` is appended to the config of every node but one given `node0_yaml`.
  explicit Cluster(int nodes, int replicas = 1, std::string node0_yaml = "",
                   std::string every_yaml = "")
      : node0_yaml_(std::move(node0_yaml)), every_yaml_(std::move(every_yaml)) {
    dir_ = MakeTempDir("cluster");
    std::ofstream(dir_ + "/secret") << "cluster-test-secret-0123456789\n";
    // A port picked free may be taken by the time its daemon binds it: start over then.
    for (int attempt = 0; attempt < 3; ++attempt) {
      daemons_.clear();
      StartAll(nodes, replicas);
      if (ok()) break;
    }
  }

  void StartAll(int nodes, int replicas) {
    std::vector<std::string> addrs;
    for (int i = 0; i < nodes; ++i) addrs.push_back(absl::StrCat("127.0.0.1:", FreePort()));
    std::string peers;
    for (int i = 0; i < nodes; ++i) peers += absl::StrCat("\"n", i, "@", addrs[i], "\", ");
    for (int i = 0; i < nodes; ++i) {
      std::string yaml =
          absl::StrCat("node_id: n", i, "\ncluster_secret_file: ", dir_, "/secret\n",
                       i == 0 && !node0_yaml_.empty() ? "" : "host_tier:\n  capacity: 64MiB\n",
                       "cluster:\n  membership: static\n  static_nodes: [", peers, "]\n",
                       "  replicas: ", replicas, "\n  peer_timeout: 500ms\n  directory_ttl: 30s\n",
                       i == 0 ? absl::StrReplaceAll(node0_yaml_, {{"$DIR", dir_}}) : std::string(),
                       i == 0 && !node0_yaml_.empty() ? std::string() : every_yaml_);
      daemons_.push_back(
          std::make_unique<DaemonProcess>(yaml, std::vector<std::string>{"--listen", addrs[i]}));
    }
  }
  ~Cluster() {
    daemons_.clear();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  bool ok() const { return testing::AllServing(daemons_); }
  std::string logs() const { return testing::AllLogs(daemons_); }
  DaemonProcess& node(int i) { return *daemons_[i]; }
  void Kill(int i) {
    daemons_[i]->Signal(SIGKILL);
    daemons_[i]->WaitExit(std::chrono::seconds(5));
  }

 private:
  std::string dir_;
  std::string node0_yaml_, every_yaml_;
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
};

inline std::unique_ptr<Client> Connect(DaemonProcess& d) {
  ClientOptions o;
  o.endpoint = d.endpoint();
  o.rpc_timeout = absl::Seconds(5);
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

struct Published {
  NamespaceId ns;
  std::vector<uint32_t> tokens;
  std::vector<BlockId> ids;
  std::vector<std::vector<uint8_t>> blocks;
};

inline Published Publish(Client& c, size_t n, uint32_t seed, uint32_t replicas = 0) {
  Published p;
  auto ns = c.OpenNamespace(Spec(), "tenant-a", replicas);
  EXPECT_TRUE(ns.ok()) << ns.status();
  p.ns = *ns;
  p.tokens = Tokens(n * kTokensPerBlock, seed);
  p.blocks = testing::RandomBlocks(n, kBlockBytes, seed);
  std::vector<ConstBuffer> views;
  for (const auto& b : p.blocks) views.push_back({b.data(), b.size()});
  auto r = c.Publish(p.ns, p.tokens, views);
  EXPECT_TRUE(r.ok()) << r.status();
  if (r.ok()) {
    EXPECT_EQ(r->stored, n);
    p.ids = r->ids;
  }
  return p;
}

// Fetches every block of `p` through `c`; returns how many came back byte-identical.
inline size_t FetchIdentical(Client& c, const NamespaceId& ns, const Published& p, size_t* remote) {
  std::vector<std::vector<uint8_t>> out(p.ids.size(), std::vector<uint8_t>(kBlockBytes));
  std::vector<MutableBuffer> bufs;
  for (auto& b : out) bufs.push_back({b.data(), b.size()});
  auto r = c.Fetch(ns, p.ids, bufs);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return 0;
  if (remote) *remote = r->remote;
  size_t same = 0;
  for (size_t i = 0; i < out.size(); ++i)
    same += r->status[i] == BlockStatus::kOk && out[i] == p.blocks[i];
  return same;
}

// Waits (the directory fills asynchronously, in tens of milliseconds) until a lookup through
// `c` sees the whole prefix.
inline size_t AwaitPrefix(Client& c, const NamespaceId& ns, const Published& p) {
  size_t got = 0;
  for (int i = 0; i < 100; ++i) {
    auto r = c.Lookup(ns, p.tokens);
    if (r.ok()) got = r->prefix_blocks;
    if (got == p.ids.size()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return got;
}

}  // namespace strata::cluster_fixture
