#include "daemon/staging_table.h"

#include <fcntl.h>
#include <openssl/rand.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata::daemon {

StagingWindow::~StagingWindow() { munmap(const_cast<uint8_t*>(data), bytes); }

absl::StatusOr<uint64_t> StagingTable::Add(int fd, const std::string& tenant, uint64_t zone_begin,
                                           uint64_t zone_bytes) {
  // F_GET_SEALS fails on anything but a memfd (a file could be truncated behind the mapping).
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0)
    return absl::InvalidArgumentError("a staging window must be a memfd (memfd_create)");
  if ((seals & F_SEAL_SHRINK) == 0)
    return absl::InvalidArgumentError("a staging window's memfd must be sealed F_SEAL_SHRINK");
  struct stat st {};
  if (fstat(fd, &st) != 0) return absl::InvalidArgumentError("cannot stat the staging window");
  const uint64_t bytes = static_cast<uint64_t>(st.st_size);
  if (bytes < limits_.min_bytes || bytes > limits_.max_bytes)
    return absl::InvalidArgumentError(absl::StrCat("a staging window holds ", limits_.min_bytes,
                                                   " to ", limits_.max_bytes, " bytes, not ",
                                                   bytes));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (windows_.size() >= limits_.max_windows)
      return absl::ResourceExhaustedError(
          absl::StrCat("stratad holds its limit of ", limits_.max_windows, " staging windows"));
    auto it = per_tenant_.find(tenant);
    if (it != per_tenant_.end() && it->second >= limits_.max_windows_per_tenant)
      return absl::ResourceExhaustedError(absl::StrCat(
          "this tenant holds its limit of ", limits_.max_windows_per_tenant, " staging windows"));
  }
  void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return absl::InvalidArgumentError(
        absl::StrCat("cannot map the staging window: ", std::strerror(errno)));
  auto window = std::make_shared<const StagingWindow>(tenant, zone_begin, zone_bytes,
                                                      static_cast<const uint8_t*>(p), bytes);
  std::lock_guard<std::mutex> lock(mu_);
  // Checked again: another client may have taken the last place while this one mapped.
  auto held = per_tenant_.find(tenant);
  if (windows_.size() >= limits_.max_windows ||
      (held != per_tenant_.end() && held->second >= limits_.max_windows_per_tenant))
    return absl::ResourceExhaustedError("stratad holds its limit of staging windows");
  uint64_t id = 0;
  // The id is the window's credential on the data plane: unguessable, nonzero, unused.
  while (id == 0 || windows_.contains(id))
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&id), sizeof id) != 1)
      return absl::InternalError("cannot draw random bytes for a staging window id");
  windows_.emplace(id, std::move(window));
  ++per_tenant_[tenant];
  return id;
}

void StagingTable::Remove(uint64_t id) {
  std::shared_ptr<const StagingWindow> gone;  // unmapped outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = windows_.find(id);
  if (it == windows_.end()) return;
  gone = std::move(it->second);
  windows_.erase(it);
  auto t = per_tenant_.find(gone->tenant);
  if (t != per_tenant_.end() && --t->second == 0) per_tenant_.erase(t);
}

std::shared_ptr<const StagingWindow> StagingTable::Find(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = windows_.find(id);
  return it == windows_.end() ? nullptr : it->second;
}

size_t StagingTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return windows_.size();
}

}  // namespace strata::daemon
