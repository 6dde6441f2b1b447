#include "storage/eviction/admission_policy.h"

#include "absl/strings/str_cat.h"
#include "common/strings.h"

namespace strata {

bool SecondAccessAdmission::Admit(const BlockId& id, uint32_t accesses) {
  if (rejected_.Erase(id)) return true;
  if (accesses >= 2) return true;
  rejected_.Add(id, ghost_capacity_);
  return false;
}

std::vector<std::string_view> AdmissionPolicyNames() { return {"always", "second-access"}; }

absl::StatusOr<std::unique_ptr<AdmissionPolicy>> MakeAdmissionPolicy(std::string_view name,
                                                                     size_t ghost_capacity) {
  if (name == "always") return std::make_unique<AlwaysAdmit>();
  if (name == "second-access") {
    if (ghost_capacity == 0) {
      return absl::InvalidArgumentError("second-access admission needs a ghost capacity > 0");
    }
    return std::make_unique<SecondAccessAdmission>(ghost_capacity);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown admission policy '", AsAbsl(name), "' (want always or second-access)"));
}

}  // namespace strata
