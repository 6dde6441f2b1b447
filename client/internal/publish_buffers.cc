#include "client/internal/publish_buffers.h"

#include <sys/mman.h>
#include <unistd.h>

namespace strata::client {

PublishBuffers::~PublishBuffers() {
  absl::MutexLock l(&mu_);
  for (Buffer& b : buffers_) {
    if (b.socket >= 0) close(b.socket);  // ends the loan first: the daemon unmaps its view
    munmap(b.data, b.bytes);
    close(b.fd);
  }
}

absl::Status PublishBuffers::LendTo(const ZoneWindow& window, Buffer& b) {
  if (b.socket >= 0) close(b.socket);
  b.socket = -1;
  b.lent_to = 0;
  auto id = window.Lend(b.fd, &b.socket);
  if (!id.ok()) return id.status();
  b.id = *id;
  b.lent_to = window.serial();
  return absl::OkStatus();
}

absl::StatusOr<uint8_t*> PublishBuffers::Allocate(const ZoneWindow& window, uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("a publish buffer of 0 bytes");
  Buffer b;
  b.bytes = bytes;
  auto fd = CreateStagingMemfd(bytes, &b.data);
  if (!fd.ok()) return fd.status();
  b.fd = *fd;
  if (absl::Status lent = LendTo(window, b); !lent.ok()) {
    munmap(b.data, b.bytes);
    close(b.fd);
    return lent;
  }
  absl::MutexLock l(&mu_);
  buffers_.push_back(b);
  return b.data;
}

std::optional<PublishBuffers::At> PublishBuffers::Find(const ZoneWindow& window, const void* data,
                                                       uint64_t length) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(data);
  absl::MutexLock l(&mu_);
  for (Buffer& b : buffers_) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(b.data);
    if (p < base || length > b.bytes || p - base > b.bytes - length) continue;
    if (b.lent_to != window.serial() && !LendTo(window, b).ok()) return std::nullopt;
    return At{b.id, p - base};
  }
  return std::nullopt;
}

}  // namespace strata::client
