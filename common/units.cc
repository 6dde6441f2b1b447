#include "common/units.h"

#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace strata {

absl::StatusOr<uint64_t> ParseSize(std::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size()));
  size_t split = 0;
  while (split < t.size() && (absl::ascii_isdigit(t[split]) || t[split] == '.')) ++split;
  double value = 0;
  if (split == 0 || !absl::SimpleAtod(t.substr(0, split), &value))
    return absl::InvalidArgumentError(absl::StrCat("'", t, "' is not a size (e.g. 512MiB)"));
  std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(t.substr(split)));
  double mult = 0;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kb")
    mult = 1e3;
  else if (unit == "m" || unit == "mb")
    mult = 1e6;
  else if (unit == "g" || unit == "gb")
    mult = 1e9;
  else if (unit == "t" || unit == "tb")
    mult = 1e12;
  else if (unit == "kib")
    mult = 1024.0;
  else if (unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "tib")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    return absl::InvalidArgumentError(
        absl::StrCat("'", t, "' has an unknown size unit (use B, KiB, MiB, GiB, TiB)"));
  double bytes = value * mult;
  if (bytes > 1.8e19) return absl::InvalidArgumentError(absl::StrCat("'", t, "' is too large"));
  return static_cast<uint64_t>(std::llround(bytes));
}

std::string FormatSize(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  if (u == 0) return absl::StrCat(bytes, "B");
  return absl::StrFormat("%.1f%s", v, units[u]);
}

absl::StatusOr<absl::Duration> ParseDurationText(std::string_view text) {
  absl::Duration d;
  absl::string_view t = absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size()));
  if (!absl::ParseDuration(t, &d) || d < absl::ZeroDuration())
    return absl::InvalidArgumentError(
        absl::StrCat("'", t, "' is not a duration (e.g. 30s, 250ms, 5m)"));
  return d;
}

}  // namespace strata
