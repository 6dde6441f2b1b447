#include "daemon/http_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <deque>
#include <list>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace strata::daemon {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";
// A probe or scraper sends its whole request at once; a connection that has not within this
// time (idle, or trickling bytes: slowloris) is closed, so it cannot hold anything for longer.
constexpr auto kRequestDeadline = std::chrono::milliseconds(2000);
// A reader that does not take its answer within this time is dropped.
constexpr auto kWriteDeadline = std::chrono::milliseconds(5000);
constexpr size_t kMaxRequestBytes = 8192;
// Connections held at once. Beyond it the oldest one still sending its request is closed, so a
// flood of idle connections can never lock a liveness probe out.
constexpr size_t kMaxConnections = 256;
// /metrics answers waiting for the render thread; more get 503 instead of queueing up.
constexpr size_t kMaxQueuedRenders = 8;

absl::Status ListenError(const std::string& listen, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("config field 'http_listen': '", listen, "' ", why));
}

std::string Response(int status, const char* reason, const char* type, const std::string& body,
                     bool head) {
  std::string out =
      absl::StrCat("HTTP/1.1 ", status, " ", reason, "\r\nContent-Type: ", type,
                   "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n");
  if (!head) out += body;
  return out;
}

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

}  // namespace

// One event thread owns every socket and answers /healthz, /readyz and 404s itself; /metrics is
// rendered on a second thread (it reads tier stats under their lock), so a slow render never
// delays a probe. Two threads whatever the number of connections; each connection answers one
// request and closes.
struct HttpServer::Impl {
  struct Conn {
    int fd = -1;
    std::string in;
    std::string out;
    size_t written = 0;
    bool answered = false;     // `out` is final
    bool rendering = false;    // waiting for the render thread
    bool dead = false;         // the peer left while rendering: closed when the render returns
    bool peer_closed = false;  // the peer shut down its side after a whole request
    bool head = false;
    Clock::time_point deadline;
  };

  int listen_fd = -1;
  int wake_fd = -1;
  std::string endpoint;
  Handlers handlers;
  std::thread events;
  std::thread renderer;
  std::list<Conn> conns;  // oldest first; only the event thread touches it

  absl::Mutex mu;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  std::deque<Conn*> to_render ABSL_GUARDED_BY(mu);
  std::vector<std::pair<Conn*, std::string>> rendered ABSL_GUARDED_BY(mu);

  void Wake() {
    uint64_t one = 1;
    (void)!write(wake_fd, &one, sizeof one);
  }
  void EventLoop();
  void RenderLoop();
  void Accept();
  void Close(std::list<Conn>::iterator it) {
    close(it->fd);
    conns.erase(it);
  }
  // Parses a complete request in `c.in` and sets the answer (or queues the render).
  void Route(Conn& c);
  void Answer(Conn& c, std::string response) {
    c.out = std::move(response);
    c.answered = true;
    c.deadline = Clock::now() + kWriteDeadline;
  }
  // Reads what arrived; false when the connection is finished with.
  bool OnReadable(Conn& c);
  bool OnWritable(Conn& c);
};

void HttpServer::Impl::Accept() {
  for (;;) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or out of descriptors: try on the next event
    if (conns.size() >= kMaxConnections) {
      auto victim = conns.begin();
      while (victim != conns.end() && (victim->answered || victim->rendering)) ++victim;
      if (victim == conns.end()) {
        close(fd);  // every held connection is being answered: refuse the newcomer
        continue;
      }
      Close(victim);
    }
    Conn c;
    c.fd = fd;
    c.deadline = Clock::now() + kRequestDeadline;
    conns.push_back(std::move(c));
  }
}

void HttpServer::Impl::Route(Conn& c) {
  const size_t line_end = c.in.find("\r\n");
  const std::string line = c.in.substr(0, line_end);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos)
    return Answer(c, Response(400, "Bad Request", "text/plain", "bad request\n", false));
  const std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  c.head = method == "HEAD";
  if (method != "GET" && !c.head)
    return Answer(c, Response(405, "Method Not Allowed", "text/plain", "GET only\n", false));
  if (path == "/healthz") return Answer(c, Response(200, "OK", "text/plain", "ok\n", c.head));
  if (path == "/readyz") {
    std::string why;
    if (handlers.ready(&why))
      return Answer(c, Response(200, "OK", "text/plain",
                                why.empty() ? std::string("ready\n")
                                            : absl::StrCat("ready (degraded: ", why, ")\n"),
                                c.head));
    return Answer(c, Response(503, "Service Unavailable", "text/plain",
                              absl::StrCat("not ready: ", why, "\n"), c.head));
  }
  if (path == "/")
    return Answer(
        c, Response(200, "OK", "text/plain", "stratad: /metrics /healthz /readyz\n", c.head));
  if (path != "/metrics")
    return Answer(c, Response(404, "Not Found", "text/plain", "not found\n", c.head));
  absl::MutexLock lock(&mu);
  if (to_render.size() >= kMaxQueuedRenders)
    return Answer(c, Response(503, "Service Unavailable", "text/plain",
                              "busy: too many /metrics requests at once\n", c.head));
  c.rendering = true;
  to_render.push_back(&c);
}

