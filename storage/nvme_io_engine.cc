#include "storage/nvme_io_engine.h"

#include <liburing.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace strata {
namespace nvme_internal {

std::string Errno(int err) { return std::strerror(err); }

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

void StageIn(std::byte* buf, const std::byte* src, uint64_t copy_len, uint64_t len) {
  std::memcpy(buf, src, copy_len);
  if (len > copy_len) std::memset(buf + copy_len, 0, len - copy_len);
}

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
    Batch b{ops, is_write, results};
    while (b.done < ops.size()) {
      QueueOps(rg, b);
      int r = io_uring_submit_and_wait(ring, b.inflight > 0 ? 1 : 0);
      if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
        // The ring is unusable: ops not submitted fail; wait out those in flight.
        for (size_t i = b.next; i < ops.size(); ++i) results[i] = r;
        b.done += ops.size() - b.next;
        b.next = ops.size();
        rg.broken = true;  // closed after this batch; the next one gets a fresh ring
        if (b.inflight == 0) break;
        io_uring_cqe* cqe = nullptr;
        if (io_uring_wait_cqe(ring, &cqe) < 0) {
          for (size_t i = 0; i < b.next; ++i)
            if (results[i] == 0) results[i] = r;
          break;
        }
      }
      ReapCompletions(rg, b);
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

  // One batch's progress through the ring.
  struct Batch {
    std::vector<Op>& ops;
    bool is_write;
    std::vector<int64_t>& results;
    size_t next = 0;  // ops queued so far
    size_t done = 0;  // ops completed (or failed unsubmitted)
    uint32_t inflight = 0;
  };

  // Queues the next ops while the queue depth, the submission queue and (for staged ops) the
  // staging buffers allow.
  void QueueOps(Ring& rg, Batch& b) {
    io_uring* ring = &rg.ring;
    const bool is_write = b.is_write;
    while (b.next < b.ops.size() && b.inflight < qd_) {
      Op& op = b.ops[b.next];
      int buf = -1;
      if (!op.direct) {
        if (free_bufs_.empty()) break;
        buf = static_cast<int>(free_bufs_.back());
      }
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      if (!sqe) break;
      if (buf >= 0) free_bufs_.pop_back();
      std::byte* mem = op.direct ? op.direct : region_.at(uint64_t(buf) * buf_bytes_);
      if (is_write && buf >= 0) StageIn(mem, op.src, op.copy_len, op.len);
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
      io_uring_sqe_set_data64(sqe, b.next);
      op_buf_[b.next] = buf;
      ++b.next;
      ++b.inflight;
    }
  }

  // Takes every completion posted: its result (a short transfer is an error), a staged read's
  // copy out, and its staging buffer back.
  void ReapCompletions(Ring& rg, Batch& b) {
    io_uring* ring = &rg.ring;
    unsigned head, seen = 0;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(ring, head, cqe) {
      size_t i = static_cast<size_t>(io_uring_cqe_get_data64(cqe));
      Op& op = b.ops[i];
      int64_t res = cqe->res;
      if (res >= 0 && static_cast<uint64_t>(res) != op.len) res = -EIO;  // short I/O
      b.results[i] = res;
      if (op_buf_[i] >= 0) {
        if (!b.is_write && res >= 0) {
          std::memcpy(op.dst, region_.at(uint64_t(op_buf_[i]) * buf_bytes_), op.copy_len);
        }
        free_bufs_.push_back(static_cast<uint32_t>(op_buf_[i]));
      }
      ++seen;
      --b.inflight;
      ++b.done;
    }
    io_uring_cq_advance(ring, seen);
  }

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
    if (is_write && !op.direct) StageIn(mem, op.src, op.copy_len, op.len);
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

}  // namespace

absl::StatusOr<std::unique_ptr<NvmeTier::Impl>> CreateUringEngine(
    uint32_t queue_depth, uint32_t staging_buffers, uint64_t staging_buffer_bytes,
    const std::vector<int>& fds, bool taskrun_flags, bool shared, UringSetup* setup) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<UringEngine> engine,
                          UringEngine::Create(queue_depth, staging_buffers, staging_buffer_bytes,
                                              fds, taskrun_flags, shared));
  setup->fixed_bufs = engine->fixed_bufs();
  setup->setup_flags = engine->setup_flags();
  return engine;
}

absl::StatusOr<std::unique_ptr<NvmeTier::Impl>> CreateThreadPoolEngine(
    uint32_t threads, uint32_t queue_depth, uint64_t staging_buffer_bytes) {
  auto pool = std::make_unique<ThreadPoolEngine>(threads, queue_depth, staging_buffer_bytes);
  if (!pool->ok()) return absl::ResourceExhaustedError("nvme tier: cannot map staging buffers");
  return pool;
}

}  // namespace nvme_internal
}  // namespace strata
