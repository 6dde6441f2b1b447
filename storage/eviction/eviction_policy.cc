#include "storage/eviction/eviction_policy.h"

#include "absl/strings/str_cat.h"
#include "common/strings.h"
#include "storage/eviction/lru_policy.h"
#include "storage/eviction/prefix_aware_policy.h"
#include "storage/eviction/s3fifo_policy.h"

namespace strata {

std::vector<std::string_view> OnlineEvictionPolicyNames() {
  return {"lru", "s3fifo", "prefix-lru", "prefix-freq", "prefix-adaptive"};
}

absl::StatusOr<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name) {
  if (name == "lru") return std::make_unique<LruPolicy>();
  if (name == "s3fifo") return std::make_unique<S3FifoPolicy>();
  if (name == "prefix-lru") return std::make_unique<PrefixAwarePolicy>();
  if (name == "prefix-freq") {
    return std::make_unique<PrefixAwarePolicy>(
        PrefixAwareOptions{.frequency_bonus = 0.5, .max_counted_accesses = 2}, "prefix-freq");
  }
  if (name == "prefix-adaptive") {
    return std::make_unique<PrefixAwarePolicy>(
        PrefixAwareOptions{.frequency_bonus = 0.5, .max_counted_accesses = 2, .adaptive = true},
        "prefix-adaptive");
  }
  if (name == "belady") {
    return absl::InvalidArgumentError(
        "belady needs the future access sequence; only a trace replay can build it");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown eviction policy '", AsAbsl(name),
                   "' (want lru, s3fifo, prefix-lru, prefix-freq or prefix-adaptive)"));
}

}  // namespace strata
