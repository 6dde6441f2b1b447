#include "daemon/zone_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/zone_wire.h"
#include "daemon/logging.h"
#include "spdlog/spdlog.h"

namespace strata::daemon {
namespace {

// Reads exactly `n` bytes before `deadline`; false on EOF, error or timeout. A file descriptor
// passed along (SCM_RIGHTS) lands in `*passed` when that is still -1; any other is closed.
bool ReadFull(int fd, char* out, size_t n, absl::Time deadline, int* passed) {
  size_t got = 0;
  while (got < n) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    iovec iov{out + got, n - got};
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t k = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    for (cmsghdr* c = k >= 0 ? CMSG_FIRSTHDR(&msg) : nullptr; c != nullptr;
         c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int got_fd;
        std::memcpy(&got_fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (*passed < 0)
          *passed = got_fd;
        else
          close(got_fd);
      }
    }
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
                                                              StagingTable* stagings,
                                                              TicketCheck check,
                                                              const std::string& name,
                                                              absl::Duration io_deadline) {
  std::unique_ptr<ZoneServer> s(new ZoneServer(arena, stagings, std::move(check), io_deadline));
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
  for (const auto& [conn, id] : lent_) {
    if (stagings_ != nullptr) stagings_->Remove(id);
    close(conn);
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
}

void ZoneServer::Run() {
  std::vector<pollfd> fds;
  while (true) {
    fds.assign({{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}});
    for (const auto& [conn, id] : lent_) fds.push_back({conn, POLLIN, 0});
    if (poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;
    // A lent window's connection says nothing until it closes: any event ends the loan.
    for (size_t i = fds.size(); i-- > 2;) {
      if (fds[i].revents == 0) continue;
      const size_t k = i - 2;
      if (stagings_ != nullptr) stagings_->Remove(lent_[k].second);
      close(lent_[k].first);
      lent_.erase(lent_.begin() + static_cast<ptrdiff_t>(k));
      staging_returned_.fetch_add(1);
    }
    if (fds[0].revents == 0) continue;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    if (std::optional<uint64_t> lent = Serve(conn)) {
      lent_.emplace_back(conn, *lent);
    } else {
      close(conn);
    }
  }
}

std::optional<uint64_t> ZoneServer::Serve(int conn) {
  const absl::Time deadline = absl::Now() + io_deadline_;
  zone_wire::Reply reply;
  const ZonedArena::Zone* zone = nullptr;
  char head[zone_wire::kRequestHeaderBytes];
  std::optional<zone_wire::RequestHeader> request;
  int passed = -1;  // the staging window's memfd
  if (ReadFull(conn, head, sizeof head, deadline, &passed))
    request = zone_wire::DecodeRequestHeader(std::string_view(head, sizeof head));
  std::string ticket;
  if (!request) {
    reply.code = static_cast<uint32_t>(absl::StatusCode::kInvalidArgument);
    reply.message = "not a zone request (or none before the deadline)";
  } else {
    ticket.resize(request->ticket_bytes);
    std::optional<Caller> caller;
    if (ReadFull(conn, ticket.data(), ticket.size(), deadline, &passed)) caller = check_(ticket);
    const ZonedArena::Zone* own = nullptr;
    if (!caller) {
      reply.code = static_cast<uint32_t>(absl::StatusCode::kUnauthenticated);
      reply.message = "unknown or expired ticket: call Connect again";
    } else if (caller->role != Role::kTenant || (own = arena_->Find(caller->tenant)) == nullptr) {
      reply.code = static_cast<uint32_t>(absl::StatusCode::kFailedPrecondition);
      reply.message = "this identity has no zone of its own (admin and peer callers use "
                      "checked messages)";
    } else if (request->kind == zone_wire::RequestKind::kZone) {
      zone = own;
      reply.begin = zone->begin;
      reply.bytes = zone->size;
      reply.flags = zone->writable ? zone_wire::kWritable : zone_wire::kStagedMany;
    } else if (own->writable || stagings_ == nullptr) {
      reply.code = static_cast<uint32_t>(absl::StatusCode::kFailedPrecondition);
      reply.message = "this daemon takes no staging windows (its tenant zones are writable)";
    } else if (passed < 0) {
      reply.code = static_cast<uint32_t>(absl::StatusCode::kInvalidArgument);
      reply.message = "a staging window request carries the window's memfd (SCM_RIGHTS)";
    } else {
      auto id = stagings_->Add(passed, caller->tenant, own->begin, own->size);
      if (id.ok()) {
        reply.begin = own->begin;
        reply.bytes = own->size;
        reply.staging_id = *id;
      } else {
        reply.code = static_cast<uint32_t>(id.status().code());
        reply.message = std::string(id.status().message());
      }
    }
  }
  if (passed >= 0) close(passed);  // mapped by now where it was taken
  // The reply fits the socket buffer: one send, never blocking on a client that does not read.
  const bool sent = zone_wire::SendWithFd(conn, zone_wire::EncodeReply(reply),
                                          zone != nullptr ? zone->fd : -1,
                                          MSG_DONTWAIT | MSG_NOSIGNAL);
  if (reply.staging_id != 0) {
    if (sent) {
      staging_lent_.fetch_add(1);
      return reply.staging_id;  // the loan lasts as long as this connection
    }
    stagings_->Remove(reply.staging_id);
  }
  if (zone != nullptr && sent) {
    handed_out_.fetch_add(1);
    spdlog::debug("zone of tenant '{}' handed to a client", LogSafe(zone->tenant));
  } else if (reply.staging_id == 0) {
    refused_.fetch_add(1);
  }
  return std::nullopt;
}

}  // namespace strata::daemon
