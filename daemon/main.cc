// stratad: the Strata node daemon.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

#include "common/units.h"
#include "config/daemon_config.h"
#include "daemon/daemon.h"
#include "daemon/logging.h"

int main(int argc, char** argv) {
  using strata::DaemonConfig;
  CLI::App app{"stratad: Strata KV-cache node daemon"};
  // A flag given twice takes its last value, so wrappers can append overrides.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::string config_file, listen, http_listen, capacity, data_dir, ready_file, log_level, node_id;
  bool print_default = false, version = false, insecure = false;
  app.add_option("--config", config_file, "YAML config file (default: the embedded config)");
  // The last --listen wins, so a wrapper can append its own.
  app.add_option("--listen", listen, "gRPC address HOST:PORT (overrides 'listen')")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--http-listen", http_listen,
                 "HTTP /metrics, /healthz, /readyz address HOST:PORT (overrides 'http_listen'; "
                 "'off' disables it)");
  app.add_option("--host-capacity", capacity,
                 "host tier size, e.g. 4GiB (overrides "
                 "'host_tier.capacity')");
  app.add_option("--data-dir", data_dir, "state directory (overrides 'data_dir')");
  app.add_option("--node-id", node_id, "node name (overrides 'node_id')");
  std::string advertise;
  app.add_option("--advertise-address", advertise,
                 "HOST:PORT other nodes and clients use to reach this daemon (overrides "
                 "'cluster.advertise_address')");
  app.add_option("--log-level", log_level, "overrides 'log_level'");
  std::string log_format;
  app.add_option("--log-format", log_format, "text or json (overrides 'log_format')");
  app.add_option("--ready-file", ready_file,
                 "write {\"endpoint\":...,\"http_endpoint\":...,\"pid\":...} here once serving "
                 "(for scripts and tests; http_endpoint only with HTTP on)");
  app.add_flag("--insecure", insecure,
               "serve without authentication on a non-loopback listen address (sets 'insecure')");
  app.add_flag("--print-default-config", print_default, "print the embedded config and exit");
  app.add_flag("--version", version, "print the version and exit");
  CLI11_PARSE(app, argc, argv);

  if (version) {
    std::cout << "stratad " << STRATA_VERSION << "\n";
    return 0;
  }
  if (print_default) {
    std::cout << strata::DefaultConfigYaml();
    return 0;
  }

  absl::StatusOr<DaemonConfig> config =
      config_file.empty() ? strata::ParseConfig("") : strata::LoadConfigFile(config_file);
  if (!config.ok()) {
    std::cerr << "stratad: invalid configuration: " << config.status().message() << "\n";
    return 2;
  }
  if (!listen.empty()) config->listen = listen;
  if (!http_listen.empty()) config->http_listen = http_listen == "off" ? "" : http_listen;
  if (!data_dir.empty()) config->data_dir = data_dir;
  if (!node_id.empty()) config->node_id = node_id;
  if (!advertise.empty()) config->cluster.advertise_address = advertise;
  if (!log_level.empty()) config->log_level = log_level;
  if (insecure) config->insecure = true;
  if (!log_format.empty()) config->log_format = log_format;
  if (!capacity.empty()) {
    auto bytes = strata::ParseSize(capacity);
    if (!bytes.ok()) {
      std::cerr << "stratad: --host-capacity: " << bytes.status().message() << "\n";
      return 2;
    }
    config->host.capacity = *bytes;
  }
  if (auto s = strata::ValidateConfig(*config); !s.ok()) {
    std::cerr << "stratad: invalid configuration: " << s.message() << "\n";
    return 2;
  }
  strata::daemon::ConfigureLogging(config->log_level, config->log_format);

  // Signals are taken synchronously on this thread; every other thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto daemon = strata::daemon::Daemon::Start(*config);
  if (!daemon.ok()) {
    spdlog::error("cannot start: {}", daemon.status().ToString());
    return 1;
  }
  if (!ready_file.empty()) {
    std::string tmp = ready_file + ".tmp";
    std::ofstream out(tmp);
    out << "{\"endpoint\":\"" << (*daemon)->endpoint() << "\",";
    if (!(*daemon)->http_endpoint().empty())
      out << "\"http_endpoint\":\"" << (*daemon)->http_endpoint() << "\",";
    if (!(*daemon)->events_endpoint().empty())
      out << "\"events_endpoint\":\"" << (*daemon)->events_endpoint() << "\",";
    if (!(*daemon)->events_replay_endpoint().empty())
      out << "\"events_replay_endpoint\":\"" << (*daemon)->events_replay_endpoint() << "\",";
    out << "\"pid\":" << getpid() << "}\n";
    out.close();
    std::rename(tmp.c_str(), ready_file.c_str());
  }
  int sig = 0;
  sigwait(&signals, &sig);
  spdlog::info("received {}", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  (*daemon)->Shutdown();
  daemon->reset();
  spdlog::info("exited cleanly");
  return 0;
}
