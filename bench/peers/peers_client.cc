// peers_client: the C++ side of bench/peers. One process runs the put/get workload against one
// system (Strata through libstrata, or Redis through hiredis) for every block size and client
// count asked for, or measures the baselines of the run (memcpy, ucx_perftest tag_bw). It prints
// one JSON object per line; bench/peers/peers_bench.py starts the servers, alternates the sides,
// repeats, and builds the table.
//
// The workload is the same for every system: `clients` threads, each with its own connection,
// put distinct keys from their own source memory (working set / clients each), then get them
// back into their own destination memory; one block per call, so latency is that of one put or
// one get under the given concurrency, and GB/s is all bytes over the wall time of the pass.
#include <hiredis/hiredis.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstring>
#include <iostream>
#include <latch>
#include <memory>
#include <random>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/common/bench_util.h"
#include "strata/client.h"

namespace {

using strata::bench::Clock;
using strata::bench::Percentile;
using strata::bench::Seconds;

struct Config {
  std::string system;
  std::vector<size_t> sizes;
  std::vector<int> clients;
  size_t ws_bytes = 256 << 20;
  std::string endpoint;      // strata
  std::string redis_host = "127.0.0.1";
  int redis_port = 0;        // redis over tcp
  std::string redis_socket;  // redis over its unix socket
  std::string tls = "tcp,self";
  std::string link;          // the label printed with each row
  bool verify = true;
  int get_passes = 1;          // more than one: a long get phase to profile alone (each printed)
  bool fetch_cached = false;   // Strata's fetched blocks through the CPU caches (a comparison)
  // A get pass repeats the working set, whole, until it has run this long (every key fetched as
  // often as the others): a pass of 64 KiB blocks is otherwise ~10 ms, which the threads'
  // start and end skew and one scheduling hiccup swing by tens of percent, on either side.
  double min_get_ms = 0;
  // The same for puts: the working set is put again, after an untimed removal of what the last
  // round stored, until the rounds' timed spans add up to this (each round from its threads'
  // common start to its last end, as a single pass).
  double min_put_ms = 0;
};

struct PassResult {
  double gbps = 0, p50_us = 0, p99_us = 0;
  size_t ops = 0;
  bool ok = true;
};

// One side of a system: what a client thread does. Prepare() runs outside the timed passes.
class Side {
 public:
  virtual ~Side() = default;
  virtual bool Prepare(char* src, char* dst, size_t keys, size_t size) = 0;
  virtual bool Put(size_t key) = 0;
  virtual bool Get(size_t key) = 0;
  virtual bool Forget() = 0;  // removes what this client stored, to put it again (untimed)
  virtual bool Clear() = 0;   // Forget() and release what Prepare() took (untimed)
};

class StrataSide : public Side {
 public:
  static std::unique_ptr<StrataSide> Connect(const Config& cfg, uint64_t seed) {
    strata::ClientOptions o;
    o.endpoint = cfg.endpoint;
    o.fetch_bypasses_cache = !cfg.fetch_cached;
    o.client_name = "peers_bench";
    auto c = strata::Client::Connect(o);
    if (!c.ok()) {
      std::cerr << "strata connect: " << c.status() << "\n";
      return nullptr;
    }
    strata::NamespaceSpec s;
    s.model_id = "peers-bench";
    // Opaque: bytes stored as given, so the row measures the store and its data plane alone,
    // as Redis and Mooncake store opaque values.
    s.codec_policy = std::string(strata::kOpaqueCodecPolicy);
    s.layout = strata::KvLayout{1, 1, 64, strata::DType::kFloat16, kTpb,
                                strata::KvKind::kSeparateKV};
    auto ns = (*c)->OpenNamespace(s, "bench");
    if (!ns.ok()) {
      std::cerr << "strata namespace: " << ns.status() << "\n";
      return nullptr;
    }
    auto side = std::unique_ptr<StrataSide>(new StrataSide);
    side->client_ = std::move(*c);
    side->ns_ = *ns;
    side->rng_.seed(seed);
    return side;
  }
  bool Prepare(char* src, char* dst, size_t keys, size_t size) override {
    src_ = src;
    dst_ = dst;
    size_ = size;
    // Registered once, as an engine registers its KV pool: transfers then skip registration.
    if (!client_->RegisterBuffer(src, keys * size).ok() ||
        !client_->RegisterBuffer(dst, keys * size).ok())
      return false;
    // A key is the token chain of one block; random tokens make every key new.
    tokens_.assign(keys * kTpb, 0);
    for (auto& t : tokens_) t = static_cast<uint32_t>(rng_());
    ids_.assign(keys, strata::BlockId{});
    return true;
  }
  bool Put(size_t key) override {
    strata::ConstBuffer b{src_ + key * size_, size_};
    auto r = client_->Publish(ns_, std::span(tokens_).subspan(key * kTpb, kTpb), {&b, 1});
    if (!r.ok() || r->stored != 1) {
      std::cerr << "strata put: " << (r.ok() ? "not stored" : r.status().ToString()) << "\n";
      return false;
    }
    ids_[key] = r->ids[0];
    return true;
  }
  bool Get(size_t key) override {
    strata::MutableBuffer b{dst_ + key * size_, size_};
    auto r = client_->Fetch(ns_, {&ids_[key], 1}, {&b, 1});
    if (!r.ok() || r->fetched != 1) {
      std::cerr << "strata get of " << size_ << " B: "
                << (r.ok() ? absl::StrCat("missed (block status ",
                                          static_cast<int>(r->status[0]), ")")
                           : r.status().ToString())
                << "\n";
      return false;
    }
    return true;
  }
  bool Forget() override {
    for (size_t i = 0; i < ids_.size(); i += 1024) {
      auto n = std::min<size_t>(1024, ids_.size() - i);
      if (!client_->Evict(ns_, std::span(ids_).subspan(i, n), false, true).ok()) return false;
    }
    return true;
  }
  bool Clear() override {
    // Before the caller frees the memory, so no registration outlives it.
    return Forget() && client_->UnregisterBuffer(src_).ok() &&
           client_->UnregisterBuffer(dst_).ok();
  }

