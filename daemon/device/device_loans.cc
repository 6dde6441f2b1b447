#include "daemon/device/device_loans.h"

#include <openssl/rand.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace strata::daemon {

absl::StatusOr<uint64_t> DeviceLoans::Add(const Caller& lender, std::unique_ptr<PeerBuffer> buffer,
                                          absl::Time now) {
  std::string owner = OwnerOf(lender);
  absl::MutexLock lock(&mu_);
  if (loans_.size() >= limits_.total)
    return absl::ResourceExhaustedError(absl::StrCat(
        "this daemon holds ", loans_.size(), " lent device buffers, its limit: return one first"));
  size_t& held = per_owner_[owner];
  if (held >= limits_.per_tenant)
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant '", owner, "' has lent ", held,
                     " device buffers, the limit per tenant: return one first"));
  uint64_t id = 0;
  while (id == 0 || loans_.contains(id)) {
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&id), sizeof id) != 1)
      return absl::InternalError("no random bytes for a loan id");
  }
  ++held;
  loans_.emplace(id, Loan{std::move(owner), std::move(buffer), now});
  return id;
}

absl::StatusOr<std::shared_ptr<PeerBuffer>> DeviceLoans::Use(uint64_t id, const Caller& caller,
                                                             absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = loans_.find(id);
  if (it == loans_.end() || !MayUse(it->second, caller))
    return absl::NotFoundError(absl::StrCat("no lent device buffer ", id,
                                            " (returned, closed after idling, or never lent)"));
  it->second.last_used = now;
  return it->second.buffer;
}

absl::Status DeviceLoans::Return(uint64_t id, const Caller& caller) {
  std::shared_ptr<PeerBuffer> closing;  // closed after the lock is released
  absl::MutexLock lock(&mu_);
  auto it = loans_.find(id);
  if (it == loans_.end() || !MayUse(it->second, caller))
    return absl::NotFoundError(absl::StrCat("no lent device buffer ", id));
  closing = std::move(it->second.buffer);
  if (--per_owner_[it->second.owner] == 0) per_owner_.erase(it->second.owner);
  loans_.erase(it);
  return absl::OkStatus();
}

size_t DeviceLoans::CloseIdle(absl::Time now) {
  std::vector<std::shared_ptr<PeerBuffer>> closing;
  absl::MutexLock lock(&mu_);
  for (auto it = loans_.begin(); it != loans_.end();) {
    if (now - it->second.last_used <= limits_.idle) {
      ++it;
      continue;
    }
    closing.push_back(std::move(it->second.buffer));
    if (--per_owner_[it->second.owner] == 0) per_owner_.erase(it->second.owner);
    loans_.erase(it++);
  }
  return closing.size();
}

size_t DeviceLoans::size() const {
  absl::MutexLock lock(&mu_);
  return loans_.size();
}

}  // namespace strata::daemon
