#include "storage/zoned_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat("zoned arena: ", what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ZonedArena>> ZonedArena::Create(
    uint64_t capacity, std::span<const std::string> tenants, bool prefault,
    bool tenant_zones_writable) {
  constexpr uint64_t kUnit = kZoneAlignment;
  const uint64_t units = capacity / kUnit;
  const uint64_t common_units = std::max<uint64_t>(1, units / 16);
  const uint64_t per_tenant = tenants.empty() ? 0 : (units - std::min(units, common_units)) /
                                                        tenants.size();
  if (units < common_units + 1 || (!tenants.empty() && per_tenant == 0))
    return absl::InvalidArgumentError(absl::StrCat(
        "host_tier.capacity ", capacity, " bytes is too small to give each of ", tenants.size(),
        " tenants its own zone of at least 2 MiB beside the common zone"));
  const uint64_t size = units * kUnit;

  // One reservation of address space, so the zones sit back to back and the tier sees a range.
  void* reserved = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                        -1, 0);
  if (reserved == MAP_FAILED) return Errno(absl::StrCat("reserving ", size, " bytes"));
  std::unique_ptr<ZonedArena> arena(new ZonedArena(static_cast<uint8_t*>(reserved), size));

  auto add_zone = [&](const std::string& tenant, uint64_t begin, uint64_t bytes) -> absl::Status {
    Zone z{tenant, begin, bytes, -1, !tenant.empty() && tenant_zones_writable};
    const std::string name = tenant.empty() ? "strata-zone-common" : "strata-zone";
    z.fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (z.fd < 0) return Errno("memfd_create");
    arena->zones_.push_back(z);  // closed by the destructor from here on
    if (ftruncate(z.fd, static_cast<off_t>(bytes)) != 0) return Errno("ftruncate");
    void* at = mmap(arena->data_ + begin, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                    z.fd, 0);
    if (at == MAP_FAILED) return Errno("mapping a zone");
    // Faulted in now, as the other arenas are: a publish must not pay page faults.
    if (prefault) std::memset(at, 0, bytes);
    // This mapping stays writable; nobody can make another writable one, write(2) the file or
    // resize it, and the seals themselves are final.
    if (fcntl(z.fd, F_ADD_SEALS,
              (z.writable ? 0 : F_SEAL_FUTURE_WRITE) | F_SEAL_GROW | F_SEAL_SHRINK |
                  F_SEAL_SEAL) != 0)
      return Errno("sealing a zone");
    return absl::OkStatus();
  };
  uint64_t begin = 0;
  const uint64_t common_bytes = (units - per_tenant * tenants.size()) * kUnit;
  if (auto s = add_zone("", 0, common_bytes); !s.ok()) return s;
  begin = common_bytes;
  for (const std::string& t : tenants) {
    if (auto s = add_zone(t, begin, per_tenant * kUnit); !s.ok()) return s;
    begin += per_tenant * kUnit;
  }
  return arena;
}

ZonedArena::~ZonedArena() {
  munmap(data_, size_);
  for (const Zone& z : zones_) close(z.fd);
}

const ZonedArena::Zone* ZonedArena::Find(std::string_view tenant) const {
  if (tenant.empty()) return nullptr;
  for (const Zone& z : zones_)
    if (z.tenant == tenant) return &z;
  return nullptr;
}

std::vector<HostTierZone> ZonedArena::Layout() const {
  std::vector<HostTierZone> out;
  for (const Zone& z : zones_) out.push_back({z.tenant, z.begin, z.size});
  return out;
}

}  // namespace strata
