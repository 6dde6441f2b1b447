#include "placement/internal/etcd_client.h"

#include <httplib.h>

#include <chrono>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "placement/internal/json.h"

namespace strata::placement::internal {
namespace {

std::string B64(std::string_view s) {
  return absl::Base64Escape(absl::string_view(s.data(), s.size()));
}

std::string UnB64(const std::string& s) {
  std::string out;
  if (!absl::Base64Unescape(s, &out)) return {};
  return out;
}

std::chrono::microseconds Micros(absl::Duration d) {
  return std::chrono::microseconds(absl::ToInt64Microseconds(d));
}

void SetTimeouts(httplib::Client& c, absl::Duration connect, absl::Duration read,
                 absl::Duration write) {
  c.set_connection_timeout(Micros(connect));
  c.set_read_timeout(Micros(read));
  c.set_write_timeout(Micros(write));
}

EtcdKv ParseKv(const Json& kv) {
  EtcdKv out;
  out.key = UnB64(kv.StringOr("key"));
  out.value = UnB64(kv.StringOr("value"));
  out.mod_revision = kv.IntOr("mod_revision");
  out.lease = kv.IntOr("lease");
  return out;
}

// The gateway wraps unary answers as the message itself and errors as {"error", "code", ...}.
absl::StatusOr<Json> ParseAnswer(const std::string& body) {
  auto j = Json::Parse(body);
  if (!j.ok()) return j.status();
  if (!j->is_object()) return absl::InternalError("etcd answer is not a JSON object");
  if (j->Get("error") && !j->Get("header")) {
    return absl::FailedPreconditionError(absl::StrCat("etcd: ", j->StringOr("error", body)));
  }
  return j;
}

}  // namespace

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    unsigned char c = static_cast<unsigned char>(end.back());
    if (c < 0xFF) {
      end.back() = static_cast<char>(c + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

EtcdClient::EtcdClient(std::vector<std::string> endpoints, absl::Duration call_timeout)
    : endpoints_(std::move(endpoints)), timeout_(call_timeout) {}

EtcdClient::~EtcdClient() = default;

std::string EtcdClient::endpoint() const {
  return endpoints_.empty() ? std::string("(no endpoint)") : endpoints_[current_];
}

absl::StatusOr<std::string> EtcdClient::Post(const std::string& path, const std::string& body) {
  if (endpoints_.empty()) return absl::InvalidArgumentError("no etcd endpoints configured");
  std::string errors;
  for (size_t attempt = 0; attempt < endpoints_.size(); ++attempt) {
    size_t i = (current_ + attempt) % endpoints_.size();
    httplib::Client client(endpoints_[i]);
    if (!client.is_valid()) {
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", endpoints_[i], ": not a URL");
      continue;
    }
    SetTimeouts(client, timeout_, timeout_, timeout_);
    auto res = client.Post(path, body, "application/json");
    if (!res) {
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", endpoints_[i], path, ": ",
                      httplib::to_string(res.error()));
      continue;
    }
    current_ = i;
    if (res->status != 200) {
      // etcd answered: an application error (lease not found, ...) is not a reason to try the
      // next endpoint.
      auto j = Json::Parse(res->body);
      std::string what =
          j.ok() ? j->StringOr("error", j->StringOr("message", res->body)) : res->body;
      std::string msg = absl::StrCat(endpoints_[i], path, ": HTTP ", res->status, ": ", what);
      // 503/504: no leader yet, an election, a request timed out inside etcd — it may answer
      // in a moment, which callers that retry need to tell apart from a refusal.
      if (res->status == 503 || res->status == 504) return absl::UnavailableError(msg);
      return absl::FailedPreconditionError(msg);
    }
    return std::move(res->body);
  }
  return absl::UnavailableError(absl::StrCat("etcd unreachable: ", errors));
}

absl::StatusOr<std::pair<int64_t, int64_t>> EtcdClient::Grant(int64_t ttl_seconds) {
  auto body = Post("/v3/lease/grant", absl::StrCat("{\"TTL\":\"", ttl_seconds, "\"}"));
  if (!body.ok()) return body.status();
  auto j = ParseAnswer(*body);
  if (!j.ok()) return j.status();
  int64_t id = j->IntOr("ID");
  if (id == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(endpoint(), ": lease grant refused: ", j->StringOr("error", *body)));
  }
  return std::make_pair(id, j->IntOr("TTL", ttl_seconds));
}

absl::StatusOr<int64_t> EtcdClient::KeepAlive(int64_t lease) {
  auto body = Post("/v3/lease/keepalive", absl::StrCat("{\"ID\":\"", lease, "\"}"));
  if (!body.ok()) return body.status();
  // The gateway streams: each line is {"result": LeaseKeepAliveResponse}; one request, one line.
  std::string_view first = *body;
  if (auto nl = first.find('\n'); nl != std::string_view::npos) first = first.substr(0, nl);
  auto j = Json::Parse(first);
  if (!j.ok()) return j.status();
  const Json* result = j->Get("result");
  if (!result) {
    return absl::UnavailableError(
        absl::StrCat(endpoint(), ": keepalive failed: ", j->StringOr("error", *body)));
  }
  return result->IntOr("TTL", 0);  // absent: the lease is gone
}

absl::Status EtcdClient::Revoke(int64_t lease) {
  auto body = Post("/v3/lease/revoke", absl::StrCat("{\"ID\":\"", lease, "\"}"));
  return body.status();
}

absl::Status EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  auto body = Post("/v3/kv/put", absl::StrCat("{\"key\":\"", B64(key), "\",\"value\":\"",
                                              B64(value), "\",\"lease\":\"", lease, "\"}"));
  if (!body.ok()) return body.status();
  return ParseAnswer(*body).status();
}

