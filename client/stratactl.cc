// stratactl: admin CLI for a stratad node.
//
// Exit codes: 0 success; 1 the daemon refused or failed the operation; 2 bad usage;
// 3 the daemon could not be reached within --timeout.
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_format.h"
#include "common/block_id.h"
#include "common/block_status.h"
#include "common/units.h"
#include "strata/v1/cache.grpc.pb.h"

namespace {

constexpr int kExitFailed = 1;
constexpr int kExitUnreachable = 3;

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      o += absl::StrFormat("\\u%04x", c);
      continue;
    }
    o += c;
  }
  return o;
}

int Report(const grpc::Status& s, const std::string& endpoint, const char* what) {
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    std::cerr << "stratactl: cannot reach stratad at " << endpoint << " (" << s.error_message()
              << "); is it running and is --endpoint right?\n";
    return kExitUnreachable;
  }
  std::cerr << "stratactl: " << what << " failed: " << s.error_message() << "\n";
  return kExitFailed;
}

const strata::v1::TierStats* HostTier(const strata::v1::StatsResponse& r) {
  for (const auto& t : r.tiers())
    if (t.tier() == strata::v1::TIER_HOST) return &t;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"stratactl: administer a Strata node"};
  app.require_subcommand(1);
  app.fallthrough();  // inherited by subcommands: global flags may follow the subcommand
  std::string endpoint = "127.0.0.1:7420";
  double timeout_s = 5;
  bool json = false;
  app.add_option("--endpoint", endpoint, "stratad gRPC address HOST:PORT")->capture_default_str();
  app.add_option("--timeout", timeout_s, "seconds to wait for the daemon")->capture_default_str();
  app.add_flag("--json", json, "machine-readable output");

  auto* status_cmd = app.add_subcommand("status", "is the node up, and how full is it");
  auto* stats_cmd = app.add_subcommand("stats", "every counter of the node");
  auto* evict_cmd = app.add_subcommand("evict", "remove blocks of a namespace");
  std::string ns_hex;
  std::vector<std::string> id_hex;
  bool cascade = false, force = false;
  evict_cmd->add_option("--namespace", ns_hex, "namespace id (64 hex characters)")->required();
  evict_cmd->add_option("ids", id_hex, "block ids (64 hex characters each)")->required();
  evict_cmd->add_flag("--cascade", cascade, "also remove every block chained after each id");
  evict_cmd->add_flag("--force", force, "remove pinned blocks too");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return e.get_exit_code() == 0 ? 0 : 2;
  }

  auto channel = grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials());
  auto stub = strata::v1::Cache::NewStub(channel);
  auto deadline = std::chrono::system_clock::now() +
                  std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));

  if (*status_cmd || *stats_cmd) {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    strata::v1::StatsResponse r;
    grpc::Status s = stub->Stats(&ctx, strata::v1::StatsRequest(), &r);
    if (!s.ok()) return Report(s, endpoint, "stats");
    const auto* host = HostTier(r);
    uint64_t cap = host ? host->capacity_bytes() : 0, used = host ? host->used_bytes() : 0;
    uint64_t blocks = host ? host->blocks() : 0;
    std::map<std::string, uint64_t> counters(r.counters().begin(), r.counters().end());
    if (json) {
      std::ostringstream o;
      o << "{\"endpoint\":\"" << JsonEscape(endpoint) << "\",\"status\":\"serving\""
        << ",\"node_id\":\"" << JsonEscape(r.node_id()) << "\",\"version\":\""
        << JsonEscape(r.version()) << "\",\"uptime_ms\":" << r.uptime_ms()
        << ",\"transport\":\"" << JsonEscape(r.transport()) << "\""
        << ",\"tiers\":[{\"tier\":\"host\",\"capacity_bytes\":" << cap
        << ",\"used_bytes\":" << used << ",\"blocks\":" << blocks
        << ",\"reserved_bytes\":" << (host ? host->reserved_bytes() : 0) << "}]"
        << ",\"open_reservations\":" << r.open_reservations()
        << ",\"open_leases\":" << r.open_leases() << ",\"pinned_blocks\":" << r.pinned_blocks()
        << ",\"namespaces\":" << r.namespaces();
      if (*stats_cmd) {
        o << ",\"counters\":{";
        bool first = true;
        for (const auto& [k, v] : counters) {
          o << (first ? "" : ",") << "\"" << JsonEscape(k) << "\":" << v;
          first = false;
        }
        o << "}";
      }
      o << "}";
      std::cout << o.str() << "\n";
      return 0;
    }
    std::cout << absl::StrFormat("node        %s (stratad %s) at %s\n", r.node_id(), r.version(),
                                 endpoint);
    std::cout << absl::StrFormat("status      serving, up %.0fs, UCX transports %s\n",
                                 r.uptime_ms() / 1000.0, r.transport());
    std::cout << absl::StrFormat("host tier   %s of %s used (%.1f%%), %d blocks\n",
                                 strata::FormatSize(used), strata::FormatSize(cap),
                                 cap ? 100.0 * used / cap : 0.0, blocks);
    std::cout << absl::StrFormat("in flight   %d reservations, %d leases, %d pinned blocks, %d "
                                 "namespaces\n",
                                 r.open_reservations(), r.open_leases(), r.pinned_blocks(),
                                 r.namespaces());
    if (*stats_cmd) {
      std::cout << "\ncounters\n";
      for (const auto& [k, v] : counters) std::cout << absl::StrFormat("  %-28s %d\n", k, v);
    }
    return 0;
  }

  if (*evict_cmd) {
    auto ns = strata::Digest::FromHex(ns_hex);
    if (!ns.ok()) {
      std::cerr << "stratactl: --namespace: " << ns.status().message() << "\n";
      return 2;
    }
    strata::v1::EvictRequest req;
    req.set_namespace_id(std::string(ns->AsBytes()));
    std::string packed;
    for (const auto& h : id_hex) {
      auto id = strata::Digest::FromHex(h);
      if (!id.ok()) {
        std::cerr << "stratactl: block id: " << id.status().message() << "\n";
        return 2;
      }
      packed.append(id->AsBytes());
    }
    req.set_ids(packed);
    req.set_cascade(cascade);
    req.set_force(force);
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    strata::v1::EvictResponse r;
    grpc::Status s = stub->Evict(&ctx, req, &r);
    if (!s.ok()) return Report(s, endpoint, "evict");
    if (json) {
      std::cout << "{\"removed_blocks\":" << r.removed_blocks() << ",\"status\":[";
      for (int i = 0; i < r.status_size(); ++i)
        std::cout << (i ? "," : "") << "\""
                  << strata::BlockStatusName(static_cast<strata::BlockStatus>(r.status(i)))
                  << "\"";
      std::cout << "]}\n";
    } else {
      for (int i = 0; i < r.status_size(); ++i)
        std::cout << id_hex[i] << "  "
                  << strata::BlockStatusName(static_cast<strata::BlockStatus>(r.status(i)))
                  << "\n";
      std::cout << r.removed_blocks() << " blocks removed\n";
    }
    return 0;
  }
  return 2;
}
