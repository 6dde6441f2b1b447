// What this host can hold, read at start so that a host tier larger than the machine is refused
// with a message instead of being found out by the OOM killer (issue 14, finding 5).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "config/daemon_config.h"

namespace strata::daemon {

struct HostMemory {
  uint64_t mem_total = 0;      // /proc/meminfo MemTotal; 0 when unreadable
  uint64_t mem_available = 0;  // /proc/meminfo MemAvailable
  // The cgroup's memory limit (v2 memory.max, v1 memory.limit_in_bytes); 0: none. In a pod this,
  // not MemTotal, is where the OOM killer steps in.
  uint64_t cgroup_limit = 0;
};

// Reads /proc/meminfo and the cgroup limit. The arena never lives in a /dev/shm file (see
// transport::Context::Create), so that filesystem's size does not bound it.
HostMemory ReadHostMemory();

// The largest host tier this host accepts: the memory limit (MemTotal, or the cgroup limit when
// lower) minus a margin for the kernel, the daemon itself and the engines beside it: 10% of the
// limit, at least 512 MiB and at most 16 GiB.
uint64_t MaxHostCapacity(const HostMemory& m);

// OK when `host.capacity` fits `m`; otherwise an error naming host_tier.capacity and the
// numbers. `warnings` gets what fits but deserves a line in the log (above MemAvailable).
absl::Status CheckHostCapacity(const HostTierConfig& host, const HostMemory& m,
                               std::vector<std::string>* warnings);

}  // namespace strata::daemon
