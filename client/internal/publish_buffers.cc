#include "client/internal/publish_buffers.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "common/zone_wire.h"

namespace strata::client {

PublishBuffers::~PublishBuffers() {
  absl::MutexLock l(&mu_);
  for (Buffer& b : buffers_) {
    if (b.socket >= 0) close(b.socket);  // ends the loan first: the daemon unmaps its view
    munmap(b.data, b.bytes);
    close(b.fd);
  }
}


absl::StatusOr<uint8_t*> PublishBuffers::Allocate(const ZoneWindow& window, uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("a publish buffer of 0 bytes");
  Buffer b;
  // A small buffer is lent as the smallest window the daemon takes; the caller uses its start.
  b.bytes = std::max<uint64_t>(bytes, zone_wire::kMinStagingBytes);
  auto fd = CreateStagingMemfd(b.bytes, &b.data);
  if (!fd.ok()) return fd.status();
  b.fd = *fd;
  auto id = window.Lend(b.fd, &b.socket);
  if (!id.ok()) {
    munmap(b.data, b.bytes);
    close(b.fd);
    return id.status();
  }
  b.id = *id;
  b.lent_to = window.serial();
  absl::MutexLock l(&mu_);
  buffers_.push_back(b);
  return b.data;
}

void PublishBuffers::LendStale(const ZoneWindow& window) {
  struct Loan {
    size_t index;
    int fd;
    absl::StatusOr<uint64_t> id = 0;
    int socket = -1;
  };
  std::vector<Loan> loans;
  {
    absl::MutexLock l(&mu_);
    for (size_t i = 0; i < buffers_.size(); ++i) {
      Buffer& b = buffers_[i];
      if (b.lent_to == window.serial() || b.lending) continue;
      b.lending = true;
      loans.push_back({i, b.fd});
    }
  }
  if (loans.empty()) return;
  for (Loan& loan : loans) loan.id = window.Lend(loan.fd, &loan.socket);
  absl::MutexLock l(&mu_);
  for (const Loan& loan : loans) {
    Buffer& b = buffers_[loan.index];  // buffers are only ever appended
    b.lending = false;
    if (!loan.id.ok()) continue;
    if (b.socket >= 0) close(b.socket);  // ends the loan to the daemon that went away
    b.socket = loan.socket;
    b.id = *loan.id;
    b.lent_to = window.serial();
  }
}

std::optional<PublishBuffers::At> PublishBuffers::Find(const ZoneWindow& window, const void* data,
                                                       uint64_t length) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(data);
  absl::MutexLock l(&mu_);
  for (Buffer& b : buffers_) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(b.data);
    if (p < base || length > b.bytes || p - base > b.bytes - length) continue;
    if (b.lent_to != window.serial()) return std::nullopt;
    return At{b.id, p - base};
  }
  return std::nullopt;
}

}  // namespace strata::client
