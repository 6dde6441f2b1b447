// Block catalog in RocksDB: BlockId -> where a committed block lives and what it is.
//
// Key: the 32 raw bytes of the BlockId. Value: the fixed-size record of storage/catalog_record.h.
//
// Every write goes through the WAL; `sync_writes` also fsyncs it before the call returns, so an
// entry that Put reported is there after kill -9 or power loss. Thread-safe (RocksDB is).
//
// Write failures (a full disk): after the first failed write the catalog refuses further writes
// itself (UNAVAILABLE, naming the first error) instead of passing them to RocksDB, whose WAL
// writer must not be used again after an error (RocksDB's own assertion aborts the process in
// builds that keep assertions, such as Debian's). Recover() brings it back once the cause is
// gone: RocksDB's Resume (a flush to a fresh WAL) and a synced probe write. RocksDB's automatic
// recovery is off, so that the owner decides when to retry and nothing races with it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/catalog_record.h"
#include "strata/block_id.h"

namespace rocksdb {
class DB;
class EventListener;
class WriteBatch;
struct WriteOptions;
}

namespace strata {

struct CatalogOptions {
  bool sync_writes = true;  // fsync the WAL on every Put/Delete batch
  bool create_if_missing = true;
};

class Catalog {
 public:
  static absl::StatusOr<std::unique_ptr<Catalog>> Open(const std::string& path,
                                                       CatalogOptions options = {});
  ~Catalog();
  Catalog(const Catalog&) = delete;
  Catalog& operator=(const Catalog&) = delete;

  absl::Status Put(const BlockId& id, const CatalogEntry& entry);
  // One atomic write batch.
  absl::Status PutBatch(std::span<const std::pair<BlockId, CatalogEntry>> entries);
  absl::Status Delete(const BlockId& id);
  absl::Status DeleteBatch(std::span<const BlockId> ids);
  // As above, fsyncing the WAL only when `sync` (a later synced write makes it durable too).
  absl::Status DeleteBatch(std::span<const BlockId> ids, bool sync);
  // NOT_FOUND when absent; DATA_LOSS when the stored value does not decode.
  absl::StatusOr<CatalogEntry> Get(const BlockId& id) const;

  // Calls fn for every key in key order. `entry` is an error status for a value that does not
  // decode (or a key that is not 32 bytes: then id is zero and `raw_key` holds the key).
  absl::Status ForEach(
      const std::function<void(const BlockId& id, const std::string& raw_key,
                               const absl::StatusOr<CatalogEntry>& entry)>& fn) const;
  // Deletes a raw key (for keys that are not block ids).
  absl::Status DeleteRaw(const std::string& raw_key);
  absl::Status Flush();

  // True after a write failed and until Recover() succeeds; `why` gets the first error.
  bool write_failed(std::string* why = nullptr) const;
  // OK at once when no write failed; otherwise tries to resume RocksDB and to write a probe
  // (a synced delete of a key that is never used), and accepts writes again when both succeed.
  absl::Status Recover();
  const std::string& path() const { return path_; }

 private:
  Catalog() = default;
  std::string path_;
  CatalogOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
  std::shared_ptr<rocksdb::EventListener> listener_;
  // Write errors: see the comment at the top.
  absl::Status Write(const rocksdb::WriteOptions& wo, rocksdb::WriteBatch* batch,
                     std::string_view what);
  mutable absl::Mutex fail_mu_;
  absl::Status first_failure_ ABSL_GUARDED_BY(fail_mu_);
  std::atomic<bool> failed_{false};
};

}  // namespace strata
