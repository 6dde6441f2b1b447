// stratactl: admin CLI for a stratad node, built on libstrata's AdminClient.
//
// Exit codes: 0 success; 1 the daemon refused or failed the operation (or a config file is
// invalid, or a reposition/drain left blocks behind); 2 bad usage; 3 the daemon could not be
// reached within --timeout.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "absl/strings/str_format.h"
#include "common/units.h"
#include "config/daemon_config.h"
#include "strata/admin_client.h"
#include "strata/block_id.h"
#include "strata/block_status.h"

namespace {

using strata::AdminClient;

constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitUnreachable = 3;

// Every flag of every subcommand; CLI11 writes into it while parsing.
struct Flags {
  std::string endpoint = "127.0.0.1:7420";
  std::string token_file;
  std::string tls_ca, tls_cert, tls_key, tls_server_name;
  double timeout_s = 5;
  bool json = false;
  std::string ns_hex;
  std::vector<std::string> ids;
  bool cascade = false, force = false, move = false, all_pages = false;
  uint32_t page_size = 100;
  uint64_t page_token = 0;
  std::string ttl = "1h";
  std::string config_file;
  std::string target_node;
  std::string target_tier = "host";
  std::string calibration_id;  // 16 hex digits; empty: the namespace's current calibration
  std::string file;            // calibration get: where to write; put: what to send
};

std::string Hex(const strata::Digest& d) { return d.IsZero() ? std::string() : d.ToHex(); }

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

std::string BlockJson(const strata::BlockDetail& b) {
  return absl::StrFormat(
      "{\"id\":\"%s\",\"namespace_id\":\"%s\",\"tier\":\"host\",\"size_bytes\":%d,"
      "\"crc32c\":%d,\"parent_id\":\"%s\",\"pinned_for_ms\":%d,\"leases\":%d,"
      "\"idle_ms\":%d}",
      Hex(b.id), Hex(b.ns), b.size_bytes, b.crc32c, Hex(b.parent), b.pinned_for_ms, b.leases,
      b.idle_ms);
}

int Report(const absl::Status& s, const std::string& endpoint, const char* what) {
  if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
    std::cerr << "stratactl: cannot reach stratad at " << endpoint << " (" << s.message()
              << "); is it running and is --endpoint right?\n";
    return kExitUnreachable;
  }
  std::cerr << "stratactl: " << what << " failed: " << s.message() << "\n";
  return kExitFailed;
}

int Usage(const absl::Status& s) {
  std::cerr << "stratactl: " << s.message() << "\n";
  return kExitUsage;
}

absl::StatusOr<std::vector<strata::BlockId>> ParseIds(const std::vector<std::string>& hex) {
  std::vector<strata::BlockId> ids;
  for (const auto& h : hex) {
    auto id = strata::Digest::FromHex(h);
    if (!id.ok())
      return absl::InvalidArgumentError(absl::StrCat("block id: ", id.status().message()));
    ids.push_back(*id);
  }
  return ids;
}

absl::StatusOr<strata::NamespaceId> ParseNamespace(const std::string& hex) {
  auto ns = strata::Digest::FromHex(hex);
  if (!ns.ok())
    return absl::InvalidArgumentError(absl::StrCat("--namespace: ", ns.status().message()));
  return *ns;
}

