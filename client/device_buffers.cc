// StandInDeviceBuffer: the host-memory stand-in for an engine's device buffer.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/device_handles.h"
#include "strata/device_buffer.h"

namespace strata {
namespace {

absl::StatusOr<std::string> RandomStandInName() {
  unsigned char raw[device_handles::kStandInRandomHexDigits / 2];
  size_t got = 0;
  while (got < sizeof raw) {
    const ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::InternalError(absl::StrCat("getrandom: ", std::strerror(errno)));
    got += static_cast<size_t>(n);
  }
  std::string name(device_handles::kStandInPrefix);
  static constexpr char kHex[] = "0123456789abcdef";
  for (unsigned char b : raw) {
    name.push_back(kHex[b >> 4]);
    name.push_back(kHex[b & 15]);
  }
  return name;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StandInDeviceBuffer>> StandInDeviceBuffer::Create(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("a device buffer of 0 bytes");
  auto name = RandomStandInName();
  if (!name.ok()) return name.status();
  // Readable and writable by this user only: the daemon of the node runs as the same user (or
  // as root) and is the one process the name is given to.
  const int fd = shm_open(name->c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return absl::InternalError(absl::StrCat("shm_open ", *name, ": ", std::strerror(errno)));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(name->c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot size a stand-in device buffer of ", bytes, " bytes: ",
                     std::strerror(err)));
  }
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (map == MAP_FAILED) {
    shm_unlink(name->c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map a stand-in device buffer: ", std::strerror(err)));
  }
  DeviceBufferHandle handle{std::string(device_handles::kHostStandIn), *name, 0, bytes};
  return std::unique_ptr<StandInDeviceBuffer>(
      new StandInDeviceBuffer(static_cast<uint8_t*>(map), bytes, std::move(handle)));
}

StandInDeviceBuffer::~StandInDeviceBuffer() {
  munmap(data_, bytes_);
  shm_unlink(handle_.handle.c_str());
}

}  // namespace strata
