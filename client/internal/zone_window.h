// The memory of this client's tenant zone in a daemon's arena (several tenants:
// storage/zoned_arena.h), mapped read-only, or writable where the daemon allows it
// (auth.tenant_zones_writable). Fetches whose blocks all lie inside copy from it as from a
// mapped arena; publishes too when it is writable. A read-only zone comes with a staging window
// lent to the daemon (common/zone_wire.h): publishes copy their blocks there and the daemon
// copies them on into the zone.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata::client {

// Lends the daemon the memfd `fd` as a staging window (the exchange alone); its id on success,
// with the socket whose closing ends the loan in `*socket_out`.
absl::StatusOr<uint64_t> LendStagingFd(std::string_view socket, std::string_view ticket, int fd,
                                       absl::Duration timeout, int* socket_out);

// A memfd of `bytes` for lending, sealed so that it can never shrink under the daemon's
// read-only mapping of it, and mapped writable here at `*mapped`. The caller owns both.
absl::StatusOr<int> CreateStagingMemfd(uint64_t bytes, uint8_t** mapped);

class ZoneWindow {
 public:
  ~ZoneWindow();
  ZoneWindow(const ZoneWindow&) = delete;
  ZoneWindow& operator=(const ZoneWindow&) = delete;

  // Where the zone's bytes are here, and which arena offsets they are: [begin, begin + bytes).
  const uint8_t* data() const { return data_; }
  bool writable() const { return writable_; }
  uint64_t begin() const { return begin_; }
  uint64_t bytes() const { return bytes_; }
  bool Covers(uint64_t offset, uint64_t length) const {
    return offset >= begin_ && length <= bytes_ && offset - begin_ <= bytes_ - length;
  }
  const uint8_t* At(uint64_t offset) const { return data_ + (offset - begin_); }

  // The staging window lent to the daemon: this process's memory (writable here, read-only in
  // the daemon) and the id the daemon knows it by; data null when none was lent, and
  // staging_status() says why. Its user serializes writes to it (the data mover's ucx_mu_).
  struct Staging {
    uint8_t* data = nullptr;
    uint64_t bytes = 0;
    uint64_t id = 0;
    int socket = -1;  // the loan lasts while this stays open
  };
  const Staging& staging() const { return staging_; }
  // Whether the daemon takes several staged blocks per message (am_wire::kPublishStagedManyAm).
  bool staged_many() const { return staged_many_; }
  const absl::Status& staging_status() const { return staging_status_; }

  // Unique per window this process opened: tells a loan to this daemon from one to an earlier.
  uint64_t serial() const { return serial_; }
  // Lends the daemon another window: the sealed memfd `fd` (see LendStagingFd). Its id, and
  // the socket whose closing ends the loan in `*socket_out`.
  absl::StatusOr<uint64_t> Lend(int fd, int* socket_out) const {
    return LendStagingFd(socket_name_, ticket_, fd, timeout_, socket_out);
  }

 private:
  friend absl::StatusOr<std::shared_ptr<const ZoneWindow>> OpenZoneWindow(std::string_view,
                                                                          std::string_view,
                                                                          uint64_t,
                                                                          absl::Duration,
                                                                          uint64_t);
  ZoneWindow(const uint8_t* data, uint64_t begin, uint64_t bytes, bool writable);
  const uint8_t* data_;
  uint64_t begin_, bytes_;
  bool writable_;
  Staging staging_;
  bool staged_many_ = false;
  absl::Status staging_status_ = absl::FailedPreconditionError("no staging window asked for");
  uint64_t serial_;
  // What lending more windows takes: the daemon's zone socket and this client's ticket.
  std::string socket_name_, ticket_;
  absl::Duration timeout_;
};

// What the daemon's zone socket answered: the zone's place in the arena and its file (the
// caller owns `fd` and closes it).
struct ZoneGrant {
  uint64_t begin = 0, bytes = 0;
  int fd = -1;
  bool writable = false;
  bool staged_many = false;  // the daemon takes am_wire::kPublishStagedManyAm
};

// The exchange alone (common/zone_wire.h): a refusal comes back as the daemon's status.
absl::StatusOr<ZoneGrant> RequestZone(std::string_view socket, std::string_view ticket,
                                      absl::Duration timeout);

// Asks the daemon's zone socket ("@name": abstract) for this caller's zone, proving who it is
// with its Connect ticket, and maps what comes back. `arena_bytes` bounds the zone's place.
// A read-only zone also gets a staging window of `staging_bytes` (0: none).
inline constexpr uint64_t kDefaultStagingBytes = 32 << 20;
absl::StatusOr<std::shared_ptr<const ZoneWindow>> OpenZoneWindow(
    std::string_view socket, std::string_view ticket, uint64_t arena_bytes,
    absl::Duration timeout, uint64_t staging_bytes = kDefaultStagingBytes);

}  // namespace strata::client