absl::StatusOr<EtcdRange> EtcdClient::RangePrefix(const std::string& prefix) {
  auto body = Post("/v3/kv/range", absl::StrCat("{\"key\":\"", B64(prefix), "\",\"range_end\":\"",
                                                B64(PrefixEnd(prefix)), "\"}"));
  if (!body.ok()) return body.status();
  auto j = ParseAnswer(*body);
  if (!j.ok()) return j.status();
  EtcdRange out;
  if (const Json* h = j->Get("header")) out.revision = h->IntOr("revision");
  if (const Json* kvs = j->Get("kvs")) {
    for (const Json& kv : kvs->items()) out.kvs.push_back(ParseKv(kv));
  }
  return out;
}

absl::Status EtcdClient::Watch(const std::string& prefix, int64_t start_revision,
                               absl::Duration idle_timeout,
                               const std::function<bool(const EtcdWatchResponse&)>& on_response) {
  if (endpoints_.empty()) return absl::InvalidArgumentError("no etcd endpoints configured");
  if (stop_watch_.exchange(false)) return absl::OkStatus();
  const std::string url = endpoints_[current_];
  httplib::Client client(url);
  if (!client.is_valid()) return absl::InvalidArgumentError(absl::StrCat(url, ": not a URL"));
  SetTimeouts(client, timeout_, std::max(idle_timeout, timeout_), timeout_);
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    watch_client_ = &client;
  }
  struct Unregister {
    EtcdClient* self;
    ~Unregister() {
      std::lock_guard<std::mutex> lock(self->watch_mu_);
      self->watch_client_ = nullptr;
    }
  } unregister{this};
  if (stop_watch_.exchange(false)) return absl::OkStatus();

  httplib::Request req;
  req.method = "POST";
  req.path = "/v3/watch";
  req.body =
      absl::StrCat("{\"create_request\":{\"key\":\"", B64(prefix), "\",\"range_end\":\"",
                   B64(PrefixEnd(prefix)), "\",\"start_revision\":\"", start_revision, "\"}}");
  req.set_header("Content-Type", "application/json");
  bool created = false;
  bool stopped_by_callback = false;
  std::string pending;
  std::string stream_error;
  int status = 0;
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    pending.append(data, n);
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string_view line(pending.data() + start, nl - start);
      if (line.empty() || status != 200) continue;
      auto j = Json::Parse(line);
      if (!j.ok()) continue;
      const Json* result = j->Get("result");
      if (!result) {
        stream_error = j->StringOr("error", std::string(line));
        return false;
      }
      EtcdWatchResponse r;
      r.created = result->Get("created") && result->Get("created")->boolean();
      r.canceled = result->Get("canceled") && result->Get("canceled")->boolean();
      r.compact_revision = result->IntOr("compact_revision");
      if (const Json* h = result->Get("header")) r.revision = h->IntOr("revision");
      if (const Json* events = result->Get("events")) {
        for (const Json& e : events->items()) {
          EtcdEvent ev;
          ev.is_delete = e.StringOr("type") == "DELETE";
          if (const Json* kv = e.Get("kv")) ev.kv = ParseKv(*kv);
          r.events.push_back(std::move(ev));
        }
      }
      if (r.created) created = true;
      if (!on_response(r) || stop_watch_.exchange(false)) {
        stopped_by_callback = true;
        return false;
      }
    }
    pending.erase(0, start);
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  client.send(req, res, err);
  if (created || stopped_by_callback) return absl::OkStatus();
  if (status != 0 && status != 200) {
    return absl::FailedPreconditionError(
        absl::StrCat(url, "/v3/watch: HTTP ", status, ": ", pending));
  }
  if (!stream_error.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(url, "/v3/watch: ", stream_error));
  }
  // Could not establish: next time try the next endpoint.
  current_ = (current_ + 1) % endpoints_.size();
  return absl::UnavailableError(
      absl::StrCat("etcd unreachable: ", url, "/v3/watch: ", httplib::to_string(err)));
}

void EtcdClient::StopWatch() {
  stop_watch_ = true;
  std::lock_guard<std::mutex> lock(watch_mu_);
  if (watch_client_) watch_client_->stop();
}

}  // namespace strata::placement::internal