std::string StatusJson(const strata::NodeStatus& r, const Flags& f, bool with_counters) {
  const strata::TierUsage* host = r.Tier("host");
  std::ostringstream o;
  o << "{\"endpoint\":\"" << JsonEscape(f.endpoint) << "\",\"status\":\"serving\""
    << ",\"node_id\":\"" << JsonEscape(r.node_id) << "\",\"version\":\"" << JsonEscape(r.version)
    << "\",\"uptime_ms\":" << r.uptime_ms << ",\"transport\":\"" << JsonEscape(r.transport) << "\""
    << ",\"tiers\":[{\"tier\":\"host\",\"capacity_bytes\":" << (host ? host->capacity_bytes : 0)
    << ",\"used_bytes\":" << (host ? host->used_bytes : 0)
    << ",\"blocks\":" << (host ? host->blocks : 0)
    << ",\"reserved_bytes\":" << (host ? host->reserved_bytes : 0) << "}";
  for (const char* name : {"nvme", "gpu"})
    if (const strata::TierUsage* t = r.Tier(name))
      o << ",{\"tier\":\"" << name << "\",\"capacity_bytes\":" << t->capacity_bytes
        << ",\"used_bytes\":" << t->used_bytes << ",\"blocks\":" << t->blocks << "}";
  o << "]"
    << ",\"open_reservations\":" << r.open_reservations << ",\"open_leases\":" << r.open_leases
    << ",\"pinned_blocks\":" << r.pinned_blocks << ",\"namespaces\":" << r.namespaces;
  if (with_counters) {
    o << ",\"counters\":{";
    bool first = true;
    for (const auto& [k, v] : r.counters) {
      o << (first ? "" : ",") << "\"" << JsonEscape(k) << "\":" << v;
      first = false;
    }
    o << "}";
  }
  o << "}";
  return o.str();
}

std::string UsageLine(const char* name, const strata::TierUsage& t) {
  return absl::StrFormat("%-11s %s of %s used (%.1f%%), %d blocks\n", name,
                         strata::FormatSize(t.used_bytes), strata::FormatSize(t.capacity_bytes),
                         t.capacity_bytes ? 100.0 * t.used_bytes / t.capacity_bytes : 0.0,
                         t.blocks);
}

int RunStatus(AdminClient& admin, const Flags& f, bool with_counters) {
  auto r = admin.Status();
  if (!r.ok()) return Report(r.status(), f.endpoint, "stats");
  if (f.json) {
    std::cout << StatusJson(*r, f, with_counters) << "\n";
    return 0;
  }
  std::cout << absl::StrFormat("node        %s (stratad %s) at %s\n", r->node_id, r->version,
                               f.endpoint);
  std::cout << absl::StrFormat("status      serving, up %.0fs, UCX transports %s\n",
                               r->uptime_ms / 1000.0, r->transport);
  std::cout << UsageLine("host tier", r->Tier("host") ? *r->Tier("host") : strata::TierUsage{});
  if (const strata::TierUsage* nvme = r->Tier("nvme")) std::cout << UsageLine("nvme tier", *nvme);
  if (const strata::TierUsage* gpu = r->Tier("gpu")) std::cout << UsageLine("gpu tier", *gpu);
  std::cout << absl::StrFormat(
      "in flight   %d reservations, %d leases, %d pinned blocks, %d namespaces\n",
      r->open_reservations, r->open_leases, r->pinned_blocks, r->namespaces);
  if (with_counters) {
    std::cout << "\ncounters\n";
    for (const auto& [k, v] : r->counters) std::cout << absl::StrFormat("  %-28s %d\n", k, v);
  }
  return 0;
}

int RunValidate(const Flags& f) {
  auto c = strata::LoadConfigFile(f.config_file);
  if (!c.ok()) {
    if (f.json)
      std::cout << "{\"valid\":false,\"error\":\"" << JsonEscape(std::string(c.status().message()))
                << "\"}\n";
    else
      std::cerr << "stratactl: " << c.status().message() << "\n";
    return kExitFailed;
  }
  if (f.json)
    std::cout << "{\"valid\":true}\n";
  else
    std::cout << f.config_file << ": valid\n";
  return 0;
}

