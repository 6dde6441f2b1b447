#include "storage/nvme_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "storage/nvme_io_engine.h"

namespace strata {

using nvme_internal::Errno;

std::string_view NvmeIoBackendName(NvmeIoBackend backend) {
  return backend == NvmeIoBackend::kIoUring ? "io_uring" : "thread_pool";
}

namespace {

bool Aligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) & (kNvmeAlignment - 1)) == 0; }

}  // namespace

absl::StatusOr<std::unique_ptr<NvmeTier>> NvmeTier::Open(NvmeTierOptions options) {
  if (options.files.empty()) return absl::InvalidArgumentError("nvme tier: no files configured");
  if (options.queue_depth == 0) options.queue_depth = 1;
  if (options.staging_buffers == 0) options.staging_buffers = 1;
  options.staging_buffer_bytes = RoundUp(std::max<uint64_t>(options.staging_buffer_bytes, 1));
  auto tier = std::unique_ptr<NvmeTier>(new NvmeTier(std::move(options)));
  STRATA_RETURN_IF_ERROR(tier->OpenFiles());
  STRATA_RETURN_IF_ERROR(tier->SetUpIo());
  return tier;
}

NvmeTier::NvmeTier(NvmeTierOptions options) : options_(std::move(options)) {}

NvmeTier::~NvmeTier() {
  impl_.reset();
  for (auto& f : files_) {
    if (f.fd >= 0) close(f.fd);
  }
}

absl::Status NvmeTier::OpenFiles() {
  for (const auto& spec : options_.files) {
    File f;
    f.path = spec.path;
    f.capacity = spec.capacity_bytes & ~(kNvmeAlignment - 1);
    if (f.capacity == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("nvme tier: capacity of ", spec.path, " is below 4 KiB"));
    }
    struct stat st;
    if (stat(spec.path.c_str(), &st) == 0) f.size_at_open = static_cast<uint64_t>(st.st_size);
    int flags = O_RDWR | O_CREAT | O_CLOEXEC;
    int fd = -1;
    if (!options_.force_buffered) {
      fd = open(spec.path.c_str(), flags | O_DIRECT, 0644);
      if (fd < 0 && errno != EINVAL) {
        return absl::UnavailableError(
            absl::StrCat("nvme tier: open ", spec.path, ": ", Errno(errno)));
      }
    }
    if (fd < 0) {
      direct_io_ = false;  // the filesystem refuses O_DIRECT (or buffered was asked for)
      fd = open(spec.path.c_str(), flags, 0644);
      if (fd < 0) {
        return absl::UnavailableError(
            absl::StrCat("nvme tier: open ", spec.path, ": ", Errno(errno)));
      }
    }
    f.fd = fd;
    files_.push_back(std::move(f));
    File& cur = files_.back();
    // A file larger than its capacity (capacity lowered in config) is cut back, so the disk
    // space in use never exceeds what is configured.
    if (cur.size_at_open > cur.capacity && ftruncate(fd, static_cast<off_t>(cur.capacity)) != 0) {
      return absl::UnavailableError(
          absl::StrCat("nvme tier: truncate ", cur.path, ": ", Errno(errno)));
    }
    int r = fallocate(fd, 0, 0, static_cast<off_t>(cur.capacity));
    if (r != 0 && errno == EOPNOTSUPP)
      r = posix_fallocate(fd, 0, static_cast<off_t>(cur.capacity));
    else if (r != 0)
      r = errno;
    if (r == ENOSPC) {
      return absl::ResourceExhaustedError(absl::StrCat("nvme tier: cannot preallocate ",
                                                       cur.capacity, " bytes for ", cur.path,
                                                       ": no space left on device"));
    }
    if (r != 0) {
      return absl::UnavailableError(
          absl::StrCat("nvme tier: preallocate ", cur.path, ": ", Errno(r)));
    }
    cur.allocator = std::make_unique<ExtentAllocator>(cur.capacity, kNvmeAlignment);
  }
  return absl::OkStatus();
}

absl::Status NvmeTier::SetUpIo() {
  std::vector<int> fds;
  for (const auto& f : files_) fds.push_back(f.fd);
  if (!options_.force_thread_pool) {
    nvme_internal::UringSetup setup;
    auto uring = nvme_internal::CreateUringEngine(
        options_.queue_depth, options_.staging_buffers, options_.staging_buffer_bytes, fds,
        options_.io_uring_taskrun_flags, options_.shared_ring, &setup);
    if (uring.ok()) {
      registered_buffers_ = setup.fixed_bufs;
      io_uring_setup_flags_ = setup.setup_flags;
      impl_ = std::move(*uring);
      backend_ = NvmeIoBackend::kIoUring;
      return absl::OkStatus();
    }
    io_uring_error_ = std::string(uring.status().message());
  } else {
    io_uring_error_ = "disabled by configuration";
  }
  STRATA_ASSIGN_OR_RETURN(impl_, nvme_internal::CreateThreadPoolEngine(
                                     options_.thread_pool_threads, options_.queue_depth,
                                     options_.staging_buffer_bytes));
  backend_ = NvmeIoBackend::kThreadPool;
  return absl::OkStatus();
}

