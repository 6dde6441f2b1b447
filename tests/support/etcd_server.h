// A real etcd server (Debian's etcd-server package) for tests: one member in a temp dir on free
// loopback ports, killed (-9) at destruction.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/support/free_port.h"

extern char** environ;

namespace strata::testing {

inline std::string FindEtcd() {
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/usr/sbin"}) {
    std::string p = std::string(dir) + "/etcd";
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return {};
}

class EtcdServer {
 public:
  EtcdServer() {
    char tmpl[] = "/tmp/strata-etcd-XXXXXX";
    dir_ = mkdtemp(tmpl);
    client_port_ = FreePort();
    peer_port_ = FreePort();
  }
  ~EtcdServer() {
    Kill();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  std::string endpoint() const { return absl::StrCat("http://127.0.0.1:", client_port_); }

  // Starts (or restarts, with the same data dir and ports) without waiting for it; callers
  // wait for whatever they need to see.
  bool Spawn() {
    std::string client = endpoint();
    std::string peer = absl::StrCat("http://127.0.0.1:", peer_port_);
    std::vector<std::string> args = {FindEtcd(),
                                     "--name",
                                     "t",
                                     "--data-dir",
                                     dir_ + "/data",
                                     "--listen-client-urls",
                                     client,
                                     "--advertise-client-urls",
                                     client,
                                     "--listen-peer-urls",
                                     peer,
                                     "--initial-advertise-peer-urls",
                                     peer,
                                     "--initial-cluster",
                                     "t=" + peer,
                                     "--listen-metrics-urls",
                                     "",
                                     "--log-level",
                                     "warn"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    std::string log = dir_ + "/etcd.log";
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    int rc = posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) pid_ = -1;
    return rc == 0;
  }

  // Spawns and waits (up to `limit`) until `ready` says it answers.
  bool Start(const std::function<bool()>& ready,
             std::chrono::milliseconds limit = std::chrono::seconds(15)) {
    if (!Spawn()) return false;
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (ready()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return ready();
  }

  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  std::string log() const {
    std::string out;
    if (FILE* f = fopen((dir_ + "/etcd.log").c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
      fclose(f);
    }
    return out.size() > 4000 ? out.substr(out.size() - 4000) : out;
  }

 private:
  std::string dir_;
  int client_port_ = -1;
  int peer_port_ = -1;
  pid_t pid_ = -1;
};

}  // namespace strata::testing
