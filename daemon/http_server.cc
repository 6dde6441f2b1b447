#include "daemon/http_server.h"

#include <httplib.h>

#include <charconv>
#include <thread>

#include "absl/strings/str_cat.h"

namespace strata::daemon {

struct HttpServer::Impl {
  httplib::Server server;
  std::thread thread;
  std::string endpoint;
  Handlers handlers;
};

namespace {

constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

absl::Status ListenError(const std::string& listen, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("config field 'http_listen': '", listen, "' ", why));
}

}  // namespace

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

const std::string& HttpServer::endpoint() const { return impl_->endpoint; }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& listen,
                                                              Handlers handlers) {
  size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) return ListenError(listen, "must be HOST:PORT");
  std::string host = listen.substr(0, colon);
  std::string port_text = listen.substr(colon + 1);
  int port = -1;
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || ptr != port_text.data() + port_text.size() || port < 0 || port > 65535)
    return ListenError(listen, "has no valid port (0-65535)");
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);

  auto impl = std::make_unique<Impl>();
  impl->handlers = std::move(handlers);
  Impl* raw = impl.get();
  httplib::Server& s = impl->server;
  // Two workers: a scrape and a probe may overlap; nothing here needs more.
  s.new_task_queue = [] { return new httplib::ThreadPool(2); };
  // SO_REUSEADDR (restart while old connections linger) but not cpp-httplib's default
  // SO_REUSEPORT, which would let a second daemon share the port and split the scrapes.
  s.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  s.set_read_timeout(5, 0);
  s.set_write_timeout(5, 0);
  s.Get("/metrics", [raw](const httplib::Request&, httplib::Response& res) {
    res.set_content(raw->handlers.metrics(), kMetricsContentType);
  });
  s.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  s.Get("/readyz", [raw](const httplib::Request&, httplib::Response& res) {
    std::string why;
    if (raw->handlers.ready(&why)) {
      res.set_content("ready\n", "text/plain");
    } else {
      res.status = 503;
      res.set_content(absl::StrCat("not ready: ", why, "\n"), "text/plain");
    }
  });
  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("stratad: /metrics /healthz /readyz\n", "text/plain");
  });

  int bound = port;
  if (port == 0) {
    bound = s.bind_to_any_port(host);
    if (bound <= 0) return ListenError(listen, "cannot be bound");
  } else if (!s.bind_to_port(host, port)) {
    return ListenError(listen, "cannot be bound (address in use or not local?)");
  }
  impl->endpoint = host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", bound)
                                                       : absl::StrCat(host, ":", bound);
  impl->thread = std::thread([raw] { raw->server.listen_after_bind(); });
  // Stop() is only effective once the accept loop runs; wait for it so a quick Stop never hangs.
  for (int i = 0; i < 2000 && !s.is_running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

void HttpServer::Stop() {
  if (!impl_->thread.joinable()) return;
  impl_->server.stop();
  impl_->thread.join();
}

}  // namespace strata::daemon
