// Chaos (issue 14 item 7): three real stratad processes in one cluster (static membership) under
// a storm of publishes and fetches from several client threads, while one daemon at a time is
// killed with SIGKILL and restarted on the same address. Whatever the timing, these must hold:
//  - a block a fetch reports kOk holds exactly the bytes published under its id (a block's
//    bytes are a function of its id's seed, so every fetched byte is checked, remote or local);
//  - no client call runs much past its deadlines (a hang shows up as a long call);
//  - the storm makes progress again after the restarts, on every client;
//  - the daemons that were not killed are still running at the end.
// STRATA_CHAOS_SECONDS lengthens the storm for soaks (default 25 s, to fit CI).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "strata/client.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/free_port.h"
#include "tests/support/test_data.h"

namespace strata {
namespace {

using testing::DaemonProcess;
using Clock = std::chrono::steady_clock;

constexpr int kNodes = 3;
constexpr int kClients = 4;  // client t talks to node t % kNodes: node 0 has two
constexpr size_t kBlocksPerPublish = 4;
constexpr uint32_t kTokensPerBlock = 16;
constexpr size_t kMaxBlockBytes = 64 << 10;
constexpr absl::Duration kRpcTimeout = absl::Seconds(2);
constexpr absl::Duration kTransferTimeout = absl::Seconds(2);
// After a failed call, as an engine would, rather than spinning on a dead daemon (which would
// only inflate the failure counts and starve the daemons of CPU).
constexpr auto kBackoff = std::chrono::milliseconds(20);

uint64_t SplitMix(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t x = a ^ (b * 0xD6E8FEB86659FD93ull);
  return SplitMix(x);
}

// Everything about one publish follows from its seed: the tokens (hence the block ids, a hash
// chain over them) and each block's size and bytes. Any id a fetch returns can be checked
// without remembering what was sent, including ids whose publish failed part-way.
std::vector<uint32_t> TokensOf(uint64_t seed) {
  std::vector<uint32_t> t(kBlocksPerPublish * kTokensPerBlock);
  uint64_t x = seed;
  for (auto& v : t) v = static_cast<uint32_t>(SplitMix(x) % 128000);
  return t;
}

size_t BlockSizeOf(uint64_t seed, size_t k) { return 4096 * (1 + Mix(seed, k) % 16); }

std::vector<uint8_t> BlockOf(uint64_t seed, size_t k) {
  std::vector<uint8_t> b(BlockSizeOf(seed, k));
  uint64_t x = Mix(seed, k + 1000);
  for (size_t i = 0; i < b.size(); i += 8) {
    uint64_t v = SplitMix(x);
    std::memcpy(b.data() + i, &v, std::min<size_t>(8, b.size() - i));
  }
  return b;
}

// What the storm has tried to publish: seeds and the ids they give.
class Registry {
 public:
  struct Entry {
    uint64_t seed;
    std::vector<BlockId> ids;
  };
  void Add(Entry e) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.push_back(std::move(e));
  }
  // Mostly recent entries (likely still cached somewhere), sometimes any.
  std::optional<Entry> Pick(std::mt19937_64& rng) {
    std::lock_guard<std::mutex> lock(mu_);
    if (entries_.empty()) return std::nullopt;
    const size_t n = entries_.size();
    const size_t window = rng() % 5 == 0 ? n : std::min<size_t>(n, 64);
    return entries_[n - 1 - rng() % window];
  }

 private:
  std::mutex mu_;
  std::vector<Entry> entries_;
};

struct Counters {
  std::atomic<uint64_t> publish_ok{0}, publish_failed{0}, blocks_stored{0}, blocks_existed{0},
      blocks_refused{0};
  std::atomic<uint64_t> fetch_ok{0}, fetch_failed{0}, blocks_ok{0}, blocks_remote{0},
      blocks_missed{0}, blocks_crc{0}, blocks_other{0}, wrong_bytes{0};
  std::atomic<int64_t> max_call_us{0};
  std::atomic<uint64_t> log_lines{0};

  std::mutex mu;
  std::map<std::string, uint64_t> errors;   // "publish UNAVAILABLE" -> count
  std::map<std::string, std::string> example;  // one message per key
  std::string slowest;                         // the longest call and how it ended

