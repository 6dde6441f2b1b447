#include "storage/nvme_tier.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/crc32c.h"
#include "common/status_macros.h"

namespace strata {

std::string_view NvmeIoBackendName(NvmeIoBackend backend) {
  return backend == NvmeIoBackend::kIoUring ? "io_uring" : "thread_pool";
}

// One device operation: a contiguous aligned range of one file, either straight to/from the
// caller's memory (`direct`) or through a staging buffer with a copy of `copy_len` bytes.
struct NvmeTier::Op {
  size_t req = 0;
  int fd = -1;
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t len = 0;
  std::byte* direct = nullptr;
  const std::byte* src = nullptr;  // staged write: caller bytes
  std::byte* dst = nullptr;        // staged read: caller destination
  uint64_t copy_len = 0;
};

namespace {

// Aligned, page-backed memory for staging buffers (never touched by malloc).
struct AlignedRegion {
  void* base = nullptr;
  size_t bytes = 0;
  explicit AlignedRegion(size_t n) : bytes(n) {
    if (n == 0) return;
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    base = p == MAP_FAILED ? nullptr : p;
  }
  ~AlignedRegion() {
    if (base) munmap(base, bytes);
  }
  std::byte* at(size_t off) const { return static_cast<std::byte*>(base) + off; }
};

std::string Errno(int err) { return std::strerror(err); }

void StageIn(const NvmeTier::Impl*, std::byte* buf, const std::byte* src, uint64_t copy_len,
             uint64_t len) {
  std::memcpy(buf, src, copy_len);
  if (len > copy_len) std::memset(buf + copy_len, 0, len - copy_len);
}

}  // namespace

// The I/O engine. Run() carries out every op and stores, per op, the bytes moved (== len) or
// a negative errno.
struct NvmeTier::Impl {
  virtual ~Impl() = default;
  virtual void Run(std::vector<Op>& ops, bool is_write, std::vector<int64_t>& results) = 0;
};

namespace {

// io_uring engine. Each thread that runs a batch gets its own ring (or, with shared_ring, all
// share one without SINGLE_ISSUER), set up the way fio sets up
// its ring (COOP_TASKRUN, SINGLE_ISSUER, DEFER_TASKRUN: completions are posted only when the
// owner waits for them, no inter-processor interrupt per completion), with the files and the
// staging buffers registered. A ring with SINGLE_ISSUER accepts submissions from the thread that
// created it only, hence one per thread; batches are still serialized by the tier (io_mu_), so
// rings never run concurrently and the staging pool is never shared by two batches. At most
// kMaxRings are kept; the least recently used one is closed when another thread needs one.
class UringEngine final : public NvmeTier::Impl {
 public:
  using Op = NvmeTier::Op;
  static constexpr size_t kMaxRings = 8;

  static absl::StatusOr<std::unique_ptr<UringEngine>> Create(uint32_t qd, uint32_t nbufs,
                                                             uint64_t buf_bytes,
                                                             const std::vector<int>& fds,
                                                             bool taskrun_flags, bool shared) {
    auto e = std::unique_ptr<UringEngine>(new UringEngine(qd, nbufs, buf_bytes, fds));
    e->shared_ = shared;
    e->want_flags_ = !taskrun_flags ? 0
                     : shared       ? IORING_SETUP_COOP_TASKRUN
                                    : IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SINGLE_ISSUER |
                                    IORING_SETUP_DEFER_TASKRUN;
    if (!e->region_.base) return absl::ResourceExhaustedError("cannot map staging buffers");
    // Huge pages where the kernel has them: a staged op is then one physically contiguous
    // segment for the device instead of one per 4 KiB page. Before the first touch.
    madvise(e->region_.base, e->region_.bytes, MADV_HUGEPAGE);
    for (uint32_t i = 0; i < nbufs; ++i) e->iov_[i] = {e->region_.at(i * buf_bytes), buf_bytes};
    // The opening thread's ring: proves io_uring works here (else the thread pool takes over).
    STRATA_ASSIGN_OR_RETURN(Ring * ring, e->RingForThisThread());
    e->fixed_bufs_ = ring->fixed_bufs;
    return e;
  }
  ~UringEngine() override = default;
  bool fixed_bufs() const { return fixed_bufs_; }
  unsigned setup_flags() const { return setup_flags_; }

