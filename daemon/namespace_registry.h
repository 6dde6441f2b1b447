// Namespaces opened on this daemon. The daemon holds the cluster secret and derives each
// tenant's salt, so a client learns only the seed of namespaces it opened.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "strata/block_id.h"

namespace strata::daemon {

class NamespaceRegistry {
 public:
  explicit NamespaceRegistry(std::string cluster_secret) : secret_(std::move(cluster_secret)) {}

  absl::StatusOr<NamespaceId> Open(const NamespaceSpec& spec, const std::string& tenant);
  // OK when `id` was opened; otherwise an error that says what to do.
  absl::Status Check(const NamespaceId& id) const;
  size_t size() const;
  // Tokens per block of an open namespace; 0 when it is not open.
  uint32_t TokensPerBlock(const NamespaceId& id) const;

  struct Entry {
    NamespaceId id;
    NamespaceSpec spec;
    std::string tenant;
    uint32_t replicas = 0;  // 0: the daemon's default
  };
  std::vector<Entry> List() const;
  std::optional<Entry> Find(const NamespaceId& id) const;
  // Copies per block the namespace asked for (a later non-zero request replaces it).
  void SetReplicas(const NamespaceId& id, uint32_t replicas);

 private:
  const std::string secret_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<NamespaceId, Entry> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::daemon