int RunReposition(AdminClient& admin, const Flags& f) {
  auto ns = ParseNamespace(f.ns_hex);
  if (!ns.ok()) return Usage(ns.status());
  auto ids = ParseIds(f.ids);
  if (!ids.ok()) return Usage(ids.status());
  auto r = admin.Reposition(*ns, *ids, f.target_node, f.move, f.target_tier);
  if (!r.ok()) return Report(r.status(), f.endpoint, "reposition");
  uint64_t failed = 0;
  for (strata::BlockStatus st : r->status) failed += st != strata::BlockStatus::kOk;
  if (f.json)
    std::cout << absl::StrFormat(
        "{\"copied\":%d,\"already_there\":%d,\"removed_sources\":%d,\"failed\":%d}\n", r->copied,
        r->already_there, r->removed_sources, failed);
  else
    std::cout << absl::StrFormat(
        "%d copied, %d already there, %d source copies removed, %d failed\n", r->copied,
        r->already_there, r->removed_sources, failed);
  return failed == 0 ? 0 : kExitFailed;
}

// Drains the --endpoint node, or the node named `f.target_node`, found through it.
int RunDrain(AdminClient& admin, const Flags& f, const strata::AdminClientOptions& options) {
  std::unique_ptr<AdminClient> other;
  AdminClient* target = &admin;
  if (!f.target_node.empty()) {
    auto view = admin.ListNodes();
    if (!view.ok()) return Report(view.status(), f.endpoint, "drain");
    std::string address;
    for (const auto& n : view->nodes)
      if (n.id == f.target_node) address = n.address;
    if (address.empty()) {
      std::cerr << "stratactl: node '" << f.target_node << "' is not in the cluster view of "
                << f.endpoint << "\n";
      return kExitFailed;
    }
    strata::AdminClientOptions o = options;
    o.endpoint = address;
    auto c = AdminClient::Connect(o);
    if (!c.ok()) return Report(c.status(), address, "drain");
    other = std::move(*c);
    target = other.get();
  }
  auto r = target->Drain();
  if (!r.ok()) return Report(r.status(), target->endpoint(), "drain");
  if (f.json) {
    std::cout << absl::StrFormat("{\"blocks\":%d,\"moved\":%d,\"failed\":%d,\"targets\":[",
                                 r->blocks, r->moved, r->failed);
    for (size_t i = 0; i < r->targets.size(); ++i)
      std::cout << (i ? "," : "") << "\"" << JsonEscape(r->targets[i]) << "\"";
    std::cout << "]}\n";
  } else {
    std::cout << absl::StrFormat("drained %d blocks: %d moved to %d nodes, %d failed\n", r->blocks,
                                 r->moved, r->targets.size(), r->failed);
  }
  return r->failed == 0 ? 0 : kExitFailed;
}

int RunNodes(AdminClient& admin, const Flags& f) {
  auto r = admin.ListNodes();
  if (!r.ok()) return Report(r.status(), f.endpoint, "nodes");
  if (f.json) {
    std::cout << absl::StrFormat(
        "{\"membership\":\"%s\",\"healthy\":%s,\"detail\":\"%s\",\"epoch\":%d,"
        "\"directory_ids\":%d,\"directory_bytes\":%d,\"nodes\":[",
        JsonEscape(r->membership), r->healthy ? "true" : "false", JsonEscape(r->detail), r->epoch,
        r->directory_ids, r->directory_bytes);
    for (size_t i = 0; i < r->nodes.size(); ++i) {
      const auto& n = r->nodes[i];
      std::cout << (i ? "," : "")
                << absl::StrFormat(
                       "{\"node_id\":\"%s\",\"endpoint\":\"%s\",\"state\":\"serving\","
                       "\"version\":\"%s\",\"host_capacity_bytes\":%d,\"self\":%s}",
                       JsonEscape(n.id), JsonEscape(n.address), JsonEscape(n.version),
                       n.host_capacity, n.self ? "true" : "false");
    }
    std::cout << "]}\n";
    return 0;
  }
  std::cout << absl::StrFormat("membership %s, %s%s; this node owns %d directory entries\n",
                               r->membership, r->healthy ? "healthy" : "DEGRADED",
                               r->detail.empty() ? "" : " (" + r->detail + ")", r->directory_ids);
  std::cout << absl::StrFormat("%-20s %-24s %-8s %s\n", "NODE", "ENDPOINT", "STATE", "HOST");
  for (const auto& n : r->nodes)
    std::cout << absl::StrFormat(
        "%-20s %-24s %-8s %s%s\n", n.id, n.address, "serving",
        n.host_capacity ? strata::FormatSize(n.host_capacity) : std::string("-"),
        n.self ? "  (this node)" : "");
  return 0;
}

