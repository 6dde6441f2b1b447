// The staging windows clients of read-only tenant zones lend the daemon (common/zone_wire.h):
// memory of the client's own, mapped here read-only, from which the daemon copies published
// blocks into the reserved extents of that client's tenant zone. A window is found by its
// random 64-bit id and is good only for its own tenant's zone.
//
// The zone server adds a window when a client lends one and removes it when the client's
// connection closes; the progress thread finds windows while it handles staged blocks. A window
// found stays mapped while the finder holds it, even after it is removed.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/zone_wire.h"

namespace strata::daemon {

struct StagingWindow {
  StagingWindow(std::string tenant, uint64_t zone_begin, uint64_t zone_bytes, const uint8_t* data,
                uint64_t bytes)
      : tenant(std::move(tenant)), zone_begin(zone_begin), zone_bytes(zone_bytes), data(data),
        bytes(bytes) {}
  ~StagingWindow();
  StagingWindow(const StagingWindow&) = delete;
  StagingWindow& operator=(const StagingWindow&) = delete;

  // Whether [offset, offset + size) of the arena lies in this window's tenant zone.
  bool ZoneCovers(uint64_t offset, uint64_t size) const {
    return offset >= zone_begin && size <= zone_bytes && offset - zone_begin <= zone_bytes - size;
  }
  // Whether [offset, offset + size) lies inside the window.
  bool Holds(uint64_t offset, uint64_t size) const {
    return size <= bytes && offset <= bytes - size;
  }

  const std::string tenant;
  const uint64_t zone_begin, zone_bytes;
  const uint8_t* const data;
  const uint64_t bytes;
};

class StagingTable {
 public:
  struct Limits {
    size_t max_windows = 256;            // on this daemon
    size_t max_windows_per_tenant = 64;  // so that one tenant cannot take them all
    uint64_t min_bytes = zone_wire::kMinStagingBytes;
    uint64_t max_bytes = 1ull << 30;
  };
  StagingTable() : StagingTable(Limits{}) {}
  explicit StagingTable(Limits limits) : limits_(limits) {}

  // Maps the memfd `fd` (the caller keeps and closes it) read-only as a window of `tenant`,
  // whose zone is [zone_begin, zone_begin + zone_bytes) of the arena, and returns its id.
  // InvalidArgument unless `fd` is a memfd sealed against shrinking (a client that shrank it
  // would turn the daemon's copies into SIGBUS) and its size within the limits;
  // ResourceExhausted over the window limits.
  absl::StatusOr<uint64_t> Add(int fd, const std::string& tenant, uint64_t zone_begin,
                               uint64_t zone_bytes);
  void Remove(uint64_t id);
  // The window `id`, or null.
  std::shared_ptr<const StagingWindow> Find(uint64_t id) const;
  size_t size() const;

 private:
  const Limits limits_;
  mutable std::mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<const StagingWindow>> windows_;
  absl::flat_hash_map<std::string, size_t> per_tenant_;
};

}  // namespace strata::daemon
