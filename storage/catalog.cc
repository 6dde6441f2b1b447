#include "storage/catalog.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/strings.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"

namespace strata {
namespace {

absl::Status FromRocks(const rocksdb::Status& s, std::string_view what) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = absl::StrCat("catalog ", AsAbsl(what), ": ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsIOError()) return absl::UnavailableError(msg);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  return absl::InternalError(msg);
}

rocksdb::Slice KeyOf(const BlockId& id) {
  return {reinterpret_cast<const char*>(id.bytes.data()), id.bytes.size()};
}

}  // namespace

absl::StatusOr<std::unique_ptr<Catalog>> Catalog::Open(const std::string& path,
                                                       CatalogOptions options) {
  rocksdb::Options opts;
  opts.create_if_missing = options.create_if_missing;
  opts.IncreaseParallelism(2);
  // Values are small and fixed; keep the memtable modest and recovery quick.
  opts.write_buffer_size = 16 << 20;
  opts.max_log_file_size = 64 << 20;
  opts.keep_log_file_num = 4;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(opts, path, &raw);
  if (!s.ok()) return FromRocks(s, absl::StrCat("open ", path));
  auto cat = std::unique_ptr<Catalog>(new Catalog());
  cat->path_ = path;
  cat->options_ = options;
  cat->db_.reset(raw);
  return cat;
}

Catalog::~Catalog() {
  if (db_) {
    (void)db_->SyncWAL();
    (void)db_->Close();
  }
}

absl::Status Catalog::Put(const BlockId& id, const CatalogEntry& entry) {
  std::pair<BlockId, CatalogEntry> one{id, entry};
  return PutBatch({&one, 1});
}

absl::Status Catalog::PutBatch(std::span<const std::pair<BlockId, CatalogEntry>> entries) {
  rocksdb::WriteBatch batch;
  uint8_t buf[kCatalogValueBytes];
  for (const auto& [id, e] : entries) {
    EncodeCatalogEntry(e, buf);
    batch.Put(KeyOf(id), rocksdb::Slice(reinterpret_cast<const char*>(buf), sizeof(buf)));
  }
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  return FromRocks(db_->Write(wo, &batch), absl::StrCat("write ", path_));
}

absl::Status Catalog::Delete(const BlockId& id) { return DeleteBatch({&id, 1}); }

absl::Status Catalog::DeleteBatch(std::span<const BlockId> ids) {
  return DeleteBatch(ids, options_.sync_writes);
}

absl::Status Catalog::DeleteBatch(std::span<const BlockId> ids, bool sync) {
  rocksdb::WriteBatch batch;
  for (const auto& id : ids) batch.Delete(KeyOf(id));
  rocksdb::WriteOptions wo;
  wo.sync = sync && options_.sync_writes;
  return FromRocks(db_->Write(wo, &batch), absl::StrCat("delete ", path_));
}

absl::Status Catalog::DeleteRaw(const std::string& raw_key) {
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  return FromRocks(db_->Delete(wo, raw_key), absl::StrCat("delete ", path_));
}

absl::StatusOr<CatalogEntry> Catalog::Get(const BlockId& id) const {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), KeyOf(id), &value);
  if (!s.ok()) return FromRocks(s, absl::StrCat("get ", id.ShortHex()));
  return DecodeCatalogEntry({reinterpret_cast<const uint8_t*>(value.data()), value.size()});
}

absl::Status Catalog::ForEach(
    const std::function<void(const BlockId&, const std::string&,
                             const absl::StatusOr<CatalogEntry>&)>& fn) const {
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;
  ro.readahead_size = 2 << 20;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
  std::string raw_key;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    rocksdb::Slice k = it->key();
    rocksdb::Slice v = it->value();
    BlockId id;
    raw_key.assign(k.data(), k.size());
    if (k.size() != id.bytes.size()) {
      fn(id, raw_key, absl::DataLossError("catalog key is not a block id"));
      continue;
    }
    std::memcpy(id.bytes.data(), k.data(), k.size());
    fn(id, raw_key, DecodeCatalogEntry({reinterpret_cast<const uint8_t*>(v.data()), v.size()}));
  }
  return FromRocks(it->status(), absl::StrCat("scan ", path_));
}

absl::Status Catalog::Flush() {
  STRATA_RETURN_IF_ERROR(FromRocks(db_->SyncWAL(), "sync wal"));
  return FromRocks(db_->Flush(rocksdb::FlushOptions()), "flush");
}

}  // namespace strata
