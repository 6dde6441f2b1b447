#include "storage/gpu/gpu_tiered_store.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace strata {
namespace {

constexpr size_t kPromoteBatch = 64;

// One status for a block two tiers answered for: removed or pinned anywhere wins.
BlockStatus Merge(BlockStatus a, BlockStatus b) {
  if (a == BlockStatus::kOk || b == BlockStatus::kOk) return BlockStatus::kOk;
  if (a == BlockStatus::kPinned || b == BlockStatus::kPinned) return BlockStatus::kPinned;
  return a == BlockStatus::kNotFound ? b : a;
}

}  // namespace

HostTierOptions GpuTieredStore::DeviceIndexOptions(HostTierOptions o) {
  o.write_back = true;
  o.zones.clear();
  o.tenant_max_reserved_bytes = 0;
  return o;
}

GpuTieredStore::GpuTieredStore(BlockStore* below, std::unique_ptr<DeviceMemory> memory,
                               GpuTieredStoreOptions options)
    : BlockStoreWrapper(below),
      memory_(std::move(memory)),
      options_(std::move(options)),
      device_(reinterpret_cast<uint8_t*>(memory_->device_address()), memory_->capacity(),
              DeviceIndexOptions(options_.device)) {}

absl::StatusOr<std::unique_ptr<GpuTieredStore>> GpuTieredStore::Open(
    BlockStore* below, std::unique_ptr<DeviceMemory> memory, GpuTieredStoreOptions options) {
  if (below == nullptr || memory == nullptr)
    return absl::InvalidArgumentError("a GPU tier needs a store below it and device memory");
  if (options.demotion_batch == 0) options.demotion_batch = 1;
  std::unique_ptr<GpuTieredStore> s(
      new GpuTieredStore(below, std::move(memory), std::move(options)));
  if (absl::Status r = s->memory_->RegisterHost(below->arena_base(), below->arena_bytes());
      !r.ok())
    s->Warn(absl::StrCat("gpu tier: the host arena could not be registered with the device (",
                         r.ToString(), "); copies go through the runtime's staging buffers"));
  GpuTieredStore* raw = s.get();
  s->demoter_ = std::thread([raw] { raw->DemotionLoop(); });
  return s;
}

GpuTieredStore::~GpuTieredStore() { Stop(); }

void GpuTieredStore::Stop() {
  if (stop_.exchange(true)) return;
  device_.StopWriteBack();
  if (demoter_.joinable()) demoter_.join();
}

bool GpuTieredStore::HoldsOnDevice(const BlockId& id) const {
  return !device_.Inspect({&id, 1}).empty();
}

absl::flat_hash_set<BlockId> GpuTieredStore::HeldOnDevice(const NamespaceId& ns,
                                                          std::span<const BlockId> ids) const {
  absl::flat_hash_set<BlockId> out;
  for (const BlockInfo& b : device_.Inspect(ids))
    if (b.ns == ns) out.insert(b.id);
  return out;
}