  void Run(std::vector<Op>& ops, bool is_write, std::vector<int64_t>& results) override {
    results.assign(ops.size(), 0);
    absl::StatusOr<Ring*> got = RingForThisThread();
    if (!got.ok()) {
      std::fill(results.begin(), results.end(), -ENOMEM);
      return;
    }
    Ring& rg = **got;
    io_uring* ring = &rg.ring;
    op_buf_.assign(ops.size(), -1);
    free_bufs_.clear();
    for (uint32_t i = 0; i < nbufs_; ++i) free_bufs_.push_back(nbufs_ - 1 - i);
    size_t next = 0, done = 0;
    uint32_t inflight = 0;
    while (done < ops.size()) {
      while (next < ops.size() && inflight < qd_) {
        Op& op = ops[next];
        int buf = -1;
        if (!op.direct) {
          if (free_bufs_.empty()) break;
          buf = static_cast<int>(free_bufs_.back());
        }
        io_uring_sqe* sqe = io_uring_get_sqe(ring);
        if (!sqe) break;
        if (buf >= 0) free_bufs_.pop_back();
        std::byte* mem = op.direct ? op.direct : region_.at(uint64_t(buf) * buf_bytes_);
        if (is_write && buf >= 0) StageIn(this, mem, op.src, op.copy_len, op.len);
        int fd = rg.fixed_files ? static_cast<int>(op.file) : op.fd;
        unsigned len = static_cast<unsigned>(op.len);
        if (buf >= 0 && rg.fixed_bufs) {
          if (is_write)
            io_uring_prep_write_fixed(sqe, fd, mem, len, op.offset, buf);
          else
            io_uring_prep_read_fixed(sqe, fd, mem, len, op.offset, buf);
        } else {
          if (is_write)
            io_uring_prep_write(sqe, fd, mem, len, op.offset);
          else
            io_uring_prep_read(sqe, fd, mem, len, op.offset);
        }
        if (rg.fixed_files) sqe->flags |= IOSQE_FIXED_FILE;
        io_uring_sqe_set_data64(sqe, next);
        op_buf_[next] = buf;
        ++next;
        ++inflight;
      }
      int r = io_uring_submit_and_wait(ring, inflight > 0 ? 1 : 0);
      if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
        // The ring is unusable: ops not submitted fail; wait out those in flight.
        for (size_t i = next; i < ops.size(); ++i) results[i] = r;
        done += ops.size() - next;
        next = ops.size();
        rg.broken = true;  // closed after this batch; the next one gets a fresh ring
        if (inflight == 0) break;
        io_uring_cqe* cqe = nullptr;
        if (io_uring_wait_cqe(ring, &cqe) < 0) {
          for (size_t i = 0; i < next; ++i)
            if (results[i] == 0) results[i] = r;
          break;
        }
      }
      unsigned head, seen = 0;
      io_uring_cqe* cqe;
      io_uring_for_each_cqe(ring, head, cqe) {
        size_t i = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
        Op& op = ops[i];
        int64_t res = cqe->res;
        if (res >= 0 && static_cast<uint64_t>(res) != op.len) res = -EIO;  // short I/O
        results[i] = res;
        if (op_buf_[i] >= 0) {
          if (!is_write && res >= 0) {
            std::memcpy(op.dst, region_.at(uint64_t(op_buf_[i]) * buf_bytes_), op.copy_len);
          }
          free_bufs_.push_back(static_cast<uint32_t>(op_buf_[i]));
        }
        ++seen;
        --inflight;
        ++done;
      }
      io_uring_cq_advance(ring, seen);
    }
    if (rg.broken) {
      rings_.erase(std::find_if(rings_.begin(), rings_.end(),
                                [&](const auto& r) { return r.get() == &rg; }));
    }
  }

