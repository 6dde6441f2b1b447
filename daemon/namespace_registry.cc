#include "daemon/namespace_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace strata::daemon {

absl::StatusOr<NamespaceId> NamespaceRegistry::Open(const NamespaceSpec& spec,
                                                    const std::string& tenant) {
  STRATA_RETURN_IF_ERROR(spec.Validate());
  if (tenant.empty()) return absl::InvalidArgumentError("tenant must be set");
  NamespaceId id = ComputeNamespaceId(spec, ComputeTenantSalt(secret_, tenant));
  absl::MutexLock lock(&mu_);
  open_.try_emplace(id, Entry{id, spec, tenant});
  return id;
}

absl::Status NamespaceRegistry::Check(const NamespaceId& id) const {
  absl::MutexLock lock(&mu_);
  if (open_.contains(id)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "namespace ", id.ShortHex(), " is not open on this daemon; call OpenNamespace first"));
}

std::vector<NamespaceRegistry::Entry> NamespaceRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<Entry> out;
  for (const auto& [id, e] : open_) out.push_back(e);
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.id < b.id; });
  return out;
}

uint32_t NamespaceRegistry::TokensPerBlock(const NamespaceId& id) const {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(id);
  return it == open_.end() ? 0 : it->second.spec.layout.tokens_per_block;
}

size_t NamespaceRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return open_.size();
}

std::optional<NamespaceRegistry::Entry> NamespaceRegistry::Find(const NamespaceId& id) const {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(id);
  if (it == open_.end()) return std::nullopt;
  return it->second;
}

void NamespaceRegistry::SetReplicas(const NamespaceId& id, uint32_t replicas) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(id);
  if (it != open_.end()) it->second.replicas = replicas;
}

}  // namespace strata::daemon