absl::flat_hash_map<BlockId, BlockInfo> GpuTieredStore::OnDevice(
    const NamespaceId& ns, std::span<const BlockId> ids) const {
  absl::flat_hash_map<BlockId, BlockInfo> out;
  for (BlockInfo& b : device_.Inspect(ids))
    if (b.ns == ns) out.emplace(b.id, std::move(b));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Up: promotion

std::vector<BlockStatus> GpuTieredStore::Promote(const NamespaceId& ns,
                                                 std::span<const BlockId> ids) {
  absl::flat_hash_map<BlockId, BlockStatus> result;
  const auto held = OnDevice(ns, ids);
  // Blocks on the device, already or promoted by this call, stay there until it returns (device
  // leases): a later batch must not evict them to make room, or "kOk: on the device" would not
  // hold when the caller reads it. What does not fit beside them is kNoSpace.
  std::vector<uint64_t> leases;
  {
    std::vector<BlockId> keep;
    for (const auto& [id, info] : held) keep.push_back(id);
    if (uint64_t l = device_.Acquire(ns, keep).lease_id; l != 0) leases.push_back(l);
  }
  std::vector<BlockId> batch;
  for (const BlockId& id : ids) {
    if (held.contains(id) || result.contains(id)) continue;
    result[id] = BlockStatus::kNotFound;
    batch.push_back(id);
    // Bounded: the host leases and device reservations of one batch are held until its copy
    // is done, so a huge reposition must not pin most of both tiers at once.
    if (batch.size() == kPromoteBatch) {
      PromoteBatch(ns, batch, result, leases);
      batch.clear();
    }
  }
  if (!batch.empty()) PromoteBatch(ns, batch, result, leases);
  for (uint64_t l : leases) (void)device_.Release(l);
  std::vector<BlockStatus> out;
  out.reserve(ids.size());
  for (const BlockId& id : ids) out.push_back(held.contains(id) ? BlockStatus::kOk : result[id]);
  return out;
}

void GpuTieredStore::PromoteBatch(const NamespaceId& ns, std::span<const BlockId> ids,
                                  absl::flat_hash_map<BlockId, BlockStatus>& out,
                                  std::vector<uint64_t>& leases) {
  // The host lease keeps the source extents where they are while they are copied (and stages
  // NVMe blocks up to host memory first).
  AcquireResult lease = below()->Acquire(ns, ids);
  if (lease.lease_id == 0) return;
  absl::flat_hash_map<BlockId, BlockId> parents;
  for (const BlockInfo& b : below()->Inspect(ids)) parents[b.id] = b.parent;
  std::vector<ReserveItem> items;
  std::vector<size_t> item_src;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (lease.status[i] != BlockStatus::kOk) continue;
    items.push_back(ReserveItem{ids[i], parents[ids[i]], lease.sizes[i]});
    item_src.push_back(i);
  }
  ReserveResult rr = device_.Reserve(ns, items);
  std::vector<DeviceCopy> copies;
  std::vector<uint32_t> crcs;
  std::vector<size_t> copied;  // indices into items
  for (size_t k = 0; k < items.size(); ++k) {
    const size_t i = item_src[k];
    switch (rr.status[k]) {
      case BlockStatus::kOk:
        copies.push_back(DeviceCopy{rr.offsets[k], below()->arena_base() + lease.offsets[i],
                                    lease.sizes[i]});
        crcs.push_back(lease.crcs[i]);
        copied.push_back(k);
        break;
      case BlockStatus::kExists:  // promoted meanwhile by another caller
        out[ids[i]] = BlockStatus::kOk;
        break;
      default:
        out[ids[i]] = rr.status[k];
    }
  }
  if (rr.reservation_id != 0) {
    absl::Status copy = memory_->ToDevice(copies);
    if (!copy.ok()) {
      (void)device_.Abort(rr.reservation_id);
      n_.copy_errors.fetch_add(1);
      Warn(absl::StrCat("gpu tier: promotion of ", copies.size(),
                        " blocks failed: ", copy.ToString()));
      for (size_t k : copied) out[items[k].id] = BlockStatus::kInvalid;
    } else {
      // The bytes came from host extents whose CRC32C host memory verified at commit: the
      // device records those CRCs; every copy down checks them again.
      auto committed = device_.Commit(rr.reservation_id, crcs, CommitCheck::kWriterChecksummed);
      std::vector<BlockId> keep;
      for (size_t c = 0; c < copied.size(); ++c) {
        const ReserveItem& item = items[copied[c]];
        const BlockStatus st = committed.ok() ? (*committed)[c] : BlockStatus::kExpired;
        out[item.id] = st;
        if (st == BlockStatus::kOk) {
          keep.push_back(item.id);
          n_.promotions.fetch_add(1);
          n_.promoted_bytes.fetch_add(item.size);
        }
      }
      if (uint64_t l = device_.Acquire(ns, keep).lease_id; l != 0) leases.push_back(l);
    }
  }
  (void)below()->Release(lease.lease_id);
}

