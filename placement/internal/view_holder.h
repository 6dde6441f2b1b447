// What every Membership keeps: the current view and the listener, behind the mutex that also
// guards the implementation's own state.
#pragma once

#include <utility>

#include "absl/synchronization/mutex.h"
#include "placement/membership.h"

namespace strata::placement::internal {

class ViewHolder : public Membership {
 public:
  MembershipView View() const override {
    absl::MutexLock lock(&mu_);
    return view_;
  }
  void SetListener(Listener listener) override {
    absl::MutexLock lock(&mu_);
    listener_ = std::move(listener);
  }

 protected:
  mutable absl::Mutex mu_;
  MembershipView view_ ABSL_GUARDED_BY(mu_);
  Listener listener_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::placement::internal