  void Failed(const char* op, const absl::Status& s) {
    const std::string key = absl::StrCat(op, " ", absl::StatusCodeToString(s.code()));
    std::lock_guard<std::mutex> lock(mu);
    ++errors[key];
    example.emplace(key, std::string(s.message()));
  }
  void Took(const char* op, Clock::duration d, const absl::Status& s) {
    const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(d).count();
    int64_t prev = max_call_us.load();
    while (us > prev && !max_call_us.compare_exchange_weak(prev, us)) {
    }
    if (us >= prev) {
      std::lock_guard<std::mutex> lock(mu);
      if (us >= max_call_us.load())
        slowest = absl::StrCat(op, " ", us / 1000, " ms: ", s.ok() ? "OK" : s.ToString());
    }
  }
};

// The last time each client thread saw a call succeed, per kind.
struct Progress {
  std::atomic<int64_t> last_publish_ok{0};
  std::atomic<int64_t> last_fetch_ok{0};  // a fetch with at least one block served
  std::atomic<uint64_t> remote_ok{0};
  std::atomic<uint64_t> publish_failed{0}, fetch_failed{0}, refused{0};
  std::mutex mu;
  std::string last_error;  // for the report of a client that stopped making progress
  void Error(const absl::Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    last_error = s.ToString();
  }
};

int64_t Now() { return Clock::now().time_since_epoch().count(); }

int StormSeconds() {
  const char* env = std::getenv("STRATA_CHAOS_SECONDS");
  int s = env ? std::atoi(env) : 0;
  return s > 0 ? s : 25;
}

class ChaosCluster {
 public:
  ChaosCluster() {
    dir_ = testing::MakeTempDir("chaos");
    std::ofstream(dir_ + "/secret") << "chaos-test-secret-0123456789abcdef\n";
    // A port picked free may be taken by the time its daemon binds it: start over then.
    for (int attempt = 0; attempt < 3 && !AllStarted(); ++attempt) StartAll();
  }
  ~ChaosCluster() {
    daemons_.clear();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  bool AllStarted() const { return daemons_.size() == kNodes && testing::AllServing(daemons_); }
  DaemonProcess& node(int i) { return *daemons_[i]; }
  std::string logs() const { return testing::AllLogs(daemons_); }

  void Kill(int i) {
    daemons_[i]->Signal(SIGKILL);
    daemons_[i]->WaitExit(std::chrono::seconds(5));
  }
  // The same config on the same address, as an operator's restart (or a DaemonSet's) would.
  // The old process's log is kept beside the new one.
  bool Restart(int i) {
    old_logs_ += absl::StrCat("--- n", i, " before restart ---\n", daemons_[i]->log());
    for (int attempt = 0; attempt < 5; ++attempt) {
      daemons_[i] = Start(i);
      if (daemons_[i]->ok()) return true;
      old_logs_ += absl::StrCat("--- n", i, " failed restart ---\n", daemons_[i]->log());
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    return false;
  }
  const std::string& old_logs() const { return old_logs_; }

 private:
  void StartAll() {
    daemons_.clear();
    addrs_.clear();
    for (int i = 0; i < kNodes; ++i)
      addrs_.push_back(absl::StrCat("127.0.0.1:", testing::FreePort()));
    peers_.clear();
    for (int i = 0; i < kNodes; ++i) peers_ += absl::StrCat("\"n", i, "@", addrs_[i], "\", ");
    for (int i = 0; i < kNodes; ++i) daemons_.push_back(Start(i));
  }
  std::unique_ptr<DaemonProcess> Start(int i) {
    std::string yaml = absl::StrCat(
        "node_id: n", i, "\ncluster_secret_file: ", dir_, "/secret\n",
        "host_tier:\n  capacity: 64MiB\n", "cluster:\n  membership: static\n  static_nodes: [",
        peers_, "]\n  peer_timeout: 500ms\n  directory_ttl: 30s\n");
    return std::make_unique<DaemonProcess>(yaml, std::vector<std::string>{"--listen", addrs_[i]});
  }

  std::string dir_, peers_, old_logs_;
  std::vector<std::string> addrs_;
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
};

// One client thread's storm: publishes of fresh seeds, fetches of anything tried before.
void Storm(int t, Client& client, const NamespaceId& ns, Registry& registry, Counters& c,
           Progress& progress, const std::atomic<bool>& stop) {
  std::mt19937_64 rng(0xC4A05 + t);
  uint64_t next = 0;
  std::vector<std::vector<uint8_t>> out(kBlocksPerPublish, std::vector<uint8_t>(kMaxBlockBytes));
  std::vector<MutableBuffer> bufs;
  for (auto& b : out) bufs.push_back({b.data(), b.size()});
  while (!stop.load()) {
    if (rng() % 5 < 2) {
      const uint64_t seed = (static_cast<uint64_t>(t + 1) << 40) | next++;
      const std::vector<uint32_t> tokens = TokensOf(seed);
      auto ids = client.BlockIds(ns, tokens);
      ASSERT_TRUE(ids.ok()) << ids.status();
      std::vector<std::vector<uint8_t>> blocks;
      for (size_t k = 0; k < kBlocksPerPublish; ++k) blocks.push_back(BlockOf(seed, k));
      const auto views = testing::BufferViews(blocks);
      registry.Add({seed, *ids});  // before the call: a failed publish may still have landed
      const auto t0 = Clock::now();
      auto r = client.Publish(ns, tokens, views);
      c.Took("publish", Clock::now() - t0, r.status());
      if (!r.ok()) {
        ++c.publish_failed;
        ++progress.publish_failed;
        progress.Error(r.status());
        c.Failed("publish", r.status());
        std::this_thread::sleep_for(kBackoff);
        continue;
      }
      ++c.publish_ok;
      for (BlockStatus s : r->status) {
        if (s == BlockStatus::kOk) {
          ++c.blocks_stored;
        } else if (s == BlockStatus::kExists) {
          ++c.blocks_existed;
        }
        else {
          ++c.blocks_refused;
          ++progress.refused;
        }
      }
      if (r->stored + r->deduplicated > 0) progress.last_publish_ok = Now();
    } else {
      auto e = registry.Pick(rng);
      if (!e) continue;
      const auto t0 = Clock::now();
      auto r = client.Fetch(ns, e->ids, bufs);
      c.Took("fetch", Clock::now() - t0, r.status());
      if (!r.ok()) {
        ++c.fetch_failed;
        ++progress.fetch_failed;
        progress.Error(r.status());
        c.Failed("fetch", r.status());
        std::this_thread::sleep_for(kBackoff);
        continue;
      }
      ++c.fetch_ok;
      c.blocks_remote += r->remote;
      progress.remote_ok += r->remote;
      bool any = false;
      for (size_t k = 0; k < e->ids.size(); ++k) {
        switch (r->status[k]) {
          case BlockStatus::kOk: {
            ++c.blocks_ok;
            any = true;
            const std::vector<uint8_t> want = BlockOf(e->seed, k);
            if (r->sizes[k] != want.size() || std::memcmp(out[k].data(), want.data(), want.size())) {
              ++c.wrong_bytes;
              ADD_FAILURE() << "block " << k << " of seed " << e->seed << ": " << r->sizes[k]
                            << " bytes, want " << want.size() << (r->remote ? " (remote)" : "");
            }
            break;
          }
          case BlockStatus::kNotFound: ++c.blocks_missed; break;
          case BlockStatus::kCrcMismatch: ++c.blocks_crc; break;
          default: ++c.blocks_other; break;
        }
      }
      if (any) progress.last_fetch_ok = Now();
    }
  }
}

TEST(ChaosTest, KillAndRestartDaemonsDuringAPublishFetchStorm) {
  const auto storm = std::chrono::seconds(StormSeconds());
  ChaosCluster cl;
  ASSERT_TRUE(cl.AllStarted()) << cl.logs();

  Counters c;
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<NamespaceId> ns;
  for (int t = 0; t < kClients; ++t) {
    ClientOptions o;
    o.endpoint = cl.node(t % kNodes).endpoint();
    o.client_name = absl::StrCat("chaos-", t);
    o.rpc_timeout = kRpcTimeout;
    o.transfer_timeout = kTransferTimeout;
    // The last client trusts the transfer (no CRC check of fetched blocks), as an engine may to
    // save the pass: only this test's own byte check then stands between it and bad bytes.
    o.verify_crc = t != kClients - 1;
    // Reconnect notices are expected here; counted, not printed.
    o.log = [&c](LogLevel, std::string_view) { ++c.log_lines; };
    auto client = Client::Connect(o);
    ASSERT_TRUE(client.ok()) << client.status();
    auto opened = (*client)->OpenNamespace(testing::SmallSpec("chaos-test"), "tenant-chaos");
    ASSERT_TRUE(opened.ok()) << opened.status();
    ns.push_back(*opened);
    clients.push_back(std::move(*client));
  }
  for (int t = 1; t < kClients; ++t) ASSERT_EQ(ns[t], ns[0]) << "one namespace on every node";

  Registry registry;
  std::vector<Progress> progress(kClients);
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (int t = 0; t < kClients; ++t)
    threads.emplace_back([&, t] { Storm(t, *clients[t], ns[t], registry, c, progress[t], stop); });

  // One victim at a time: down for a while (its clients see a dead daemon, its peers a dead
  // peer), then back on the same address with empty tiers. The storm runs on for `tail` after
  // the last restart so recovery can be judged.
  const auto end = start + storm;
  const auto warmup = std::min<Clock::duration>(std::chrono::seconds(3), storm / 6);
  const auto down = std::chrono::milliseconds(1500);
  const auto up = std::chrono::seconds(3);
  const auto tail = std::max<Clock::duration>(std::chrono::seconds(6), storm / 5);
  std::this_thread::sleep_for(warmup);
  int restarts = 0, victim = 0;
  std::string crashed;
  int64_t last_restart = 0;
  auto check_survivors = [&](int except) {
    for (int i = 0; i < kNodes; ++i)
      if (i != except && !cl.node(i).Running() && crashed.empty())
        crashed = absl::StrCat("n", i, " (", cl.node(i).ExitDescription(), ")");
  };
  do {
    check_survivors(-1);
    cl.Kill(victim);
    std::this_thread::sleep_for(down);
    check_survivors(victim);
    if (!cl.Restart(victim)) {
      ADD_FAILURE() << "n" << victim << " did not restart";
      break;
    }
    ++restarts;
    last_restart = Now();
    victim = (victim + 1) % kNodes;
    std::this_thread::sleep_for(up);
  } while (Clock::now() + down + up + tail < end);
  std::this_thread::sleep_until(std::max(end, Clock::now() + tail));
  stop = true;
  for (auto& th : threads) th.join();
  check_survivors(-1);

  std::string errors;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    for (const auto& [key, n] : c.errors)
      absl::StrAppend(&errors, "\n  ", key, " x", n, " e.g. \"", c.example[key], "\"");
  }
  const std::string summary = absl::StrCat(
      "chaos: ", std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start).count(),
      " s, restarts ", restarts, "; publishes ok ", c.publish_ok.load(), " failed ",
      c.publish_failed.load(), " (blocks stored ", c.blocks_stored.load(), " existed ",
      c.blocks_existed.load(), " refused ", c.blocks_refused.load(), "); fetches ok ",
      c.fetch_ok.load(), " failed ", c.fetch_failed.load(), " (blocks ok ", c.blocks_ok.load(),
      " remote ", c.blocks_remote.load(), " miss ", c.blocks_missed.load(), " crc ",
      c.blocks_crc.load(), " other ", c.blocks_other.load(), "); wrong bytes ",
      c.wrong_bytes.load(), "; max call ", c.max_call_us.load() / 1000, " ms (", c.slowest,
      "); client log lines ", c.log_lines.load());
  std::printf("%s%s\n", summary.c_str(), errors.c_str());
  std::fflush(stdout);
  ::testing::Test::RecordProperty("summary", summary);

