// Device links over TCP between host memory pools (see device_link.h): what NCCL does between
// GPU tiers, on machines without a GPU. One connection per link; bytes go in issue order.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "transport/device_link.h"

namespace strata::transport {
namespace {

constexpr size_t kTokenBytes = 16;
constexpr absl::Duration kIdLifetime = absl::Minutes(1);

absl::Status Errno(const char* what) {
  return absl::UnavailableError(absl::StrCat("stand-in link: ", what, ": ", std::strerror(errno)));
}

// Waits until `fd` is ready for `events`; DeadlineExceeded at `deadline`.
absl::Status WaitFor(int fd, short events, absl::Time deadline) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration())
      return absl::DeadlineExceededError("stand-in link: the other end did not answer in time");
    pollfd p{fd, events, 0};
    const int ms = static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000));
    const int r = poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno("poll");
    if (r == 0) continue;
    if (p.revents & (POLLERR | POLLNVAL))
      return absl::UnavailableError("stand-in link: the connection broke");
    return absl::OkStatus();
  }
}

absl::Status WriteAll(int fd, const uint8_t* p, uint64_t n, absl::Time deadline) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= static_cast<uint64_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (absl::Status s = WaitFor(fd, POLLOUT, deadline); !s.ok()) return s;
      continue;
    }
    return Errno("send");
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, uint8_t* p, uint64_t n, absl::Time deadline) {
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<uint64_t>(r);
      continue;
    }
    if (r == 0) return absl::UnavailableError("stand-in link: the other end closed the link");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (absl::Status s = WaitFor(fd, POLLIN, deadline); !s.ok()) return s;
      continue;
    }
    return Errno("recv");
  }
  return absl::OkStatus();
}

// Constant time: how long a refusal takes says nothing about the token.
bool SameToken(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

class StandInLink final : public DeviceLink {
 public:
  StandInLink(int fd, int rank) : fd_(fd), rank_(rank) {}
  ~StandInLink() override { close(fd_); }
  std::string_view kind() const override { return "stand-in"; }
  int rank() const override { return rank_; }

  absl::Status Send(std::span<const DeviceRange> ranges, absl::Time deadline) override {
    return Each(ranges, [&](const DeviceRange& r) {
      return WriteAll(fd_, reinterpret_cast<const uint8_t*>(r.address), r.size, deadline);
    });
  }
  absl::Status Recv(std::span<const DeviceRange> ranges, absl::Time deadline) override {
    return Each(ranges, [&](const DeviceRange& r) {
      return ReadAll(fd_, reinterpret_cast<uint8_t*>(r.address), r.size, deadline);
    });
  }
  void Abort() override {
    broken_.store(true);
    shutdown(fd_, SHUT_RDWR);  // wakes a poll in progress
  }

 private:
  template <typename Op>
  absl::Status Each(std::span<const DeviceRange> ranges, Op op) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const DeviceRange& r : ranges) {
      if (broken_.load()) return absl::UnavailableError("stand-in link: broken (aborted)");
      if (absl::Status s = op(r); !s.ok()) {
        Abort();
        return s;
      }
    }
    return absl::OkStatus();
  }

  const int fd_;
  const int rank_;
  std::mutex mu_;  // one transfer at a time per end, like a stream
  std::atomic<bool> broken_{false};
};

struct Pending {
  int listener = -1;
  absl::Time expires;
};

class StandInLinkFactory final : public DeviceLinkFactory {
 public:
  explicit StandInLinkFactory(std::string host) : host_(std::move(host)) {}
  ~StandInLinkFactory() override {
    for (auto& [token, p] : pending_) close(p.listener);
  }
  std::string_view kind() const override { return "stand-in"; }

