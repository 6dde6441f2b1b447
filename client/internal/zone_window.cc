#include "client/internal/zone_window.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <utility>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/zone_wire.h"

namespace strata::client {
namespace {

// Closes the descriptor when it leaves scope.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

absl::Status Failed(const std::string& what) {
  return absl::UnavailableError(absl::StrCat("zone window: ", what, ": ", std::strerror(errno)));
}

}  // namespace

ZoneWindow::ZoneWindow(const uint8_t* data, uint64_t begin, uint64_t bytes, bool writable)
    : data_(data), begin_(begin), bytes_(bytes), writable_(writable) {
  static std::atomic<uint64_t> next_serial{1};
  serial_ = next_serial.fetch_add(1);
}

ZoneWindow::~ZoneWindow() {
  munmap(const_cast<uint8_t*>(data_), bytes_);
  if (staging_.data != nullptr) munmap(staging_.data, staging_.bytes);
  if (staging_.socket >= 0) close(staging_.socket);  // ends the loan
}

namespace {

// One exchange on the daemon's zone socket: `request`, with `send_fd` as SCM_RIGHTS when it is
// not -1; the reply and the file descriptor that came with it (-1: none) in `*got_fd`. With
// `keep` the socket stays open and is returned there (a staging window's loan).
absl::StatusOr<zone_wire::Reply> ZoneCall(std::string_view socket_name, const std::string& request,
                                          int send_fd, absl::Duration timeout, int* got_fd,
                                          int* keep) {
  *got_fd = -1;
  if (socket_name.size() < 2 || socket_name[0] != '@')
    return absl::InvalidArgumentError("zone window: the daemon named no abstract socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string_view name = socket_name.substr(1);
  if (name.size() + 1 > sizeof(addr.sun_path))
    return absl::InvalidArgumentError("zone window: socket name too long");
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  Fd sock{socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (sock.fd < 0) return Failed("socket");
  timeval tv{};
  const int64_t us = std::max<int64_t>(1000, absl::ToInt64Microseconds(timeout));
  tv.tv_sec = us / 1000000;
  tv.tv_usec = us % 1000000;
  setsockopt(sock.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(sock.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  // A daemon on another host (or in another network namespace) has no socket here.
  if (connect(sock.fd, reinterpret_cast<sockaddr*>(&addr),
              static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())) != 0)
    return Failed("connecting to " + std::string(socket_name));
  if (!zone_wire::SendWithFd(sock.fd, request, send_fd, MSG_NOSIGNAL))
    return Failed("sending the request");
  char buf[zone_wire::kReplyHeaderBytes + zone_wire::kMaxMessageBytes];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{buf, sizeof buf};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = recvmsg(sock.fd, &msg, MSG_CMSG_CLOEXEC);
  if (n < 0) return Failed("reading the reply");
  Fd passed;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
        c->cmsg_len == CMSG_LEN(sizeof(int)) && passed.fd < 0)
      std::memcpy(&passed.fd, CMSG_DATA(c), sizeof(int));
  auto reply = zone_wire::DecodeReply(std::string_view(buf, static_cast<size_t>(n)));
  if (!reply) return absl::InternalError("zone window: malformed reply from stratad");
  if (reply->code != 0)
    return absl::Status(static_cast<absl::StatusCode>(reply->code),
                        absl::StrCat("zone window refused: ", reply->message));
  std::swap(*got_fd, passed.fd);
  if (keep != nullptr) std::swap(*keep, sock.fd);
  return *reply;
}

// Lends the daemon a staging window of `bytes`: a memfd of this process, sealed so that it can
// never shrink under the daemon's read-only mapping of it.
absl::Status LendStaging(std::string_view socket_name, std::string_view ticket, uint64_t bytes,
                         absl::Duration timeout, ZoneWindow::Staging* out) {
  uint8_t* p = nullptr;
  auto fd = CreateStagingMemfd(bytes, &p);
  if (!fd.ok()) return fd.status();
  Fd mem{*fd};
  int sock = -1;
  auto id = LendStagingFd(socket_name, ticket, mem.fd, timeout, &sock);
  if (!id.ok()) {
    munmap(p, bytes);
    return id.status();
  }
  *out = ZoneWindow::Staging{p, bytes, *id, sock};
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> CreateStagingMemfd(uint64_t bytes, uint8_t** mapped) {
  Fd mem{memfd_create("strata-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING)};
  if (mem.fd < 0) return Failed("memfd_create");
  if (ftruncate(mem.fd, static_cast<off_t>(bytes)) != 0 ||
      fcntl(mem.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return Failed("sizing and sealing the staging window");
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, mem.fd, 0);
  if (p == MAP_FAILED) return Failed("mapping the staging window");
  *mapped = static_cast<uint8_t*>(p);
  return std::exchange(mem.fd, -1);
}

absl::StatusOr<uint64_t> LendStagingFd(std::string_view socket_name, std::string_view ticket,
                                       int fd, absl::Duration timeout, int* socket_out) {
  if (ticket.size() > zone_wire::kMaxTicketBytes)
    return absl::InvalidArgumentError("zone window: ticket too long");
  int ignored = -1, sock = -1;
  auto reply = ZoneCall(socket_name,
                        zone_wire::EncodeRequest(ticket, zone_wire::RequestKind::kStaging), fd,
                        timeout, &ignored, &sock);
  if (ignored >= 0) close(ignored);
  if (reply.ok() && reply->staging_id != 0) {
    *socket_out = sock;
    return reply->staging_id;
  }
  if (sock >= 0) close(sock);
  return reply.ok() ? absl::InternalError("zone window: stratad lent no staging window id")
                    : reply.status();
}

absl::StatusOr<ZoneGrant> RequestZone(std::string_view socket_name, std::string_view ticket,
                                      absl::Duration timeout) {
  if (ticket.size() > zone_wire::kMaxTicketBytes)
    return absl::InvalidArgumentError("zone window: ticket too long");
  int fd = -1;
  auto reply = ZoneCall(socket_name, zone_wire::EncodeRequest(ticket), -1, timeout, &fd, nullptr);
  if (!reply.ok()) return reply.status();
  if (fd < 0) return absl::InternalError("zone window: stratad sent no file");
  return ZoneGrant{reply->begin, reply->bytes, fd, (reply->flags & zone_wire::kWritable) != 0,
                   (reply->flags & zone_wire::kStagedMany) != 0};
}

absl::StatusOr<std::shared_ptr<const ZoneWindow>> OpenZoneWindow(std::string_view socket_name,
                                                                std::string_view ticket,
                                                                uint64_t arena_bytes,
                                                                absl::Duration timeout,
                                                                uint64_t staging_bytes) {
  if (ticket.empty()) return absl::InvalidArgumentError("zone window: no Connect ticket");
  auto grant = RequestZone(socket_name, ticket, timeout);
  if (!grant.ok()) return grant.status();
  Fd zone{grant->fd};
  if (grant->bytes == 0 || grant->begin > arena_bytes || grant->bytes > arena_bytes - grant->begin)
    return absl::InternalError("zone window: stratad named a zone outside its arena");
  // A file shorter than the zone would turn a read past its end into SIGBUS here.
  struct stat st {};
  if (fstat(zone.fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < grant->bytes)
    return absl::InternalError("zone window: the file stratad sent is smaller than the zone");
  void* p = mmap(nullptr, grant->bytes, PROT_READ | (grant->writable ? PROT_WRITE : 0),
                 MAP_SHARED, zone.fd, 0);
  if (p == MAP_FAILED) return Failed("mapping the zone");
  std::shared_ptr<ZoneWindow> window(
      new ZoneWindow(static_cast<const uint8_t*>(p), grant->begin, grant->bytes, grant->writable));
  window->socket_name_ = std::string(socket_name);
  window->ticket_ = std::string(ticket);
  window->timeout_ = timeout;
  window->staged_many_ = grant->staged_many;
  // A read-only zone is published into through a staging window; without one (an older
  // daemon, its limits reached), by messages.
  if (!grant->writable && staging_bytes > 0)
    window->staging_status_ = LendStaging(socket_name, ticket, staging_bytes, timeout,
                                          &window->staging_);
  return std::shared_ptr<const ZoneWindow>(std::move(window));
}

}  // namespace strata::client
