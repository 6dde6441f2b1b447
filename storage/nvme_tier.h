// NVMe tier: block payloads in 4 KiB-aligned extents of preallocated files, moved with O_DIRECT
// through io_uring.
//
// NvmeTier owns the files and the I/O. Each configured file is preallocated (fallocate) to its
// capacity when opened, so the disk space the tier uses is fixed at open and never grows: a
// write that finds no free extent fails with RESOURCE_EXHAUSTED naming the files. Free space is
// tracked per file by an ExtentAllocator (4 KiB alignment); the allocator lives in memory and is
// rebuilt at open from the catalog (see NvmeBlockStore).
//
// I/O: one io_uring ring with `queue_depth` entries. A batch (Write / Read of many requests) is
// split into operations that keep up to queue_depth requests in flight, submitted in batches.
// Buffers that are already 4 KiB aligned (address and length) go straight to the kernel; others
// go through a pool of aligned staging buffers that are registered with the ring (fixed-buffer
// ops), so no I/O allocates memory. When io_uring cannot be set up (old kernel, seccomp,
// RLIMIT_MEMLOCK) a small thread pool doing pread/pwrite takes over; `io_backend()` says which
// path is in use so the caller can log it. When the filesystem refuses O_DIRECT (tmpfs), the
// files are opened buffered and `direct_io()` is false.
//
// Thread-safe: batches from different threads are serialized on the ring.
//
// The engines are in storage/nvme_io_engine.{h,cc}; NvmeBlockStore in storage/nvme_block_store.cc.
//
// NvmeBlockStore puts the tier and the RocksDB catalog (storage/catalog.h) together: commit
// writes the data, makes it durable (fdatasync), then writes the catalog entry; open recovers
// the catalog, drops entries whose extents are missing or overlap, and rebuilds free space; the
// first read of a block after open verifies its CRC32C and drops a block that fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "storage/catalog.h"
#include "storage/extent_allocator.h"
#include "strata/block_id.h"

namespace strata {

inline constexpr uint64_t kNvmeAlignment = 4096;

struct NvmeFileSpec {
  std::string path;
  uint64_t capacity_bytes = 0;  // rounded down to kNvmeAlignment
};

enum class NvmeIoBackend : uint8_t { kIoUring = 0, kThreadPool = 1 };
std::string_view NvmeIoBackendName(NvmeIoBackend backend);

struct NvmeTierOptions {
  std::vector<NvmeFileSpec> files;
  uint32_t queue_depth = 32;                          // requests in flight per batch (>= 1)
  uint32_t staging_buffers = 32;                      // aligned staging buffers in the pool
  uint64_t staging_buffer_bytes = uint64_t{1} << 20;  // size of each (multiple of 4 KiB)
  bool sync_after_write = true;      // fdatasync the files a Write touched before it returns
  bool force_thread_pool = false;    // skip io_uring (tests, or a kernel without it)
  bool force_buffered = false;       // skip O_DIRECT (tests)
  uint32_t thread_pool_threads = 4;  // workers of the pread/pwrite fallback
  // io_uring rings set up like fio's (COOP_TASKRUN | SINGLE_ISSUER | DEFER_TASKRUN, one ring per
  // calling thread); false: plain rings without setup flags (the engine before; A/B in the bench).
  bool io_uring_taskrun_flags = true;
  // One ring for every calling thread (COOP_TASKRUN only; SINGLE_ISSUER would tie it to one
  // thread). For callers on many short-lived threads, such as the daemon's gRPC handlers, where
  // per-thread rings would be set up (and their staging buffers registered) again and again.
  bool shared_ring = false;
};

// Where a payload lives. `size` is the payload length; the extent occupies RoundUp(size).
struct NvmeExtent {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

struct NvmeWriteReq {
  std::span<const std::byte> data;
  NvmeExtent extent;  // out: where the payload went (set when the request's status is OK)
};

struct NvmeReadReq {
  NvmeExtent extent;
  // Destination of extent.size bytes. If its address is 4 KiB aligned and it holds at least
  // RoundUp(extent.size) bytes (dst.size() >= that), the device reads straight into it;
  // otherwise the payload goes through a staging buffer and only extent.size bytes are written.
  std::span<std::byte> dst;
};

struct NvmeFileStats {
  std::string path;
  uint64_t capacity_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t size_at_open = 0;  // file size found before preallocation (0: new file)
};

class NvmeTier {
 public:
  static absl::StatusOr<std::unique_ptr<NvmeTier>> Open(NvmeTierOptions options);
  ~NvmeTier();
  NvmeTier(const NvmeTier&) = delete;
  NvmeTier& operator=(const NvmeTier&) = delete;

