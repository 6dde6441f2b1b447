// A host arena split into zones, one per tenant plus a common one, each backed by its own
// anonymous shared-memory file (memfd) and mapped one after the other into this process.
//
// The host tier sees one range and places a namespace's blocks in its tenant's zone
// (HostTierOptions::zones). A tenant's clients on this node can then be handed the file of
// their own zone and map it, so they fetch by plain copies as single-tenant clients do, while
// no other tenant's byte is in what they map. Every file is sealed against writes from
// anyone but this process's existing mapping (F_SEAL_FUTURE_WRITE): a client cannot map it
// writable, write(2) it, or reopen it writable through /proc, so committed blocks stay
// read-only to clients; publishes still reach the daemon as checked messages.
//
// The files are anonymous: nothing is left in /dev/shm or anywhere else when stratad dies.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/host_tier.h"

namespace strata {

class ZonedArena {
 public:
  struct Zone {
    std::string tenant;  // "" for the common zone
    uint64_t begin = 0, size = 0;
    int fd = -1;  // the sealed memfd
    bool writable = false;  // not sealed against writes: its tenant's clients may map it so
  };

  // Zones are whole multiples of kZoneAlignment. The common zone (namespaces charged to no
  // tenant: replicas or promotions that arrived before any client of the tenant opened the
  // namespace here) takes 1/16 of `capacity`, at least one alignment unit, and whatever the
  // equal split of the rest among `tenants` leaves over. Fails when a tenant's zone would be
  // smaller than one alignment unit. `tenant_zones_writable`: the tenants' zones are not sealed
  // against writes (the common zone always is).
  static absl::StatusOr<std::unique_ptr<ZonedArena>> Create(uint64_t capacity,
                                                            std::span<const std::string> tenants,
                                                            bool prefault = true,
                                                            bool tenant_zones_writable = false);
  ~ZonedArena();
  ZonedArena(const ZonedArena&) = delete;
  ZonedArena& operator=(const ZonedArena&) = delete;

  static constexpr uint64_t kZoneAlignment = 2 << 20;

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::vector<Zone>& zones() const { return zones_; }
  // The zone of `tenant`; null for one without a zone (and for "").
  const Zone* Find(std::string_view tenant) const;
  // The layout as the host tier takes it.
  std::vector<HostTierZone> Layout() const;

 private:
  ZonedArena(uint8_t* data, uint64_t size) : data_(data), size_(size) {}

  uint8_t* data_;
  uint64_t size_;
  std::vector<Zone> zones_;
};

}  // namespace strata
