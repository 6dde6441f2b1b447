// MembershipView helpers and the static membership.
#include "placement/membership.h"

#include <algorithm>

#include "absl/synchronization/mutex.h"
#include "placement/internal/view_holder.h"

namespace strata::placement {

const NodeRecord* MembershipView::Find(std::string_view id) const {
  auto it = std::lower_bound(nodes.begin(), nodes.end(), id,
                             [](const NodeRecord& n, std::string_view v) { return n.id < v; });
  if (it == nodes.end() || it->id != id) return nullptr;
  return &*it;
}

std::vector<std::string> MembershipView::Ids() const {
  std::vector<std::string> out;
  out.reserve(nodes.size());
  for (const auto& n : nodes) out.push_back(n.id);
  return out;
}

namespace {

// A fixed list. Start adds self (its record replaces a configured entry with the same id).
class StaticMembership final : public internal::ViewHolder {
 public:
  explicit StaticMembership(std::vector<NodeRecord> nodes) : configured_(std::move(nodes)) {}

  absl::Status Start(const NodeRecord& self) override {
    if (self.id.empty()) return absl::InvalidArgumentError("membership: self id is empty");
    Listener listener;
    MembershipView view;
    {
      absl::MutexLock lock(&mu_);
      if (started_) return absl::FailedPreconditionError("membership: already started");
      std::vector<NodeRecord> nodes;
      for (const auto& n : configured_) {
        if (n.id.empty()) return absl::InvalidArgumentError("membership: a static node has no id");
        if (n.id != self.id) nodes.push_back(n);
      }
      nodes.push_back(self);
      std::sort(nodes.begin(), nodes.end(),
                [](const NodeRecord& a, const NodeRecord& b) { return a.id < b.id; });
      for (size_t i = 1; i < nodes.size(); ++i) {
        if (nodes[i].id == nodes[i - 1].id) {
          return absl::InvalidArgumentError("membership: static node '" + nodes[i].id +
                                            "' is listed twice");
        }
      }
      view_.nodes = std::move(nodes);
      view_.epoch = 1;
      started_ = true;
      listener = listener_;
      view = view_;
    }
    // The only change a static view ever has; no lock of ours is held.
    if (listener) listener(view);
    return absl::OkStatus();
  }

  bool healthy(std::string* detail) const override {
    if (detail) detail->clear();
    return true;
  }
  absl::Status Leave() override { return absl::OkStatus(); }
  std::string kind() const override { return "static"; }

 private:
  const std::vector<NodeRecord> configured_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

std::unique_ptr<Membership> NewStaticMembership(std::vector<NodeRecord> nodes) {
  return std::make_unique<StaticMembership>(std::move(nodes));
}

}  // namespace strata::placement