  // Allocates an extent for each request, writes it, and (sync_after_write) makes it durable.
  // One status per request; a request that fails holds no extent afterwards.
  std::vector<absl::Status> Write(std::span<NvmeWriteReq> reqs);
  // Reads each request's extent into its dst. One status per request.
  std::vector<absl::Status> Read(std::span<NvmeReadReq> reqs);
  // Returns an extent obtained from Write (or restored by RestoreAllocations) to free space.
  void Free(const NvmeExtent& extent);
  // Makes every file durable (fdatasync).
  absl::Status Sync();

  // Replaces file `file`'s free space with "everything except `used`" (extents need not be
  // sorted but must not overlap and must lie inside the file). Used at recovery.
  absl::Status RestoreAllocations(uint32_t file, std::span<const NvmeExtent> used);

  // True when `extent` lies within file `extent.file` as it was found at open (before any
  // preallocation extended it) and is aligned.
  bool ExtentExistedAtOpen(const NvmeExtent& extent) const;

  NvmeIoBackend io_backend() const { return backend_; }
  // Why io_uring is not in use (empty when it is).
  const std::string& io_uring_error() const { return io_uring_error_; }
  bool direct_io() const { return direct_io_; }
  bool registered_buffers() const { return registered_buffers_; }
  // IORING_SETUP_* flags the (opening thread's) ring was created with; 0 for the thread pool.
  uint32_t io_uring_setup_flags() const { return io_uring_setup_flags_; }
  uint32_t queue_depth() const { return options_.queue_depth; }
  size_t file_count() const { return files_.size(); }
  std::vector<NvmeFileStats> Stats() const;
  uint64_t capacity_bytes() const;
  uint64_t free_bytes() const;
  static uint64_t RoundUp(uint64_t n) { return (n + kNvmeAlignment - 1) & ~(kNvmeAlignment - 1); }

  struct Impl;  // the I/O engine (io_uring or thread pool); internal
  struct Op;    // one device operation; internal

 private:
  struct File {
    std::string path;
    int fd = -1;
    uint64_t capacity = 0;
    uint64_t size_at_open = 0;
    std::unique_ptr<ExtentAllocator> allocator;
  };
  explicit NvmeTier(NvmeTierOptions options);
  absl::Status OpenFiles();
  absl::Status SetUpIo();
  // Write's steps: an extent for each request (false where it got none, its status set), the
  // ops that move the allocated ones, and fdatasync of the files they went to (a failure fails
  // their requests).
  std::vector<bool> AllocateExtents(std::span<NvmeWriteReq> reqs,
                                    std::vector<absl::Status>& statuses);
  // An op on `len` bytes at `pos` within extent `e`, for request `req` (the caller sets the
  // buffers).
  Op OpAt(size_t req, const NvmeExtent& e, uint64_t pos, uint64_t len) const;
  std::vector<Op> WriteOps(std::span<const NvmeWriteReq> reqs,
                           const std::vector<bool>& allocated) const;
  void SyncWritten(std::span<const NvmeWriteReq> reqs, const std::vector<bool>& allocated,
                   std::vector<absl::Status>& statuses);
  // Runs ops to completion; op statuses are folded into `statuses` by request index.
  void RunOps(std::vector<Op>& ops, bool is_write, std::vector<absl::Status>& statuses);
  std::string PathsForError() const;
  uint64_t free_bytes_locked() const;  // alloc_mu_ held

