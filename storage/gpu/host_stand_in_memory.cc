#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/device_handles.h"
#include "storage/gpu/device_memory.h"

namespace strata {
namespace {

// A stand-in peer buffer: the lender's shared-memory object, written with pwrite rather than
// mapped, so that a lender that shrinks the object under the daemon gets a longer file, not a
// daemon killed by SIGBUS.
class StandInPeerBuffer final : public PeerBuffer {
 public:
  StandInPeerBuffer(int fd, uint64_t offset, uint64_t bytes)
      : fd_(fd), offset_(offset), bytes_(bytes) {}
  ~StandInPeerBuffer() override { close(fd_); }
  uint64_t size() const override { return bytes_; }

  absl::Status Read(uint64_t at, uint8_t* dst, uint64_t n) const {
    while (n > 0) {
      const ssize_t r = pread(fd_, dst, n, static_cast<off_t>(offset_ + at));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        return absl::InternalError(absl::StrCat("reading the lent buffer: ",
                                                r < 0 ? std::strerror(errno) : "no progress"));
      dst += r;
      at += static_cast<uint64_t>(r);
      n -= static_cast<uint64_t>(r);
    }
    return absl::OkStatus();
  }

  absl::Status Write(uint64_t at, const uint8_t* src, uint64_t n) const {
    while (n > 0) {
      const ssize_t w = pwrite(fd_, src, n, static_cast<off_t>(offset_ + at));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0)
        return absl::InternalError(absl::StrCat("writing the lent buffer: ",
                                                w < 0 ? std::strerror(errno) : "no progress"));
      src += w;
      at += static_cast<uint64_t>(w);
      n -= static_cast<uint64_t>(w);
    }
    return absl::OkStatus();
  }

 private:
  const int fd_;
  const uint64_t offset_, bytes_;
};

}  // namespace

