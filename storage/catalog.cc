#include "storage/catalog.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/strings.h"
#include "rocksdb/db.h"
#include "rocksdb/listener.h"
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

// Turns RocksDB's automatic recovery from background errors off: it would retry on its own
// threads, at its own pace, while the owner keeps calling; Catalog::Recover retries instead.
class NoAutoRecovery : public rocksdb::EventListener {
 public:
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason, rocksdb::Status,
                            bool* auto_recovery) override {
    *auto_recovery = false;
  }
};

// RocksDB's own log, kept off the disk: by default it is a LOG file beside the catalog, on the
// tier's disk, and once a write to that file fails (a full disk) RocksDB's next log line aborts
// the process (an assertion that Debian's build keeps). Warnings and errors go to stderr, where
// stratad's log goes too; informational lines are dropped.
class StderrLogger : public rocksdb::Logger {
 public:
  StderrLogger() : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL) {}
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::WARN_LEVEL, format, ap);
  }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    if (level < GetInfoLogLevel() || level == rocksdb::InfoLogLevel::HEADER_LEVEL) return;
    char line[1024];
    vsnprintf(line, sizeof line, format, ap);
    fprintf(stderr, "rocksdb (nvme catalog): %s\n", line);
  }
};

// A key no block ever has (block ids are 32 bytes): the target of the recovery probe's delete.
constexpr std::string_view kProbeKey = "strata-catalog-write-probe";

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
  // No fallocate: RocksDB would preallocate 1.1 x write_buffer_size (17.6 MiB) per WAL file on
  // the tier's disk, outside the tier's configured capacity, and on a nearly full disk ext4 hands
  // it whatever is left. That only moves a disk-full error from the next write to an unpredictable
  // later memtable switch. Catalog records are small and each batch is synced on its own, so
  // preallocation buys little; without it a full disk shows up at once and is recovered from
  // (TieredStore's health probe, Catalog::Recover).
  opts.allow_fallocate = false;
  opts.info_log = std::make_shared<StderrLogger>();
  auto listener = std::make_shared<NoAutoRecovery>();
  opts.listeners.push_back(listener);
  opts.max_bgerror_resume_count = 0;  // no automatic resume of retryable I/O errors either
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(opts, path, &raw);
  if (!s.ok()) return FromRocks(s, absl::StrCat("open ", path));
  auto cat = std::unique_ptr<Catalog>(new Catalog());
  cat->listener_ = std::move(listener);
  cat->path_ = path;
  cat->options_ = options;
  cat->db_.reset(raw);
  return cat;
}

Catalog::~Catalog() {
  if (db_) {
    // A WAL writer that failed must not be touched again (see the header).
    if (!failed_.load()) (void)db_->SyncWAL();
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
  return Write(wo, &batch, "write");
}

absl::Status Catalog::Write(const rocksdb::WriteOptions& wo, rocksdb::WriteBatch* batch,
                            std::string_view what) {
  if (failed_.load(std::memory_order_acquire)) {
    absl::MutexLock l(&fail_mu_);
    return absl::UnavailableError(absl::StrCat("catalog ", path_, ": writes suspended after ",
                                               first_failure_.message(),
                                               " (retried once the disk has room again)"));
  }
  absl::Status s = FromRocks(db_->Write(wo, batch), absl::StrCat(AsAbsl(what), " ", path_));
  if (!s.ok()) {
    absl::MutexLock l(&fail_mu_);
    if (!failed_.load()) first_failure_ = s;
    failed_.store(true, std::memory_order_release);
  }
  return s;
}

bool Catalog::write_failed(std::string* why) const {
  if (!failed_.load(std::memory_order_acquire)) return false;
  if (why) {
    absl::MutexLock l(&fail_mu_);
    *why = std::string(first_failure_.message());
  }
  return true;
}

absl::Status Catalog::Recover() {
  if (!failed_.load(std::memory_order_acquire)) return absl::OkStatus();
  // Resume flushes the memtable to an SST and switches to a new WAL, so the failed WAL writer
  // is never written to again. It fails (and may be called again) while the disk is still full.
  rocksdb::Status r = db_->Resume();
  if (!r.ok()) return FromRocks(r, absl::StrCat("resume ", path_));
  rocksdb::WriteBatch probe;
  probe.Delete(rocksdb::Slice(kProbeKey.data(), kProbeKey.size()));
  rocksdb::WriteOptions wo;
  wo.sync = true;
  absl::Status s = FromRocks(db_->Write(wo, &probe), absl::StrCat("probe write ", path_));
  if (!s.ok()) return s;  // still failed_: the next Recover resumes again
  absl::MutexLock l(&fail_mu_);
  first_failure_ = absl::OkStatus();
  failed_.store(false, std::memory_order_release);
  return absl::OkStatus();
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
  return Write(wo, &batch, "delete");
}

absl::Status Catalog::DeleteRaw(const std::string& raw_key) {
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync_writes;
  rocksdb::WriteBatch batch;
  batch.Delete(raw_key);
  return Write(wo, &batch, "delete");
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
  if (failed_.load()) return absl::UnavailableError(absl::StrCat("catalog ", path_, ": writes suspended"));
  STRATA_RETURN_IF_ERROR(FromRocks(db_->SyncWAL(), "sync wal"));
  return FromRocks(db_->Flush(rocksdb::FlushOptions()), "flush");
}

}  // namespace strata
