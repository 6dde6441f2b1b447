// Block catalog in RocksDB: BlockId -> where a committed block lives and what it is.
//
// Key: the 32 raw bytes of the BlockId. Value: a fixed 116-byte little-endian record
// (kCatalogValueBytes), version 1:
//
//   off  size  field
//     0     1  version (1)
//     1     1  tier (storage Tier value: 1 host, 2 nvme)
//     2     2  codec id
//     4     4  file index (which NVMe file)
//     8     8  offset in the file (bytes, 4 KiB aligned for NVMe)
//    16     8  payload size (bytes)
//    24     4  CRC32C of the payload
//    28     4  reserved (0)
//    32    32  namespace id
//    64    32  parent block id (zero for the first block of a chain)
//    96     8  last access (unix microseconds, signed)
//   104     8  pin until (unix microseconds, signed; 0: not pinned)
//   112     4  CRC32C of bytes [0, 112): a torn or bit-rotted record is rejected on load
//
// Every write goes through the WAL; `sync_writes` also fsyncs it before the call returns, so an
// entry that Put reported is there after kill -9 or power loss. Thread-safe (RocksDB is).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "strata/block_id.h"

namespace rocksdb {
class DB;
}

namespace strata {

inline constexpr size_t kCatalogValueBytes = 116;
inline constexpr uint8_t kCatalogValueVersion = 1;

struct CatalogEntry {
  NamespaceId ns;
  uint8_t tier = 2;  // Tier::kNvme
  uint16_t codec_id = 0;
  uint32_t file_index = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t crc32c = 0;
  BlockId parent;
  int64_t last_access_us = 0;
  int64_t pin_until_us = 0;

  bool operator==(const CatalogEntry&) const = default;
};

// The fixed-size value encoding above.
void EncodeCatalogEntry(const CatalogEntry& e, uint8_t out[kCatalogValueBytes]);
absl::StatusOr<CatalogEntry> DecodeCatalogEntry(std::span<const uint8_t> value);

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
  const std::string& path() const { return path_; }

 private:
  Catalog() = default;
  std::string path_;
  CatalogOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace strata
