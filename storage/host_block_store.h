// The host tier alone as a BlockStore: a node without lower tiers.
#pragma once

#include "storage/block_store.h"
#include "storage/host_tier.h"

namespace strata {

class HostBlockStore final : public BlockStore {
 public:
  // `host` must outlive the store.
  explicit HostBlockStore(HostTier* host) : host_(host) {}

  ReserveResult Reserve(const NamespaceId& ns, std::span<const ReserveItem> items) override {
    return host_->Reserve(ns, items);
  }
  absl::StatusOr<std::vector<BlockStatus>> Commit(
      uint64_t reservation_id, std::span<const uint32_t> crcs,
      CommitCheck check = CommitCheck::kReread) override {
    return host_->Commit(reservation_id, crcs, check);
  }
  absl::Status Abort(uint64_t reservation_id) override { return host_->Abort(reservation_id); }
  absl::StatusOr<BlockStatus> RenameReserved(uint64_t reservation_id, const NamespaceId& ns,
                                             const ReserveItem& item) override {
    return host_->RenameReserved(reservation_id, ns, item);
  }

  size_t Lookup(const NamespaceId& ns, std::span<const BlockId> ids,
                std::vector<Tier>* tiers) override;
  AcquireResult Acquire(const NamespaceId& ns, std::span<const BlockId> ids) override {
    return host_->Acquire(ns, ids);
  }
  absl::Status Release(uint64_t lease_id) override { return host_->Release(lease_id); }
  bool BeginLeaseRead(uint64_t lease_id, std::span<const ArenaExtent> extents,
                      uint32_t holds) override {
    return host_->BeginLeaseRead(lease_id, extents, holds);
  }
  void EndLeaseRead(uint64_t lease_id) override { host_->EndLeaseRead(lease_id); }
  absl::Status BeginReservedWrite(uint64_t reservation_id, ArenaExtent extent) override {
    return host_->BeginReservedWrite(reservation_id, extent);
  }
  void EndReservedWrite(uint64_t reservation_id) override {
    host_->EndReservedWrite(reservation_id);
  }
  std::vector<ArenaExtent> ReservedExtents(uint64_t reservation_id) const override {
    return host_->ReservedExtents(reservation_id);
  }

  EvictResult Evict(const NamespaceId& ns, std::span<const BlockId> ids, bool cascade,
                    bool force) override {
    return host_->Evict(ns, ids, cascade, force);
  }
  std::vector<BlockStatus> Pin(const NamespaceId& ns, std::span<const BlockId> ids,
                               absl::Duration ttl) override {
    return host_->Pin(ns, ids, ttl);
  }
  std::vector<BlockStatus> Unpin(const NamespaceId& ns, std::span<const BlockId> ids) override {
    return host_->Unpin(ns, ids);
  }

  std::vector<BlockInfo> List(const NamespaceId* ns, size_t limit,
                              uint64_t* cursor) const override {
    return host_->List(ns, limit, cursor);
  }
  std::vector<BlockInfo> Inspect(std::span<const BlockId> ids) const override {
    return host_->Inspect(ids);
  }
  absl::flat_hash_map<NamespaceId, std::pair<uint64_t, uint64_t>> UsageByNamespace()
      const override {
    return host_->UsageByNamespace();
  }

  std::vector<BlockInfo> AllBlocks() const override;
  std::vector<BlockId> AllIds() const override;
  bool Holds(const BlockId& id) const override { return !host_->Inspect({&id, 1}).empty(); }

  BlockStoreStats Stats() const override {
    BlockStoreStats s;
    s.host = host_->Stats();
    return s;
  }
  void ReclaimExpired() override { host_->ReclaimExpired(); }
  void SetChangeHook(BlockEventHook hook) override { host_->SetChangeHook(std::move(hook)); }

  uint8_t* arena_base() const override { return host_->base(); }
  uint64_t arena_bytes() const override { return host_->capacity(); }
  absl::Duration reservation_timeout() const override {
    return host_->options().reservation_timeout;
  }
  absl::Duration lease_timeout() const override { return host_->options().lease_timeout; }

 private:
  HostTier* const host_;
};

}  // namespace strata
