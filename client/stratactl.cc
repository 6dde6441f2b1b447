// stratactl: admin CLI for a stratad node.
//
// Exit codes: 0 success; 1 the daemon refused or failed the operation (or a config file is
// invalid, or a reposition/drain left blocks behind); 2 bad usage; 3 the daemon could not be
// reached within --timeout.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>

#include "absl/strings/str_format.h"
#include "strata/block_id.h"
#include "strata/block_status.h"
#include "common/units.h"
#include "config/daemon_config.h"
#include "strata/v1/admin.grpc.pb.h"
#include "strata/v1/cache.grpc.pb.h"

namespace {

constexpr int kExitFailed = 1;
constexpr int kExitUnreachable = 3;

std::string Hex(const std::string& raw) {
  auto d = strata::Digest::FromBytes(raw);
  return d.ok() ? d->ToHex() : std::string();
}

absl::StatusOr<std::string> PackHexIds(const std::vector<std::string>& hex) {
  std::string packed;
  for (const auto& h : hex) {
    auto id = strata::Digest::FromHex(h);
    if (!id.ok()) return id.status();
    packed.append(id->AsBytes());
  }
  return packed;
}

std::string BlockJson(const strata::v1::BlockInfo& b) {
  return absl::StrFormat(
      "{\"id\":\"%s\",\"namespace_id\":\"%s\",\"tier\":\"host\",\"size_bytes\":%d,"
      "\"crc32c\":%d,\"parent_id\":\"%s\",\"pinned_for_ms\":%d,\"leases\":%d,"
      "\"idle_ms\":%d}",
      Hex(b.id()), Hex(b.namespace_id()), b.size_bytes(), b.crc32c(), Hex(b.parent_id()),
      b.pinned_for_ms(), b.leases(), b.idle_ms());
}

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

const strata::v1::TierStats* FindTier(const strata::v1::StatsResponse& r, strata::v1::Tier tier) {
  for (const auto& t : r.tiers())
    if (t.tier() == tier) return &t;
  return nullptr;
}

const strata::v1::TierStats* HostTier(const strata::v1::StatsResponse& r) {
  return FindTier(r, strata::v1::TIER_HOST);
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

  auto* nodes_cmd = app.add_subcommand("nodes", "the nodes of the cluster, as this node sees it");
  auto* ls_cmd = app.add_subcommand("ls", "namespaces, or the blocks of one namespace (paged)");
  std::string ls_ns;
  uint32_t page_size = 100;
  uint64_t page_token = 0;
  bool all_pages = false;
  ls_cmd->add_option("--namespace", ls_ns, "namespace id; without it, list the namespaces");
  ls_cmd->add_option("--page-size", page_size, "blocks per page")->capture_default_str();
  ls_cmd->add_option("--page-token", page_token, "continue from a previous page");
  ls_cmd->add_flag("--all", all_pages, "every page");
  auto* inspect_cmd = app.add_subcommand("inspect", "where blocks live: tier, size, CRC, pins");
  std::vector<std::string> inspect_ids;
  inspect_cmd->add_option("ids", inspect_ids, "block ids (64 hex characters each)")->required();
  auto* pin_cmd = app.add_subcommand("pin", "protect blocks from eviction for a while");
  auto* unpin_cmd = app.add_subcommand("unpin", "remove pins");
  std::string pin_ns, ttl = "1h";
  std::vector<std::string> pin_ids;
  for (auto* c : {pin_cmd, unpin_cmd}) {
    c->add_option("--namespace", pin_ns, "namespace id (64 hex characters)")->required();
    c->add_option("ids", pin_ids, "block ids")->required();
  }
  pin_cmd->add_option("--ttl", ttl, "how long, e.g. 30m")->capture_default_str();
  auto* config_cmd = app.add_subcommand("config", "configuration files");
  config_cmd->require_subcommand(1);
  auto* validate_cmd = config_cmd->add_subcommand("validate", "check a stratad config file");
  std::string config_file;
  validate_cmd->add_option("file", config_file, "YAML file")->required();
  auto* reposition_cmd =
      app.add_subcommand("reposition", "copy or move blocks to another node's host tier");
  std::string repo_ns, repo_to;
  std::vector<std::string> repo_ids;
  bool repo_move = false;
  reposition_cmd->add_option("--namespace", repo_ns, "namespace id (64 hex characters)")
      ->required();
  reposition_cmd->add_option("--to", repo_to, "target node id (default: the --endpoint node)");
  reposition_cmd->add_flag("--move", repo_move, "remove the source copies afterwards");
  reposition_cmd->add_option("ids", repo_ids, "block ids")->required();
  auto* drain_cmd = app.add_subcommand(
      "drain", "move a node's blocks to the nodes that rank next for them, then leave the cluster");
  std::string drain_node;
  drain_cmd->add_option("node", drain_node, "node id (default: the --endpoint node)");
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
        << JsonEscape(r.version()) << "\",\"uptime_ms\":" << r.uptime_ms() << ",\"transport\":\""
        << JsonEscape(r.transport()) << "\""
        << ",\"tiers\":[{\"tier\":\"host\",\"capacity_bytes\":" << cap << ",\"used_bytes\":" << used
        << ",\"blocks\":" << blocks << ",\"reserved_bytes\":" << (host ? host->reserved_bytes() : 0)
        << "}";
      if (const auto* nvme = FindTier(r, strata::v1::TIER_NVME))
        o << ",{\"tier\":\"nvme\",\"capacity_bytes\":" << nvme->capacity_bytes()
          << ",\"used_bytes\":" << nvme->used_bytes() << ",\"blocks\":" << nvme->blocks() << "}";
      o << "]"
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
    if (const auto* nvme = FindTier(r, strata::v1::TIER_NVME))
      std::cout << absl::StrFormat(
          "nvme tier   %s of %s used (%.1f%%), %d blocks\n", strata::FormatSize(nvme->used_bytes()),
          strata::FormatSize(nvme->capacity_bytes()),
          nvme->capacity_bytes() ? 100.0 * nvme->used_bytes() / nvme->capacity_bytes() : 0.0,
          nvme->blocks());
    std::cout << absl::StrFormat(
        "in flight   %d reservations, %d leases, %d pinned blocks, %d "
        "namespaces\n",
        r.open_reservations(), r.open_leases(), r.pinned_blocks(), r.namespaces());
    if (*stats_cmd) {
      std::cout << "\ncounters\n";
      for (const auto& [k, v] : counters) std::cout << absl::StrFormat("  %-28s %d\n", k, v);
    }
    return 0;
  }

