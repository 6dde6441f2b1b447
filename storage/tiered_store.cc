#include "storage/tiered_store.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "storage/block_store_wrapper.h"

namespace strata {

absl::StatusOr<std::unique_ptr<TieredStore>> TieredStore::Open(HostTier* host,
                                                               TieredStoreOptions options) {
  if (!host->options().write_back)
    return absl::InvalidArgumentError("TieredStore needs a host tier with write_back on");
  if (!(options.nvme_low_watermark > 0 &&
        options.nvme_low_watermark <= options.nvme_high_watermark &&
        options.nvme_high_watermark <= 1))
    return absl::InvalidArgumentError("nvme watermarks need 0 < low <= high <= 1");
  std::unique_ptr<TieredStore> s(new TieredStore(host, std::move(options)));
  STRATA_ASSIGN_OR_RETURN(auto policy, MakeEvictionPolicy(s->options_.nvme_policy));
  STRATA_ASSIGN_OR_RETURN(s->store_, NvmeBlockStore::Open(s->options_.nvme));
  const uint64_t typical = 1 << 20;
  STRATA_ASSIGN_OR_RETURN(
      auto admission,
      MakeAdmissionPolicy(s->options_.admission,
                          std::max<uint64_t>(1024, s->store_->tier().capacity_bytes() / typical)));
  {
    absl::MutexLock l(&s->meta_mu_);
    s->policy_ = std::move(policy);
    s->admission_ = std::move(admission);
    // Recovered blocks enter the NVMe policy (their access history is not persisted).
    for (const BlockId& id : s->store_->Ids()) {
      auto e = s->store_->Lookup(id);
      s->policy_->OnInsert(id, BlockMeta{e ? e->parent : BlockId{}, 1});
    }
  }
  TieredStore* raw = s.get();
  s->writer_ = std::thread([raw] { raw->WriteBackLoop(); });
  return s;
}

TieredStore::~TieredStore() { Stop(); }

void TieredStore::Stop() {
  if (stop_.exchange(true)) return;
  host_->StopWriteBack();  // wakes the writer; queued victims are dropped
  if (writer_.joinable()) writer_.join();
}

bool TieredStore::OnNvme(const NamespaceId& ns, const BlockId& id, CatalogEntry* entry) const {
  auto e = store_->Lookup(id);
  if (!e || e->ns != ns) return false;
  if (entry) *entry = *e;
  return true;
}

std::vector<BlockId> TieredStore::NvmeIds() const { return store_->Ids(); }

// A block moving between the tiers is in its new tier before it leaves the old one (write-back
// puts it on NVMe before the host drops it; a promotion commits it in host memory before NVMe
// drops it). So the host tier, then NVMe, then the host tier again sees every block at least
// once, whichever way it moves meanwhile; NVMe then the host once missed blocks demoted in
// between.
std::vector<BlockInfo> TieredStore::AllBlocks() const {
  std::vector<BlockInfo> blocks;
  absl::flat_hash_set<BlockId> seen;
  auto add = [&](BlockInfo b) {
    if (seen.insert(b.id).second) blocks.push_back(std::move(b));
  };
  ForEachHostBlock(add);
  for (BlockInfo& b : NvmeBlocks()) add(std::move(b));
  ForEachHostBlock(add);
  return blocks;
}

std::vector<BlockId> TieredStore::AllIds() const {
  std::vector<BlockId> ids;
  absl::flat_hash_set<BlockId> seen;
  auto add = [&](const BlockId& id) {
    if (seen.insert(id).second) ids.push_back(id);
  };
  ForEachHostBlock([&](const BlockInfo& b) { add(b.id); });
  for (const BlockId& id : NvmeIds()) add(id);
  ForEachHostBlock([&](const BlockInfo& b) { add(b.id); });
  return ids;
}

void TieredStore::ForEachHostBlock(const std::function<void(BlockInfo)>& fn) const {
  uint64_t cursor = 0;
  do {
    for (BlockInfo& b : host_->List(nullptr, 65536, &cursor)) fn(std::move(b));
  } while (cursor != 0);
}

bool TieredStore::Holds(const BlockId& id) const {
  return !host_->Inspect({&id, 1}).empty() || HoldsOnNvme(id);
}

std::vector<BlockInfo> TieredStore::NvmeBlocks() const {
  std::vector<BlockInfo> out;
  for (const BlockId& id : store_->Ids()) {
    auto e = store_->Lookup(id);
    if (!e) continue;  // removed meanwhile
    BlockInfo b;
    b.id = id;
    b.ns = e->ns;
    b.parent = e->parent;
    b.size = e->size;
    b.crc = e->crc32c;
    out.push_back(b);
  }
  return out;
}

bool TieredStore::HoldsOnNvme(const BlockId& id) const { return store_->Lookup(id).has_value(); }

bool TieredStore::PinnedOnNvme(const BlockId& id) {
  auto it = pins_.find(id);
  if (it == pins_.end()) return false;
  if (it->second > absl::Now()) return true;
  pins_.erase(it);
  return false;
}

// ---------------------------------------------------------------------------------------------
// Write-back

void TieredStore::WriteBackLoop() {
  while (!stop_.load()) {
    auto items = host_->TakeDemotions(options_.write_back_batch, absl::Milliseconds(100));
    // Before the batch: once space is back, this batch already goes to NVMe.
    ProbeIfDegraded();
    if (!items.empty()) WriteBack(items);
  }
}

bool TieredStore::Degraded(std::string* why) const {
  if (!degraded_.load(std::memory_order_acquire)) return false;
  if (why) {
    absl::MutexLock l(&health_mu_);
    *why = degraded_reason_;
  }
  return true;
}

void TieredStore::MarkDegraded(const absl::Status& cause) {
  absl::MutexLock l(&health_mu_);
  if (degraded_.load()) return;
  degraded_reason_ = std::string(cause.message());
  last_probe_ = absl::Now();
  degraded_.store(true, std::memory_order_release);
  Warn(absl::StrCat("nvme tier degraded: writes fail (", cause.ToString(),
                    "); host victims are dropped instead of demoted, blocks already on NVMe are "
                    "still served; retrying every second"));
}

void TieredStore::ProbeIfDegraded() {
  if (!degraded_.load(std::memory_order_acquire)) return;
  {
    absl::MutexLock l(&health_mu_);
    const absl::Time now = absl::Now();
    if (now - last_probe_ < absl::Seconds(1)) return;
    last_probe_ = now;
  }
  absl::Status s;
  {
    absl::MutexLock io(&io_mu_);
    s = store_->ProbeWrites();
  }
  if (!s.ok()) return;
  std::string was;
  {
    absl::MutexLock l(&health_mu_);
    was = std::move(degraded_reason_);
    degraded_reason_.clear();
    degraded_.store(false, std::memory_order_release);
  }
  Warn(absl::StrCat("nvme tier recovered: writes work again (the episode began with: ", was, ")"));
}

void TieredStore::MakeRoom(uint64_t need) {
  const NvmeTier& tier = store_->tier();
  const double cap = static_cast<double>(tier.capacity_bytes());
  auto used = [&] { return static_cast<double>(tier.capacity_bytes() - tier.free_bytes()); };
  // Past the high watermark: down to the low one; otherwise only what the batch needs.
  const double limit =
      used() + need > options_.nvme_high_watermark * cap ? options_.nvme_low_watermark * cap : cap;
  std::vector<BlockId> skipped;
  std::vector<BlockId> victims;
  {
    absl::MutexLock l(&meta_mu_);
    double projected = used();
    while (projected + need > limit) {
      auto v = policy_->PopVictim();
      if (!v) break;
      if (PinnedOnNvme(*v)) {
        skipped.push_back(*v);
        continue;
      }
      auto e = store_->Lookup(*v);
      if (!e) continue;
      projected -= static_cast<double>(NvmeTier::RoundUp(e->size));
      victims.push_back(*v);
    }
    for (const BlockId& id : skipped) {
      auto e = store_->Lookup(id);
      if (e) policy_->OnInsert(id, BlockMeta{e->parent, 1});
    }
  }
  for (const BlockId& id : victims) {
    absl::Status st = store_->Remove(id);
    if (st.ok()) {
      n_.nvme_evictions.fetch_add(1);
    } else if (store_->Lookup(id)) {
      // The catalog refused the delete (a full disk): the block and its extent stay, so it
      // goes back into the policy, or its extent would be lost to the tier until a restart.
      {
        absl::MutexLock l(&meta_mu_);
        auto e = store_->Lookup(id);
        if (e) policy_->OnInsert(id, BlockMeta{e->parent, 1});
      }
      MarkDegraded(st);
    }
  }
}

void TieredStore::WriteBack(std::vector<DemotionItem>& items) {
  std::vector<DemotionItem> admitted;
  std::vector<uint32_t> rejected;
  {
    absl::MutexLock l(&meta_mu_);
    for (const DemotionItem& d : items) {
      if (admission_->Admit(d.id, d.accesses))
        admitted.push_back(d);
      else
        rejected.push_back(d.handle);
    }
  }
  for (uint32_t h : rejected) host_->FinishDemotion(h, false);
  n_.admission_rejected.fetch_add(rejected.size());
  if (admitted.empty()) return;

  absl::MutexLock io(&io_mu_);
  uint64_t need = 0;
  for (const DemotionItem& d : admitted) need += NvmeTier::RoundUp(d.size);
  MakeRoom(need);
  std::vector<NvmePutReq> puts(admitted.size());
  const int64_t now_us = absl::ToUnixMicros(absl::Now());
  for (size_t i = 0; i < admitted.size(); ++i) {
    const DemotionItem& d = admitted[i];
    puts[i].id = d.id;
    puts[i].meta.ns = d.ns;
    puts[i].meta.parent = d.parent;
    puts[i].meta.last_access_us = now_us;
    puts[i].data = std::span<const std::byte>(
        reinterpret_cast<const std::byte*>(host_->base() + d.offset), d.size);
  }
  std::vector<absl::Status> st = store_->Put(puts);
  for (size_t i = 0; i < admitted.size(); ++i) {
    const DemotionItem& d = admitted[i];
    if (!st[i].ok()) {
      if (absl::IsResourceExhausted(st[i])) {
        uint64_t k = n_.nvme_full_drops.fetch_add(1) + 1;
        if ((k & (k - 1)) == 0)  // 1st, 2nd, 4th, 8th, ... time: the log stays readable
          Warn(absl::StrCat("nvme tier full: host victim ", d.id.ShortHex(), " (", d.size,
                            " bytes) dropped instead of demoted (", k,
                            " so far); serving continues from host memory: ", st[i].message()));
      } else {
        uint64_t k = n_.nvme_write_errors.fetch_add(1) + 1;
        MarkDegraded(st[i]);
        if ((k & (k - 1)) == 0)  // 1st, 2nd, 4th, ...: a full disk does not flood the log
          Warn(absl::StrCat("nvme write of block ", d.id.ShortHex(), " failed; dropped (", k,
                            " so far): ", st[i].ToString()));
      }
      host_->FinishDemotion(d.handle, false);
      continue;
    }
    {
      absl::MutexLock l(&meta_mu_);
      policy_->OnInsert(d.id, BlockMeta{d.parent, d.accesses});
    }
    n_.demotions.fetch_add(1);
    n_.demoted_bytes.fetch_add(d.size);
    if (!host_->FinishDemotion(d.handle, true)) {
      // Evicted by a client while it was being written: the NVMe copy must go too.
      RemoveNvme(d.id);
    }
  }
}

bool TieredStore::RemoveNvme(const BlockId& id) {
  absl::Status st = store_->Remove(id);
  bool removed = st.ok();
  if (!removed && store_->Lookup(id)) {
    // The catalog refused the delete: the block stays on NVMe, and so in the policy and pins.
    MarkDegraded(st);
    return false;
  }
  absl::MutexLock l(&meta_mu_);
  policy_->OnRemove(id);
  pins_.erase(id);
  return removed;
}

// ---------------------------------------------------------------------------------------------
// Reads

size_t TieredStore::Lookup(const NamespaceId& ns, std::span<const BlockId> ids,
                           std::vector<Tier>* tiers) {
  auto probe = [&](const BlockId& id) {
    if (!OnNvme(ns, id)) return false;
    absl::MutexLock l(&meta_mu_);
    policy_->OnAccess(id);
    return true;
  };
  std::vector<bool> lower;
  size_t n = host_->Lookup(ns, ids, probe, &lower);
  if (tiers) {
    tiers->clear();
    for (size_t i = 0; i < n; ++i) tiers->push_back(lower[i] ? Tier::kNvme : Tier::kHost);
  }
  return n;
}

void TieredStore::Promote(const NamespaceId& ns, std::span<const Promotion> blocks) {
  // Host extents are whole multiples of the host tier's alignment; when that is a multiple of
  // the NVMe alignment, the read may fill the padding and goes straight into host memory
  // (O_DIRECT) instead of through a staging buffer and a copy.
  const uint64_t host_align = host_->options().alignment;
  const bool whole_pages = host_align % kNvmeAlignment == 0;
  std::vector<uint64_t> reservation(blocks.size(), 0);
  std::vector<NvmeGetReq> gets;
  std::vector<size_t> get_block;
  gets.reserve(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const CatalogEntry& e = blocks[i].entry;
    ReserveItem item{blocks[i].id, e.parent, e.size};
    ReserveResult rr = host_->Reserve(ns, {&item, 1});
    if (rr.status[0] != BlockStatus::kOk) continue;  // kExists: back in host already; or no room
    // The read lands in this extent later (after the rest of the batch is reserved and the tier
    // is free): it must not expire and go to another block meanwhile.
    if (!host_->HoldReservation(rr.reservation_id).ok()) continue;
    reservation[i] = rr.reservation_id;
    uint64_t len = whole_pages ? NvmeTier::RoundUp(e.size) : e.size;
    NvmeGetReq g;
    g.id = blocks[i].id;
    g.dst = std::span<std::byte>(reinterpret_cast<std::byte*>(host_->base() + rr.offsets[0]), len);
    gets.push_back(g);
    get_block.push_back(i);
  }
  if (gets.empty()) return;
  // Read, commit and drop the NVMe copies under io_mu_, so a write-back of a block just
  // committed (it could be chosen as a victim at once) or an Evict cannot interleave: each
  // block ends in exactly one tier, or none if it was evicted or failed its CRC.
  absl::MutexLock io(&io_mu_);
  std::vector<absl::Status> read = store_->Get(gets);
  std::vector<BlockId> moved;
  std::vector<size_t> committed_blocks;
  for (size_t k = 0; k < gets.size(); ++k) {
    const size_t i = get_block[k];
    const BlockId& id = blocks[i].id;
    const absl::Status& st = read[k];
    if (!st.ok()) {
      (void)host_->Abort(reservation[i]);
      if (absl::IsDataLoss(st)) {  // the store dropped it already
        n_.nvme_crc_failures.fetch_add(1);
        absl::MutexLock l(&meta_mu_);
        policy_->OnRemove(id);
        pins_.erase(id);
        Warn(st.ToString());
      } else if (!absl::IsNotFound(st)) {  // NotFound: evicted meanwhile
        n_.nvme_read_errors.fetch_add(1);
        Warn(absl::StrCat("nvme read of block ", id.ShortHex(), " failed: ", st.ToString()));
      }
      continue;
    }
    // The host tier verifies the CRC32C recorded when the block was first committed.
    const uint32_t crc = blocks[i].entry.crc32c;
    auto committed = host_->Commit(reservation[i], {&crc, 1});
    if (!committed.ok()) {  // the reservation is gone: keep the NVMe copy, it is intact
      (void)host_->Abort(reservation[i]);
      Warn(absl::StrCat("promotion of nvme block ", id.ShortHex(), " lost its host reservation: ",
                        committed.status().ToString(), "; the block stays on NVMe"));
      continue;
    }
    moved.push_back(id);  // exclusive tiers: the block lives in host memory now (or nowhere)
    if ((*committed)[0] != BlockStatus::kOk) {
      n_.nvme_crc_failures.fetch_add(1);
      Warn(absl::StrCat("nvme block ", id.ShortHex(),
                        " failed its CRC32C when staged into host "
                        "memory (",
                        std::string(BlockStatusName((*committed)[0])), "); dropped"));
      continue;
    }
    committed_blocks.push_back(i);
  }
  absl::StatusOr<std::vector<BlockId>> removed = store_->RemoveMoved(moved);
  if (!removed.ok()) {
    Warn(
        absl::StrCat("nvme catalog: promoted blocks not removed from NVMe (they stay there and "
                     "are found again): ",
                     removed.status().ToString()));
  }
  // Pins follow the block. An NVMe pin lives in pins_ until here (also one set while the block
  // was reserved: the host tier did not hold it yet).
  std::vector<absl::Time> pin_until(blocks.size(), absl::InfinitePast());
  {
    absl::MutexLock l(&meta_mu_);
    for (size_t i : committed_blocks) {
      auto it = pins_.find(blocks[i].id);
      if (it != pins_.end()) pin_until[i] = it->second;
    }
    if (removed.ok()) {
      for (const BlockId& id : *removed) {
        policy_->OnRemove(id);
        pins_.erase(id);
      }
    }
  }
  const absl::Time now = absl::Now();
  for (size_t i : committed_blocks) {
    const BlockId& id = blocks[i].id;
    n_.promotions.fetch_add(1);
    n_.promoted_bytes.fetch_add(blocks[i].entry.size);
    if (pin_until[i] > now) host_->Pin(ns, {&id, 1}, pin_until[i] - now);
  }
}

AcquireResult TieredStore::Acquire(const NamespaceId& ns, std::span<const BlockId> ids) {
  absl::flat_hash_set<BlockId> in_host;
  for (const BlockInfo& b : host_->Inspect(ids)) in_host.insert(b.id);
  std::vector<Promotion> batch;
  for (const BlockId& id : ids) {
    if (in_host.contains(id)) continue;
    Promotion p{id, {}};
    if (!OnNvme(ns, id, &p.entry)) continue;
    batch.push_back(p);
    // Bounded batches: reserved-but-unread host extents cannot be evicted, so a huge fetch
    // must not hold most of the host tier in reservations at once.
    if (batch.size() == kPromoteBatch) {
      Promote(ns, batch);
      batch.clear();
    }
  }
  Promote(ns, batch);
  return host_->Acquire(ns, ids);
}

ReserveResult TieredStore::Reserve(const NamespaceId& ns, std::span<const ReserveItem> items) {
  return ReserveExceptHeld(
      items, [&](const ReserveItem& item) { return OnNvme(ns, item.id); },
      [&](std::span<const ReserveItem> rest) { return host_->Reserve(ns, rest); });
}

absl::StatusOr<BlockStatus> TieredStore::RenameReserved(uint64_t reservation_id,
                                                        const NamespaceId& ns,
                                                        const ReserveItem& item) {
  return RenameUnlessHeld(
      [&] { return OnNvme(ns, item.id); },
      [&] { return host_->RenameReserved(reservation_id, ns, item); },
      [&] { return host_->Abort(reservation_id); });
}

// ---------------------------------------------------------------------------------------------
// Evict, pins

EvictResult TieredStore::Evict(const NamespaceId& ns, std::span<const BlockId> ids, bool cascade,
                               bool force) {
  if (!cascade) {
    EvictResult r = host_->Evict(ns, ids, false, force);
    // A fetch may promote a block between the looks below (its reservation was not yet a block
    // when host memory was asked; the promotion ends under io_mu_): its host copy then goes.
    auto evict_promoted = [&](size_t i) {
      const EvictResult up = host_->Evict(ns, {&ids[i], 1}, false, force);
      r.status[i] = up.status[0];
      r.removed_blocks += up.removed_blocks;
    };
    for (size_t i = 0; i < ids.size(); ++i) {
      if (r.status[i] != BlockStatus::kNotFound) continue;
      if (!OnNvme(ns, ids[i])) {
        evict_promoted(i);
        continue;
      }
      {
        absl::MutexLock l(&meta_mu_);
        if (!force && PinnedOnNvme(ids[i])) {
          r.status[i] = BlockStatus::kPinned;
          continue;
        }
      }
      absl::MutexLock io(&io_mu_);
      if (RemoveNvme(ids[i])) {
        r.status[i] = BlockStatus::kOk;
        ++r.removed_blocks;
        n_.nvme_removed_explicit.fetch_add(1);
        continue;
      }
      evict_promoted(i);
    }
    return r;
  }
  // Cascade across both tiers: one scan of the parent -> child edges of `ns` (rare admin call).
  struct Node {
    bool pinned = false;
    bool host = false;
  };
  absl::flat_hash_map<BlockId, Node> nodes;
  absl::flat_hash_map<BlockId, std::vector<BlockId>> children;
  uint64_t cursor = 0;
  do {
    for (const BlockInfo& b : host_->List(&ns, 4096, &cursor)) {
      nodes[b.id] = Node{b.pinned_for > absl::ZeroDuration(), true};
      if (!b.parent.IsZero()) children[b.parent].push_back(b.id);
    }
  } while (cursor != 0);
  for (const BlockId& id : store_->Ids()) {
    CatalogEntry e;
    if (nodes.contains(id) || !OnNvme(ns, id, &e)) continue;
    bool pinned;
    {
      absl::MutexLock l(&meta_mu_);
      pinned = PinnedOnNvme(id);
    }
    nodes[id] = Node{pinned, false};
    if (!e.parent.IsZero()) children[e.parent].push_back(id);
  }
  EvictResult r;
  r.status.assign(ids.size(), BlockStatus::kNotFound);
  std::vector<BlockId> closure;
  absl::flat_hash_set<BlockId> seen;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = nodes.find(ids[i]);
    if (it == nodes.end()) continue;
    if (it->second.pinned && !force) {
      r.status[i] = BlockStatus::kPinned;
      continue;
    }
    r.status[i] = BlockStatus::kOk;
    if (seen.insert(ids[i]).second) closure.push_back(ids[i]);
  }
  for (size_t i = 0; i < closure.size(); ++i) {
    auto it = children.find(closure[i]);
    if (it == children.end()) continue;
    for (const BlockId& c : it->second)
      if ((force || !nodes[c].pinned) && seen.insert(c).second) closure.push_back(c);
  }
  std::vector<BlockId> host_ids, nvme_ids;
  for (const BlockId& id : closure) (nodes[id].host ? host_ids : nvme_ids).push_back(id);
  if (!host_ids.empty())
    r.removed_blocks += host_->Evict(ns, host_ids, false, force).removed_blocks;
  absl::MutexLock io(&io_mu_);
  for (const BlockId& id : nvme_ids)
    if (RemoveNvme(id)) {
      ++r.removed_blocks;
      n_.nvme_removed_explicit.fetch_add(1);
    }
  return r;
}