 private:
  struct Ring {
    io_uring ring{};
    uint64_t thread = 0;
    uint64_t last_used = 0;
    bool fixed_bufs = false;
    bool fixed_files = false;
    bool broken = false;  // a submit failed for good: not used again
    ~Ring() { io_uring_queue_exit(&ring); }
  };

  UringEngine(uint32_t qd, uint32_t nbufs, uint64_t buf_bytes, std::vector<int> fds)
      : qd_(std::max<uint32_t>(qd, 1)),
        nbufs_(nbufs),
        buf_bytes_(buf_bytes),
        region_(size_t(nbufs) * buf_bytes),
        iov_(nbufs),
        fds_(std::move(fds)) {}

  // A process-unique number for the calling thread (thread ids and tids can be reused).
  static uint64_t ThisThread() {
    static std::atomic<uint64_t> next{1};
    thread_local uint64_t id = next.fetch_add(1);
    return id;
  }

  // Callers are serialized (the tier's io_mu_, or Create before the tier is shared).
  absl::StatusOr<Ring*> RingForThisThread() {
    if (shared_ && !rings_.empty()) return rings_[0].get();
    uint64_t me = ThisThread();
    ++clock_;
    for (auto& r : rings_) {
      if (r->thread == me) {
        r->last_used = clock_;
        return r.get();
      }
    }
    if (rings_.size() >= kMaxRings) {
      auto lru = std::min_element(rings_.begin(), rings_.end(), [](const auto& a, const auto& b) {
        return a->last_used < b->last_used;
      });
      rings_.erase(lru);
    }
    auto r = std::make_unique<Ring>();
    // fio's flags; each one the kernel does not know is dropped in turn (DEFER_TASKRUN needs
    // SINGLE_ISSUER; both need 6.1, COOP_TASKRUN 5.19).
    unsigned flags = want_flags_;
    int rc;
    while (true) {
      io_uring_params p{};
      p.flags = flags;
      rc = io_uring_queue_init_params(qd_, &r->ring, &p);
      if (rc != -EINVAL || flags == 0) break;
      if (flags & IORING_SETUP_DEFER_TASKRUN) {
        flags &= ~(IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_SINGLE_ISSUER);
      } else {
        flags = 0;
      }
    }
    if (rc < 0) return absl::UnavailableError(absl::StrCat("io_uring_queue_init: ", Errno(-rc)));
    setup_flags_ = flags;
    r->thread = me;
    r->last_used = clock_;
    r->fixed_bufs = io_uring_register_buffers(&r->ring, iov_.data(), iov_.size()) == 0;
    r->fixed_files = io_uring_register_files(&r->ring, fds_.data(), fds_.size()) == 0;
    rings_.push_back(std::move(r));
    return rings_.back().get();
  }

  uint32_t qd_, nbufs_;
  uint64_t buf_bytes_;
  AlignedRegion region_;
  std::vector<iovec> iov_;
  std::vector<int> fds_;
  std::vector<std::unique_ptr<Ring>> rings_;
  uint64_t clock_ = 0;
  bool fixed_bufs_ = false;
  bool shared_ = false;
  unsigned want_flags_ = 0;
  unsigned setup_flags_ = 0;
  std::vector<int> op_buf_;          // per batch, reused
  std::vector<uint32_t> free_bufs_;  // per batch, reused
};

// pread/pwrite on a small pool of threads, each with its own staging buffer.
class ThreadPoolEngine final : public NvmeTier::Impl {
 public:
  using Op = NvmeTier::Op;

  ThreadPoolEngine(uint32_t threads, uint32_t qd, uint64_t buf_bytes)
      : buf_bytes_(buf_bytes), region_(size_t(std::max<uint32_t>(threads, 1)) * buf_bytes) {
    uint32_t n = std::max<uint32_t>(1, std::min(threads, std::max<uint32_t>(qd, 1)));
    for (uint32_t t = 0; t < n; ++t) workers_.emplace_back([this, t] { Loop(t); });
  }
  ~ThreadPoolEngine() override {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    for (auto& w : workers_) w.join();
  }
  bool ok() const { return region_.base != nullptr; }

