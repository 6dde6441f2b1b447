// strata_bench: publish/fetch throughput and latency through a real stratad, beside
// ucx_perftest (same sizes, same UCX transport) and memcpy measured in the same run.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_format.h"
#include "bench/common/bench_util.h"
#include "common/crc32c.h"
#include "strata/client.h"

namespace {

using strata::bench::Clock;
using strata::bench::MemcpyGbps;
using strata::bench::Percentile;
using strata::bench::PerftestGbps;
using strata::bench::ReadFile;
using strata::bench::Seconds;
using strata::bench::Spawn;

struct Row {
  std::string op;
  size_t block_bytes;
  std::string transport;
  double gbps = 0, p50_us = 0, p99_us = 0, perftest_gbps = 0, gbps_no_crc = 0;
  double ws_gbps = 0, ws_gbps_no_crc = 0;  // fetch, working-set footprint
  double ws_memcpy_gbps = 0;              // memcpy of the working set (publish and fetch)
};

// stratad with a host tier of `capacity`, its state in tmp/data.
// With `token`, the daemon authenticates callers (a tokens file holding that tenant token and
// `tenants` - 1 more tenants'): with one tenant and no tcp its clients still map the arena; else
// it hands out no remote key and bytes move by messages (docs/security.md).
std::unique_ptr<strata::bench::StratadProcess> StartDaemon(const std::string& bin,
                                                           const std::string& tls,
                                                           const std::string& capacity,
                                                           const std::string& tmp,
                                                           const std::string& token,
                                                           int tenants, bool zones_writable) {
  std::vector<std::string> args{"--data-dir", tmp + "/data", "--host-capacity", capacity,
                                "--log-level", "warn"};
  if (!token.empty()) {
    std::ofstream tokens(tmp + "/tokens");
    tokens << token << " bench tenant\n";
    for (int i = 1; i < tenants; ++i)
      tokens << "strata-bench-other-token-" << i << " other-" << i << " tenant\n";
    tokens.close();
    // Over tcp the authenticated daemon needs the operator's word that its network is trusted
    // (UCX tcp checks no key); the bench measures the protocol's cost, not that choice.
    std::ofstream(tmp + "/config.yaml") << "auth:\n  tokens_file: " << tmp << "/tokens\n"
                                        << (tls.find("tcp") != std::string::npos
                                                ? "  ucx_tcp_trusted: true\n"
                                                : "")
                                        << (zones_writable ? "  tenant_zones_writable: true\n" : "");
    args.push_back("--config");
    args.push_back(tmp + "/config.yaml");
  }
  return std::make_unique<strata::bench::StratadProcess>(bin, std::move(args), tmp, tls);
}

strata::NamespaceSpec BenchSpec(uint32_t tokens_per_block) {
  strata::NamespaceSpec s;
  s.model_id = "strata-bench";
  s.codec_policy = std::string(strata::kOpaqueCodecPolicy);  // measures the data plane alone
  s.layout = strata::KvLayout{
      32, 8, 128, strata::DType::kFloat16, tokens_per_block, strata::KvKind::kSeparateKV};
  return s;
}

struct Config {
  bool smoke = false;
  bool publish_only = false;  // the publish rows alone (A/B runs of the publish path)
  int rounds = 0;             // publish/fetch rounds per row (0: 20, 3 with --smoke)
  std::string stratad = STRATAD_BIN;
  std::string endpoint;
  bool auth = false;  // a tenant token on every call (the daemon's own, or --token's)
  std::string token;
  int tenants = 1;  // --auth: tenants in the daemon's tokens file
  bool zones_writable = false;  // --auth --tenants >1: auth.tenant_zones_writable
  bool control_by_message = true;  // ClientOptions::control_by_message
  bool publish_buffer = false;  // publish from Client::AllocatePublishBuffer memory
};

bool RunTransport(const Config& cfg, const std::string& name, const std::string& tls,
                  std::vector<Row>& rows, double* lookup_p50, double* lookup_p99, double* hash_p50,
                  double* rpc_p50) {
  std::string tmp = (std::filesystem::temp_directory_path() / "strata-bench-XXXXXX").string();
  if (!mkdtemp(tmp.data())) return false;
  setenv("UCX_TLS", tls.c_str(), 1);
  std::unique_ptr<strata::bench::StratadProcess> daemon;
  std::string endpoint = cfg.endpoint;
  if (endpoint.empty()) {
    daemon = StartDaemon(cfg.stratad, tls, cfg.smoke ? "256MiB" : "1GiB", tmp,
                         cfg.auth ? cfg.token : "", cfg.tenants, cfg.zones_writable);
    endpoint = daemon->endpoint();
    if (endpoint.empty()) {
      std::cerr << "stratad did not start:\n" << daemon->log() << "\n";
      return false;
    }
  }
  strata::ClientOptions o;
  o.endpoint = endpoint;
  o.client_name = "strata_bench";
  if (cfg.auth) o.auth_token = cfg.token;
  o.control_by_message = cfg.control_by_message;
  auto client = strata::Client::Connect(o);
  if (!client.ok()) {
    std::cerr << "connect: " << client.status() << "\n";
    return false;
  }
  o.verify_crc = false;
  auto raw_client = strata::Client::Connect(o);
  if (!raw_client.ok()) return false;
  constexpr uint32_t kTpb = 256;
  auto ns = (*client)->OpenNamespace(BenchSpec(kTpb), "bench");
  auto ns2 = (*raw_client)->OpenNamespace(BenchSpec(kTpb), "bench");
  if (!ns.ok() || !ns2.ok()) {
    std::cerr << "open namespace: " << ns.status() << "\n";
    return false;
  }
  strata::bench::TokenSource tokens(kTpb);

  std::vector<size_t> sizes = cfg.smoke ? std::vector<size_t>{64 << 10, 1 << 20}
                                        : std::vector<size_t>{64 << 10, 1 << 20, 8 << 20};
  const size_t batch_bytes = cfg.smoke ? (8 << 20) : (32 << 20);
  for (size_t size : sizes) {
    const size_t batch = std::max<size_t>(1, batch_bytes / size);
    std::vector<char> src(batch * size), dst(batch * size);
    std::mt19937_64 rng(size);
    for (size_t i = 0; i < src.size(); i += 8) {
      uint64_t v = rng();
      std::memcpy(&src[i], &v, 8);
    }
    char* source = src.data();
    if (cfg.publish_buffer) {
      // The engine writes its blocks where publishing them needs no copy by the client.
      auto pb = (*client)->AllocatePublishBuffer(src.size());
      if (!pb.ok()) {
        std::cerr << "publish buffer: " << pb.status() << "\n";
        return false;
      }
      source = static_cast<char*>(pb->data);
      std::memcpy(source, src.data(), src.size());
    }
    (void)(*client)->RegisterBuffer(source, src.size());
    (void)(*client)->RegisterBuffer(dst.data(), dst.size());
    (void)(*raw_client)->RegisterBuffer(dst.data(), dst.size());
    std::vector<strata::ConstBuffer> in(batch);
    std::vector<strata::MutableBuffer> out(batch);
    for (size_t i = 0; i < batch; ++i) {
      in[i] = {source + i * size, size};
      out[i] = {dst.data() + i * size, size};
    }
    const int rounds = cfg.rounds > 0 ? cfg.rounds : cfg.smoke ? 3 : 20;
    const int lat_iters = cfg.smoke ? 20 : 200;

    // Publish: batched throughput, then single-block latency.
    Row pub{"publish", size, name};
    double bytes = 0, secs = 0;
    for (int r = 0; r < rounds; ++r) {
      auto t = tokens.Next(batch);
      auto t0 = Clock::now();
      auto res = (*client)->Publish(*ns, t, in);
      secs += Seconds(Clock::now() - t0);
      if (!res.ok() || res->stored != batch) {
        std::cerr << "publish failed: " << (res.ok() ? "partial" : res.status().ToString()) << "\n";
        return false;
      }
      bytes += static_cast<double>(batch * size);
    }
    pub.gbps = bytes / secs / 1e9;
    // The baseline of publish: memcpy of the same working set, measured right after it.
    pub.ws_memcpy_gbps = MemcpyGbps(batch * size, rounds);
    std::vector<double> publat;
    for (int i = 0; i < lat_iters; ++i) {
      auto t = tokens.Next(1);
      auto t0 = Clock::now();
      auto res = (*client)->Publish(*ns, t, std::span(in).first(1));
      publat.push_back(Seconds(Clock::now() - t0) * 1e6);
      if (!res.ok()) return false;
    }
    pub.p50_us = Percentile(publat, 0.5);
    pub.p99_us = Percentile(publat, 0.99);
    if (cfg.publish_only) {
      rows.push_back(pub);
      (void)(*client)->UnregisterBuffer(source);
      (void)(*client)->UnregisterBuffer(dst.data());
      (void)(*raw_client)->UnregisterBuffer(dst.data());
      continue;
    }

    // Fetch, two footprints. "hot" matches ucx_perftest's: one source block fetched into one
    // destination buffer, repeated within a batch, so the comparison is transport against
    // transport. "working set" fetches distinct blocks into distinct buffers (batch_bytes in
    // all), the way an engine restores a long prompt; its baseline is memcpy of the same size.
    Row fetch{"fetch", size, name};
    auto t = tokens.Next(batch);
    auto res = (*client)->Publish(*ns, t, in);
    if (!res.ok()) return false;
    const std::vector<strata::BlockId> ids = res->ids;
    const size_t hot_batch = std::max<size_t>(16, (cfg.smoke ? (8u << 20) : (64u << 20)) / size);
    const std::vector<strata::BlockId> hot_ids(hot_batch, ids[0]);
    // A pair of staging buffers, alternated, so the two copying threads do not share one.
    std::vector<strata::MutableBuffer> hot_out(hot_batch, out[0]);
    for (size_t i = 1; i < hot_batch; i += 2) hot_out[i] = out[batch > 1 ? 1 : 0];
    auto fetch_gbps = [&](strata::Client& c, const std::vector<strata::BlockId>& fids,
                          std::span<const strata::MutableBuffer> fout) -> double {
      double b = 0, s = 0;
      for (int r = 0; r < rounds + 1; ++r) {
        auto t0 = Clock::now();
        auto f = c.Fetch(*ns, fids, fout);
        double dt = Seconds(Clock::now() - t0);
        if (!f.ok() || f->fetched != fids.size()) {
          std::cerr << "fetch failed: " << (f.ok() ? "partial" : f.status().ToString()) << "\n";
          return -1;
        }
        if (r == 0) continue;  // warm-up
        s += dt;
        b += static_cast<double>(fids.size() * size);
      }
      return b / s / 1e9;
    };
    fetch.gbps = fetch_gbps(**client, hot_ids, hot_out);
    fetch.gbps_no_crc = fetch_gbps(**raw_client, hot_ids, hot_out);
    fetch.ws_gbps = fetch_gbps(**client, ids, out);
    fetch.ws_gbps_no_crc = fetch_gbps(**raw_client, ids, out);
    fetch.ws_memcpy_gbps = MemcpyGbps(batch * size, rounds);
    if (fetch.gbps < 0 || fetch.gbps_no_crc < 0 || fetch.ws_gbps < 0 || fetch.ws_gbps_no_crc < 0)
      return false;
    if (std::memcmp(src.data(), dst.data(), src.size()) != 0) {
      std::cerr << "fetched bytes differ from published bytes\n";
      return false;
    }
    std::vector<double> lat;
    lat.reserve(lat_iters);
    for (int i = 0; i < lat_iters; ++i) {
      auto t0 = Clock::now();
      auto f = (*client)->Fetch(*ns, std::span(ids).first(1), std::span(out).first(1));
      lat.push_back(Seconds(Clock::now() - t0) * 1e6);
      if (!f.ok() || f->fetched != 1) return false;
    }
    fetch.p50_us = Percentile(lat, 0.5);
    fetch.p99_us = Percentile(lat, 0.99);

    int pt_iters = std::max(20, static_cast<int>((cfg.smoke ? (256 << 20) : (2ull << 30)) / size));
    pub.perftest_gbps = PerftestGbps("ucp_put_bw", size, pt_iters, tls, tmp).value_or(0);
    fetch.perftest_gbps = PerftestGbps("ucp_get", size, pt_iters, tls, tmp).value_or(0);
    rows.push_back(pub);
    rows.push_back(fetch);
    (void)(*client)->UnregisterBuffer(source);
    (void)(*client)->UnregisterBuffer(dst.data());
    (void)(*raw_client)->UnregisterBuffer(dst.data());
  }

  auto finish = [&] {
    client->reset();
    raw_client->reset();
    daemon.reset();
    std::filesystem::remove_all(tmp);
    return true;
  };
  if (cfg.publish_only) return finish();
  // Lookup of a 128k-token prompt: 512 blocks of 256 tokens, all cached.
  auto prompt = tokens.Next(512);
  std::vector<char> small(4096, 7);
  std::vector<strata::ConstBuffer> small_in(512, strata::ConstBuffer{small.data(), small.size()});
  auto p = (*client)->Publish(*ns, prompt, small_in);
  if (!p.ok() || p->stored + p->deduplicated != 512) return false;
  std::vector<double> lat, hash;
  const int iters = cfg.smoke ? 50 : 1000;
  for (int i = 0; i < iters; ++i) {
    auto t0 = Clock::now();
    auto ids = strata::ComputeBlockIds(*ns, kTpb, prompt);
    auto t1 = Clock::now();
    auto n = (*client)->LookupIds(*ns, ids);
    auto t2 = Clock::now();
    if (!n.ok() || *n != 512) {
      std::cerr << "lookup failed\n";
      return false;
    }
    hash.push_back(Seconds(t1 - t0) * 1e6);
    lat.push_back(Seconds(t2 - t1) * 1e6);
  }
  // Baseline: the smallest round trip on the same channel (Stats, no ids).
  std::vector<double> empty;
  for (int i = 0; i < iters; ++i) {
    auto t0 = Clock::now();
    if (!(*client)->Stats().ok()) return false;
    empty.push_back(Seconds(Clock::now() - t0) * 1e6);
  }
  *rpc_p50 = Percentile(empty, 0.5);
  *lookup_p50 = Percentile(lat, 0.5);
  *lookup_p99 = Percentile(lat, 0.99);
  *hash_p50 = Percentile(hash, 0.5);
  return finish();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"strata_bench: Strata publish/fetch/lookup against ucx_perftest and memcpy"};
  Config cfg;
  bool json = false;
  std::string transports = "shm,tcp";
  app.add_flag("--smoke", cfg.smoke, "tiny sizes and counts (CI)");
  app.add_flag("--publish-only", cfg.publish_only,
               "the publish rows alone: no fetch, lookup or ucx_perftest (A/B runs of publish)");
  app.add_option("--rounds", cfg.rounds, "batched rounds per row (default 20; --smoke: 3)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--json", json, "print one JSON object");
  app.add_option("--transports", transports, "comma list of shm and tcp")->capture_default_str();
  app.add_option("--stratad", cfg.stratad, "stratad binary to start")->capture_default_str();
  app.add_option("--endpoint", cfg.endpoint, "use a running stratad instead of starting one");
  app.add_flag("--auth", cfg.auth,
               "authenticate: the started stratad gets a tokens file, the client its token");
  app.add_flag("!--no-control-by-message", cfg.control_by_message,
               "Reserve, Commit and Acquire through gRPC only (the baseline of the message route)");
  app.add_option("--token", cfg.token, "the tenant token (--auth; default: a fixed test token)");
  app.add_option("--tenants", cfg.tenants,
                 "tenants in the started daemon's tokens file (--auth; more than one: no client "
                 "maps the arena)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--publish-buffer", cfg.publish_buffer,
               "publish from memory of Client::AllocatePublishBuffer (read-only zones: no client "
               "copy)");
  app.add_flag("--zones-writable", cfg.zones_writable,
               "several tenants: their clients may write their own zone (auth.tenant_zones_writable)");
  CLI11_PARSE(app, argc, argv);
  if (cfg.auth && cfg.token.empty()) cfg.token = "strata-bench-tenant-token-0123456789";
  signal(SIGPIPE, SIG_IGN);