std::string NvmeTier::PathsForError() const {
  std::vector<std::string> paths;
  for (const auto& f : files_) paths.push_back(f.path);
  return absl::StrJoin(paths, ", ");
}

namespace {

// Splits one request into ops: whole when the caller's memory can be used directly, else in
// staging-buffer-sized chunks.
template <typename Fn>
void Chunk(uint64_t size, uint64_t chunk, Fn&& fn) {
  uint64_t total = NvmeTier::RoundUp(size);
  for (uint64_t pos = 0; pos < total; pos += chunk) {
    uint64_t len = std::min(chunk, total - pos);
    uint64_t copy = pos < size ? std::min(len, size - pos) : 0;
    fn(pos, len, copy);
  }
}

}  // namespace

void NvmeTier::RunOps(std::vector<Op>& ops, bool is_write, std::vector<absl::Status>& statuses) {
  if (ops.empty()) return;
  std::vector<int64_t> results;
  {
    absl::MutexLock l(&io_mu_);
    impl_->Run(ops, is_write, results);
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    if (results[i] >= 0 || !statuses[ops[i].req].ok()) continue;
    statuses[ops[i].req] = absl::UnavailableError(absl::StrCat(
        "nvme tier: ", is_write ? "write " : "read ", files_[ops[i].file].path, " at ",
        ops[i].offset, " (", ops[i].len, " bytes): ", Errno(static_cast<int>(-results[i]))));
  }
}

std::vector<bool> NvmeTier::AllocateExtents(std::span<NvmeWriteReq> reqs,
                                            std::vector<absl::Status>& statuses) {
  std::vector<bool> allocated(reqs.size(), false);
  absl::MutexLock l(&alloc_mu_);
  for (size_t i = 0; i < reqs.size(); ++i) {
    uint64_t size = reqs[i].data.size();
    if (size == 0) {
      statuses[i] = absl::InvalidArgumentError("nvme tier: empty write");
      continue;
    }
    bool ok = false;
    for (size_t k = 0; k < files_.size() && !ok; ++k) {
      uint32_t f = (next_file_ + k) % files_.size();
      if (auto off = files_[f].allocator->Allocate(size)) {
        reqs[i].extent = {f, *off, size};
        ok = true;
        next_file_ = (f + 1) % files_.size();
      }
    }
    if (!ok) {
      statuses[i] = absl::ResourceExhaustedError(absl::StrCat(
          "nvme tier full: no free extent of ", RoundUp(size), " bytes in ", PathsForError(), " (",
          free_bytes_locked(), " of ", capacity_bytes(), " bytes free)"));
      continue;
    }
    allocated[i] = true;
  }
  return allocated;
}

NvmeTier::Op NvmeTier::OpAt(size_t req, const NvmeExtent& e, uint64_t pos, uint64_t len) const {
  Op op;
  op.req = req;
  op.file = e.file;
  op.fd = files_[e.file].fd;
  op.offset = e.offset + pos;
  op.len = len;
  return op;
}

std::vector<NvmeTier::Op> NvmeTier::WriteOps(std::span<const NvmeWriteReq> reqs,
                                             const std::vector<bool>& allocated) const {
  std::vector<Op> ops;
  ops.reserve(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (!allocated[i]) continue;
    const NvmeExtent& e = reqs[i].extent;
    const std::byte* data = reqs[i].data.data();
    if (Aligned(data) && e.size % kNvmeAlignment == 0) {
      Op op = OpAt(i, e, 0, e.size);
      op.direct = const_cast<std::byte*>(data);
      ops.push_back(op);
      continue;
    }
    Chunk(e.size, options_.staging_buffer_bytes, [&](uint64_t pos, uint64_t len, uint64_t copy) {
      Op op = OpAt(i, e, pos, len);
      op.src = data + pos;
      op.copy_len = copy;
      ops.push_back(op);
    });
  }
  return ops;
}

void NvmeTier::SyncWritten(std::span<const NvmeWriteReq> reqs, const std::vector<bool>& allocated,
                           std::vector<absl::Status>& statuses) {
  std::vector<bool> touched(files_.size(), false);
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (allocated[i] && statuses[i].ok()) touched[reqs[i].extent.file] = true;
  }
  for (size_t f = 0; f < files_.size(); ++f) {
    if (!touched[f] || fdatasync(files_[f].fd) == 0) continue;
    absl::Status err = absl::UnavailableError(
        absl::StrCat("nvme tier: fdatasync ", files_[f].path, ": ", Errno(errno)));
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (allocated[i] && statuses[i].ok() && reqs[i].extent.file == f) statuses[i] = err;
    }
  }
}

std::vector<absl::Status> NvmeTier::Write(std::span<NvmeWriteReq> reqs) {
  std::vector<absl::Status> statuses(reqs.size());
  const std::vector<bool> allocated = AllocateExtents(reqs, statuses);
  std::vector<Op> ops = WriteOps(reqs, allocated);
  RunOps(ops, /*is_write=*/true, statuses);
  if (options_.sync_after_write) SyncWritten(reqs, allocated, statuses);
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (allocated[i] && !statuses[i].ok()) Free(reqs[i].extent);
  }
  return statuses;
}

