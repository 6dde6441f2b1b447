// Helpers every benchmark shares: timing, percentiles, spawning processes with a UCX_TLS, and
// the baselines measured in the same run (ucx_perftest, memcpy).
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace strata::bench {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t k = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[k];
}

inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// `env`: more variables for the child only. -1 when the program cannot be started.
// posix_spawn, not fork: a fork marks every page of this process copy-on-write, and each page
// of a benchmark's buffers then faults on the next write into it: a 64 MiB fetch right after
// each ucx_perftest baseline took 16,000 faults and ran 2.5x slower than the rounds after it.
inline pid_t Spawn(const std::vector<std::string>& args, const std::string& log,
                   const std::string& tls,
                   const std::vector<std::pair<std::string, std::string>>& env = {}) {
  std::vector<std::pair<std::string, std::string>> set = env;
  if (!tls.empty()) set.emplace_back("UCX_TLS", tls);  // empty: the environment's choice
  std::vector<std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view var(*e);
    const std::string_view name = var.substr(0, var.find('='));
    if (std::none_of(set.begin(), set.end(), [&](const auto& kv) { return kv.first == name; }))
      vars.emplace_back(var);
  }
  for (const auto& [k, v] : set) vars.push_back(k + "=" + v);
  std::vector<char*> envp, argv;
  for (auto& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t io;
  posix_spawn_file_actions_init(&io);
  posix_spawn_file_actions_addopen(&io, 1, log.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&io, 1, 2);
  pid_t pid = -1;
  if (posix_spawnp(&pid, argv[0], &io, nullptr, argv.data(), envp.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&io);
  return pid;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Unique token sequences: each call returns `blocks` full blocks never published before.
class TokenSource {
 public:
  explicit TokenSource(uint32_t tpb, uint32_t seed = 12345) : tpb_(tpb), rng_(seed) {}
  std::vector<uint32_t> Next(size_t blocks) {
    std::vector<uint32_t> t(blocks * tpb_);
    for (auto& x : t) x = static_cast<uint32_t>(rng_());
    return t;
  }

 private:
  uint32_t tpb_;
  std::mt19937 rng_;
};

// A stratad for a benchmark: `bin` with `args` plus --listen 127.0.0.1:0 and a ready file in
// `dir`, UCX_TLS=`tls` and `env` in its environment, output in dir/stratad.log. endpoint() is
// empty when it did not get ready within 20 s. SIGTERM and wait on destruction.
class StratadProcess {
 public:
  StratadProcess(const std::string& bin, std::vector<std::string> args, const std::string& dir,
                 const std::string& tls,
                 const std::vector<std::pair<std::string, std::string>>& env = {})
      : log_(dir + "/stratad.log") {
    const std::string ready = dir + "/ready.json";
    std::filesystem::remove(ready);
    args.insert(args.begin(), bin);
    for (const char* a : {"--listen", "127.0.0.1:0", "--ready-file"}) args.push_back(a);
    args.push_back(ready);
    pid_ = Spawn(args, log_, tls, env);
    for (int i = 0; pid_ > 0 && i < 800 && endpoint_.empty(); ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {  // died at start: no 20 s wait
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
      std::string json = ReadFile(ready);
      auto k = json.find("\"endpoint\":\"");
      if (k != std::string::npos) {
        k += 12;
        endpoint_ = json.substr(k, json.find('"', k) - k);
      }
    }
  }
  ~StratadProcess() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  StratadProcess(const StratadProcess&) = delete;
  StratadProcess& operator=(const StratadProcess&) = delete;
  const std::string& endpoint() const { return endpoint_; }
  std::string log() const { return ReadFile(log_); }

 private:
  std::string log_, endpoint_;
  pid_t pid_ = -1;
};

// Runs ucx_perftest (server + client on loopback) and returns its overall bandwidth in GB/s.
inline std::optional<double> PerftestGbps(const std::string& test, size_t bytes, int iters,
                                          const std::string& tls, const std::string& tmp) {
  int port = FreePort();
  pid_t server = Spawn({"ucx_perftest", "-p", std::to_string(port)}, tmp + "/pt_server.log", tls);
  if (server <= 0) {
    std::cerr << "ucx_perftest could not be started\n";
    return std::nullopt;
  }
  std::optional<double> result;
  for (int attempt = 0; attempt < 50 && !result; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::string log = tmp + "/pt_client.log";
    pid_t client = Spawn({"ucx_perftest", "127.0.0.1", "-p", std::to_string(port), "-t", test, "-s",
                          std::to_string(bytes), "-n", std::to_string(iters)},
                         log, tls);
    if (client <= 0) break;
    int st = 0;
    waitpid(client, &st, 0);
    std::string out = ReadFile(log);
    auto k = out.find("Final:");
    if (k != std::string::npos) {
      std::istringstream line(out.substr(k + 6));
      double f[8] = {};
      for (double& x : f) line >> x;
      result = f[5] * 1024.0 * 1024.0 / 1e9;  // "overall" MB/s, MB = 2^20 bytes
    } else if (attempt == 49) {
      std::cerr << "ucx_perftest " << test << " failed:\n" << out << "\n";
    }  // otherwise the server was not listening yet, or the run was disturbed: try again
  }
  kill(server, SIGKILL);
  waitpid(server, nullptr, 0);
  return result;
}

inline double MemcpyGbps(size_t bytes, int iters) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  std::memcpy(b.data(), a.data(), bytes);
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) {
    std::memcpy(b.data(), a.data(), bytes);
    a[i % bytes] = static_cast<char>(b[(i * 7) % bytes]);  // keep the copies observable
  }
  return static_cast<double>(bytes) * iters / Seconds(Clock::now() - t0) / 1e9;
}

}  // namespace strata::bench
