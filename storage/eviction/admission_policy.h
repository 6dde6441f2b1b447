// Admission to a lower tier: decides whether a block evicted from the tier above is written
// down (demoted) or dropped. Writing every one-hit block to NVMe costs device bandwidth and
// endurance for blocks that are never read again.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/eviction/ghost_list.h"
#include "strata/block_id.h"

namespace strata {

class AdmissionPolicy {
 public:
  virtual ~AdmissionPolicy() = default;
  virtual std::string_view name() const = 0;
  // `accesses`: times the block was requested while resident above, counting the request that
  // brought it in (1 = never hit).
  virtual bool Admit(const BlockId& id, uint32_t accesses) = 0;
};

// Admits every block.
class AlwaysAdmit final : public AdmissionPolicy {
 public:
  std::string_view name() const override { return "always"; }
  bool Admit(const BlockId&, uint32_t) override { return true; }
};

// Admits a block on its second access: one that was hit while resident above, or one that was
// rejected before and has come back since (its id is in a ghost list of recent rejections).
class SecondAccessAdmission final : public AdmissionPolicy {
 public:
  explicit SecondAccessAdmission(size_t ghost_capacity) : ghost_capacity_(ghost_capacity) {}
  std::string_view name() const override { return "second-access"; }
  bool Admit(const BlockId& id, uint32_t accesses) override;

 private:
  const size_t ghost_capacity_;
  GhostList rejected_;
};

// Names: "always", "second-access".
std::vector<std::string_view> AdmissionPolicyNames();
absl::StatusOr<std::unique_ptr<AdmissionPolicy>> MakeAdmissionPolicy(std::string_view name,
                                                                     size_t ghost_capacity);

}  // namespace strata