int RunListNamespaces(AdminClient& admin, const Flags& f) {
  auto r = admin.ListNamespaces();
  if (!r.ok()) return Report(r.status(), f.endpoint, "ls");
  if (f.json) {
    std::cout << "{\"namespaces\":[";
    for (size_t i = 0; i < r->size(); ++i) {
      const auto& n = (*r)[i];
      std::cout << (i ? "," : "")
                << absl::StrFormat(
                       "{\"namespace_id\":\"%s\",\"tenant\":\"%s\",\"model_id\":"
                       "\"%s\",\"codec_policy\":\"%s\",\"blocks\":%d,\"bytes\":%d}",
                       Hex(n.id), JsonEscape(n.tenant), JsonEscape(n.model_id),
                       JsonEscape(n.codec_policy), n.blocks, n.bytes);
    }
    std::cout << "]}\n";
    return 0;
  }
  std::cout << absl::StrFormat("%-64s  %-12s %-28s %-10s %8s %10s\n", "NAMESPACE", "TENANT",
                               "MODEL", "CODEC", "BLOCKS", "BYTES");
  for (const auto& n : *r)
    std::cout << absl::StrFormat("%-64s  %-12s %-28s %-10s %8d %10s\n", Hex(n.id), n.tenant,
                                 n.model_id, n.codec_policy, n.blocks, strata::FormatSize(n.bytes));
  return 0;
}

int RunListBlocks(AdminClient& admin, const Flags& f) {
  auto ns = ParseNamespace(f.ns_hex);
  if (!ns.ok()) return Usage(ns.status());
  // Progress for long listings goes to the terminal only.
  const bool progress = f.all_pages && !f.json && isatty(2);
  std::vector<strata::BlockDetail> blocks;
  uint64_t token = f.page_token;
  int pages = 0;
  do {
    auto page = admin.ListBlocks(*ns, f.page_size, token);
    if (!page.ok()) return Report(page.status(), f.endpoint, "ls");
    blocks.insert(blocks.end(), page->blocks.begin(), page->blocks.end());
    token = page->next_page_token;
    if (progress)
      std::cerr << "\rstratactl: " << blocks.size() << " blocks, page " << ++pages << std::flush;
  } while (f.all_pages && token != 0);
  if (progress) std::cerr << "\n";
  if (f.json) {
    std::cout << "{\"blocks\":[";
    for (size_t i = 0; i < blocks.size(); ++i) std::cout << (i ? "," : "") << BlockJson(blocks[i]);
    std::cout << "],\"next_page_token\":" << token << "}\n";
    return 0;
  }
  std::cout << absl::StrFormat("%-64s  %-5s %10s %10s %7s %9s\n", "BLOCK", "TIER", "SIZE", "CRC32C",
                               "LEASES", "PINNED");
  for (const auto& b : blocks)
    std::cout << absl::StrFormat(
        "%-64s  %-5s %10s   %08x %7d %9s\n", Hex(b.id), "host", strata::FormatSize(b.size_bytes),
        b.crc32c, b.leases, b.pinned_for_ms ? absl::StrFormat("%ds", b.pinned_for_ms / 1000) : "-");
  if (token != 0) std::cout << "more: --page-token " << token << "\n";
  return 0;
}