 private:
  static constexpr uint32_t kTpb = 16;
  std::unique_ptr<strata::Client> client_;
  strata::NamespaceId ns_;
  std::mt19937_64 rng_;
  std::vector<uint32_t> tokens_;
  std::vector<strata::BlockId> ids_;
  char *src_ = nullptr, *dst_ = nullptr;
  size_t size_ = 0;
};

class RedisSide : public Side {
 public:
  static std::unique_ptr<RedisSide> Connect(const Config& cfg, int client) {
    redisContext* c = cfg.redis_socket.empty()
                          ? redisConnect(cfg.redis_host.c_str(), cfg.redis_port)
                          : redisConnectUnix(cfg.redis_socket.c_str());
    if (c == nullptr || c->err) {
      std::cerr << "redis connect: " << (c ? c->errstr : "no context") << "\n";
      if (c) redisFree(c);
      return nullptr;
    }
    auto side = std::unique_ptr<RedisSide>(new RedisSide);
    side->c_ = c;
    side->client_ = client;
    return side;
  }
  ~RedisSide() override {
    if (c_) redisFree(c_);
  }
  bool Prepare(char* src, char* dst, size_t keys, size_t size) override {
    src_ = src;
    dst_ = dst;
    size_ = size;
    keys_ = keys;
    ++generation_;
    return true;
  }
  bool Put(size_t key) override {
    std::string k = Key(key);
    // %b: binary-safe arguments; hiredis formats the command into its own buffer (one copy).
    auto* r = static_cast<redisReply*>(
        redisCommand(c_, "SET %b %b", k.data(), k.size(), src_ + key * size_, size_));
    bool ok = r != nullptr && r->type == REDIS_REPLY_STATUS;
    if (!ok) std::cerr << "redis put: " << (r ? r->str : c_->errstr) << "\n";
    if (r) freeReplyObject(r);
    return ok;
  }
  bool Get(size_t key) override {
    std::string k = Key(key);
    auto* r = static_cast<redisReply*>(redisCommand(c_, "GET %b", k.data(), k.size()));
    bool ok = r != nullptr && r->type == REDIS_REPLY_STRING && r->len == size_;
    // hiredis hands the value back in memory of its own: copying it out is part of a get.
    if (ok) std::memcpy(dst_ + key * size_, r->str, size_);
    else std::cerr << "redis get: " << (r ? "wrong reply" : c_->errstr) << "\n";
    if (r) freeReplyObject(r);
    return ok;
  }
  bool Clear() override { return Forget(); }
  bool Forget() override {
    for (size_t i = 0; i < keys_; ++i) {
      std::string k = Key(i);
      redisAppendCommand(c_, "DEL %b", k.data(), k.size());
    }
    for (size_t i = 0; i < keys_; ++i) {
      void* r = nullptr;
      if (redisGetReply(c_, &r) != REDIS_OK) return false;
      freeReplyObject(r);
    }
    return true;
  }