  void Run(std::vector<Op>& ops, bool is_write, std::vector<int64_t>& results) override {
    results.assign(ops.size(), 0);
    absl::MutexLock l(&mu_);
    ops_ = &ops;
    results_ = &results;
    is_write_ = is_write;
    next_.store(0);
    busy_ = workers_.size();
    ++generation_;
    mu_.Await(absl::Condition(
        +[](size_t* busy) { return *busy == 0; }, &busy_));
    ops_ = nullptr;
  }

 private:
  void Loop(uint32_t t) {
    uint64_t seen = 0;
    std::byte* buf = region_.at(size_t(t) * buf_bytes_);
    while (true) {
      std::vector<Op>* ops;
      std::vector<int64_t>* results;
      bool is_write;
      {
        absl::MutexLock l(&mu_);
        auto ready = [&] { return stop_ || generation_ != seen; };
        mu_.Await(absl::Condition(&ready));
        if (stop_) return;
        seen = generation_;
        ops = ops_;
        results = results_;
        is_write = is_write_;
      }
      for (size_t i = next_.fetch_add(1); i < ops->size(); i = next_.fetch_add(1)) {
        (*results)[i] = DoOp((*ops)[i], is_write, buf);
      }
      absl::MutexLock l(&mu_);
      --busy_;
    }
  }

  int64_t DoOp(const Op& op, bool is_write, std::byte* buf) {
    std::byte* mem = op.direct ? op.direct : buf;
    if (is_write && !op.direct) StageIn(this, mem, op.src, op.copy_len, op.len);
    uint64_t moved = 0;
    while (moved < op.len) {
      ssize_t r = is_write ? pwrite(op.fd, mem + moved, op.len - moved, op.offset + moved)
                           : pread(op.fd, mem + moved, op.len - moved, op.offset + moved);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return -errno;
      if (r == 0) return -EIO;
      moved += static_cast<uint64_t>(r);
    }
    if (!is_write && !op.direct) std::memcpy(op.dst, buf, op.copy_len);
    return static_cast<int64_t>(moved);
  }

  uint64_t buf_bytes_;
  AlignedRegion region_;
  std::vector<std::thread> workers_;
  absl::Mutex mu_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  size_t busy_ = 0;
  std::vector<Op>* ops_ = nullptr;
  std::vector<int64_t>* results_ = nullptr;
  bool is_write_ = false;
  std::atomic<size_t> next_{0};
};

bool Aligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) & (kNvmeAlignment - 1)) == 0; }

}  // namespace

// ---------------------------------------------------------------------------------------------

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
    auto uring = UringEngine::Create(options_.queue_depth, options_.staging_buffers,
                                     options_.staging_buffer_bytes, fds,
                                     options_.io_uring_taskrun_flags, options_.shared_ring);
    if (uring.ok()) {
      registered_buffers_ = (*uring)->fixed_bufs();
      io_uring_setup_flags_ = (*uring)->setup_flags();
      impl_ = std::move(*uring);
      backend_ = NvmeIoBackend::kIoUring;
      return absl::OkStatus();
    }
    io_uring_error_ = std::string(uring.status().message());
  } else {
    io_uring_error_ = "disabled by configuration";
  }
  auto pool = std::make_unique<ThreadPoolEngine>(options_.thread_pool_threads, options_.queue_depth,
                                                 options_.staging_buffer_bytes);
  if (!pool->ok()) return absl::ResourceExhaustedError("nvme tier: cannot map staging buffers");
  impl_ = std::move(pool);
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