std::vector<BlockStatus> TieredStore::Pin(const NamespaceId& ns, std::span<const BlockId> ids,
                                          absl::Duration ttl) {
  std::vector<BlockStatus> out = host_->Pin(ns, ids, ttl);
  const absl::Time until = absl::Now() + std::min(ttl, host_->options().max_pin_ttl);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (out[i] != BlockStatus::kNotFound || !OnNvme(ns, ids[i])) continue;
    absl::MutexLock l(&meta_mu_);
    auto [it, inserted] = pins_.try_emplace(ids[i], until);
    if (!inserted) it->second = std::max(it->second, until);
    out[i] = BlockStatus::kOk;
  }
  return out;
}

std::vector<BlockStatus> TieredStore::Unpin(const NamespaceId& ns, std::span<const BlockId> ids) {
  std::vector<BlockStatus> out = host_->Unpin(ns, ids);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (out[i] != BlockStatus::kNotFound || !OnNvme(ns, ids[i])) continue;
    absl::MutexLock l(&meta_mu_);
    pins_.erase(ids[i]);
    out[i] = BlockStatus::kOk;
  }
  return out;
}

NvmeTierCounters TieredStore::Counters() const {
  NvmeTierCounters c;
  const NvmeTier& tier = store_->tier();
  c.nvme_capacity_bytes = tier.capacity_bytes();
  c.nvme_used_bytes = tier.capacity_bytes() - tier.free_bytes();
  NvmeStoreCounters sc = store_->Counters();
  c.nvme_blocks = sc.blocks;
  {
    absl::MutexLock l(&meta_mu_);
    const absl::Time now = absl::Now();
    for (const auto& [id, until] : pins_)
      if (until > now) ++c.nvme_pinned_blocks;
  }
  c.demotions = n_.demotions.load();
  c.demoted_bytes = n_.demoted_bytes.load();
  c.promotions = n_.promotions.load();
  c.promoted_bytes = n_.promoted_bytes.load();
  c.admission_rejected = n_.admission_rejected.load();
  c.nvme_evictions = n_.nvme_evictions.load();
  c.nvme_full_drops = n_.nvme_full_drops.load();
  c.nvme_write_errors = n_.nvme_write_errors.load();
  c.nvme_read_errors = n_.nvme_read_errors.load();
  c.nvme_crc_failures = n_.nvme_crc_failures.load();
  c.nvme_removed_explicit = n_.nvme_removed_explicit.load();
  c.degraded = Degraded(&c.degraded_reason);
  return c;
}

}  // namespace strata