AcquireResult GpuTieredStore::AcquireOnDevice(const NamespaceId& ns,
                                              std::span<const BlockId> ids, bool promote) {
  if (promote) (void)Promote(ns, ids);
  return device_.Acquire(ns, ids);
}

absl::Status GpuTieredStore::ReleaseOnDevice(uint64_t lease_id) {
  return device_.Release(lease_id);
}

std::vector<BlockStatus> GpuTieredStore::DropFromDevice(const NamespaceId& ns,
                                                        std::span<const BlockId> ids) {
  std::vector<BlockStatus> out(ids.size(), BlockStatus::kNotFound);
  const auto held = OnDevice(ns, ids);
  std::vector<BlockId> drop;
  std::vector<size_t> drop_idx;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!held.contains(ids[i])) continue;
    if (!below()->Holds(ids[i])) {
      out[i] = BlockStatus::kInProgress;
      continue;
    }
    drop.push_back(ids[i]);
    drop_idx.push_back(i);
  }
  EvictResult r = device_.Evict(ns, drop, false, /*force=*/false);
  for (size_t k = 0; k < drop.size(); ++k) out[drop_idx[k]] = r.status[k];
  return out;
}

// ---------------------------------------------------------------------------------------------
// Down: staging for host fetches, and demotion of victims

void GpuTieredStore::StageDown(const NamespaceId& ns, std::span<const BlockId> ids) {
  AcquireResult lease = device_.Acquire(ns, ids);
  if (lease.lease_id == 0) return;
  const auto info = OnDevice(ns, ids);
  std::vector<ReserveItem> items;
  std::vector<size_t> item_src;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto it = info.find(ids[i]);
    if (lease.status[i] != BlockStatus::kOk || it == info.end()) continue;
    items.push_back(ReserveItem{ids[i], it->second.parent, lease.sizes[i]});
    item_src.push_back(i);
  }
  ReserveResult rr = below()->Reserve(ns, items);
  std::vector<DeviceCopy> copies;
  std::vector<uint32_t> crcs;
  std::vector<size_t> copied;
  for (size_t k = 0; k < items.size(); ++k) {
    if (rr.status[k] != BlockStatus::kOk) continue;  // kExists: host memory has it again
    const size_t i = item_src[k];
    copies.push_back(
        DeviceCopy{lease.offsets[i], below()->arena_base() + rr.offsets[k], lease.sizes[i]});
    crcs.push_back(lease.crcs[i]);
    copied.push_back(k);
  }
  if (rr.reservation_id != 0) {
    if (absl::Status copy = memory_->ToHost(copies); !copy.ok()) {
      (void)below()->Abort(rr.reservation_id);
      n_.copy_errors.fetch_add(1);
      Warn(absl::StrCat("gpu tier: copying ", copies.size(),
                        " blocks down for a fetch failed: ", copy.ToString()));
    } else {
      auto committed = below()->Commit(rr.reservation_id, crcs, CommitCheck::kReread);
      std::vector<BlockId> bad;
      for (size_t c = 0; committed.ok() && c < copied.size(); ++c) {
        const ReserveItem& item = items[copied[c]];
        if ((*committed)[c] == BlockStatus::kOk) {
          n_.staged_down.fetch_add(1);
          n_.staged_down_bytes.fetch_add(item.size);
        } else if ((*committed)[c] == BlockStatus::kCrcMismatch) {
          bad.push_back(item.id);
        }
      }
      (void)device_.Release(lease.lease_id);
      lease.lease_id = 0;
      if (!bad.empty()) {
        // The device copy is damaged: it must never be served, by this route or another.
        n_.crc_failures.fetch_add(bad.size());
        device_.Evict(ns, bad, false, /*force=*/true);
        Warn(absl::StrCat("gpu tier: ", bad.size(), " device blocks failed their CRC32C when "
                          "copied down (first ", bad[0].ShortHex(), "); dropped"));
      }
    }
  }
  if (lease.lease_id != 0) (void)device_.Release(lease.lease_id);
}

