// One membership view, ready for ranking (rendezvous hashing), and the current one.
//
// Every part of the cluster layer reads the ring it needs at the start of a call and keeps that
// snapshot to the end, so a view change never shows a call two different memberships.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>

#include "placement/membership.h"
#include "placement/rendezvous.h"

namespace strata::daemon {

struct Ring {
  placement::MembershipView view;
  placement::Rendezvous rendezvous;
  int self = -1;  // this node's rendezvous index; -1 while the view lacks it

  static std::shared_ptr<const Ring> Make(const placement::MembershipView& view,
                                          std::string_view self_id);
  // The node a rendezvous index names (the view holds every node the ring ranks).
  const placement::NodeRecord& NodeAt(uint32_t index) const {
    return *view.Find(rendezvous.node(index));
  }
};

class CurrentRing {
 public:
  // Null until the first view arrives.
  std::shared_ptr<const Ring> Get() const;
  // Installs `next`, unless it shows the same nodes at the same epoch or comes from an older
  // epoch (the membership's thread may deliver an older view after a newer one was read
  // directly). Returns whether it did; `*prev` is the ring it replaced (null the first time).
  bool Replace(std::shared_ptr<const Ring> next, std::shared_ptr<const Ring>* prev);

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const Ring> ring_;
};

}  // namespace strata::daemon
