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
  const absl::Time now = absl::Now();
  bool opened = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = open_.find(id);
    if (it == open_.end()) {
      if (open_.size() >= limits_.max_namespaces)
        return absl::ResourceExhaustedError(absl::StrCat(
            "this daemon holds ", open_.size(),
            " open namespaces, its limit (limits.max_namespaces); "
            "namespaces without blocks are released after ",
            absl::FormatDuration(limits_.idle_timeout), " unused (limits.namespace_idle_timeout)"));
      it = open_.try_emplace(id, Entry{id, spec, tenant, 0, "", now}).first;
      opened = true;
    }
    it->second.last_used = now;
  }
  // Before the caller learns the id, so no Reserve in it can precede the tenant's charge.
  if (opened && on_open_) on_open_(id, tenant);
  return id;
}

absl::Status NamespaceRegistry::Check(const NamespaceId& id) const {
  absl::MutexLock lock(&mu_);
  if (auto it = open_.find(id); it != open_.end()) {
    it->second.last_used = absl::Now();
    return absl::OkStatus();
  }
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

size_t NamespaceRegistry::ReleaseIdle(absl::Time now,
                                      const std::function<bool(const NamespaceId&)>& has_blocks) {
  absl::MutexLock lock(&mu_);
  return absl::erase_if(open_, [&](const auto& kv) {
    return now - kv.second.last_used > limits_.idle_timeout && !has_blocks(kv.first);
  });
}

void NamespaceRegistry::SetReplicas(const NamespaceId& id, uint32_t replicas) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(id);
  if (it != open_.end()) it->second.replicas = replicas;
}

void NamespaceRegistry::SetColdCodec(const NamespaceId& id, const std::string& spec) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(id);
  if (it != open_.end()) it->second.cold_codec = spec;
}

}  // namespace strata::daemon
