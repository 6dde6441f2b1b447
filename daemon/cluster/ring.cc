#include "daemon/cluster/ring.h"

namespace strata::daemon {

std::shared_ptr<const Ring> Ring::Make(const placement::MembershipView& view,
                                       std::string_view self_id) {
  auto ring = std::make_shared<Ring>(Ring{view, placement::Rendezvous(view.Ids()), -1});
  ring->self = ring->rendezvous.IndexOf(self_id);
  return ring;
}

std::shared_ptr<const Ring> CurrentRing::Get() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ring_;
}

bool CurrentRing::Replace(std::shared_ptr<const Ring> next, std::shared_ptr<const Ring>* prev) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ring_ && ring_->view.epoch == next->view.epoch && ring_->view.nodes == next->view.nodes)
    return false;
  if (ring_ && next->view.epoch < ring_->view.epoch) return false;
  *prev = std::move(ring_);
  ring_ = std::move(next);
  return true;
}

}  // namespace strata::daemon