int RunInspect(AdminClient& admin, const Flags& f) {
  auto ids = ParseIds(f.ids);
  if (!ids.ok()) return Usage(ids.status());
  auto r = admin.InspectBlocks(*ids);
  if (!r.ok()) return Report(r.status(), f.endpoint, "inspect");
  if (f.json) {
    std::cout << "{\"blocks\":[";
    for (size_t i = 0; i < r->size(); ++i) std::cout << (i ? "," : "") << BlockJson((*r)[i]);
    std::cout << "]}\n";
  } else {
    for (const auto& b : *r)
      std::cout << absl::StrFormat(
          "block      %s\nnamespace  %s\nlocation   node %s, tier host\nsize       %s\n"
          "crc32c     %08x\nparent     %s\nleases     %d\npinned     %s\nidle       %.1fs\n\n",
          Hex(b.id), Hex(b.ns), f.endpoint, strata::FormatSize(b.size_bytes), b.crc32c,
          b.parent.IsZero() ? "(first block of its chain)" : Hex(b.parent), b.leases,
          b.pinned_for_ms ? absl::StrFormat("%ds more", b.pinned_for_ms / 1000) : "no",
          b.idle_ms / 1000.0);
  }
  if (r->size() < ids->size()) {
    std::cerr << "stratactl: " << ids->size() - r->size()
              << " of the ids are not held by this node\n";
    return kExitFailed;
  }
  return 0;
}

int RunPin(AdminClient& admin, const Flags& f, bool pin) {
  auto ns = ParseNamespace(f.ns_hex);
  if (!ns.ok()) return Usage(ns.status());
  auto ids = ParseIds(f.ids);
  if (!ids.ok()) return Usage(ids.status());
  auto ttl = strata::ParseDurationText(f.ttl);
  if (!ttl.ok()) return Usage(ttl.status());
  auto r = pin ? admin.Pin(*ns, *ids, *ttl) : admin.Unpin(*ns, *ids);
  if (!r.ok()) return Report(r.status(), f.endpoint, pin ? "pin" : "unpin");
  bool all_ok = true;
  if (f.json) std::cout << "{\"status\":[";
  for (size_t i = 0; i < r->size(); ++i) {
    auto st = strata::BlockStatusName((*r)[i]);
    all_ok &= st == "ok";
    if (f.json)
      std::cout << (i ? "," : "") << "\"" << st << "\"";
    else
      std::cout << f.ids[i] << "  " << st << "\n";
  }
  if (f.json) std::cout << "]}\n";
  return all_ok ? 0 : kExitFailed;
}

int RunListCalibrations(AdminClient& admin, const Flags& f) {
  std::optional<strata::NamespaceId> only;
  if (!f.ns_hex.empty()) {
    auto ns = ParseNamespace(f.ns_hex);
    if (!ns.ok()) return Usage(ns.status());
    only = *ns;
  }
  auto r = admin.ListCalibrations(only);
  if (!r.ok()) return Report(r.status(), f.endpoint, "calibration ls");
  if (f.json) {
    std::cout << "{\"calibrations\":[";
    for (size_t i = 0; i < r->size(); ++i) {
      const auto& c = (*r)[i];
      std::cout << (i ? "," : "")
                << absl::StrFormat(
                       "{\"namespace_id\":\"%s\",\"id\":\"%016x\",\"version\":%d,\"bytes\":%d,"
                       "\"layers\":%d,\"kv_heads\":%d,\"head_dim\":%d,\"target_bits\":%g,"
                       "\"sample_bits\":%g,\"rope_theta\":%g,\"added_unix_ms\":%d,"
                       "\"current\":%s,\"mode\":\"%s\",\"step\":%g}",
                       Hex(c.ns), c.id, c.version, c.bytes, c.num_layers, c.num_kv_heads,
                       c.head_dim, c.target_bits, c.sample_bits, c.rope_theta, c.added_unix_ms,
                       c.current ? "true" : "false", c.mode.empty() ? "pca" : c.mode, c.step);
    }
    std::cout << "]}\n";
    return 0;
  }
  // TARGET: the bits per value a pca calibration aimed for, the step an xl one was made with.
  std::cout << absl::StrFormat("%-16s  %-16s %4s %-4s %9s %-13s %6s %6s %8s\n", "NAMESPACE", "ID",
                               "VER", "MODE", "BYTES", "SHAPE", "TARGET", "BITS", "CURRENT");
  for (const auto& c : *r)
    std::cout << absl::StrFormat(
        "%-16s  %016x %4d %-4s %9s %-13s %6s %6.2f %8s\n", c.ns.ShortHex(), c.id, c.version,
        c.mode.empty() ? "pca" : c.mode, strata::FormatSize(c.bytes),
        absl::StrFormat("%dx%dx%d", c.num_layers, c.num_kv_heads, c.head_dim),
        c.mode == "xl" ? absl::StrFormat("s%.2f", c.step) : absl::StrFormat("%.2f", c.target_bits),
        c.sample_bits, c.current ? "yes" : "");
  return 0;
}

