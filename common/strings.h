// Debian's Abseil (20220623) has its own absl::string_view, distinct from std::string_view.
// Our headers speak std::string_view; this bridges into absl::StrCat and friends.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace strata {

inline absl::string_view AsAbsl(std::string_view s) { return {s.data(), s.size()}; }

}  // namespace strata