  NvmeTierOptions options_;
  std::vector<File> files_;
  mutable absl::Mutex alloc_mu_;  // guards allocators and next_file_
  uint32_t next_file_ = 0;
  absl::Mutex io_mu_;  // serializes batches on the I/O engine
  std::unique_ptr<Impl> impl_;
  NvmeIoBackend backend_ = NvmeIoBackend::kIoUring;
  std::string io_uring_error_;
  bool direct_io_ = true;
  bool registered_buffers_ = false;
  uint32_t io_uring_setup_flags_ = 0;
};

// ---------------------------------------------------------------------------------------------

struct NvmeBlockStoreOptions {
  NvmeTierOptions tier;
  std::string catalog_path;        // RocksDB directory
  bool verify_every_read = false;  // false: CRC checked on the first read after open only
};

struct NvmeRecoveryReport {
  uint64_t entries_loaded = 0;  // catalog entries read
  uint64_t entries_kept = 0;
  uint64_t dropped_undecodable = 0;     // value failed to decode or its own checksum
  uint64_t dropped_missing_extent = 0;  // file gone, too short, or extent misaligned
  uint64_t dropped_overlapping = 0;
  absl::Duration elapsed;
};

struct NvmePutReq {
  BlockId id;
  CatalogEntry meta;  // namespace, codec, parent, last access, pin; location/size/crc are set here
  std::span<const std::byte> data;
};

struct NvmeGetReq {
  BlockId id;
  std::span<std::byte> dst;  // see NvmeReadReq::dst; at least the block's size
  uint64_t size = 0;         // out: payload bytes read
};

struct NvmeStoreCounters {
  uint64_t blocks = 0;
  uint64_t used_bytes = 0;    // allocated (4 KiB-rounded)
  uint64_t crc_failures = 0;  // blocks dropped because their CRC failed on read
  uint64_t unverified = 0;    // blocks recovered at open not yet read
};

class NvmeBlockStore {
 public:
  static absl::StatusOr<std::unique_ptr<NvmeBlockStore>> Open(NvmeBlockStoreOptions options);
  ~NvmeBlockStore();

  // Writes and commits each block: data durable first, then the catalog entry (WAL, synced).
  // A block id already present is left as is (OK). One status per request.
  std::vector<absl::Status> Put(std::span<NvmePutReq> reqs);
  // Reads each block into dst. NOT_FOUND for an unknown id; DATA_LOSS (and the block dropped)
  // when its CRC fails. One status per request.
  std::vector<absl::Status> Get(std::span<NvmeGetReq> reqs);
  // Drops a block (catalog entry first, then the extent). NOT_FOUND when absent.
  absl::Status Remove(const BlockId& id);
  // Drops the blocks among `ids` that are here, in one catalog batch that is not fsynced: for
  // blocks that now live elsewhere (promoted to host memory). If the deletions are lost in a
  // crash, the entries come back at restart: their data is still on disk, or, where a new block
  // reused the extent, their CRC fails on first read and they are dropped, never served.
  // Returns the ids removed (each once); an error when the catalog refused the batch (nothing
  // is removed then).
  absl::StatusOr<std::vector<BlockId>> RemoveMoved(std::span<const BlockId> ids);

  // After write errors (a full disk): brings the catalog back (Catalog::Recover) and writes a
  // 4 KiB probe extent to the tier files (freed at once). OK when both work, so the caller can
  // stop reporting the tier as degraded; the error otherwise (call again later).
  absl::Status ProbeWrites();

  std::optional<CatalogEntry> Lookup(const BlockId& id) const;
  std::vector<BlockId> Ids() const;
  NvmeStoreCounters Counters() const;
  const NvmeRecoveryReport& recovery() const { return recovery_; }
  NvmeTier& tier() { return *tier_; }
  Catalog& catalog() { return *catalog_; }

 private:
  struct Block {
    CatalogEntry entry;
    bool verified = false;
  };
  NvmeBlockStore() = default;
  absl::Status Recover();
  static NvmeExtent ExtentOf(const CatalogEntry& e) { return {e.file_index, e.offset, e.size}; }

  NvmeBlockStoreOptions options_;
  std::unique_ptr<NvmeTier> tier_;
  std::unique_ptr<Catalog> catalog_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<BlockId, Block> blocks_;
  uint64_t crc_failures_ = 0;
  NvmeRecoveryReport recovery_;
};

}  // namespace strata