  double memcpy_gbps = MemcpyGbps(64 << 20, cfg.smoke ? 4 : 40);
  std::vector<Row> rows;
  double lookup_p50 = 0, lookup_p99 = 0, hash_p50 = 0, rpc_p50 = 0;
  bool ok = true;
  for (const std::string& t : {std::string("shm"), std::string("tcp")}) {
    if (transports.find(t) == std::string::npos) continue;
    // Same UCX_TLS for stratad, the client and ucx_perftest.
    std::string tls = t == "shm" ? "shm,self" : "tcp,self";
    double p50 = 0, p99 = 0, h = 0, rpc = 0;
    if (!RunTransport(cfg, t, tls, rows, &p50, &p99, &h, &rpc)) {
      std::cerr << "benchmark over " << t << " failed\n";
      ok = false;
      continue;
    }
    if (lookup_p50 == 0) {  // report the first transport's lookup (control plane is gRPC anyway)
      lookup_p50 = p50;
      lookup_p99 = p99;
      hash_p50 = h;
      rpc_p50 = rpc;
    }
  }
  if (json) {
    std::cout << absl::StrFormat(
        "{\"memcpy_gbps\": %.3f, \"lookup_512_p50_us\": %.1f, \"lookup_512_p99_us\": %.1f, "
        "\"hash_512_p50_us\": %.1f, \"empty_rpc_p50_us\": %.1f, \"crc32c_hw\": %s, "
        "\"rows\": [",
        memcpy_gbps, lookup_p50, lookup_p99, hash_p50, rpc_p50,
        strata::Crc32cIsHardwareAccelerated() ? "true" : "false");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::cout << absl::StrFormat(
          "%s{\"op\": \"%s\", \"block_bytes\": %d, \"transport\": \"%s\", \"gbps\": %.3f, "
          "\"p50_us\": %.1f, \"p99_us\": %.1f, \"perftest_gbps\": %.3f, "
          "\"ratio_vs_perftest\": %.3f%s}",
          i ? ", " : "", r.op, r.block_bytes, r.transport, r.gbps, r.p50_us, r.p99_us,
          r.perftest_gbps, r.perftest_gbps > 0 ? r.gbps / r.perftest_gbps : 0.0,
          r.op == "fetch"
              ? absl::StrFormat(", \"gbps_no_crc\": %.3f, \"ws_gbps\": %.3f, "
                                "\"ws_gbps_no_crc\": %.3f, \"ws_memcpy_gbps\": %.3f",
                                r.gbps_no_crc, r.ws_gbps, r.ws_gbps_no_crc, r.ws_memcpy_gbps)
              : absl::StrFormat(", \"ws_memcpy_gbps\": %.3f", r.ws_memcpy_gbps));
    }
    std::cout << "]}\n";
  } else {
    std::cout << absl::StrFormat("memcpy (64 MiB, one core): %.2f GB/s\n", memcpy_gbps);
    std::cout << absl::StrFormat(
        "lookup of 512 blocks (128k tokens): p50 %.1f us, p99 %.1f us (+ %.1f us hashing); "
        "empty RPC p50 %.1f us\n\n",
        lookup_p50, lookup_p99, hash_p50, rpc_p50);
    std::cout
        << "GB/s and ratio: publish of distinct blocks; fetch with ucx_perftest's footprint "
           "(one block, two staging buffers).\nws: fetch of distinct blocks into distinct buffers "
           "(32 MiB), against memcpy of the same size.\nmemcpy: of the working set (32 MiB), "
           "measured right after the row's own runs (publish: against its GB/s).\n\n";
    std::cout << absl::StrFormat("%-8s %-7s %-5s %7s %8s %8s %9s %6s %7s %7s %8s %8s\n", "op",
                                 "block", "tls", "GB/s", "p50 us", "p99 us", "perftest", "ratio",
                                 "no-CRC", "ws", "ws-noCRC", "memcpy");
    for (const Row& r : rows) {
      bool f = r.op == "fetch";
      std::cout << absl::StrFormat(
          "%-8s %-7s %-5s %7.2f %8.1f %8.1f %9.2f %6.2f %7s %7s %8s %8s\n", r.op,
          r.block_bytes >= (1 << 20) ? absl::StrFormat("%dMiB", r.block_bytes >> 20)
                                     : absl::StrFormat("%dKiB", r.block_bytes >> 10),
          r.transport, r.gbps, r.p50_us, r.p99_us, r.perftest_gbps,
          r.perftest_gbps > 0 ? r.gbps / r.perftest_gbps : 0.0,
          f ? absl::StrFormat("%.2f", r.gbps_no_crc) : "",
          f ? absl::StrFormat("%.2f", r.ws_gbps) : "",
          f ? absl::StrFormat("%.2f", r.ws_gbps_no_crc) : "",
          absl::StrFormat("%.2f", r.ws_memcpy_gbps));
    }
  }
  return ok ? 0 : 1;
}