void GpuTieredStore::DemotionLoop() {
  while (!stop_.load()) {
    auto items = device_.TakeDemotions(options_.demotion_batch, absl::Milliseconds(100));
    if (!items.empty()) Demote(items);
  }
}

void GpuTieredStore::Demote(std::span<const DemotionItem> items) {
  struct Move {
    const DemotionItem* item;
    uint64_t reservation;
  };
  std::vector<Move> moves;
  std::vector<DeviceCopy> copies;
  for (const DemotionItem& item : items) {
    if (below()->Holds(item.id)) {
      n_.victims_held_below.fetch_add(1);
      device_.FinishDemotion(item.handle, /*stored_below=*/true);
      continue;
    }
    ReserveItem r{item.id, item.parent, item.size};
    ReserveResult rr = below()->Reserve(item.ns, {&r, 1});
    if (rr.status[0] == BlockStatus::kExists) {
      n_.victims_held_below.fetch_add(1);
      device_.FinishDemotion(item.handle, true);
    } else if (rr.status[0] != BlockStatus::kOk) {
      n_.victims_dropped.fetch_add(1);
      device_.FinishDemotion(item.handle, false);
    } else {
      moves.push_back(Move{&item, rr.reservation_id});
      copies.push_back(DeviceCopy{item.offset, below()->arena_base() + rr.offsets[0], item.size});
    }
  }
  if (moves.empty()) return;
  const absl::Status copy = memory_->ToHost(copies);
  if (!copy.ok()) {
    n_.copy_errors.fetch_add(1);
    Warn(absl::StrCat("gpu tier: demoting ", moves.size(), " blocks failed (", copy.ToString(),
                      "); they are dropped"));
  }
  for (const Move& m : moves) {
    const DemotionItem& item = *m.item;
    bool stored = false;
    if (copy.ok()) {
      auto committed = below()->Commit(m.reservation, {&item.crc, 1}, CommitCheck::kReread);
      stored = committed.ok() && (*committed)[0] == BlockStatus::kOk;
      if (committed.ok() && (*committed)[0] == BlockStatus::kCrcMismatch) {
        n_.crc_failures.fetch_add(1);
        Warn(absl::StrCat("gpu tier: device block ", item.id.ShortHex(),
                          " failed its CRC32C when demoted; dropped"));
      }
    } else {
      (void)below()->Abort(m.reservation);
    }
    if (stored) {
      n_.demotions.fetch_add(1);
      n_.demoted_bytes.fetch_add(item.size);
    } else {
      n_.victims_dropped.fetch_add(1);
    }
    // Evicted from the device while it was being copied: the eviction meant every tier.
    if (!device_.FinishDemotion(item.handle, stored) && stored)
      below()->Evict(item.ns, {&item.id, 1}, false, /*force=*/true);
  }
}

// ---------------------------------------------------------------------------------------------
// BlockStore

ReserveResult GpuTieredStore::Reserve(const NamespaceId& ns, std::span<const ReserveItem> items) {
  std::vector<BlockId> ids;
  ids.reserve(items.size());
  for (const ReserveItem& it : items) ids.push_back(it.id);
  const auto held = OnDevice(ns, ids);
  return ReserveExceptHeld(
      items, [&](const ReserveItem& item) { return held.contains(item.id); },
      [&](std::span<const ReserveItem> rest) { return below()->Reserve(ns, rest); });
}