  if (*validate_cmd) {
    auto c = strata::LoadConfigFile(config_file);
    if (!c.ok()) {
      if (json)
        std::cout << "{\"valid\":false,\"error\":\""
                  << JsonEscape(std::string(c.status().message())) << "\"}\n";
      else
        std::cerr << "stratactl: " << c.status().message() << "\n";
      return kExitFailed;
    }
    if (json)
      std::cout << "{\"valid\":true}\n";
    else
      std::cout << config_file << ": valid\n";
    return 0;
  }

  // Moving blocks takes longer than a query: allow minutes unless --timeout says more.
  const auto long_deadline =
      std::max(deadline, std::chrono::system_clock::now() + std::chrono::minutes(10));
  if (*reposition_cmd) {
    auto ns = strata::Digest::FromHex(repo_ns);
    auto packed = PackHexIds(repo_ids);
    if (!ns.ok() || !packed.ok()) {
      std::cerr << "stratactl: " << (!ns.ok() ? ns.status() : packed.status()).message() << "\n";
      return 2;
    }
    strata::v1::RepositionRequest req;
    req.set_namespace_id(std::string(ns->AsBytes()));
    req.set_ids(*packed);
    req.set_target_node(repo_to);
    req.set_target_tier(strata::v1::TIER_HOST);
    req.set_move(repo_move);
    grpc::ClientContext ctx;
    ctx.set_deadline(long_deadline);
    strata::v1::RepositionResponse r;
    grpc::Status s = stub->Reposition(&ctx, req, &r);
    if (!s.ok()) return Report(s, endpoint, "reposition");
    uint64_t failed = 0;
    for (int st : r.status()) failed += st != strata::v1::BLOCK_OK;
    if (json) {
      std::cout << absl::StrFormat(
          "{\"copied\":%d,\"already_there\":%d,\"removed_sources\":%d,\"failed\":%d}\n", r.copied(),
          r.already_there(), r.removed_sources(), failed);
    } else {
      std::cout << absl::StrFormat(
          "%d copied, %d already there, %d source copies removed, "
          "%d failed\n",
          r.copied(), r.already_there(), r.removed_sources(), failed);
    }
    return failed == 0 ? 0 : kExitFailed;
  }
  if (*drain_cmd) {
    std::string target = endpoint;
    if (!drain_node.empty()) {  // find the node's address through the --endpoint node
      auto admin0 = strata::v1::Admin::NewStub(channel);
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline);
      strata::v1::ListNodesResponse nodes;
      grpc::Status s = admin0->ListNodes(&ctx, strata::v1::ListNodesRequest(), &nodes);
      if (!s.ok()) return Report(s, endpoint, "drain");
      target.clear();
      for (const auto& n : nodes.nodes())
        if (n.id() == drain_node) target = n.address();
      if (target.empty()) {
        std::cerr << "stratactl: node '" << drain_node << "' is not in the cluster view of "
                  << endpoint << "\n";
        return kExitFailed;
      }
    }
    auto admin1 =
        strata::v1::Admin::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(long_deadline);
    strata::v1::DrainResponse r;
    grpc::Status s = admin1->Drain(&ctx, strata::v1::DrainRequest(), &r);
    if (!s.ok()) return Report(s, target, "drain");
    if (json) {
      std::cout << absl::StrFormat("{\"blocks\":%d,\"moved\":%d,\"failed\":%d,\"targets\":[",
                                   r.blocks(), r.moved(), r.failed());
      for (int i = 0; i < r.targets_size(); ++i)
        std::cout << (i ? "," : "") << "\"" << JsonEscape(r.targets(i)) << "\"";
      std::cout << "]}\n";
    } else {
      std::cout << absl::StrFormat("drained %d blocks: %d moved to %d nodes, %d failed\n",
                                   r.blocks(), r.moved(), r.targets_size(), r.failed());
    }
    return r.failed() == 0 ? 0 : kExitFailed;
  }

  auto admin = strata::v1::Admin::NewStub(channel);
  if (*nodes_cmd) {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    strata::v1::ListNodesResponse r;
    grpc::Status s = admin->ListNodes(&ctx, strata::v1::ListNodesRequest(), &r);
    if (!s.ok()) return Report(s, endpoint, "nodes");
    if (json) {
      std::cout << absl::StrFormat(
          "{\"membership\":\"%s\",\"healthy\":%s,\"detail\":\"%s\",\"epoch\":%d,"
          "\"directory_ids\":%d,\"directory_bytes\":%d,\"nodes\":[",
          JsonEscape(r.membership()), r.healthy() ? "true" : "false", JsonEscape(r.detail()),
          r.epoch(), r.directory_ids(), r.directory_bytes());
      for (int i = 0; i < r.nodes_size(); ++i) {
        const auto& n = r.nodes(i);
        std::cout << (i ? "," : "")
                  << absl::StrFormat(
                         "{\"node_id\":\"%s\",\"endpoint\":\"%s\",\"state\":\"serving\","
                         "\"version\":\"%s\",\"host_capacity_bytes\":%d,\"self\":%s}",
                         JsonEscape(n.id()), JsonEscape(n.address()), JsonEscape(n.version()),
                         n.host_capacity(), n.self() ? "true" : "false");
      }
      std::cout << "]}\n";
    } else {
      std::cout << absl::StrFormat("membership %s, %s%s; this node owns %d directory entries\n",
                                   r.membership(), r.healthy() ? "healthy" : "DEGRADED",
                                   r.detail().empty() ? "" : " (" + r.detail() + ")",
                                   r.directory_ids());
      std::cout << absl::StrFormat("%-20s %-24s %-8s %s\n", "NODE", "ENDPOINT", "STATE", "HOST");
      for (const auto& n : r.nodes())
        std::cout << absl::StrFormat(
            "%-20s %-24s %-8s %s%s\n", n.id(), n.address(), "serving",
            n.host_capacity() ? strata::FormatSize(n.host_capacity()) : std::string("-"),
            n.self() ? "  (this node)" : "");
    }
    return 0;
  }

  if (*ls_cmd && ls_ns.empty()) {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    strata::v1::ListNamespacesResponse r;
    grpc::Status s = admin->ListNamespaces(&ctx, {}, &r);
    if (!s.ok()) return Report(s, endpoint, "ls");
    if (json) {
      std::cout << "{\"namespaces\":[";
      for (int i = 0; i < r.namespaces_size(); ++i) {
        const auto& n = r.namespaces(i);
        std::cout << (i ? "," : "")
                  << absl::StrFormat(
                         "{\"namespace_id\":\"%s\",\"tenant\":\"%s\",\"model_id\":"
                         "\"%s\",\"codec_policy\":\"%s\",\"blocks\":%d,\"bytes\":%d}",
                         Hex(n.namespace_id()), JsonEscape(n.tenant()),
                         JsonEscape(n.spec().model_id()), JsonEscape(n.spec().codec_policy()),
                         n.blocks(), n.bytes());
      }
      std::cout << "]}\n";
    } else {
      std::cout << absl::StrFormat("%-64s  %-12s %-28s %-10s %8s %10s\n", "NAMESPACE", "TENANT",
                                   "MODEL", "CODEC", "BLOCKS", "BYTES");
      for (const auto& n : r.namespaces())
        std::cout << absl::StrFormat("%-64s  %-12s %-28s %-10s %8d %10s\n", Hex(n.namespace_id()),
                                     n.tenant(), n.spec().model_id(), n.spec().codec_policy(),
                                     n.blocks(), strata::FormatSize(n.bytes()));
    }
    return 0;
  }

  if (*ls_cmd) {
    auto ns = strata::Digest::FromHex(ls_ns);
    if (!ns.ok()) {
      std::cerr << "stratactl: --namespace: " << ns.status().message() << "\n";
      return 2;
    }
    std::vector<strata::v1::BlockInfo> blocks;
    uint64_t token = page_token;
    int pages = 0;
    do {
      strata::v1::ListBlocksRequest req;
      req.set_namespace_id(std::string(ns->AsBytes()));
      req.set_page_size(page_size);
      req.set_page_token(token);
      grpc::ClientContext ctx;
      ctx.set_deadline(deadline);
      strata::v1::ListBlocksResponse r;
      grpc::Status s = admin->ListBlocks(&ctx, req, &r);
      if (!s.ok()) return Report(s, endpoint, "ls");
      blocks.insert(blocks.end(), r.blocks().begin(), r.blocks().end());
      token = r.next_page_token();
      if (all_pages && !json && isatty(2))  // progress for long listings, on the terminal only
        std::cerr << "\rstratactl: " << blocks.size() << " blocks, page " << ++pages << std::flush;
    } while (all_pages && token != 0);
    if (all_pages && !json && isatty(2)) std::cerr << "\n";
    if (json) {
      std::cout << "{\"blocks\":[";
      for (size_t i = 0; i < blocks.size(); ++i)
        std::cout << (i ? "," : "") << BlockJson(blocks[i]);
      std::cout << "],\"next_page_token\":" << token << "}\n";
    } else {
      std::cout << absl::StrFormat("%-64s  %-5s %10s %10s %7s %9s\n", "BLOCK", "TIER", "SIZE",
                                   "CRC32C", "LEASES", "PINNED");
      for (const auto& b : blocks)
        std::cout << absl::StrFormat(
            "%-64s  %-5s %10s   %08x %7d %9s\n", Hex(b.id()), "host",
            strata::FormatSize(b.size_bytes()), b.crc32c(), b.leases(),
            b.pinned_for_ms() ? absl::StrFormat("%ds", b.pinned_for_ms() / 1000) : "-");
      if (token != 0) std::cout << "more: --page-token " << token << "\n";
    }
    return 0;
  }

  if (*inspect_cmd) {
    auto packed = PackHexIds(inspect_ids);
    if (!packed.ok()) {
      std::cerr << "stratactl: block id: " << packed.status().message() << "\n";
      return 2;
    }
    strata::v1::InspectBlocksRequest req;
    req.set_ids(*packed);
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    strata::v1::InspectBlocksResponse r;
    grpc::Status s = admin->InspectBlocks(&ctx, req, &r);
    if (!s.ok()) return Report(s, endpoint, "inspect");
    if (json) {
      std::cout << "{\"blocks\":[";
      for (int i = 0; i < r.blocks_size(); ++i)
        std::cout << (i ? "," : "") << BlockJson(r.blocks(i));
      std::cout << "]}\n";
    } else {
      for (const auto& b : r.blocks())
        std::cout << absl::StrFormat(
            "block      %s\nnamespace  %s\nlocation   node %s, tier host\nsize       %s\n"
            "crc32c     %08x\nparent     %s\nleases     %d\npinned     %s\nidle       %.1fs\n\n",
            Hex(b.id()), Hex(b.namespace_id()), endpoint, strata::FormatSize(b.size_bytes()),
            b.crc32c(), b.parent_id().empty() ? "(first block of its chain)" : Hex(b.parent_id()),
            b.leases(),
            b.pinned_for_ms() ? absl::StrFormat("%ds more", b.pinned_for_ms() / 1000) : "no",
            b.idle_ms() / 1000.0);
    }
    if (r.blocks_size() < static_cast<int>(inspect_ids.size())) {
      std::cerr << "stratactl: " << inspect_ids.size() - r.blocks_size()
                << " of the ids are not held by this node\n";
      return kExitFailed;
    }
    return 0;
  }

  if (*pin_cmd || *unpin_cmd) {
    auto ns = strata::Digest::FromHex(pin_ns);
    auto packed = PackHexIds(pin_ids);
    auto ttl_d = strata::ParseDurationText(ttl);
    if (!ns.ok() || !packed.ok() || !ttl_d.ok()) {
      std::cerr << "stratactl: "
                << (!ns.ok()       ? ns.status()
                    : !packed.ok() ? packed.status()
                                   : ttl_d.status())
                       .message()
                << "\n";
      return 2;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    google::protobuf::RepeatedField<int> statuses;
    grpc::Status s;
    if (*pin_cmd) {
      strata::v1::PinRequest req;
      req.set_namespace_id(std::string(ns->AsBytes()));
      req.set_ids(*packed);
      req.set_ttl_ms(absl::ToInt64Milliseconds(*ttl_d));
      strata::v1::PinResponse r;
      s = stub->Pin(&ctx, req, &r);
      statuses = r.status();
    } else {
      strata::v1::UnpinRequest req;
      req.set_namespace_id(std::string(ns->AsBytes()));
      req.set_ids(*packed);
      strata::v1::UnpinResponse r;
      s = stub->Unpin(&ctx, req, &r);
      statuses = r.status();
    }
    if (!s.ok()) return Report(s, endpoint, *pin_cmd ? "pin" : "unpin");
    bool all_ok = true;
    if (json) std::cout << "{\"status\":[";
    for (int i = 0; i < statuses.size(); ++i) {
      auto st = strata::BlockStatusName(static_cast<strata::BlockStatus>(statuses[i]));
      all_ok &= st == "ok";
      if (json)
        std::cout << (i ? "," : "") << "\"" << st << "\"";
      else
        std::cout << pin_ids[i] << "  " << st << "\n";
    }
    if (json) std::cout << "]}\n";
    return all_ok ? 0 : kExitFailed;
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
                  << strata::BlockStatusName(static_cast<strata::BlockStatus>(r.status(i))) << "\"";
      std::cout << "]}\n";
    } else {
      for (int i = 0; i < r.status_size(); ++i)
        std::cout << id_hex[i] << "  "
                  << strata::BlockStatusName(static_cast<strata::BlockStatus>(r.status(i))) << "\n";
      std::cout << r.removed_blocks() << " blocks removed\n";
    }
    return 0;
  }
  return 2;
}
