// cluster_bench: a static cluster of real stratad processes on loopback.
//  - lookup latency of a 512-block prompt (128k tokens, 256 per block) whose blocks are spread
//    over every node, through one node's client;
//  - remote fetch throughput: blocks held on one node fetched by a client of another node,
//    beside ucx_perftest tag_bw and ucp_get (same size, same UCX_TLS) measured in the same run;
//    fetch and tag_bw alternate over --reps repetitions and the table shows their medians;
//  - beside them, plain tcp sockets moving the same blocks out of the same working set (the
//    least that crossing a socket costs when the blocks are not in the caches: tag_bw resends
//    one cache-resident buffer).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <filesystem>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/common/bench_util.h"
#include "strata/client.h"

namespace {

using namespace strata::bench;

struct Node {
  pid_t pid = -1;
  std::string endpoint;
};

class LocalCluster {
 public:
  LocalCluster(int n, const std::string& tls, const std::string& capacity) {
    dir_ = (std::filesystem::temp_directory_path() / "strata-cluster-bench-XXXXXX").string();
    if (!mkdtemp(dir_.data())) return;
    std::ofstream(dir_ + "/secret") << "cluster-bench-secret-0123456789\n";
    std::vector<std::string> addrs;
    for (int i = 0; i < n; ++i) addrs.push_back(absl::StrCat("127.0.0.1:", FreePort()));
    std::string peers;
    for (int i = 0; i < n; ++i) peers += absl::StrCat("\"n", i, "@", addrs[i], "\", ");
    for (int i = 0; i < n; ++i) {
      std::string d = absl::StrCat(dir_, "/n", i);
      std::filesystem::create_directories(d);
      std::ofstream(d + "/stratad.yaml")
          << "node_id: n" << i << "\ncluster_secret_file: " << dir_ << "/secret\n"
          << "log_level: warn\nhost_tier:\n  capacity: " << capacity << "\n"
          << "cluster:\n  membership: static\n  static_nodes: [" << peers << "]\n";
      Node node;
      node.pid = Spawn({STRATAD_BIN, "--config", d + "/stratad.yaml", "--listen", addrs[i],
                        "--data-dir", d + "/data", "--ready-file", d + "/ready.json"},
                       d + "/stratad.log", tls);
      for (int k = 0; k < 400; ++k) {
        if (ReadFile(d + "/ready.json").find("\"endpoint\"") != std::string::npos) {
          node.endpoint = addrs[i];
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
      }
      nodes_.push_back(node);
    }
  }
  ~LocalCluster() {
    for (auto& n : nodes_)
      if (n.pid > 0) kill(n.pid, SIGTERM);
    for (auto& n : nodes_)
      if (n.pid > 0) waitpid(n.pid, nullptr, 0);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  bool ok() const {
    for (const auto& n : nodes_)
      if (n.endpoint.empty()) return false;
    return !nodes_.empty();
  }
  const std::string& endpoint(int i) const { return nodes_[i].endpoint; }
  std::string logs() const {
    std::string all;
    for (size_t i = 0; i < nodes_.size(); ++i)
      all += absl::StrCat("--- n", i, "\n", ReadFile(absl::StrCat(dir_, "/n", i, "/stratad.log")));
    return all;
  }

 private:
  std::string dir_;
  std::vector<Node> nodes_;
};

strata::NamespaceSpec Spec(uint32_t tpb) {
  strata::NamespaceSpec s;
  s.model_id = "cluster-bench";
  s.layout =
      strata::KvLayout{32, 8, 128, strata::DType::kFloat16, tpb, strata::KvKind::kSeparateKV};
  return s;
}

std::string Joined(const std::vector<double>& v) {
  std::string out;
  for (double x : v) absl::StrAppend(&out, out.empty() ? "" : ", ", absl::StrFormat("%.2f", x));
  return out;
}

// ClientOptions::verify_crc of the bench's clients (--no-verify: what the transport alone
// reaches; a fetched block's CRC takes about as much CPU as receiving it over tcp).
bool verify_crc = true;
// --fetch-only: remote fetch rounds alone, no baselines (for profiling the fetch).
bool fetch_only = false;
// --block-kib: remote fetch of these block sizes only (default 64, 1024, 8192).
std::vector<size_t> block_kib;

std::unique_ptr<strata::Client> Connect(const std::string& endpoint) {
  strata::ClientOptions o;
  o.verify_crc = verify_crc;
  o.endpoint = endpoint;
  o.client_name = "cluster_bench";
  auto c = strata::Client::Connect(o);
  if (!c.ok()) {
    std::cerr << "connect " << endpoint << ": " << c.status() << "\n";
    return nullptr;
  }
  return std::move(*c);
}

// GB/s of `rounds` passes of the blocks of `src` over one loopback tcp connection, as plain
// sockets move them at best here: send() calls of at most 64 KiB less 256 bytes (the holder's
// pieces are as large at most), recv() calls of at most 64 KiB (UCX's receive segment) straight
// into place in a destination of the same size, on a thread of its own (not the fetch's
// destination: the fetch's check must see its own bytes). Both limits matter on loopback:
// sends of exactly 64 KiB (each leaves a 53-byte segment past lo's MSS) ran at 1.5-1.9 GB/s
// against 3.8-4.5, and recv() calls of whole blocks at ~2 (likely: the socket stays locked through
// long copies and acknowledgements lag). nullopt (said why) if a socket fails or stalls for 10 s.
std::optional<double> PlainTcpGbps(const std::vector<char>& src, int rounds) {
  auto fail = [](const char* what, int error = errno) -> std::optional<double> {
    std::cerr << "plain tcp baseline: " << what << ": "
              << (error != 0 ? std::strerror(error) : "connection closed") << "\n";
    return std::nullopt;
  };
  const timeval stall{10, 0};
  auto bounded = [&](int fd) {
    return setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &stall, sizeof stall) == 0 &&
           setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &stall, sizeof stall) == 0;
  };
  struct Fd {
    int fd;
    ~Fd() {
      if (fd >= 0) close(fd);
    }
  };
  Fd listener{socket(AF_INET, SOCK_STREAM, 0)};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (listener.fd < 0 || !bounded(listener.fd) ||
      bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(listener.fd, 1) != 0 ||
      getsockname(listener.fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return fail("listening");
  Fd out{socket(AF_INET, SOCK_STREAM, 0)};
  if (out.fd < 0 || !bounded(out.fd) ||
      connect(out.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    return fail("connecting");
  Fd in{accept(listener.fd, nullptr, nullptr)};
  if (in.fd < 0 || !bounded(in.fd)) return fail("accepting");
  const size_t bytes = src.size();
  std::vector<char> dst(bytes, 0);  // faulted in before the clock starts
  // One pass untimed first, as the fetch's first round: a new connection starts slow.
  double secs = 0;
  for (int timed_rounds : {1, rounds}) {
    std::atomic<bool> received{true};
    int recv_errno = 0;  // errno is the receiving thread's own; read after the join
    auto t0 = Clock::now();
    std::thread receiver([&] {
      for (int r = 0; r < timed_rounds; ++r)
        for (size_t at = 0; at < bytes;) {
          ssize_t n = recv(in.fd, dst.data() + at, std::min<size_t>(bytes - at, 64 << 10), 0);
          if (n <= 0) {
            recv_errno = n < 0 ? errno : 0;
            received = false;
            return;
          }
          at += static_cast<size_t>(n);
        }
    });
    bool sent = true;
    constexpr size_t kSend = (64 << 10) - 256;
    for (int r = 0; r < timed_rounds && sent; ++r)
      for (size_t at = 0; at < bytes && sent;) {
        ssize_t n = send(out.fd, src.data() + at, std::min<size_t>(bytes - at, kSend), 0);
        sent = n > 0;
        if (sent) at += static_cast<size_t>(n);
      }
    const int send_errno = errno;
    if (!sent) shutdown(out.fd, SHUT_RDWR);  // the receiver's recv returns at once
    receiver.join();
    secs = Seconds(Clock::now() - t0);
    // A receiver that failed first leaves the sender to time out: its error is the cause.
    if (!received) return fail("receiving", recv_errno);
    if (!sent) return fail("sending", send_errno);
  }
  if (std::memcmp(src.data(), dst.data(), bytes) != 0) {
    std::cerr << "plain tcp baseline: received different bytes\n";
    return std::nullopt;
  }
  return static_cast<double>(bytes) * rounds / secs / 1e9;
}

// a / b, or 0 where the baseline did not run.
double Ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

struct FetchRow {
  size_t block_bytes = 0;
  // Medians of the repetitions; fetch and tag_bw alternate, so both see the same machine.
  double gbps = 0, perftest_gbps = 0, perftest_tag_gbps = 0, p50_us = 0;
  // The Locate of that one block (gRPC to the asking node, which asks the directory's owner):
  // part of a remote fetch's p50.
  double locate_p50_us = 0;
  double socket_gbps = 0;  // PlainTcpGbps over the same working set (median)
  std::vector<double> gbps_reps, tag_reps, socket_reps;
};

struct Result {
  int nodes = 0;
  std::string tls;
  double lookup_p50_us = 0, lookup_p99_us = 0;              // spread over every node
  double local_lookup_p50_us = 0, local_lookup_p99_us = 0;  // all on the asking node
  double hash_p50_us = 0;
  double grpc_lookup_p50_us = 0, grpc_lookup_p99_us = 0;  // gRPC only, spread
  double grpc_local_lookup_p50_us = 0,
         grpc_local_lookup_p99_us =
             0;  // computing the 512 ids from 128k tokens (client CPU, not included)
  std::vector<FetchRow> fetch;
};

bool Run(int nodes, const std::string& tls, bool smoke, int reps, Result* out) {
  setenv("UCX_TLS", tls.c_str(), 1);
  LocalCluster cl(nodes, tls, smoke ? "256MiB" : "1GiB");
  if (!cl.ok()) {
    std::cerr << "cluster did not start:\n" << cl.logs();
    return false;
  }
  out->nodes = nodes;
  out->tls = tls;
  std::vector<std::unique_ptr<strata::Client>> clients;
  for (int i = 0; i < nodes; ++i) {
    clients.push_back(Connect(cl.endpoint(i)));
    if (!clients.back()) return false;
  }
  constexpr uint32_t kTpb = 256;
  constexpr size_t kBlocks = 512;
  strata::NamespaceId ns;
  for (auto& c : clients) {
    auto opened = c->OpenNamespace(Spec(kTpb), "bench");
    if (!opened.ok()) return false;
    ns = *opened;
  }
  std::mt19937 rng(42);
  auto tokens_of = [&](size_t blocks) {
    std::vector<uint32_t> t(blocks * kTpb);
    for (auto& x : t) x = rng() % 128000;
    return t;
  };

  // Lookup: one 128k-token prompt, block k published on node k % nodes.
  {
    auto tokens = tokens_of(kBlocks);
    auto ids = strata::ComputeBlockIds(ns, kTpb, tokens);
    std::vector<char> small(4096, 1);
    for (size_t k = 0; k < ids.size(); ++k) {
      strata::BlockId parent = k == 0 ? strata::BlockId{} : ids[k - 1];
      strata::ConstBuffer b{small.data(), small.size()};
      auto r = clients[k % nodes]->PublishIds(ns, {&ids[k], 1}, {&parent, 1}, {&b, 1});
      if (!r.ok()) return false;
    }
    for (int i = 0; i < 200; ++i) {  // the directory fills asynchronously
      auto r = clients[0]->Lookup(ns, tokens);
      if (r.ok() && r->prefix_blocks == kBlocks) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    const int iters = smoke ? 50 : 500;
    // As strata_bench does: ids computed once (hashing is the client's CPU, reported apart).
    auto measure = [&](strata::Client& c, const std::vector<strata::BlockId>& q, double* p50,
                       double* p99) {
      std::vector<double> lat;
      for (int i = 0; i < iters + 10; ++i) {
        auto t0 = Clock::now();
        auto r = c.LookupIds(ns, q);
        double us = Seconds(Clock::now() - t0) * 1e6;
        if (!r.ok() || *r != kBlocks) {
          std::cerr << "lookup: " << (r.ok() ? absl::StrCat(*r, " blocks") : r.status().ToString())
                    << "\n";
          return false;
        }
        if (i >= 10) lat.push_back(us);
      }
      *p50 = Percentile(lat, 0.5);
      *p99 = Percentile(lat, 0.99);
      return true;
    };
    {
      std::vector<double> hash;
      for (int i = 0; i < 20; ++i) {
        auto t0 = Clock::now();
        auto again = strata::ComputeBlockIds(ns, kTpb, tokens);
        hash.push_back(Seconds(Clock::now() - t0) * 1e6);
      }
      out->hash_p50_us = Percentile(hash, 0.5);
    }
    if (!measure(*clients[0], ids, &out->lookup_p50_us, &out->lookup_p99_us)) return false;
    // Baseline in the same run: the same prompt size held entirely by the asking node.
    auto local_tokens = tokens_of(kBlocks);
    std::vector<strata::ConstBuffer> views(kBlocks,
                                           strata::ConstBuffer{small.data(), small.size()});
    if (!clients[0]->Publish(ns, local_tokens, views).ok()) return false;
    auto local_ids = strata::ComputeBlockIds(ns, kTpb, local_tokens);
    if (!measure(*clients[0], local_ids, &out->local_lookup_p50_us, &out->local_lookup_p99_us))
      return false;
    // The same two lookups through gRPC only (no active-message fast path), same run.
    strata::ClientOptions go;
    go.endpoint = cl.endpoint(0);
    go.lookup_fast_path = false;
    auto grpc_client = strata::Client::Connect(go);
    if (!grpc_client.ok() || !(*grpc_client)->OpenNamespace(Spec(kTpb), "bench").ok()) return false;
    if (!measure(**grpc_client, local_ids, &out->grpc_local_lookup_p50_us,
                 &out->grpc_local_lookup_p99_us))
      return false;
    if (!measure(**grpc_client, ids, &out->grpc_lookup_p50_us, &out->grpc_lookup_p99_us))
      return false;
  }

  // Remote fetch: blocks published on node 1, fetched through node 0's client.
  std::vector<size_t> sizes =
      smoke ? std::vector<size_t>{1 << 20} : std::vector<size_t>{64 << 10, 1 << 20, 8 << 20};
  if (!block_kib.empty()) {
    sizes.clear();
    for (size_t kib : block_kib) sizes.push_back(kib << 10);
  }
  const size_t batch_bytes = smoke ? (16 << 20) : (64 << 20);
  std::string tmp = (std::filesystem::temp_directory_path() / "strata-cbench-XXXXXX").string();
  if (!mkdtemp(tmp.data())) return false;
  for (size_t size : sizes) {
    const size_t batch = std::max<size_t>(1, batch_bytes / size);
    std::vector<char> src(batch * size), dst(batch * size);
    std::mt19937_64 r64(size);
    for (size_t i = 0; i < src.size(); i += 8) {
      uint64_t v = r64();
      std::memcpy(&src[i], &v, 8);
    }
    std::vector<strata::ConstBuffer> in(batch);
    std::vector<strata::MutableBuffer> dstv(batch);
    for (size_t i = 0; i < batch; ++i) {
      in[i] = {src.data() + i * size, size};
      dstv[i] = {dst.data() + i * size, size};
    }
    auto pub = clients[1]->Publish(ns, tokens_of(batch), in);
    if (!pub.ok() || pub->stored != batch) return false;
    (void)clients[0]->RegisterBuffer(dst.data(), dst.size());
    FetchRow row;
    row.block_bytes = size;
    const int rounds = smoke ? 2 : 8;
    // tag_bw on loopback tcp swings 2-9 GB/s from one run to the next on this kind of VM: one
    // measurement each would make the ratio a coin toss.
    int pt_iters = std::max(20, static_cast<int>((smoke ? (256 << 20) : (1ull << 30)) / size));
    // Plain tcp moves as many bytes as tag_bw (at least the fetch's rounds): shorter runs of it
    // swing more.
    const int socket_rounds = std::max<int>(rounds, pt_iters * size / src.size());
    // GB/s of `rounds` fetches of the whole batch (after one warm-up call in the first: it
    // connects to node 1 and opens the namespace there); nullopt on a failure, reported.
    auto fetch_rounds = [&](bool warm_up) -> std::optional<double> {
      double bytes = 0, secs = 0;
      for (int r = warm_up ? 0 : 1; r <= rounds; ++r) {
        auto t0 = Clock::now();
        auto f = clients[0]->Fetch(ns, pub->ids, dstv);
        double dt = Seconds(Clock::now() - t0);
        if (!f.ok() || f->fetched != batch || f->remote != batch) {
          std::cerr << "remote fetch of " << batch << " x " << size << " B: "
                    << (f.ok() ? absl::StrCat(f->fetched, " fetched, ", f->remote, " remote")
                               : f.status().ToString());
          if (f.ok()) {
            std::map<int, int> hist;
            for (auto st : f->status) ++hist[static_cast<int>(st)];
            for (auto [k, v] : hist) std::cerr << " status " << k << ": " << v;
          }
          std::cerr << "\n" << cl.logs();
          return std::nullopt;
        }
        if (r == 0) continue;
        bytes += static_cast<double>(batch * size);
        secs += dt;
      }
      if (std::memcmp(src.data(), dst.data(), src.size()) != 0) {
        std::cerr << "remote fetch returned different bytes\n";
        return std::nullopt;
      }
      return bytes / secs / 1e9;
    };
    for (int rep = 0; rep < reps; ++rep) {
      std::optional<double> gbps = fetch_rounds(rep == 0);
      if (!gbps) return false;
      row.gbps_reps.push_back(*gbps);
      // Two-sided send/receive: what the transport carries when nothing is emulated.
      if (!fetch_only) {
        row.tag_reps.push_back(PerftestGbps("tag_bw", size, pt_iters, tls, tmp).value_or(0));
        row.socket_reps.push_back(PlainTcpGbps(src, socket_rounds).value_or(0));
      }
    }
    row.gbps = Percentile(row.gbps_reps, 0.5);
    row.perftest_tag_gbps = row.tag_reps.empty() ? 0 : Percentile(row.tag_reps, 0.5);
    row.socket_gbps = row.socket_reps.empty() ? 0 : Percentile(row.socket_reps, 0.5);
    std::vector<double> lat;
    for (int i = 0; i < (smoke ? 10 : 100); ++i) {
      auto t0 = Clock::now();
      auto f = clients[0]->Fetch(ns, {&pub->ids[0], 1}, {&dstv[0], 1});
      if (!f.ok() || f->fetched != 1) return false;
      lat.push_back(Seconds(Clock::now() - t0) * 1e6);
    }
    row.p50_us = Percentile(lat, 0.5);
    lat.clear();
    for (int i = 0; i < (smoke ? 10 : 100); ++i) {
      auto t0 = Clock::now();
      auto l = clients[0]->Locate(ns, {&pub->ids[0], 1});
      if (!l.ok() || l->size() != 1 || (*l)[0].empty()) return false;
      lat.push_back(Seconds(Clock::now() - t0) * 1e6);
    }
    row.locate_p50_us = Percentile(lat, 0.5);
    if (!fetch_only)
      row.perftest_gbps = PerftestGbps("ucp_get", size, pt_iters, tls, tmp).value_or(0);
    (void)clients[0]->UnregisterBuffer(dst.data());
    out->fetch.push_back(row);
  }
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cluster_bench: lookup and remote fetch across a loopback stratad cluster"};
  int nodes = 5;
  bool json = false, smoke = false;
  // tcp is what crosses between nodes here (no RDMA device): the fair baseline for a remote
  // fetch. "all" lets UCX pick shared memory for ucx_perftest, which no remote node can use.
  std::vector<std::string> transports = {"tcp"};
  app.add_option("--nodes", nodes, "daemons in the cluster")->capture_default_str();
  app.add_option("--transports", transports, "UCX_TLS values to run (\"all\": UCX's choice)");
  app.add_flag("--json", json, "one JSON object on stdout");
  app.add_flag("--smoke", smoke, "small and quick (CI)");
  int reps = 5;
  bool no_verify = false;
  app.add_flag("--no-verify", no_verify, "fetch without checking each block's CRC");
  app.add_option("--block-kib", block_kib, "remote fetch: block sizes in KiB")
      ->check(CLI::Range(size_t{4}, size_t{64 << 10}));
  app.add_flag("--fetch-only", fetch_only, "remote fetch rounds alone: no ucx_perftest baselines");
  app.add_option("--reps", reps, "remote fetch: repetitions, alternating with tag_bw (medians)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  verify_crc = !no_verify;
  if (smoke) {
    nodes = std::min(nodes, 3);
    transports = {"tcp"};
  }
  std::vector<Result> results;
  for (const auto& tls : transports) {
    Result r;
    if (!Run(nodes, tls, smoke, smoke ? 1 : reps, &r)) {
      std::cerr << "cluster_bench: run with UCX_TLS=" << tls << " failed\n";
      return 1;
    }
    results.push_back(r);
  }
  if (json) {
    std::cout << "{\"runs\": [";
    for (size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      std::cout << (i ? ", " : "")
                << absl::StrFormat(
                       "{\"nodes\": %d, \"transport\": \"%s\", \"lookup_512_p50_us\": %.1f, "
                       "\"lookup_512_p99_us\": %.1f, \"local_lookup_512_p50_us\": %.1f, "
                       "\"local_lookup_512_p99_us\": %.1f, \"hash_512_p50_us\": %.1f, "
                       "\"grpc_lookup_512_p50_us\": %.1f, \"grpc_local_lookup_512_p50_us\": %.1f, "
                       "\"remote_fetch\": [",
                       r.nodes, r.tls, r.lookup_p50_us, r.lookup_p99_us, r.local_lookup_p50_us,
                       r.local_lookup_p99_us, r.hash_p50_us, r.grpc_lookup_p50_us,
                       r.grpc_local_lookup_p50_us);
      for (size_t k = 0; k < r.fetch.size(); ++k) {
        const auto& f = r.fetch[k];
        std::cout << (k ? ", " : "")
                  << absl::StrFormat(
                         "{\"block_bytes\": %d, \"gbps\": %.3f, \"p50_us\": %.1f, "
                         "\"locate_p50_us\": %.1f, "
                         "\"perftest_gbps\": %.3f, \"ratio_vs_perftest\": %.3f, "
                         "\"perftest_tag_gbps\": %.3f, \"ratio_vs_tag\": %.3f, "
                         "\"socket_gbps\": %.3f, \"ratio_vs_socket\": %.3f, "
                         "\"gbps_reps\": [%s], \"tag_reps\": [%s], \"socket_reps\": [%s]}",
                         f.block_bytes, f.gbps, f.p50_us, f.locate_p50_us,
                         f.perftest_gbps, Ratio(f.gbps, f.perftest_gbps), f.perftest_tag_gbps,
                         Ratio(f.gbps, f.perftest_tag_gbps), f.socket_gbps,
                         Ratio(f.gbps, f.socket_gbps),
                         Joined(f.gbps_reps), Joined(f.tag_reps), Joined(f.socket_reps));
      }
      std::cout << "]}";
    }
    std::cout << "]}\n";
    return 0;
  }
  for (const auto& r : results) {
    std::cout << absl::StrFormat(
        "%d nodes, UCX_TLS=%s\n  lookup of 512 blocks spread over all nodes: p50 %.0f us, p99 "
        "%.0f us (all on the asking node: p50 %.0f us, p99 %.0f us); hashing the ids: %.0f us\n",
        r.nodes, r.tls, r.lookup_p50_us, r.lookup_p99_us, r.local_lookup_p50_us,
        r.local_lookup_p99_us, r.hash_p50_us);
    std::cout << absl::StrFormat(
        "  gRPC only (no fast path), same run: spread p50 %.0f us p99 %.0f us; all local p50 "
        "%.0f us p99 %.0f us\n",
        r.grpc_lookup_p50_us, r.grpc_lookup_p99_us, r.grpc_local_lookup_p50_us,
        r.grpc_local_lookup_p99_us);
    std::cout << absl::StrFormat("  %-10s %10s %10s %10s %12s %8s %12s %8s %12s %8s\n", "block",
                                 "GB/s", "p50 us", "locate us", "ucp_get", "ratio", "tag_bw",
                                 "ratio", "plain tcp", "ratio");
    for (const auto& f : r.fetch)
      std::cout << absl::StrFormat(
          "  %-10d %10.2f %10.0f %10.0f %12.2f %8.2f %12.2f %8.2f %12.2f %8.2f\n",
          f.block_bytes, f.gbps, f.p50_us, f.locate_p50_us, f.perftest_gbps,
          Ratio(f.gbps, f.perftest_gbps), f.perftest_tag_gbps, Ratio(f.gbps, f.perftest_tag_gbps),
          f.socket_gbps, Ratio(f.gbps, f.socket_gbps));
    std::cout << "  every repetition in order (the table has their medians), GB/s:\n";
    for (const auto& f : r.fetch)
      std::cout << absl::StrFormat("  %-10d fetch %s | tag_bw %s | plain tcp %s\n",
                                   f.block_bytes, Joined(f.gbps_reps), Joined(f.tag_reps),
                                   Joined(f.socket_reps));
  }
  return 0;
}
