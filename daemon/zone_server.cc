#include "daemon/zone_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/zone_wire.h"
#include "daemon/logging.h"
#include "spdlog/spdlog.h"

namespace strata::daemon {
namespace {

// Reads exactly `n` bytes before `deadline`; false on EOF, error or timeout.
bool ReadFull(int fd, char* out, size_t n, absl::Time deadline) {
  size_t got = 0;
  while (got < n) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t k = recv(fd, out + got, n - got, MSG_DONTWAIT);
    if (k == 0) return false;
    if (k < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return false;
    }
    got += static_cast<size_t>(k);
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ZoneServer>> ZoneServer::Start(const ZonedArena* arena,
                                                              TicketCheck check,
                                                              const std::string& name,
                                                              absl::Duration io_deadline) {
  std::unique_ptr<ZoneServer> s(new ZoneServer(arena, std::move(check), io_deadline));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (name.empty() || name.size() + 1 > sizeof(addr.sun_path))
    return absl::InvalidArgumentError("zone server: socket name empty or too long");
  std::memcpy(addr.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  s->listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  s->stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->listen_fd_ < 0 || s->stop_fd_ < 0 ||
      bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      listen(s->listen_fd_, 64) != 0)
    return absl::UnavailableError(
        absl::StrCat("zone server: cannot listen on @", name, ": ", std::strerror(errno)));
  s->address_ = "@" + name;
  s->thread_ = std::thread([p = s.get()] { p->Run(); });
  return s;
}

ZoneServer::~ZoneServer() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof one);
    thread_.join();
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
}

void ZoneServer::Run() {
  while (true) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(p, 2, -1) < 0 && errno != EINTR) return;
    if (p[1].revents != 0) return;
    if (p[0].revents == 0) continue;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    Serve(conn);
    close(conn);
  }
}

void ZoneServer::Serve(int conn) {
  const absl::Time deadline = absl::Now() + io_deadline_;
  zone_wire::Reply reply;
  const ZonedArena::Zone* zone = nullptr;
  char head[zone_wire::kRequestHeaderBytes];
  std::optional<uint32_t> ticket_bytes;
  if (ReadFull(conn, head, sizeof head, deadline))
    ticket_bytes = zone_wire::DecodeRequestHeader(std::string_view(head, sizeof head));
  std::string ticket;
  if (!ticket_bytes) {
    reply.code = static_cast<uint32_t>(absl::StatusCode::kInvalidArgument);
    reply.message = "not a zone request (or none before the deadline)";
  } else {
    ticket.resize(*ticket_bytes);
    std::optional<Caller> caller;
    if (ReadFull(conn, ticket.data(), ticket.size(), deadline)) caller = check_(ticket);
    if (!caller) {
      reply.code = static_cast<uint32_t>(absl::StatusCode::kUnauthenticated);
      reply.message = "unknown or expired ticket: call Connect again";
    } else if (caller->role != Role::kTenant || (zone = arena_->Find(caller->tenant)) == nullptr) {
      reply.code = static_cast<uint32_t>(absl::StatusCode::kFailedPrecondition);
      reply.message = "this identity has no zone of its own (admin and peer callers use "
                      "checked messages)";
    } else {
      reply.begin = zone->begin;
      reply.bytes = zone->size;
      reply.flags = zone->writable ? zone_wire::kWritable : 0;
    }
  }
  const std::string bytes = zone_wire::EncodeReply(reply);
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (zone != nullptr) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &zone->fd, sizeof(int));
  }
  // The reply fits the socket buffer: one send, never blocking on a client that does not read.
  const bool sent = sendmsg(conn, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) ==
                    static_cast<ssize_t>(bytes.size());
  if (zone != nullptr && sent) {
    handed_out_.fetch_add(1);
    spdlog::debug("zone of tenant '{}' handed to a client", LogSafe(zone->tenant));
  } else {
    refused_.fetch_add(1);
  }
}

}  // namespace strata::daemon