absl::Status CheckPeerCopies(std::span<const PeerCopy> copies, uint64_t capacity,
                             uint64_t peer_size) {
  for (const PeerCopy& c : copies) {
    if (c.peer_offset > peer_size || c.size > peer_size - c.peer_offset)
      return absl::OutOfRangeError(absl::StrCat("a copy of ", c.size, " bytes at offset ",
                                                c.peer_offset, " leaves the lent buffer of ",
                                                peer_size, " bytes"));
    if (c.host == nullptr && (c.device_offset > capacity || c.size > capacity - c.device_offset))
      return absl::OutOfRangeError(absl::StrCat("a copy of ", c.size, " bytes from offset ",
                                                c.device_offset, " leaves the pool of ",
                                                capacity, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CheckDeviceCopies(std::span<const DeviceCopy> copies, uint64_t capacity) {
  for (const DeviceCopy& c : copies) {
    if (c.device_offset > capacity || c.size > capacity - c.device_offset)
      return absl::OutOfRangeError(absl::StrCat("device copy of ", c.size, " bytes at offset ",
                                                c.device_offset, " leaves the pool of ",
                                                capacity, " bytes"));
    if (c.host == nullptr && c.size != 0)
      return absl::InvalidArgumentError("device copy with no host buffer");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HostStandInMemory>> HostStandInMemory::Create(
    uint64_t capacity, HostStandInOptions options) {
  if (capacity == 0) return absl::InvalidArgumentError("device memory of 0 bytes");
  void* pool = std::aligned_alloc(4096, (capacity + 4095) / 4096 * 4096);
  if (pool == nullptr)
    return absl::ResourceExhaustedError(
        absl::StrCat("no host memory for a stand-in device pool of ", capacity, " bytes"));
  return std::unique_ptr<HostStandInMemory>(
      new HostStandInMemory(static_cast<uint8_t*>(pool), capacity, std::move(options)));
}

HostStandInMemory::~HostStandInMemory() { std::free(pool_); }

absl::Status HostStandInMemory::ToDevice(std::span<const DeviceCopy> copies) {
  if (absl::Status s = CheckDeviceCopies(copies, capacity_); !s.ok()) return s;
  for (const DeviceCopy& c : copies) {
    if (options_.fault) {
      if (absl::Status s = options_.fault(true, c); !s.ok()) return s;
    }
    std::memcpy(pool_ + c.device_offset, c.host, c.size);
  }
  return absl::OkStatus();
}

absl::Status HostStandInMemory::ToHost(std::span<const DeviceCopy> copies) {
  if (absl::Status s = CheckDeviceCopies(copies, capacity_); !s.ok()) return s;
  for (const DeviceCopy& c : copies) {
    if (options_.fault) {
      if (absl::Status s = options_.fault(false, c); !s.ok()) return s;
    }
    std::memcpy(c.host, pool_ + c.device_offset, c.size);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PeerBuffer>> HostStandInMemory::OpenPeerBuffer(
    std::string_view kind, std::string_view handle, uint64_t offset, uint64_t bytes) {
  if (kind != device_handles::kHostStandIn)
    return absl::InvalidArgumentError(absl::StrCat("this daemon's GPU tier is host memory standing "
                                                   "in for a device: it opens host-stand-in "
                                                   "buffers, not ", std::string(kind), " handles"));
  if (!device_handles::IsStandInName(handle))
    return absl::InvalidArgumentError("a host-stand-in handle must be a name the client library "
                                      "made (/strata-devbuf- and 32 hex digits)");
  if (bytes == 0) return absl::InvalidArgumentError("a lent buffer of 0 bytes");
  const std::string name(handle);
  const int fd = shm_open(name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
  if (fd < 0)
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open the lent buffer ", name, ": ", std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("the lent buffer ", name, " is no memory"));
  }
  const uint64_t have = static_cast<uint64_t>(st.st_size);
  if (offset > have || bytes > have - offset) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("the lent range of ", bytes, " bytes at ",
                                                   offset, " leaves the buffer of ", have,
                                                   " bytes"));
  }
  return std::unique_ptr<PeerBuffer>(new StandInPeerBuffer(fd, offset, bytes));
}

absl::Status HostStandInMemory::ToPeer(PeerBuffer& peer, std::span<const PeerCopy> copies) {
  if (absl::Status s = CheckPeerCopies(copies, capacity_, peer.size()); !s.ok()) return s;
  const auto& dst = static_cast<const StandInPeerBuffer&>(peer);
  for (const PeerCopy& c : copies) {
    if (options_.fault) {
      const DeviceCopy as_read{c.device_offset, nullptr, c.size};
      if (absl::Status s = options_.fault(false, as_read); !s.ok()) return s;
    }
    if (absl::Status s = dst.Write(c.peer_offset, c.host ? c.host : pool_ + c.device_offset,
                                   c.size);
        !s.ok())
      return s;
  }
  return absl::OkStatus();
}

absl::Status CheckPeerReads(std::span<const PeerRead> reads, uint64_t peer_size) {
  for (const PeerRead& r : reads)
    if (r.peer_offset > peer_size || r.size > peer_size - r.peer_offset)
      return absl::OutOfRangeError(absl::StrCat("a read of ", r.size, " bytes at offset ",
                                                r.peer_offset, " leaves the lent buffer of ",
                                                peer_size, " bytes"));
  return absl::OkStatus();
}

absl::Status HostStandInMemory::FromPeer(PeerBuffer& peer, std::span<const PeerRead> reads) {
  if (absl::Status s = CheckPeerReads(reads, peer.size()); !s.ok()) return s;
  const auto& src = static_cast<const StandInPeerBuffer&>(peer);
  for (const PeerRead& r : reads) {
    if (options_.fault) {
      const DeviceCopy as_read{r.peer_offset, r.host, r.size};
      if (absl::Status s = options_.fault(false, as_read); !s.ok()) return s;
    }
    if (absl::Status s = src.Read(r.peer_offset, r.host, r.size); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace strata
