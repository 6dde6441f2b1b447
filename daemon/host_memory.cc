#include "daemon/host_memory.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/units.h"

namespace strata::daemon {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

// First line of `path` as a byte count; 0 when absent, unreadable or "max".
uint64_t ReadLimitFile(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return 0;
  uint64_t v = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &v)) return 0;
  // cgroup v1 reports "no limit" as a page-rounded LLONG_MAX.
  return v >= (1ull << 60) ? 0 : v;
}

}  // namespace

HostMemory ReadHostMemory() {
  HostMemory m;
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    unsigned long long kb = 0;
    if (std::sscanf(line.c_str(), "MemTotal: %llu kB", &kb) == 1) m.mem_total = kb << 10;
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kb) == 1) m.mem_available = kb << 10;
  }
  m.cgroup_limit = ReadLimitFile("/sys/fs/cgroup/memory.max");
  if (m.cgroup_limit == 0)
    m.cgroup_limit = ReadLimitFile("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  return m;
}

namespace {

// The memory the OOM killer measures against, and what to call it in a message.
std::pair<uint64_t, std::string> MemoryLimit(const HostMemory& m) {
  if (m.cgroup_limit != 0 && (m.mem_total == 0 || m.cgroup_limit < m.mem_total))
    return {m.cgroup_limit, "the cgroup memory limit"};
  return {m.mem_total, "MemTotal"};
}

}  // namespace

uint64_t MaxHostCapacity(const HostMemory& m) {
  const uint64_t limit = MemoryLimit(m).first;
  if (limit == 0) return UINT64_MAX;  // nothing readable to check against
  const uint64_t margin = std::clamp(limit / 10, 512 * kMiB, 16 * kGiB);
  return limit > margin ? limit - margin : 0;
}

absl::Status CheckHostCapacity(const HostTierConfig& host, const HostMemory& m,
                               std::vector<std::string>* warnings) {
  const auto [limit, what] = MemoryLimit(m);
  const uint64_t max = MaxHostCapacity(m);
  if (host.capacity > max)
    return absl::FailedPreconditionError(absl::StrCat(
        "config field 'host_tier.capacity' (or --host-capacity): ", FormatSize(host.capacity),
        " is more than this host can hold: ", what, " is ", FormatSize(limit),
        ", and the host tier may use at most ", FormatSize(max),
        " (the limit minus 10%, at least 512MiB and at most 16GiB, for the kernel, stratad "
        "and the engines beside it)"));
  if (m.mem_available != 0 && host.capacity > m.mem_available)
    warnings->push_back(
        absl::StrCat("host_tier.capacity ", FormatSize(host.capacity),
                     " is more than the memory available now (", FormatSize(m.mem_available),
                     " MemAvailable); faulting the arena in will push other processes' pages out"));
  return absl::OkStatus();
}

}  // namespace strata::daemon
