// The memory of this client's tenant zone in a daemon's arena (several tenants:
// storage/zoned_arena.h), mapped read-only, or writable where the daemon allows it
// (auth.tenant_zones_writable). Fetches whose blocks all lie inside copy from it as from a
// mapped arena; publishes too when it is writable.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata::client {

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

 private:
  friend absl::StatusOr<std::shared_ptr<const ZoneWindow>> OpenZoneWindow(std::string_view,
                                                                          std::string_view,
                                                                          uint64_t,
                                                                          absl::Duration);
  ZoneWindow(const uint8_t* data, uint64_t begin, uint64_t bytes, bool writable)
      : data_(data), begin_(begin), bytes_(bytes), writable_(writable) {}
  const uint8_t* data_;
  uint64_t begin_, bytes_;
  bool writable_;
};

// What the daemon's zone socket answered: the zone's place in the arena and its file (the
// caller owns `fd` and closes it).
struct ZoneGrant {
  uint64_t begin = 0, bytes = 0;
  int fd = -1;
  bool writable = false;
};
// The exchange alone (common/zone_wire.h): a refusal comes back as the daemon's status.
absl::StatusOr<ZoneGrant> RequestZone(std::string_view socket, std::string_view ticket,
                                      absl::Duration timeout);

// Asks the daemon's zone socket ("@name": abstract) for this caller's zone, proving who it is
// with its Connect ticket, and maps what comes back. `arena_bytes` bounds the zone's place.
absl::StatusOr<std::shared_ptr<const ZoneWindow>> OpenZoneWindow(std::string_view socket,
                                                                std::string_view ticket,
                                                                uint64_t arena_bytes,
                                                                absl::Duration timeout);

}  // namespace strata::client
