#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "storage/nvme_tier.h"

namespace strata {

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

absl::Status NvmeBlockStore::ProbeWrites() {
  STRATA_RETURN_IF_ERROR(catalog_->Recover());
  // Aligned, so the probe goes straight to the device like block writes with O_DIRECT.
  alignas(kNvmeAlignment) static const std::byte kZeros[kNvmeAlignment] = {};
  NvmeWriteReq probe{std::span<const std::byte>(kZeros, sizeof kZeros), {}};
  absl::Status s = tier_->Write({&probe, 1})[0];
  if (s.ok()) tier_->Free(probe.extent);
  // No free extent is a full tier, not a failing one: eviction makes room for real writes.
  if (absl::IsResourceExhausted(s)) return absl::OkStatus();
  return s;
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