absl::StatusOr<BlockStatus> GpuTieredStore::RenameReserved(uint64_t reservation_id,
                                                           const NamespaceId& ns,
                                                           const ReserveItem& item) {
  return RenameUnlessHeld(
      [&] { return OnDevice(ns, std::span(&item.id, 1)).contains(item.id); },
      [&] { return below()->RenameReserved(reservation_id, ns, item); },
      [&] { return below()->Abort(reservation_id); });
}

size_t GpuTieredStore::Lookup(const NamespaceId& ns, std::span<const BlockId> ids,
                              std::vector<Tier>* tiers) {
  const auto on_device = OnDevice(ns, ids);
  std::vector<Tier> found;
  // The prefix below, continued past each block that only the device holds (rare: host memory
  // evicted it while the device kept its copy).
  size_t pos = 0;
  while (pos < ids.size()) {
    std::vector<Tier> tiers_below;
    const size_t n = below()->Lookup(ns, ids.subspan(pos), &tiers_below);
    for (size_t k = 0; k < n; ++k)
      found.push_back(on_device.contains(ids[pos + k]) ? Tier::kGpu : tiers_below[k]);
    pos += n;
    if (pos == ids.size() || !on_device.contains(ids[pos])) break;
    found.push_back(Tier::kGpu);
    ++pos;
  }
  if (tiers) *tiers = std::move(found);
  return pos;
}

AcquireResult GpuTieredStore::Acquire(const NamespaceId& ns, std::span<const BlockId> ids) {
  std::vector<BlockId> device_only;
  for (const auto& [id, info] : OnDevice(ns, ids))
    if (!below()->Holds(id)) device_only.push_back(id);
  for (size_t i = 0; i < device_only.size(); i += kPromoteBatch)
    StageDown(ns, std::span<const BlockId>(device_only)
                      .subspan(i, std::min(kPromoteBatch, device_only.size() - i)));
  return below()->Acquire(ns, ids);
}

EvictResult GpuTieredStore::Evict(const NamespaceId& ns, std::span<const BlockId> ids,
                                  bool cascade, bool force) {
  std::vector<BlockId> targets(ids.begin(), ids.end());
  EvictResult r;
  r.status.assign(ids.size(), BlockStatus::kNotFound);
  if (cascade) {
    // The closure over both tiers' parent -> child edges: a chain may be split between them
    // (rare admin call: one scan).
    absl::flat_hash_map<BlockId, std::vector<BlockId>> children;
    absl::flat_hash_set<BlockId> known, pinned;
    auto add = [&](const BlockInfo& b) {
      if (b.ns != ns || !known.insert(b.id).second) return;
      if (!b.parent.IsZero()) children[b.parent].push_back(b.id);
    };
    for (const BlockInfo& b : below()->AllBlocks()) add(b);
    uint64_t cursor = 0;
    do {
      for (const BlockInfo& b : device_.List(&ns, 4096, &cursor)) {
        add(b);
        if (b.pinned_for > absl::ZeroDuration()) pinned.insert(b.id);
      }
    } while (cursor != 0);
    for (const BlockInfo& b : below()->Inspect(std::vector<BlockId>(known.begin(), known.end())))
      if (b.pinned_for > absl::ZeroDuration()) pinned.insert(b.id);
    absl::flat_hash_set<BlockId> seen(targets.begin(), targets.end());
    for (size_t i = 0; i < targets.size(); ++i) {
      if (!force && pinned.contains(targets[i])) continue;  // a pinned block keeps its chain
      auto it = children.find(targets[i]);
      if (it == children.end()) continue;
      for (const BlockId& c : it->second)
        if ((force || !pinned.contains(c)) && seen.insert(c).second) targets.push_back(c);
    }
  }
  EvictResult low = below()->Evict(ns, targets, false, force);
  EvictResult dev = device_.Evict(ns, targets, false, force);
  for (size_t i = 0; i < targets.size(); ++i) {
    const BlockStatus st = Merge(low.status[i], dev.status[i]);
    if (st == BlockStatus::kOk) ++r.removed_blocks;
    if (i < ids.size()) r.status[i] = st;
  }
  return r;
}

