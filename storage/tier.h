// The storage tiers a block can live in on one node.
#pragma once

#include <cstdint>
#include <string_view>

namespace strata {

enum class Tier : uint8_t { kNone = 0, kHost = 1, kNvme = 2, kGpu = 3 };

constexpr std::string_view TierName(Tier tier) {
  switch (tier) {
    case Tier::kHost: return "host";
    case Tier::kNvme: return "nvme";
    case Tier::kGpu: return "gpu";
    case Tier::kNone: break;
  }
  return "none";
}

}  // namespace strata