std::vector<absl::Status> NvmeTier::Read(std::span<NvmeReadReq> reqs) {
  std::vector<absl::Status> statuses(reqs.size());
  std::vector<Op> ops;
  ops.reserve(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const NvmeExtent& e = reqs[i].extent;
    if (e.file >= files_.size() || e.size == 0 || e.offset % kNvmeAlignment != 0 ||
        e.offset + RoundUp(e.size) > files_[e.file].capacity) {
      statuses[i] = absl::InvalidArgumentError(absl::StrCat("nvme tier: extent (file ", e.file,
                                                            ", offset ", e.offset, ", size ",
                                                            e.size, ") is outside the tier"));
      continue;
    }
    std::byte* dst = reqs[i].dst.data();
    if (reqs[i].dst.size() < e.size) {
      statuses[i] = absl::InvalidArgumentError(absl::StrCat(
          "nvme tier: read destination holds ", reqs[i].dst.size(), " bytes, block has ", e.size));
      continue;
    }
    if (Aligned(dst) && reqs[i].dst.size() >= RoundUp(e.size)) {
      Op op = OpAt(i, e, 0, RoundUp(e.size));
      op.direct = dst;
      ops.push_back(op);
      continue;
    }
    Chunk(e.size, options_.staging_buffer_bytes, [&](uint64_t pos, uint64_t len, uint64_t copy) {
      if (copy == 0) return;  // padding past the payload: nothing to read
      Op op = OpAt(i, e, pos, len);
      op.dst = dst + pos;
      op.copy_len = copy;
      ops.push_back(op);
    });
  }
  RunOps(ops, /*is_write=*/false, statuses);
  return statuses;
}

void NvmeTier::Free(const NvmeExtent& e) {
  if (e.file >= files_.size() || e.size == 0) return;
  absl::MutexLock l(&alloc_mu_);
  files_[e.file].allocator->Free(e.offset, e.size);
}

absl::Status NvmeTier::Sync() {
  for (const auto& f : files_) {
    if (fdatasync(f.fd) != 0) {
      return absl::UnavailableError(
          absl::StrCat("nvme tier: fdatasync ", f.path, ": ", Errno(errno)));
    }
  }
  return absl::OkStatus();
}

absl::Status NvmeTier::RestoreAllocations(uint32_t file, std::span<const NvmeExtent> used) {
  if (file >= files_.size()) return absl::InvalidArgumentError("nvme tier: no such file");
  File& f = files_[file];
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  ranges.reserve(used.size());
  for (const auto& e : used) ranges.emplace_back(e.offset, RoundUp(e.size));
  std::sort(ranges.begin(), ranges.end());
  uint64_t pos = 0;
  for (const auto& [off, len] : ranges) {
    if (off < pos || off % kNvmeAlignment != 0 || off + len > f.capacity) {
      return absl::InvalidArgumentError(absl::StrCat("nvme tier: extent at ", off, " of ", f.path,
                                                     " overlaps or lies outside the file"));
    }
    pos = off + len;
  }
  auto alloc = std::make_unique<ExtentAllocator>(f.capacity, kNvmeAlignment);
  (void)alloc->Allocate(f.capacity);  // everything used ...
  pos = 0;
  for (const auto& [off, len] : ranges) {  // ... except the gaps between the survivors
    if (off > pos) alloc->Free(pos, off - pos);
    pos = off + len;
  }
  if (pos < f.capacity) alloc->Free(pos, f.capacity - pos);
  absl::MutexLock l(&alloc_mu_);
  f.allocator = std::move(alloc);
  return absl::OkStatus();
}

bool NvmeTier::ExtentExistedAtOpen(const NvmeExtent& e) const {
  if (e.file >= files_.size() || e.size == 0 || e.offset % kNvmeAlignment != 0) return false;
  const File& f = files_[e.file];
  uint64_t end = e.offset + RoundUp(e.size);
  return end >= e.offset && end <= std::min(f.size_at_open, f.capacity);
}

std::vector<NvmeFileStats> NvmeTier::Stats() const {
  absl::MutexLock l(&alloc_mu_);
  std::vector<NvmeFileStats> out;
  for (const auto& f : files_) {
    out.push_back({f.path, f.capacity, f.allocator->free_bytes(), f.size_at_open});
  }
  return out;
}

uint64_t NvmeTier::capacity_bytes() const {
  uint64_t c = 0;
  for (const auto& f : files_) c += f.capacity;
  return c;
}

uint64_t NvmeTier::free_bytes_locked() const {
  uint64_t c = 0;
  for (const auto& f : files_) c += f.allocator->free_bytes();
  return c;
}

uint64_t NvmeTier::free_bytes() const {
  absl::MutexLock l(&alloc_mu_);
  return free_bytes_locked();
}

}  // namespace strata
