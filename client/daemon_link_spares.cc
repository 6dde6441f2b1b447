// Publishes into spare reservations (CommitSpares): a one-blob publish through the mapped arena
// asks, with its Commit, for a spare extent the size of its blob; the next one-blob publish in
// the namespace that fits it is copied there and committed with its name, so it costs one
// round trip instead of two (Reserve, Commit). A link holds one spare at a time; the daemon
// counts it as reserved bytes of the namespace's tenant until it is used, given back or expires.
// Spares go back by one-way message only: where that fails they expire, and no publish or
// destructor waits on a daemon for them.
#include <algorithm>
#include <utility>

#include "client/daemon_link.h"

namespace strata::client {

DaemonLink::~DaemonLink() {
  std::optional<Spare> held;
  {
    std::lock_guard<std::mutex> lock(spare_mu_);
    held.swap(spare_);
  }
  if (held && control_ && mover_) control_->Abort(held->id, /*may_wait=*/false);
}

bool DaemonLink::UsesSpares(size_t n) const {
  return n == 1 && spares_on_ && control_->spare_reservations() &&
         mover_->route(DataMover::Direction::kPut) == Route::kMapped;
}

std::optional<DaemonLink::Spare> DaemonLink::TakeSpare(const NamespaceId& ns, uint64_t bytes) {
  std::optional<Spare> taken;
  {
    std::lock_guard<std::mutex> lock(spare_mu_);
    if (!spare_ || spare_->ns != ns || bytes > spare_->bytes || bytes == 0) return std::nullopt;
    taken.swap(spare_);
  }
  // Too close to its expiry to copy into and commit: the daemon may reclaim it meanwhile.
  if (taken->expires - absl::Now() < taken->lifetime / 4) {
    control_->Abort(taken->id, /*may_wait=*/false);
    return std::nullopt;
  }
  return taken;
}

void DaemonLink::KeepSpare(const NamespaceId& ns, uint64_t bytes, const Reservation& granted) {
  if (granted.id == 0 || granted.offsets.empty()) return;
  std::optional<Spare> before;  // another thread's publish may have left one meanwhile
  {
    std::lock_guard<std::mutex> lock(spare_mu_);
    before.swap(spare_);
    spare_ = Spare{granted.id,     ns, granted.offsets[0], bytes, absl::Now() + granted.expires_in,
                   granted.expires_in, granted.instance_id};
  }
  if (before) control_->Abort(before->id, /*may_wait=*/false);
}

std::optional<absl::StatusOr<PublishResult>> DaemonLink::PublishIntoSpare(
    const Spare& spare, const NamespaceId& ns, const BlockId& id, const BlockId& parent,
    const ConstBuffer& blob) {
  BlockMove move{const_cast<void*>(blob.data), blob.size, spare.offset};
  auto put = mover_->Put(spare.id, std::span(&move, 1), spare.expires - absl::Now(),
                         spare.instance_id);
  if (!put.ok()) {
    control_->Abort(spare.id, /*may_wait=*/false);
    return std::nullopt;
  }
  CommitSpares named;
  named.ns = &ns;
  named.named = &id;
  named.named_parent = parent;
  named.named_size = blob.size;
  named.want_bytes = std::max(blob.size, spare.bytes);
  auto committed = control_->Commit(spare.id, put->crc32c,
                                    /*taken_while_writing=*/put->route == Route::kMapped,
                                    nullptr, &named);
  // Refused (the spare expired, or its daemon restarted and knows neither it nor the
  // namespace yet), or no answer: the usual route publishes the blob again. Nothing was stored
  // when the Commit was refused; if it was stored after all, the Reserve answers kExists.
  if (!committed.ok()) {
    control_->Abort(spare.id, /*may_wait=*/false);  // where it was refused with the spare kept
    return std::nullopt;
  }
  KeepSpare(ns, named.want_bytes, named.granted);
  PublishResult result;
  result.ids = {id};
  result.status = *std::move(committed);
  return Tally(std::move(result), std::span(&blob, 1));
}

}  // namespace strata::client