  absl::StatusOr<std::string> NewLinkId() override {
    uint8_t token[kTokenBytes];
    size_t got = 0;
    while (got < sizeof token) {
      const ssize_t n = getrandom(token + got, sizeof token - got, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Errno("getrandom");
      got += static_cast<size_t>(n);
    }
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    if (int e = getaddrinfo(host_.c_str(), "0", &hints, &res); e != 0)
      return absl::UnavailableError(
          absl::StrCat("stand-in link: cannot resolve '", host_, "': ", gai_strerror(e)));
    const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    absl::Status st = fd < 0 ? Errno("socket") : absl::OkStatus();
    if (st.ok() && bind(fd, res->ai_addr, res->ai_addrlen) != 0) st = Errno("bind");
    freeaddrinfo(res);
    if (st.ok() && listen(fd, 4) != 0) st = Errno("listen");
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    if (st.ok() && getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0)
      st = Errno("getsockname");
    if (!st.ok()) {
      if (fd >= 0) close(fd);
      return st;
    }
    const uint16_t port = ntohs(bound.ss_family == AF_INET6
                                    ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                    : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    const std::string hex =
        absl::BytesToHexString(std::string(reinterpret_cast<const char*>(token), sizeof token));
    std::lock_guard<std::mutex> lock(mu_);
    DropExpired();
    pending_[hex] = Pending{fd, absl::Now() + kIdLifetime};
    return absl::StrCat(host_, " ", port, " ", hex);
  }

  absl::StatusOr<std::unique_ptr<DeviceLink>> Connect(std::string_view link_id, int rank,
                                                      absl::Time deadline) override {
    std::vector<std::string> parts = absl::StrSplit(std::string(link_id), ' ');
    uint32_t port = 0;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &port) || port == 0 || port > 65535 ||
        parts[2].size() != 2 * kTokenBytes)
      return absl::InvalidArgumentError("stand-in link: malformed link id");
    const std::string token = absl::HexStringToBytes(parts[2]);
    if (rank == 0) return Accept(parts[2], token, deadline);
    if (rank != 1) return absl::InvalidArgumentError("stand-in link: rank must be 0 or 1");
    return Dial(parts[0], port, token, deadline);
  }

 private:
  void DropExpired() {
    const absl::Time now = absl::Now();
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.expires < now) {
        close(it->second.listener);
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }

  absl::StatusOr<std::unique_ptr<DeviceLink>> Accept(const std::string& hex,
                                                     const std::string& token,
                                                     absl::Time deadline) {
    int listener;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pending_.find(hex);
      if (it == pending_.end())
        return absl::InvalidArgumentError("stand-in link: not a link id of this node (or used)");
      listener = it->second.listener;
      pending_.erase(it);
    }
    // Connections that do not present the token (strangers, stale dialers) are closed and
    // the wait goes on.
    absl::Status st;
    for (;;) {
      st = WaitFor(listener, POLLIN, deadline);
      if (!st.ok()) break;
      const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {  // out of descriptors, say: do not spin on a listener that stays readable
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      std::string got(kTokenBytes, '\0');
      const absl::Time token_deadline = std::min(deadline, absl::Now() + absl::Seconds(5));
      if (ReadAll(fd, reinterpret_cast<uint8_t*>(got.data()), got.size(), token_deadline).ok() &&
          SameToken(got, token)) {
        close(listener);
        return Ready(fd, 0);
      }
      close(fd);
    }
    close(listener);
    return st;
  }

  absl::StatusOr<std::unique_ptr<DeviceLink>> Dial(const std::string& host, uint32_t port,
                                                   const std::string& token, absl::Time deadline) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    if (int e = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); e != 0)
      return absl::UnavailableError(
          absl::StrCat("stand-in link: cannot resolve '", host, "': ", gai_strerror(e)));
    const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    absl::Status st = fd < 0 ? Errno("socket") : absl::OkStatus();
    if (st.ok() && connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        st = Errno("connect");
      } else if (st = WaitFor(fd, POLLOUT, deadline); st.ok()) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          errno = err;
          st = Errno("connect");
        }
      }
    }
    freeaddrinfo(res);
    if (st.ok())
      st = WriteAll(fd, reinterpret_cast<const uint8_t*>(token.data()), token.size(), deadline);
    if (!st.ok()) {
      if (fd >= 0) close(fd);
      return st;
    }
    return Ready(fd, 1);
  }

  static std::unique_ptr<DeviceLink> Ready(int fd, int rank) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return std::make_unique<StandInLink>(fd, rank);
  }

  const std::string host_;
  std::mutex mu_;
  std::map<std::string, Pending> pending_;  // by hex token
};

}  // namespace

std::unique_ptr<DeviceLinkFactory> NewStandInLinkFactory(std::string host) {
  return std::make_unique<StandInLinkFactory>(std::move(host));
}

}  // namespace strata::transport