int RunGetCalibration(AdminClient& admin, const Flags& f) {
  auto ns = ParseNamespace(f.ns_hex);
  if (!ns.ok()) return Usage(ns.status());
  uint64_t id = 0;
  if (!f.calibration_id.empty() &&
      (f.calibration_id.size() != 16 ||
       f.calibration_id.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos ||
       (id = std::stoull(f.calibration_id, nullptr, 16)) == 0))
    return Usage(absl::InvalidArgumentError("--id: expected 16 hex digits (not all zero)"));
  strata::CalibrationSummary summary;
  auto bytes = admin.GetCalibration(*ns, id, &summary);
  if (!bytes.ok()) return Report(bytes.status(), f.endpoint, "calibration get");
  std::ofstream out(f.file, std::ios::binary | std::ios::trunc);
  out.write(bytes->data(), static_cast<std::streamsize>(bytes->size()));
  if (!out.good()) {
    std::cerr << "stratactl: calibration get: cannot write " << f.file << "\n";
    return 1;
  }
  std::cout << absl::StrFormat("calibration %016x (version %d, %s) written to %s\n", summary.id,
                               summary.version, strata::FormatSize(bytes->size()), f.file);
  return 0;
}

int RunPutCalibration(AdminClient& admin, const Flags& f) {
  auto ns = ParseNamespace(f.ns_hex);
  if (!ns.ok()) return Usage(ns.status());
  std::ifstream in(f.file, std::ios::binary);
  if (!in) return Usage(absl::InvalidArgumentError("cannot read " + f.file));
  std::stringstream bytes;
  bytes << in.rdbuf();
  auto r = admin.PutCalibration(*ns, bytes.str());
  if (!r.ok()) return Report(r.status(), f.endpoint, "calibration put");
  std::cout << absl::StrFormat("calibration %016x stored as version %d of namespace %s%s\n", r->id,
                               r->version, Hex(*ns), r->current ? " (current)" : "");
  return 0;
}

int RunEvict(AdminClient& admin, const Flags& f) {
  auto ns = ParseNamespace(f.ns_hex);
  if (!ns.ok()) return Usage(ns.status());
  auto ids = ParseIds(f.ids);
  if (!ids.ok()) return Usage(ids.status());
  auto r = admin.Evict(*ns, *ids, f.cascade, f.force);
  if (!r.ok()) return Report(r.status(), f.endpoint, "evict");
  if (f.json) {
    std::cout << "{\"removed_blocks\":" << r->removed_blocks << ",\"status\":[";
    for (size_t i = 0; i < r->status.size(); ++i)
      std::cout << (i ? "," : "") << "\"" << strata::BlockStatusName(r->status[i]) << "\"";
    std::cout << "]}\n";
  } else {
    for (size_t i = 0; i < r->status.size(); ++i)
      std::cout << f.ids[i] << "  " << strata::BlockStatusName(r->status[i]) << "\n";
    std::cout << r->removed_blocks << " blocks removed\n";
  }
  return 0;
}

// The subcommands, as CLI11 knows them after parsing.
struct Commands {
  CLI::App *status, *stats, *evict, *nodes, *ls, *inspect, *pin, *unpin, *validate, *reposition,
      *drain, *calibration_ls, *calibration_get, *calibration_put;
};

