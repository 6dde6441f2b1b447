// The fill levels every tier evicts between unless configured otherwise: once used bytes pass
// high x capacity, blocks leave (demoted or dropped) until low x capacity remains. The gap keeps
// eviction in batches instead of one block per publish.
#pragma once

namespace strata {

inline constexpr double kDefaultHighWatermark = 0.95;
inline constexpr double kDefaultLowWatermark = 0.85;

}  // namespace strata