std::vector<absl::Status> NvmeTier::Write(std::span<NvmeWriteReq> reqs) {
  std::vector<absl::Status> statuses(reqs.size());
  std::vector<bool> allocated(reqs.size(), false);
  {
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
            "nvme tier full: no free extent of ", RoundUp(size), " bytes in ", PathsForError(),
            " (", free_bytes_locked(), " of ", capacity_bytes(), " bytes free)"));
        continue;
      }
      allocated[i] = true;
    }
  }
  std::vector<Op> ops;
  ops.reserve(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (!allocated[i]) continue;
    const NvmeExtent& e = reqs[i].extent;
    const std::byte* data = reqs[i].data.data();
    if (Aligned(data) && e.size % kNvmeAlignment == 0) {
      Op op;
      op.req = i;
      op.file = e.file;
      op.fd = files_[e.file].fd;
      op.offset = e.offset;
      op.len = e.size;
      op.direct = const_cast<std::byte*>(data);
      ops.push_back(op);
      continue;
    }
    Chunk(e.size, options_.staging_buffer_bytes, [&](uint64_t pos, uint64_t len, uint64_t copy) {
      Op op;
      op.req = i;
      op.file = e.file;
      op.fd = files_[e.file].fd;
      op.offset = e.offset + pos;
      op.len = len;
      op.src = data + pos;
      op.copy_len = copy;
      ops.push_back(op);
    });
  }
  RunOps(ops, /*is_write=*/true, statuses);
  if (options_.sync_after_write) {
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
      Op op;
      op.req = i;
      op.file = e.file;
      op.fd = files_[e.file].fd;
      op.offset = e.offset;
      op.len = RoundUp(e.size);
      op.direct = dst;
      ops.push_back(op);
      continue;
    }
    Chunk(e.size, options_.staging_buffer_bytes, [&](uint64_t pos, uint64_t len, uint64_t copy) {
      if (copy == 0) return;  // padding past the payload: nothing to read
      Op op;
      op.req = i;
      op.file = e.file;
      op.fd = files_[e.file].fd;
      op.offset = e.offset + pos;
      op.len = len;
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

// ---------------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<NvmeBlockStore>> NvmeBlockStore::Open(
    NvmeBlockStoreOptions options) {
  auto store = std::unique_ptr<NvmeBlockStore>(new NvmeBlockStore());
  store->options_ = options;
  STRATA_ASSIGN_OR_RETURN(store->tier_, NvmeTier::Open(options.tier));
  STRATA_ASSIGN_OR_RETURN(store->catalog_, Catalog::Open(options.catalog_path));
  STRATA_RETURN_IF_ERROR(store->Recover());
  return store;
}

NvmeBlockStore::~NvmeBlockStore() = default;

absl::Status NvmeBlockStore::Recover() {
  absl::Time start = absl::Now();
  NvmeRecoveryReport rep;
  std::vector<std::pair<BlockId, CatalogEntry>> entries;
  std::vector<std::string> bad_keys;
  STRATA_RETURN_IF_ERROR(catalog_->ForEach(
      [&](const BlockId& id, const std::string& raw_key, const absl::StatusOr<CatalogEntry>& e) {
        ++rep.entries_loaded;
        if (!e.ok()) {
          ++rep.dropped_undecodable;
          bad_keys.push_back(raw_key);
          return;
        }
        entries.emplace_back(id, *e);
      }));
  std::vector<BlockId> drop;
  // Extent must exist in a file as found at open. Entries of other tiers (host DRAM) do not
  // survive a restart either.
  std::vector<std::vector<size_t>> per_file(tier_->file_count());
  std::vector<bool> keep(entries.size(), false);
  for (size_t i = 0; i < entries.size(); ++i) {
    const CatalogEntry& e = entries[i].second;
    if (e.tier != 2 || !tier_->ExtentExistedAtOpen(ExtentOf(e))) {
      ++rep.dropped_missing_extent;
      drop.push_back(entries[i].first);
      continue;
    }
    per_file[e.file_index].push_back(i);
  }
  // No two entries may share bytes: sorted by offset, one that starts before the previous
  // survivor ends is dropped.
  for (uint32_t f = 0; f < per_file.size(); ++f) {
    auto& idx = per_file[f];
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
      return entries[a].second.offset < entries[b].second.offset;
    });
    uint64_t end = 0;
    std::vector<NvmeExtent> used;
    used.reserve(idx.size());
    for (size_t i : idx) {
      const CatalogEntry& e = entries[i].second;
      if (e.offset < end) {
        ++rep.dropped_overlapping;
        drop.push_back(entries[i].first);
        continue;
      }
      end = e.offset + NvmeTier::RoundUp(e.size);
      keep[i] = true;
      used.push_back(ExtentOf(e));
    }
    STRATA_RETURN_IF_ERROR(tier_->RestoreAllocations(f, used));
  }
  if (!drop.empty()) STRATA_RETURN_IF_ERROR(catalog_->DeleteBatch(drop));
  for (const auto& k : bad_keys) STRATA_RETURN_IF_ERROR(catalog_->DeleteRaw(k));
  absl::MutexLock l(&mu_);
  blocks_.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!keep[i]) continue;
    blocks_[entries[i].first] = Block{entries[i].second, false};
    ++rep.entries_kept;
  }
  rep.elapsed = absl::Now() - start;
  recovery_ = rep;
  return absl::OkStatus();
}

