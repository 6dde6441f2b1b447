// Helpers for operability tests and the scrape bench: HTTP GETs, ready-file fields, free ports,
// publishing many small blocks, and reading sample values out of a /metrics body.
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "strata/client.h"

namespace strata::testing {

// Value of `"key":"..."` in a flat JSON object, or "".
inline std::string JsonField(const std::string& json, const std::string& key) {
  std::string k = "\"" + key + "\":\"";
  auto p = json.find(k);
  if (p == std::string::npos) return "";
  p += k.size();
  return json.substr(p, json.find('"', p) - p);
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

struct HttpReply {
  int status = -1;  // -1: no answer
  std::string body;
};

// GET http://HOST:PORT/path.
inline HttpReply HttpGet(const std::string& endpoint, const std::string& path, int timeout_s = 5) {
  auto colon = endpoint.rfind(':');
  httplib::Client c(endpoint.substr(0, colon), std::stoi(endpoint.substr(colon + 1)));
  c.set_connection_timeout(timeout_s, 0);
  c.set_read_timeout(timeout_s, 0);
  auto r = c.Get(path.c_str());
  if (!r) return {};
  return {r->status, r->body};
}

// A loopback port that was free a moment ago (for servers that cannot report an ephemeral one).
inline int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

// Full path of an executable found on PATH (or in /usr/sbin, /usr/bin), or "".
inline std::string FindExecutable(const std::string& name) {
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/bin:/usr/sbin:/usr/local/bin";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string candidate = path.substr(start, end - start) + "/" + name;
    if (end > start && access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

// Value of the sample whose name and labels are exactly `series` (e.g. `x_total{a="b"}`).
inline std::optional<double> SampleValue(const std::string& text, const std::string& series) {
  size_t pos = 0;
  while ((pos = text.find(series + " ", pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n')
      return std::strtod(text.c_str() + pos + series.size() + 1, nullptr);
    pos += series.size();
  }
  return std::nullopt;
}

// Names of every metric family in a /metrics body (from its # TYPE lines).
inline std::vector<std::string> MetricFamilies(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = text.find("# TYPE ", pos)) != std::string::npos) {
    pos += 7;
    out.push_back(text.substr(pos, text.find(' ', pos) - pos));
  }
  return out;
}

// Every "expr" string of a Grafana dashboard JSON, unescaped (\" \\ \n \t \/ only: what
// PromQL needs).
inline std::vector<std::string> DashboardExprs(const std::string& json) {
  std::vector<std::string> out;
  const std::string key = "\"expr\":";
  size_t pos = 0;
  while ((pos = json.find(key, pos)) != std::string::npos) {
    pos = json.find('"', pos + key.size());
    if (pos == std::string::npos) break;
    std::string expr;
    for (++pos; pos < json.size() && json[pos] != '"'; ++pos) {
      char c = json[pos];
      if (c == '\\' && pos + 1 < json.size()) {
        char e = json[++pos];
        expr += e == 'n' ? '\n' : e == 't' ? '\t' : e;
      } else {
        expr += c;
      }
    }
    out.push_back(expr);
  }
  return out;
}

inline std::vector<std::string> MetricNamesWithPrefix(const std::string& expr,
                                                      const std::string& prefix) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = expr.find(prefix, pos)) != std::string::npos) {
    if (pos > 0 && (std::isalnum(static_cast<unsigned char>(expr[pos - 1])) ||
                    expr[pos - 1] == '_' || expr[pos - 1] == ':')) {
      pos += prefix.size();
      continue;
    }
    size_t end = pos;
    while (end < expr.size() && (std::isalnum(static_cast<unsigned char>(expr[end])) ||
                                 expr[end] == '_' || expr[end] == ':'))
      ++end;
    out.push_back(expr.substr(pos, end - pos));
    pos = end;
  }
  return out;
}

// Identifiers in a PromQL expression that name metrics the daemon could export: everything it
// exports is strata_* or process_*.
inline std::vector<std::string> MetricNamesIn(const std::string& expr) {
  std::vector<std::string> out;
  for (const std::string prefix : {"strata_", "process_"}) {
    auto more = MetricNamesWithPrefix(expr, prefix);
    out.insert(out.end(), more.begin(), more.end());
  }
  return out;
}

// Names a scrape answers to: each family, plus _bucket/_sum/_count for histograms.
inline std::vector<std::string> ExportedNames(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = text.find("# TYPE ", pos)) != std::string::npos) {
    pos += 7;
    size_t sp = text.find(' ', pos);
    std::string name = text.substr(pos, sp - pos);
    std::string type = text.substr(sp + 1, text.find('\n', sp) - sp - 1);
    out.push_back(name);
    if (type == "histogram")
      for (const char* suffix : {"_bucket", "_sum", "_count"}) out.push_back(name + suffix);
  }
  return out;
}

inline NamespaceSpec OpsSpec() {
  NamespaceSpec s;
  s.model_id = "ops-test";
  s.model_revision = "r1";
  s.layout = KvLayout{1, 1, 16, DType::kFloat16, 4, KvKind::kSeparateKV};
  return s;
}

// Publishes `count` distinct `bytes`-byte blobs under random ids, in batches; returns the ids.
inline absl::StatusOr<std::vector<BlockId>> PublishMany(Client& client, const NamespaceId& ns,
                                                        size_t count, size_t bytes,
                                                        uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::vector<BlockId> ids(count);
  for (auto& id : ids)
    for (size_t i = 0; i < id.bytes.size(); i += 8) {
      uint64_t v = rng();
      std::memcpy(id.bytes.data() + i, &v, 8);
    }
  std::vector<uint8_t> blob(bytes, 0x5a);
  const size_t batch = 8192;
  for (size_t first = 0; first < count; first += batch) {
    size_t n = std::min(batch, count - first);
    std::vector<ConstBuffer> views(n, ConstBuffer{blob.data(), blob.size()});
    auto r = client.PublishIds(ns, std::span<const BlockId>(ids.data() + first, n), {}, views);
    if (!r.ok()) return r.status();
    if (r->stored + r->deduplicated != n)
      return absl::InternalError("a publish batch did not store every block");
  }
  return ids;
}

}  // namespace strata::testing
