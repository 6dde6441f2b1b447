// The device buffers same-node engines lent this daemon (proto/strata/v1/device.proto), held
// open until the engine returns them, leaves them unused past the idle limit, or the daemon
// stops. Bounded per tenant and in all, so no client can make the daemon hold device mappings
// without end. A loan belongs to the tenant that lent it: callers of another tenant are told it
// does not exist, the same answer as for an id nobody was given. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/auth.h"
#include "storage/gpu/device_memory.h"

namespace strata::daemon {

class DeviceLoans {
 public:
  struct Limits {
    size_t per_tenant = 16;
    size_t total = 256;
    absl::Duration idle = absl::Minutes(10);
  };
  explicit DeviceLoans(Limits limits) : limits_(limits) {}

  // Takes `buffer` for `lender`; the loan's id (random, never 0). RESOURCE_EXHAUSTED past a
  // limit (the buffer is then closed).
  absl::StatusOr<uint64_t> Add(const Caller& lender, std::unique_ptr<PeerBuffer> buffer,
                               absl::Time now);
  // The loan's buffer for one use (it counts as activity). The returned pointer keeps the
  // buffer open through the caller's copy even when the loan is returned meanwhile. NOT_FOUND
  // for an unknown loan and for another tenant's.
  absl::StatusOr<std::shared_ptr<PeerBuffer>> Use(uint64_t id, const Caller& caller,
                                                  absl::Time now);
  // Closes the loan. NOT_FOUND as for Use.
  absl::Status Return(uint64_t id, const Caller& caller);
  // Closes loans unused for longer than the idle limit; how many.
  size_t CloseIdle(absl::Time now);
  size_t size() const;
  const Limits& limits() const { return limits_; }

 private:
  struct Loan {
    std::string owner;  // the lender's tenant; empty for callers not bound to one
    std::shared_ptr<PeerBuffer> buffer;
    absl::Time last_used;
  };
  static std::string OwnerOf(const Caller& c) {
    return c.trusted || c.role != Role::kTenant ? std::string() : c.tenant;
  }
  static bool MayUse(const Loan& loan, const Caller& c) {
    return c.trusted || c.role != Role::kTenant || loan.owner == c.tenant;
  }

  const Limits limits_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Loan> loans_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, size_t> per_owner_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::daemon
