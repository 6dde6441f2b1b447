// The GPU tier's exchanges with other processes: CopyToPeer (fetches into buffers that same-node
// engines lent the daemon) and blocks that other nodes' daemons send over device links.
#include <utility>

#include "absl/strings/str_cat.h"
#include "storage/gpu/gpu_tiered_store.h"

namespace strata {

absl::StatusOr<PeerFetchResult> GpuTieredStore::CopyToPeer(const NamespaceId& ns,
                                                           std::span<const BlockId> ids,
                                                           std::span<const uint64_t> peer_offsets,
                                                           PeerBuffer& peer, bool promote,
                                                           uint64_t device_only_max_bytes) {
  if (peer_offsets.size() != ids.size())
    return absl::InvalidArgumentError(absl::StrCat(ids.size(), " ids but ", peer_offsets.size(),
                                                   " offsets"));
  PeerFetchResult out;
  out.status.assign(ids.size(), BlockStatus::kNotFound);
  out.sizes.assign(ids.size(), 0);
  out.crcs.assign(ids.size(), 0);
  out.sources.assign(ids.size(), Tier::kNone);

  // The device first: its leases keep the extents where they are until the copies are done.
  const bool device_only = device_only_max_bytes > 0;
  AcquireResult on_device =
      promote && !device_only ? AcquireOnDevice(ns, ids) : device_.Acquire(ns, ids);
  if (device_only) {
    uint64_t total = 0;
    bool all = true;
    for (size_t i = 0; i < ids.size() && all; ++i) {
      all = on_device.status[i] == BlockStatus::kOk;
      total += all ? on_device.sizes[i] : 0;
    }
    if (!all || total > device_only_max_bytes) {
      if (on_device.lease_id != 0) (void)device_.Release(on_device.lease_id);
      out.declined = true;
      return out;
    }
  }
  std::vector<BlockId> rest;
  std::vector<size_t> rest_idx;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (on_device.status[i] == BlockStatus::kOk) continue;
    rest.push_back(ids[i]);
    rest_idx.push_back(i);
  }
  // Then host memory (which also reads back what NVMe alone holds) for the others.
  AcquireResult in_host;
  if (!rest.empty()) in_host = Acquire(ns, rest);

  std::vector<PeerCopy> copies;
  copies.reserve(ids.size());
  auto add = [&](size_t i, BlockStatus got, uint64_t offset, uint64_t size, uint32_t crc,
                 Tier from) {
    out.status[i] = got;
    if (got != BlockStatus::kOk) return;
    if (peer_offsets[i] > peer.size() || size > peer.size() - peer_offsets[i]) {
      out.status[i] = BlockStatus::kInvalid;
      return;
    }
    PeerCopy c;
    c.peer_offset = peer_offsets[i];
    c.size = size;
    if (from == Tier::kGpu)
      c.device_offset = offset;
    else
      c.host = below()->arena_base() + offset;
    copies.push_back(c);
    out.sizes[i] = size;
    out.crcs[i] = crc;
    out.sources[i] = from;
    out.bytes += size;
  };
  for (size_t i = 0; i < ids.size(); ++i)
    if (on_device.status[i] == BlockStatus::kOk)
      add(i, BlockStatus::kOk, on_device.offsets[i], on_device.sizes[i], on_device.crcs[i],
          Tier::kGpu);
  for (size_t k = 0; k < rest.size(); ++k)
    add(rest_idx[k], in_host.status[k], in_host.offsets[k], in_host.sizes[k], in_host.crcs[k],
        Tier::kHost);

  absl::Status copied = copies.empty()  ? absl::OkStatus()
                        : device_only ? memory_->TryToPeer(peer, copies)
                                      : memory_->ToPeer(peer, copies);
  if (on_device.lease_id != 0) (void)device_.Release(on_device.lease_id);
  if (in_host.lease_id != 0) (void)below()->Release(in_host.lease_id);
  if (device_only && absl::IsUnavailable(copied)) {
    // Busy with other copies: declined rather than waited for (nothing was copied).
    PeerFetchResult declined;
    declined.declined = true;
    return declined;
  }
  if (!copied.ok()) {
    n_.copy_errors.fetch_add(1);
    Warn(absl::StrCat("copying ", copies.size(), " blocks into a lent buffer failed: ",
                      copied.message()));
    return absl::Status(copied.code(),
                        absl::StrCat("copying into the lent buffer failed: ", copied.message()));
  }
  if (device_only) n_.peer_fetches_device_only.fetch_add(1);
  n_.peer_copies.fetch_add(copies.size());
  n_.peer_copied_bytes.fetch_add(out.bytes);
  return out;
}

ReserveResult GpuTieredStore::ReserveOnDevice(const NamespaceId& ns,
                                              std::span<const ReserveItem> items) {
  std::vector<ReserveItem> fresh;
  std::vector<size_t> fresh_idx;
  ReserveResult out;
  out.status.assign(items.size(), BlockStatus::kExists);
  out.offsets.assign(items.size(), 0);
  for (size_t i = 0; i < items.size(); ++i) {
    if (below()->Holds(items[i].id)) continue;
    fresh.push_back(items[i]);
    fresh_idx.push_back(i);
  }
  if (fresh.empty()) return out;
  ReserveResult rr = device_.Reserve(ns, fresh);
  if (rr.reservation_id != 0 && !device_.HoldReservation(rr.reservation_id).ok()) {
    (void)device_.Abort(rr.reservation_id);
    rr.reservation_id = 0;
    rr.status.assign(fresh.size(), BlockStatus::kExpired);
  }
  out.reservation_id = rr.reservation_id;
  out.expires_in = rr.expires_in;
  for (size_t k = 0; k < fresh.size(); ++k) {
    out.status[fresh_idx[k]] = rr.status[k];
    if (rr.status[k] == BlockStatus::kOk) out.offsets[fresh_idx[k]] = rr.offsets[k];
  }
  return out;
}

absl::StatusOr<std::vector<BlockStatus>> GpuTieredStore::CommitOnDevice(
    uint64_t reservation_id, std::span<const BlockId> ids, std::span<const uint32_t> crcs) {
  if (ids.size() != crcs.size())
    return absl::InvalidArgumentError(absl::StrCat(ids.size(), " ids but ", crcs.size(), " CRCs"));
  // The device's change hook tells listeners (the directory, KV events) of each block.
  return device_.Commit(reservation_id, crcs, CommitCheck::kWriterChecksummed);
}

}  // namespace strata