std::vector<absl::Status> NvmeBlockStore::Put(std::span<NvmePutReq> reqs) {
  std::vector<absl::Status> statuses(reqs.size());
  std::vector<NvmeWriteReq> writes;
  std::vector<size_t> write_req;
  {
    absl::MutexLock l(&mu_);
    absl::flat_hash_map<BlockId, size_t> in_batch;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (blocks_.contains(reqs[i].id) || !in_batch.emplace(reqs[i].id, i).second) continue;
      writes.push_back({reqs[i].data, {}});
      write_req.push_back(i);
    }
  }
  if (writes.empty()) return statuses;
  std::vector<absl::Status> ws = tier_->Write(writes);
  std::vector<std::pair<BlockId, CatalogEntry>> commit;
  std::vector<size_t> commit_w;
  for (size_t w = 0; w < writes.size(); ++w) {
    size_t i = write_req[w];
    if (!ws[w].ok()) {
      statuses[i] = ws[w];
      continue;
    }
    CatalogEntry e = reqs[i].meta;
    e.tier = 2;
    e.file_index = writes[w].extent.file;
    e.offset = writes[w].extent.offset;
    e.size = writes[w].extent.size;
    e.crc32c = Crc32c(reqs[i].data.data(), reqs[i].data.size());
    reqs[i].meta = e;
    commit.emplace_back(reqs[i].id, e);
    commit_w.push_back(w);
  }
  if (commit.empty()) return statuses;
  // The data is durable (Write synced it); only now does the block become visible.
  absl::Status cs = catalog_->PutBatch(commit);
  if (!cs.ok()) {
    for (size_t w : commit_w) {
      statuses[write_req[w]] = cs;
      tier_->Free(writes[w].extent);
    }
    return statuses;
  }
  absl::MutexLock l(&mu_);
  for (size_t c = 0; c < commit.size(); ++c) {
    auto [it, inserted] = blocks_.try_emplace(commit[c].first, Block{commit[c].second, true});
    if (!inserted) {  // a concurrent Put of the same id won the race: the catalog holds ours
      tier_->Free(ExtentOf(it->second.entry));
      it->second = Block{commit[c].second, true};
    }
  }
  return statuses;
}