 private:
  std::string Key(size_t key) const {
    return absl::StrFormat("peers:%d:%d:%d:%d", generation_, size_, client_, key);
  }
  redisContext* c_ = nullptr;
  int client_ = 0, generation_ = 0;
  char *src_ = nullptr, *dst_ = nullptr;
  size_t size_ = 0, keys_ = 0;
};

// One round of a pass on all sides at once, from a common start: each client puts or gets
// every key, a get round again and again until it has run min_ms. Adds the round's latencies to
// `lat` and returns its span, from the first thread's start to the last one's end (< 0: failed).
double RunRound(std::vector<std::unique_ptr<Side>>& sides, size_t keys_per_client, bool put,
                double min_ms, std::vector<std::vector<double>>* lat) {
  const size_t n = sides.size();
  std::vector<Clock::time_point> start(n), end(n);
  std::atomic<bool> ok{true};
  std::latch go(static_cast<std::ptrdiff_t>(n));
  std::vector<std::thread> threads;
  for (size_t c = 0; c < n; ++c) {
    threads.emplace_back([&, c] {
      (*lat)[c].reserve((*lat)[c].size() + keys_per_client);
      go.arrive_and_wait();
      start[c] = Clock::now();
      do {
        for (size_t k = 0; k < keys_per_client && ok; ++k) {
          auto t0 = Clock::now();
          if (!(put ? sides[c]->Put(k) : sides[c]->Get(k))) ok = false;
          (*lat)[c].push_back(Seconds(Clock::now() - t0) * 1e6);
        }
      } while (!put && ok && Seconds(Clock::now() - start[c]) * 1e3 < min_ms);
      end[c] = Clock::now();
    });
  }
  for (auto& t : threads) t.join();
  if (!ok) return -1;
  return Seconds(*std::max_element(end.begin(), end.end()) -
                 *std::min_element(start.begin(), start.end()));
}

// Runs one pass (put or get of every key) on all sides. A put pass with min_ms repeats its
// round, removing what the last one stored in between (untimed), until the rounds ran min_ms.
PassResult RunPass(std::vector<std::unique_ptr<Side>>& sides, size_t keys_per_client,
                   size_t size, bool put, double min_ms = 0) {
  std::vector<std::vector<double>> lat(sides.size());
  PassResult r;
  double secs = 0;
  for (;;) {
    const double span = RunRound(sides, keys_per_client, put, min_ms, &lat);
    if (span < 0) {
      r.ok = false;
      return r;
    }
    secs += span;
    if (!put || secs * 1e3 >= min_ms) break;
    for (auto& side : sides) {
      if (!side->Forget()) {
        std::cerr << "removing a put round's blocks failed\n";
        r.ok = false;
        return r;
      }
    }
  }
  std::vector<double> all;
  for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  r.ops = all.size();
  r.gbps = static_cast<double>(r.ops * size) / secs / 1e9;
  r.p50_us = Percentile(all, 0.5);
  r.p99_us = Percentile(all, 0.99);
  return r;
}

void PrintRow(const Config& cfg, const char* op, size_t size, int clients, const PassResult& r) {
  std::cout << absl::StrFormat(
                   "{\"system\": \"%s\", \"client\": \"c++\", \"link\": \"%s\", \"op\": \"%s\", "
                   "\"size\": %d, \"clients\": %d, \"ops\": %d, \"gbps\": %.4f, "
                   "\"p50_us\": %.1f, \"p99_us\": %.1f}",
                   cfg.system, cfg.link, op, size, clients, r.ops, r.gbps, r.p50_us, r.p99_us)
            << std::endl;
}

int RunWorkload(const Config& cfg) {
  const int max_clients = *std::max_element(cfg.clients.begin(), cfg.clients.end());
  std::vector<std::unique_ptr<Side>> all;
  for (int c = 0; c < max_clients; ++c) {
    std::unique_ptr<Side> s;
    if (cfg.system == "strata") s = StrataSide::Connect(cfg, 1000 + c);
    else s = RedisSide::Connect(cfg, c);
    if (!s) return 1;
    all.push_back(std::move(s));
  }
  for (size_t size : cfg.sizes) {
    for (int nc : cfg.clients) {
      const size_t keys = std::max<size_t>(1, cfg.ws_bytes / size / nc);
      // Each client's own source and destination memory: together the working set, so neither
      // the values nor their copies stay in a CPU cache between one use and the next.
      std::vector<std::vector<char>> src(nc), dst(nc);
      std::vector<std::unique_ptr<Side>> sides;
      for (int c = 0; c < nc; ++c) {
        src[c].resize(keys * size);
        dst[c].assign(keys * size, 0);
        std::mt19937_64 rng(size * 131 + c);
        for (size_t i = 0; i + 8 <= src[c].size(); i += 8) {
          uint64_t v = rng();
          std::memcpy(&src[c][i], &v, 8);
        }
        if (!all[c]->Prepare(src[c].data(), dst[c].data(), keys, size)) return 1;
        sides.push_back(std::move(all[c]));
      }
      PassResult put = RunPass(sides, keys, size, true, cfg.min_put_ms);
      if (!put.ok) return 1;
      std::vector<PassResult> gets;
      for (int p = 0; p < cfg.get_passes; ++p) {
        gets.push_back(RunPass(sides, keys, size, false, cfg.min_get_ms));
        if (!gets.back().ok) return 1;
      }
      for (int c = 0; c < nc && cfg.verify; ++c) {
        if (src[c] != dst[c]) {
          std::cerr << cfg.system << ": got bytes differ from put bytes\n";
          return 1;
        }
      }
      PrintRow(cfg, "put", size, nc, put);
      for (const PassResult& get : gets) PrintRow(cfg, "get", size, nc, get);
      for (int c = 0; c < nc; ++c) {
        if (!sides[c]->Clear()) {
          std::cerr << cfg.system << ": clearing the working set failed\n";
          return 1;
        }
        all[c] = std::move(sides[c]);
      }
    }
  }
  return 0;
}

// The ceilings of the run: memcpy of the working set on one core, and ucx_perftest tag_bw
// (two-sided UCX, what a message-based store could reach) per block size over cfg.tls.
int RunBaseline(const Config& cfg) {
  std::string tmp = (std::filesystem::temp_directory_path() / "strata-peers-XXXXXX").string();
  if (!mkdtemp(tmp.data())) return 1;
  double memcpy_gbps = strata::bench::MemcpyGbps(std::min<size_t>(cfg.ws_bytes, 256 << 20), 4);
  std::cout << absl::StrFormat("{\"baseline\": \"memcpy\", \"bytes\": %d, \"gbps\": %.4f}",
                               std::min<size_t>(cfg.ws_bytes, 256 << 20), memcpy_gbps)
            << std::endl;
  for (size_t size : cfg.sizes) {
    int iters = std::max<int>(20, static_cast<int>(cfg.ws_bytes / size));
    auto g = strata::bench::PerftestGbps("tag_bw", size, iters, cfg.tls, tmp);
    std::cout << absl::StrFormat(
                     "{\"baseline\": \"tag_bw\", \"link\": \"%s\", \"size\": %d, \"gbps\": %.4f}",
                     cfg.link, size, g.value_or(0))
              << std::endl;
  }
  std::filesystem::remove_all(tmp);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"peers_client: one side of bench/peers (Strata or Redis), or the baselines"};
  Config cfg;
  std::string sizes = "65536,1048576,8388608", clients = "1,4";
  app.add_option("--system", cfg.system, "strata | redis | baseline")->required();
  app.add_option("--sizes", sizes, "block sizes in bytes, comma separated");
  app.add_option("--clients", clients, "client counts, comma separated");
  app.add_option("--ws-bytes", cfg.ws_bytes, "working set per block size and client count");
  app.add_option("--endpoint", cfg.endpoint, "stratad endpoint");
  app.add_option("--redis-port", cfg.redis_port, "redis over tcp on 127.0.0.1");
  app.add_option("--redis-socket", cfg.redis_socket, "redis over this unix socket");
  app.add_option("--tls", cfg.tls, "UCX_TLS of this process (and of ucx_perftest)");
  app.add_option("--link", cfg.link, "label of the link (tcp, shm, unix)");
  app.add_option("--get-passes", cfg.get_passes, "get passes after each put pass (profiling)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--min-get-ms", cfg.min_get_ms,
                 "repeat each get pass over the working set until it ran this long");
  app.add_option("--min-put-ms", cfg.min_put_ms,
                 "put the working set again (what was put removed in between, untimed) until "
                 "the put rounds ran this long");
  app.add_flag("--fetch-cached", cfg.fetch_cached,
               "Strata: fetched blocks land in the CPU caches (fetch_bypasses_cache off)");
  CLI11_PARSE(app, argc, argv);
  signal(SIGPIPE, SIG_IGN);
  // The same UCX_TLS as the stratad the driver started: over tcp nothing may map the arena.
  setenv("UCX_TLS", cfg.tls.c_str(), 1);
  for (auto s : absl::StrSplit(sizes, ',')) cfg.sizes.push_back(std::stoull(std::string(s)));
  for (auto s : absl::StrSplit(clients, ',')) cfg.clients.push_back(std::stoi(std::string(s)));
  if (cfg.system == "baseline") return RunBaseline(cfg);
  if (cfg.system != "strata" && cfg.system != "redis") {
    std::cerr << "unknown --system " << cfg.system << "\n";
    return 2;
  }
  return RunWorkload(cfg);
}
