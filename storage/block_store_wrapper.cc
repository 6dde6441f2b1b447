#include "storage/block_store_wrapper.h"

namespace strata {

ReserveResult ReserveExceptHeld(std::span<const ReserveItem> items,
                                const std::function<bool(const ReserveItem&)>& held,
                                const std::function<ReserveResult(std::span<const ReserveItem>)>&
                                    reserve) {
  std::vector<ReserveItem> rest;
  std::vector<size_t> rest_idx;
  for (size_t i = 0; i < items.size(); ++i) {
    if (held(items[i])) continue;
    rest.push_back(items[i]);
    rest_idx.push_back(i);
  }
  if (rest.size() == items.size()) return reserve(items);
  ReserveResult part = reserve(rest);
  ReserveResult r;
  r.reservation_id = part.reservation_id;
  r.expires_in = part.expires_in;
  r.status.assign(items.size(), BlockStatus::kExists);
  r.offsets.assign(items.size(), 0);
  for (size_t k = 0; k < rest_idx.size(); ++k) {
    r.status[rest_idx[k]] = part.status[k];
    r.offsets[rest_idx[k]] = part.offsets[k];
  }
  return r;
}

absl::StatusOr<BlockStatus> RenameUnlessHeld(
    const std::function<bool()>& held,
    const std::function<absl::StatusOr<BlockStatus>()>& rename,
    const std::function<absl::Status()>& abort) {
  if (!held()) return rename();
  if (absl::Status s = abort(); !s.ok()) return s;
  return BlockStatus::kExists;
}

}  // namespace strata