Commands DefineCommands(CLI::App& app, Flags& f) {
  Commands c;
  app.add_option("--endpoint", f.endpoint, "stratad gRPC address HOST:PORT")->capture_default_str();
  app.add_option("--token-file", f.token_file,
                 "file holding an admin bearer token (default: $STRATA_TOKEN, if set)");
  app.add_option("--tls-ca", f.tls_ca,
                 "PEM CA that signs the daemon's certificate: talk TLS (daemon config tls:)");
  app.add_option("--tls-cert", f.tls_cert, "PEM client certificate (with --tls-key), for mTLS");
  app.add_option("--tls-key", f.tls_key, "PEM key of --tls-cert");
  app.add_option("--tls-server-name", f.tls_server_name,
                 "name the daemon's certificate must carry (default: the --endpoint host)");
  app.add_option("--timeout", f.timeout_s, "seconds to wait for the daemon")->capture_default_str();
  app.add_flag("--json", f.json, "machine-readable output");
  c.status = app.add_subcommand("status", "is the node up, and how full is it");
  c.stats = app.add_subcommand("stats", "every counter of the node");
  c.evict = app.add_subcommand("evict", "remove blocks of a namespace");
  c.evict->add_option("--namespace", f.ns_hex, "namespace id (64 hex characters)")->required();
  c.evict->add_option("ids", f.ids, "block ids (64 hex characters each)")->required();
  c.evict->add_flag("--cascade", f.cascade, "also remove every block chained after each id");
  c.evict->add_flag("--force", f.force, "remove pinned blocks too");
  c.nodes = app.add_subcommand("nodes", "the nodes of the cluster, as this node sees it");
  c.ls = app.add_subcommand("ls", "namespaces, or the blocks of one namespace (paged)");
  c.ls->add_option("--namespace", f.ns_hex, "namespace id; without it, list the namespaces");
  c.ls->add_option("--page-size", f.page_size, "blocks per page")->capture_default_str();
  c.ls->add_option("--page-token", f.page_token, "continue from a previous page");
  c.ls->add_flag("--all", f.all_pages, "every page");
  c.inspect = app.add_subcommand("inspect", "where blocks live: tier, size, CRC, pins");
  c.inspect->add_option("ids", f.ids, "block ids (64 hex characters each)")->required();
  c.pin = app.add_subcommand("pin", "protect blocks from eviction for a while");
  c.unpin = app.add_subcommand("unpin", "remove pins");
  for (auto* cmd : {c.pin, c.unpin}) {
    cmd->add_option("--namespace", f.ns_hex, "namespace id (64 hex characters)")->required();
    cmd->add_option("ids", f.ids, "block ids")->required();
  }
  c.pin->add_option("--ttl", f.ttl, "how long, e.g. 30m")->capture_default_str();
  auto* config = app.add_subcommand("config", "configuration files");
  config->require_subcommand(1);
  c.validate = config->add_subcommand("validate", "check a stratad config file");
  c.validate->add_option("file", f.config_file, "YAML file")->required();
  c.reposition =
      app.add_subcommand("reposition", "copy or move blocks to a node's host (or GPU) tier");
  c.reposition->add_option("--namespace", f.ns_hex, "namespace id (64 hex characters)")->required();
  c.reposition->add_option("--to", f.target_node, "target node id (default: the --endpoint node)");
  c.reposition->add_flag("--move", f.move, "remove the source copies afterwards");
  c.reposition->add_option("--tier", f.target_tier,
                           "host, or gpu (this node's GPU tier; --to must be this node)")
      ->check(CLI::IsMember({"host", "gpu"}));
  c.reposition->add_option("ids", f.ids, "block ids")->required();
  c.drain = app.add_subcommand(
      "drain", "move a node's blocks to the nodes that rank next for them, then leave the cluster");
  c.drain->add_option("node", f.target_node, "node id (default: the --endpoint node)");
  auto* calibration =
      app.add_subcommand("calibration", "namespaces' calibrations (codec modes pca and xl)");
  calibration->require_subcommand(1);
  c.calibration_ls = calibration->add_subcommand("ls", "calibrations held by the node");
  c.calibration_ls->add_option("--namespace", f.ns_hex, "only this namespace's");
  c.calibration_get = calibration->add_subcommand(
      "get", "save a calibration's bytes (from the node, else from its cluster)");
  c.calibration_put = calibration->add_subcommand(
      "put", "store a calibration for a namespace; it becomes current if its version is highest");
  for (auto* cmd : {c.calibration_get, c.calibration_put})
    cmd->add_option("--namespace", f.ns_hex, "namespace id (64 hex characters)")->required();
  c.calibration_get->add_option("--id", f.calibration_id,
                                "calibration id, 16 hex digits (default: the current one)");
  c.calibration_get->add_option("-o,--out", f.file, "file to write")->required();
  c.calibration_put->add_option("file", f.file, "serialized calibration")->required();
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"stratactl: administer a Strata node"};
  app.require_subcommand(1);
  app.fallthrough();  // inherited by subcommands: global flags may follow the subcommand
  Flags f;
  Commands c = DefineCommands(app, f);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return e.get_exit_code() == 0 ? 0 : kExitUsage;
  }
  if (*c.validate) return RunValidate(f);

  strata::AdminClientOptions options;
  options.endpoint = f.endpoint;
  // From a file or the environment, never a flag: a flag's value shows in `ps`.
  if (!f.token_file.empty()) {
    std::ifstream in(f.token_file);
    if (!(in >> options.auth_token)) {
      std::cerr << "stratactl: --token-file: cannot read a token from " << f.token_file << "\n";
      return kExitUsage;
    }
  } else if (const char* env = std::getenv("STRATA_TOKEN")) {
    options.auth_token = env;
  }
  // Checked here so an error names the flag; libstrata checks what the files hold.
  for (const auto& [flag, path] :
       {std::pair{"--tls-ca", f.tls_ca}, std::pair{"--tls-cert", f.tls_cert},
        std::pair{"--tls-key", f.tls_key}}) {
    if (!path.empty() && !std::ifstream(path)) {
      std::cerr << "stratactl: " << flag << ": cannot read " << path << "\n";
      return kExitUsage;
    }
  }
  if (f.tls_ca.empty() && !(f.tls_cert.empty() && f.tls_key.empty() && f.tls_server_name.empty())) {
    std::cerr << "stratactl: --tls-cert, --tls-key and --tls-server-name need --tls-ca\n";
    return kExitUsage;
  }
  options.tls.ca_file = f.tls_ca;
  options.tls.cert_file = f.tls_cert;
  options.tls.key_file = f.tls_key;
  options.tls.server_name = f.tls_server_name;
  options.timeout = absl::Milliseconds(static_cast<int64_t>(f.timeout_s * 1000));
  auto admin = AdminClient::Connect(options);
  if (!admin.ok()) return Usage(admin.status());
  AdminClient& a = **admin;
  if (*c.status || *c.stats) return RunStatus(a, f, /*with_counters=*/static_cast<bool>(*c.stats));
  if (*c.reposition) return RunReposition(a, f);
  if (*c.drain) return RunDrain(a, f, options);
  if (*c.nodes) return RunNodes(a, f);
  if (*c.ls) return f.ns_hex.empty() ? RunListNamespaces(a, f) : RunListBlocks(a, f);
  if (*c.inspect) return RunInspect(a, f);
  if (*c.pin || *c.unpin) return RunPin(a, f, /*pin=*/static_cast<bool>(*c.pin));
  if (*c.evict) return RunEvict(a, f);
  if (*c.calibration_ls) return RunListCalibrations(a, f);
  if (*c.calibration_get) return RunGetCalibration(a, f);
  if (*c.calibration_put) return RunPutCalibration(a, f);
  return kExitUsage;
}
