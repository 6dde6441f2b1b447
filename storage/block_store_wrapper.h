// A BlockStore that hands every call to another one (as LevelDB's EnvWrapper does for Env): a
// layer over a store overrides only what it changes. Also the helper such layers share to
// answer the ids they hold themselves when a publish reserves below.
#pragma once

#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "storage/block_store.h"

namespace strata {

class BlockStoreWrapper : public BlockStore {
 public:
  // `target` must outlive the wrapper.
  explicit BlockStoreWrapper(BlockStore* target) : target_(target) {}
  BlockStore* target() const { return target_; }

  ReserveResult Reserve(const NamespaceId& ns, std::span<const ReserveItem> items) override {
    return target_->Reserve(ns, items);
  }
  absl::StatusOr<std::vector<BlockStatus>> Commit(
      uint64_t reservation_id, std::span<const uint32_t> crcs,
      CommitCheck check = CommitCheck::kReread) override {
    return target_->Commit(reservation_id, crcs, check);
  }
  absl::Status Abort(uint64_t reservation_id) override { return target_->Abort(reservation_id); }
  absl::StatusOr<BlockStatus> RenameReserved(uint64_t reservation_id, const NamespaceId& ns,
                                             const ReserveItem& item) override {
    return target_->RenameReserved(reservation_id, ns, item);
  }
  size_t Lookup(const NamespaceId& ns, std::span<const BlockId> ids,
                std::vector<Tier>* tiers) override {
    return target_->Lookup(ns, ids, tiers);
  }
  AcquireResult Acquire(const NamespaceId& ns, std::span<const BlockId> ids) override {
    return target_->Acquire(ns, ids);
  }
  absl::Status Release(uint64_t lease_id) override { return target_->Release(lease_id); }
  bool BeginLeaseRead(uint64_t lease_id, std::span<const ArenaExtent> extents,
                      uint32_t holds) override {
    return target_->BeginLeaseRead(lease_id, extents, holds);
  }
  void EndLeaseRead(uint64_t lease_id) override { target_->EndLeaseRead(lease_id); }
  absl::Status BeginReservedWrite(uint64_t reservation_id, ArenaExtent extent) override {
    return target_->BeginReservedWrite(reservation_id, extent);
  }
  void EndReservedWrite(uint64_t reservation_id) override {
    target_->EndReservedWrite(reservation_id);
  }
  std::vector<ArenaExtent> ReservedExtents(uint64_t reservation_id) const override {
    return target_->ReservedExtents(reservation_id);
  }
  EvictResult Evict(const NamespaceId& ns, std::span<const BlockId> ids, bool cascade,
                    bool force) override {
    return target_->Evict(ns, ids, cascade, force);
  }
  std::vector<BlockStatus> Pin(const NamespaceId& ns, std::span<const BlockId> ids,
                               absl::Duration ttl) override {
    return target_->Pin(ns, ids, ttl);
  }
  std::vector<BlockStatus> Unpin(const NamespaceId& ns, std::span<const BlockId> ids) override {
    return target_->Unpin(ns, ids);
  }
  std::vector<BlockInfo> List(const NamespaceId* ns, size_t limit,
                              uint64_t* cursor) const override {
    return target_->List(ns, limit, cursor);
  }
  std::vector<BlockInfo> Inspect(std::span<const BlockId> ids) const override {
    return target_->Inspect(ids);
  }
  absl::flat_hash_map<NamespaceId, std::pair<uint64_t, uint64_t>> UsageByNamespace()
      const override {
    return target_->UsageByNamespace();
  }
  std::vector<BlockInfo> AllBlocks() const override { return target_->AllBlocks(); }
  std::vector<BlockId> AllIds() const override { return target_->AllIds(); }
  bool Holds(const BlockId& id) const override { return target_->Holds(id); }
  BlockStoreStats Stats() const override { return target_->Stats(); }
  void ReclaimExpired() override { target_->ReclaimExpired(); }
  void SetChangeHook(BlockEventHook hook) override { target_->SetChangeHook(std::move(hook)); }
  uint8_t* arena_base() const override { return target_->arena_base(); }
  uint64_t arena_bytes() const override { return target_->arena_bytes(); }
  absl::Duration reservation_timeout() const override { return target_->reservation_timeout(); }
  absl::Duration lease_timeout() const override { return target_->lease_timeout(); }

 private:
  BlockStore* const target_;
};

// A publish's reservation when a tier above holds some of its ids: those answer kExists,
// `reserve` is asked for the rest, and the answers are merged back in item order.
ReserveResult ReserveExceptHeld(std::span<const ReserveItem> items,
                                const std::function<bool(const ReserveItem&)>& held,
                                const std::function<ReserveResult(std::span<const ReserveItem>)>&
                                    reserve);

// A spare's renaming when a tier above may hold the block: held, the spare goes back (`abort`)
// and the answer is kExists; otherwise `rename` answers.
absl::StatusOr<BlockStatus> RenameUnlessHeld(
    const std::function<bool()>& held,
    const std::function<absl::StatusOr<BlockStatus>()>& rename,
    const std::function<absl::Status()>& abort);

}  // namespace strata