bool HttpServer::Impl::OnReadable(Conn& c) {
  char buf[4096];
  for (;;) {
    ssize_t n = read(c.fd, buf, sizeof buf);
    if (n == 0) {
      // The peer shut down its side. After a whole request the answer still goes (a client may
      // end its writing once it has sent one, as `nc -N` does); before one, none ever will.
      c.peer_closed = true;
      return c.answered || c.rendering;
    }
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    if (c.answered || c.rendering) continue;  // a body or pipelined bytes: ignored
    c.in.append(buf, static_cast<size_t>(n));
    if (c.in.find("\r\n\r\n") != std::string::npos) {
      Route(c);
    } else if (c.in.size() > kMaxRequestBytes) {
      Answer(c,
             Response(431, "Request Header Fields Too Large", "text/plain", "too large\n", false));
    }
  }
}

bool HttpServer::Impl::OnWritable(Conn& c) {
  while (c.written < c.out.size()) {
    ssize_t n = send(c.fd, c.out.data() + c.written, c.out.size() - c.written, MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    c.written += static_cast<size_t>(n);
  }
  return false;  // all sent: close
}

void HttpServer::Impl::EventLoop() {
  std::vector<pollfd> fds;
  for (;;) {
    {
      absl::MutexLock lock(&mu);
      if (stopping) break;
      for (auto& [conn, body] : rendered) {
        conn->rendering = false;
        Answer(*conn, Response(200, "OK", kMetricsContentType, body, conn->head));
        if (conn->dead) conn->deadline = Clock::time_point::min();
      }
      rendered.clear();
    }
    const auto now = Clock::now();
    for (auto it = conns.begin(); it != conns.end();) {
      auto next = std::next(it);
      if (!it->rendering && it->deadline < now) Close(it);
      it = next;
    }
    fds.clear();
    fds.push_back({listen_fd, POLLIN, 0});
    fds.push_back({wake_fd, POLLIN, 0});
    for (const Conn& c : conns) {
      // A peer that closed its side has nothing more to read: it waits for its render.
      const short wanted = c.dead ? 0 : c.answered ? POLLOUT : c.peer_closed ? 0 : POLLIN;
      fds.push_back({c.fd, wanted, 0});
    }
    if (poll(fds.data(), fds.size(), 100) < 0 && errno != EINTR) break;
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      (void)!read(wake_fd, &v, sizeof v);
    }
    size_t i = 2;
    for (auto it = conns.begin(); it != conns.end(); ++i) {
      auto next = std::next(it);
      const short ev = fds[i].revents;
      bool keep = true;
      if (ev & (POLLERR | POLLNVAL)) {
        keep = false;
      } else if (ev & (POLLIN | POLLHUP)) {
        keep = OnReadable(*it);
      }
      // Answered by this read (a /healthz): send at once rather than after another poll.
      if (keep && it->answered && (ev & (POLLIN | POLLOUT | POLLHUP))) keep = OnWritable(*it);
      // A connection the render thread holds stays until its render comes back.
      if (!keep && it->rendering) {
        absl::MutexLock lock(&mu);
        auto q = std::find(to_render.begin(), to_render.end(), &*it);
        if (q == to_render.end()) {
          it->dead = true;
          it = next;
          continue;
        }
        to_render.erase(q);
      }
      if (!keep) Close(it);
      it = next;
    }
    if (fds[0].revents & POLLIN) Accept();
  }
  for (const Conn& c : conns) close(c.fd);
  conns.clear();
}

void HttpServer::Impl::RenderLoop() {
  for (;;) {
    Conn* c = nullptr;
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(
          +[](Impl* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) {
            return s->stopping || !s->to_render.empty();
          },
          this));
      if (stopping) return;
      c = to_render.front();
      to_render.pop_front();
    }
    std::string body = handlers.metrics();
    {
      absl::MutexLock lock(&mu);
      rendered.emplace_back(c, std::move(body));
    }
    Wake();
  }
}

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

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found) != 0 || found == nullptr)
    return ListenError(listen, "cannot be bound (unknown host)");
  auto impl = std::make_unique<Impl>();
  impl->handlers = std::move(handlers);
  int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  // SO_REUSEADDR (restart while old connections linger) but never SO_REUSEPORT, which would let
  // a second daemon share the port and split the scrapes.
  int yes = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  const bool bound =
      fd >= 0 && bind(fd, found->ai_addr, found->ai_addrlen) == 0 && ::listen(fd, 128) == 0;
  freeaddrinfo(found);
  if (!bound) {
    if (fd >= 0) close(fd);
    return ListenError(listen, "cannot be bound (address in use or not local?)");
  }
  SetNonBlocking(fd);
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int bound_port =
      ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                       : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  impl->listen_fd = fd;
  impl->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  impl->endpoint = host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", bound_port)
                                                       : absl::StrCat(host, ":", bound_port);
  Impl* raw = impl.get();
  impl->events = std::thread([raw] { raw->EventLoop(); });
  impl->renderer = std::thread([raw] { raw->RenderLoop(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

void HttpServer::Stop() {
  if (!impl_->events.joinable()) return;
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->stopping = true;
  }
  impl_->Wake();
  impl_->events.join();
  impl_->renderer.join();
  close(impl_->listen_fd);
  close(impl_->wake_fd);
}

}  // namespace strata::daemon