std::vector<absl::Status> NvmeBlockStore::Get(std::span<NvmeGetReq> reqs) {
  std::vector<absl::Status> statuses(reqs.size());
  std::vector<NvmeReadReq> reads;
  std::vector<size_t> read_req;
  std::vector<CatalogEntry> read_entry;
  std::vector<bool> check;
  {
    absl::MutexLock l(&mu_);
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto it = blocks_.find(reqs[i].id);
      if (it == blocks_.end()) {
        statuses[i] = absl::NotFoundError(
            absl::StrCat("nvme tier: block ", reqs[i].id.ShortHex(), " not found"));
        continue;
      }
      reads.push_back({ExtentOf(it->second.entry), reqs[i].dst});
      read_req.push_back(i);
      read_entry.push_back(it->second.entry);
      check.push_back(!it->second.verified || options_.verify_every_read);
    }
  }
  std::vector<absl::Status> rs = tier_->Read(reads);
  for (size_t r = 0; r < reads.size(); ++r) {
    size_t i = read_req[r];
    if (!rs[r].ok()) {
      statuses[i] = rs[r];
      continue;
    }
    const CatalogEntry& e = read_entry[r];
    reqs[i].size = e.size;
    if (!check[r]) continue;
    uint32_t crc = Crc32c(reqs[i].dst.data(), e.size);
    if (crc == e.crc32c) {
      absl::MutexLock l(&mu_);
      auto it = blocks_.find(reqs[i].id);
      if (it != blocks_.end() && it->second.entry == e) it->second.verified = true;
      continue;
    }
    statuses[i] = absl::DataLossError(absl::StrCat("nvme tier: block ", reqs[i].id.ShortHex(),
                                                   " failed its CRC32C (stored ", e.crc32c,
                                                   ", read ", crc, "); dropped"));
    reqs[i].size = 0;
    bool dropped = false;
    {
      absl::MutexLock l(&mu_);
      auto it = blocks_.find(reqs[i].id);
      if (it != blocks_.end() && it->second.entry == e) {
        blocks_.erase(it);
        ++crc_failures_;
        dropped = true;
      }
    }
    if (dropped) {
      (void)catalog_->Delete(reqs[i].id);
      tier_->Free(ExtentOf(e));
    }
  }
  return statuses;
}

absl::Status NvmeBlockStore::Remove(const BlockId& id) {
  CatalogEntry e;
  {
    absl::MutexLock l(&mu_);
    auto it = blocks_.find(id);
    if (it == blocks_.end()) {
      return absl::NotFoundError(absl::StrCat("nvme tier: block ", id.ShortHex(), " not found"));
    }
    e = it->second.entry;
    STRATA_RETURN_IF_ERROR(catalog_->Delete(id));
    blocks_.erase(it);
  }
  tier_->Free(ExtentOf(e));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<BlockId>> NvmeBlockStore::RemoveMoved(std::span<const BlockId> ids) {
  std::vector<BlockId> gone;
  std::vector<CatalogEntry> entries;
  {
    absl::MutexLock l(&mu_);
    absl::flat_hash_set<BlockId> seen;
    for (const BlockId& id : ids) {
      auto it = blocks_.find(id);
      if (it == blocks_.end() || !seen.insert(id).second) continue;
      gone.push_back(id);
      entries.push_back(it->second.entry);
    }
    if (gone.empty()) return gone;
    STRATA_RETURN_IF_ERROR(catalog_->DeleteBatch(gone, /*sync=*/false));
    for (const BlockId& id : gone) blocks_.erase(id);
  }
  for (const CatalogEntry& e : entries) tier_->Free(ExtentOf(e));
  return gone;
}

std::optional<CatalogEntry> NvmeBlockStore::Lookup(const BlockId& id) const {
  absl::MutexLock l(&mu_);
  auto it = blocks_.find(id);
  if (it == blocks_.end()) return std::nullopt;
  return it->second.entry;
}

std::vector<BlockId> NvmeBlockStore::Ids() const {
  absl::MutexLock l(&mu_);
  std::vector<BlockId> ids;
  ids.reserve(blocks_.size());
  for (const auto& [id, b] : blocks_) ids.push_back(id);
  return ids;
}

NvmeStoreCounters NvmeBlockStore::Counters() const {
  absl::MutexLock l(&mu_);
  NvmeStoreCounters c;
  c.blocks = blocks_.size();
  for (const auto& [id, b] : blocks_) {
    c.used_bytes += NvmeTier::RoundUp(b.entry.size);
    if (!b.verified) ++c.unverified;
  }
  c.crc_failures = crc_failures_;
  return c;
}

}  // namespace strata