std::vector<BlockStatus> GpuTieredStore::Pin(const NamespaceId& ns, std::span<const BlockId> ids,
                                             absl::Duration ttl) {
  std::vector<BlockStatus> out = below()->Pin(ns, ids, ttl);
  std::vector<BlockStatus> dev = device_.Pin(ns, ids, ttl);
  for (size_t i = 0; i < out.size(); ++i) out[i] = Merge(out[i], dev[i]);
  return out;
}

std::vector<BlockStatus> GpuTieredStore::Unpin(const NamespaceId& ns,
                                               std::span<const BlockId> ids) {
  std::vector<BlockStatus> out = below()->Unpin(ns, ids);
  std::vector<BlockStatus> dev = device_.Unpin(ns, ids);
  for (size_t i = 0; i < out.size(); ++i) out[i] = Merge(out[i], dev[i]);
  return out;
}

std::vector<BlockInfo> GpuTieredStore::AllBlocks() const {
  std::vector<BlockInfo> blocks = below()->AllBlocks();
  absl::flat_hash_set<BlockId> seen;
  for (const BlockInfo& b : blocks) seen.insert(b.id);
  uint64_t cursor = 0;
  do {
    for (BlockInfo& b : device_.List(nullptr, 65536, &cursor))
      if (seen.insert(b.id).second) blocks.push_back(std::move(b));
  } while (cursor != 0);
  return blocks;
}

std::vector<BlockId> GpuTieredStore::AllIds() const {
  std::vector<BlockId> ids = below()->AllIds();
  absl::flat_hash_set<BlockId> seen(ids.begin(), ids.end());
  uint64_t cursor = 0;
  do {
    for (const BlockInfo& b : device_.List(nullptr, 65536, &cursor))
      if (seen.insert(b.id).second) ids.push_back(b.id);
  } while (cursor != 0);
  return ids;
}

void GpuTieredStore::SetChangeHook(BlockEventHook hook) {
  if (!hook) {
    below()->SetChangeHook(nullptr);
    device_.SetChangeHook(nullptr);
    return;
  }
  // Device copies coming and going (promotions, arrivals from other nodes, evictions) are
  // events of the GPU tier; the node may hold the block below all along (listeners check Holds).
  device_.SetChangeHook([hook](const BlockEvent& e) {
    BlockEvent on_device = e;
    on_device.tier = Tier::kGpu;
    hook(on_device);
  });
  below()->SetChangeHook(std::move(hook));
}

BlockStoreStats GpuTieredStore::Stats() const {
  BlockStoreStats s = below()->Stats();
  s.gpu = Counters();
  return s;
}

GpuTierCounters GpuTieredStore::Counters() const {
  GpuTierCounters c;
  c.memory = std::string(memory_->kind());
  c.device = device_.Stats();
  c.promotions = n_.promotions.load();
  c.promoted_bytes = n_.promoted_bytes.load();
  c.demotions = n_.demotions.load();
  c.demoted_bytes = n_.demoted_bytes.load();
  c.victims_held_below = n_.victims_held_below.load();
  c.victims_dropped = n_.victims_dropped.load();
  c.staged_down = n_.staged_down.load();
  c.staged_down_bytes = n_.staged_down_bytes.load();
  c.copy_errors = n_.copy_errors.load();
  c.crc_failures = n_.crc_failures.load();
  c.peer_copies = n_.peer_copies.load();
  c.peer_copied_bytes = n_.peer_copied_bytes.load();
  c.peer_reads = n_.peer_reads.load();
  c.peer_read_bytes = n_.peer_read_bytes.load();
  c.peer_device_encodes = n_.peer_device_encodes.load();
  c.peer_fetches_device_only = n_.peer_fetches_device_only.load();
  return c;
}

}  // namespace strata
