// Starts a real stratad on an ephemeral loopback port for a test and cleans up after it.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/free_port.h"

namespace strata::testing {

// The first sanitizer report in a process's output with some lines of it, empty when there is
// none. Sanitizer builds (scripts/test-sanitizers.sh) instrument stratad too; its reports go to
// its log, where no test assertion would look.
inline std::string SanitizerReport(const std::string& log) {
  static const char* const kMarkers[] = {
      "ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "WARNING: ThreadSanitizer",
      "ERROR: ThreadSanitizer", "SUMMARY: UndefinedBehaviorSanitizer"};
  size_t first = std::string::npos;
  for (const char* m : kMarkers) first = std::min(first, log.find(m));
  if (first == std::string::npos) return "";
  // UBSan's summary comes after its report: start a little before the marker.
  size_t from = log.rfind('\n', first > 2000 ? first - 2000 : 0);
  from = from == std::string::npos ? 0 : from;
  return log.substr(from, 8000);
}

// The temporary folders a test process made, removed when it exits normally (by the process
// that made them, not a forked child): tests left hundreds in /tmp per run otherwise. Never
// destroyed, since the removal runs at exit.
struct TempDirs {
  std::mutex mu;
  std::vector<std::string> dirs;
  pid_t owner = getpid();
};
inline TempDirs& TempDirsOfThisProcess() {
  static TempDirs* dirs = new TempDirs;
  return *dirs;
}
inline void RemoveTempDirsAtExit() {
  TempDirs& t = TempDirsOfThisProcess();
  if (getpid() != t.owner) return;
  std::lock_guard<std::mutex> lock(t.mu);
  std::error_code ec;
  for (const std::string& d : t.dirs) std::filesystem::remove_all(d, ec);
}

inline std::string MakeTempDir(const std::string& tag) {
  std::string tmpl = (std::filesystem::temp_directory_path() / ("strata-" + tag + "-XXXXXX"));
  char* dir = mkdtemp(tmpl.data());
  if (dir == nullptr) return std::string();
  static const bool removed_at_exit = std::atexit(RemoveTempDirsAtExit) == 0;
  (void)removed_at_exit;
  TempDirs& t = TempDirsOfThisProcess();
  std::lock_guard<std::mutex> lock(t.mu);
  t.dirs.emplace_back(dir);
  return std::string(dir);
}

// Runs a command, returns (exit code, stdout+stderr).
// Starts `args` (args[0]: the program's path) with stdout and stderr going to `log`; the pid.
inline pid_t Spawn(std::vector<std::string> args, const std::string& log, bool append) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_CREAT | O_WRONLY | (append ? O_APPEND : O_TRUNC), 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

inline std::pair<int, std::string> RunCommand(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

class DaemonProcess {
 public:
  // `config_yaml` is written to a file and passed with --config; extra args follow.
  explicit DaemonProcess(const std::string& config_yaml = "",
                         std::vector<std::string> extra_args = {}) {
    dir_ = MakeTempDir("daemon");
    std::string config = dir_ + "/stratad.yaml";
    std::ofstream(config) << (config_yaml.empty() ? "host_tier:\n  capacity: 64MiB\n"
                                                  : config_yaml);
    ready_ = dir_ + "/ready.json";
    log_ = dir_ + "/stratad.log";
    std::vector<std::string> args = {STRATAD_BIN,    "--config",     config,
                                     "--listen",     "127.0.0.1:0",  "--data-dir",
                                     dir_ + "/data", "--ready-file", ready_};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    pid_ = Spawn(args, log_, /*append=*/false);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream in(ready_);
      std::string json((std::istreambuf_iterator<char>(in)), {});
      auto k = json.find("\"endpoint\":\"");
      if (k != std::string::npos) {
        k += 12;
        endpoint_ = json.substr(k, json.find('"', k) - k);
        return;
      }
      if (waitpid(pid_, &status_, WNOHANG) == pid_) {
        exited_ = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  ~DaemonProcess() {
    if (!exited_ && pid_ > 0) {
      // Sanitizer runs stop daemons with SIGTERM first: LeakSanitizer reports only on a normal
      // exit, and a drain that hangs or crashes is worth seeing too. Plain runs kill at once.
      if (std::getenv("STRATA_TEST_DAEMON_SIGTERM") != nullptr) {
        kill(pid_, SIGCONT);  // a test may leave it stopped
        kill(pid_, SIGTERM);
        WaitExit(std::chrono::seconds(15));
      }
      if (!exited_) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
      }
    }
    // A sanitizer report (in a daemon stopped by the test, by a crash or by the teardown above)
    // fails the test that started the daemon.
    std::string report = SanitizerReport(log());
    if (!report.empty()) ADD_FAILURE() << "stratad (" << log_ << ") reported:\n" << report;
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  bool ok() const { return !endpoint_.empty() && !exited_; }
  const std::string& endpoint() const { return endpoint_; }
  pid_t pid() const { return pid_; }
  const std::string& dir() const { return dir_; }
  std::string log() const {
    std::ifstream in(log_);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }

  // A string field of the daemon's ready file ("events_endpoint", ...); empty when absent.
  std::string ReadyField(const std::string& name) const {
    std::ifstream in(ready_);
    std::string json((std::istreambuf_iterator<char>(in)), {});
    auto k = json.find("\"" + name + "\":\"");
    if (k == std::string::npos) return "";
    k += name.size() + 4;
    return json.substr(k, json.find('"', k) - k);
  }

  void Signal(int sig) { kill(pid_, sig); }

  // SIGSTOP, returning once every thread has stopped (false if the process ended instead or is
  // still running at the timeout): kill() only queues the signal, and on a loaded machine a
  // thread already running can answer a request or two before it stops.
  bool Stop(std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    if (exited_ || pid_ <= 0) return false;
    kill(pid_, SIGSTOP);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WUNTRACED | WNOHANG);
      if (r == pid_ && WIFSTOPPED(status)) return true;
      if (r == pid_) {
        status_ = status;
        exited_ = true;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }

  // Whether the process still runs now (it is reaped when it has ended, so ok() turns false).
  bool Running() {
    if (exited_ || pid_ <= 0) return false;
    if (waitpid(pid_, &status_, WNOHANG) == pid_) exited_ = true;
    return !exited_;
  }
  // How the process ended ("exit 3", "signal 11"); empty while it runs.
  std::string ExitDescription() const {
    if (!exited_) return "";
    return WIFEXITED(status_) ? "exit " + std::to_string(WEXITSTATUS(status_))
                              : "signal " + std::to_string(WTERMSIG(status_));
  }

  // Exit code once the process ends within `timeout`, nullopt if it is still running.
  std::optional<int> WaitExit(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!exited_ && std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, &status_, WNOHANG) == pid_)
        exited_ = true;
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!exited_) return std::nullopt;
    return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
  }

 private:
  std::string dir_, ready_, log_, endpoint_;
  pid_t pid_ = -1;
  int status_ = 0;
  bool exited_ = false;
};

// Whether every daemon of a test cluster started and still runs.
inline bool AllServing(const std::vector<std::unique_ptr<DaemonProcess>>& daemons) {
  for (const auto& d : daemons)
    if (!d->ok()) return false;
  return true;
}

// A daemon on a loopback port picked by FreePort, for a test that starts it again on the same
// endpoint: `start(listen)` starts it with `listen` (the --listen arguments, also left in
// *listen for the restart). Another test may take the port between the pick and the bind; a
// daemon that could not listen is started again on a new port (three tries).
template <typename Start>
std::unique_ptr<DaemonProcess> OnFreePort(std::vector<std::string>* listen, Start start) {
  std::unique_ptr<DaemonProcess> d;
  for (int attempt = 0; attempt < 3; ++attempt) {
    *listen = {"--listen", "127.0.0.1:" + std::to_string(FreePort())};
    d = start(*listen);
    if (d->ok() || d->log().find("cannot listen") == std::string::npos) break;
  }
  return d;
}

// The logs of a test cluster's daemons, each under its node name (n0, n1, ...).
inline std::string AllLogs(const std::vector<std::unique_ptr<DaemonProcess>>& daemons) {
  std::string all;
  for (size_t i = 0; i < daemons.size(); ++i)
    all += "--- n" + std::to_string(i) + " ---\n" + daemons[i]->log();
  return all;
}

}  // namespace strata::testing