  EXPECT_EQ(c.wrong_bytes.load(), 0u);
  EXPECT_TRUE(crashed.empty()) << "daemon " << crashed << " died without being killed\n"
                               << cl.old_logs() << cl.logs();
  EXPECT_GE(restarts, 1);
  // The longest call may wait out one RPC deadline and one transfer deadline (a daemon that died
  // mid-transfer) and a remote fetch adds the peer's; anything longer is a hang.
  const int64_t bound_ms = absl::ToInt64Milliseconds(2 * kRpcTimeout + kTransferTimeout) + 2000;
  EXPECT_LT(c.max_call_us.load() / 1000, bound_ms) << c.slowest;
  EXPECT_GT(c.blocks_ok.load(), 0u);
  EXPECT_GT(c.blocks_remote.load(), 0u) << "the storm must exercise remote fetches";
  for (int t = 0; t < kClients; ++t) {
    const double ago_ms = (Now() - progress[t].last_publish_ok.load()) / 1e6;
    std::printf("client %d (n%d): failed publishes %lu, fetches %lu, refused blocks %lu; last "
                "publish ok %.0f ms ago; last error %s\n",
                t, t % kNodes, progress[t].publish_failed.load(), progress[t].fetch_failed.load(),
                progress[t].refused.load(), ago_ms, progress[t].last_error.c_str());
    EXPECT_GT(progress[t].last_publish_ok.load(), last_restart)
        << "client " << t << " (node n" << t % kNodes << ") published nothing after the last "
        << "restart";
    EXPECT_GT(progress[t].last_fetch_ok.load(), last_restart)
        << "client " << t << " (node n" << t % kNodes << ") fetched nothing after the last "
        << "restart";
  }
  if (HasFailure()) std::printf("%s%s\n", cl.old_logs().c_str(), cl.logs().c_str());
}

}  // namespace
}  // namespace strata
