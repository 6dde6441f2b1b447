// Namespaces opened on this daemon. The daemon holds the cluster secret and derives each
// tenant's salt, so a client learns only the seed of namespaces it opened.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "strata/block_id.h"

namespace strata::daemon {

class NamespaceRegistry {
 public:
  // Bounds on what clients can make the registry hold (config section 'limits'). Every open
  // namespace costs memory here and in the tiers' per-namespace accounting; clients that open
  // one per request would otherwise grow the daemon without end (issue 14, finding 5).
  struct Limits {
    size_t max_namespaces = 10000;
    // A namespace with no host-tier blocks that no call named for this long is released.
    absl::Duration idle_timeout = absl::Hours(1);
  };

  explicit NamespaceRegistry(std::string cluster_secret) : NamespaceRegistry(cluster_secret, {}) {}
  NamespaceRegistry(std::string cluster_secret, Limits limits)
      : secret_(std::move(cluster_secret)), limits_(limits) {}

  // RESOURCE_EXHAUSTED when `limits.max_namespaces` are open and `spec` + `tenant` is not one of
  // them.
  absl::StatusOr<NamespaceId> Open(const NamespaceSpec& spec, const std::string& tenant);
  // OK when `id` was opened; otherwise an error that says what to do. Counts as a use.
  absl::Status Check(const NamespaceId& id) const;
  // Releases namespaces idle for longer than `limits.idle_timeout` for which `has_blocks` says
  // false; the number released. A released namespace opens again with the same id.
  size_t ReleaseIdle(absl::Time now, const std::function<bool(const NamespaceId&)>& has_blocks);
  size_t size() const;
  // Called (without the registry's lock) when a namespace is opened and was not open: the daemon
  // tells the host tier which tenant to charge its blocks to (limits.tenant_*). Set it before
  // serving.
  void SetOpenHook(std::function<void(const NamespaceId&, const std::string& tenant)> hook) {
    on_open_ = std::move(hook);
  }
  // Tokens per block of an open namespace; 0 when it is not open.
  uint32_t TokensPerBlock(const NamespaceId& id) const;

  struct Entry {
    NamespaceId id;
    NamespaceSpec spec;
    std::string tenant;
    uint32_t replicas = 0;  // 0: the daemon's default
    // Codec spec its cold blocks are rewritten with instead of evicted (daemon/transcode);
    // empty: none.
    std::string cold_codec;
    // Last Open or Check naming it; a lookup counts as a use although Check is const.
    mutable absl::Time last_used;
  };
  std::vector<Entry> List() const;
  std::optional<Entry> Find(const NamespaceId& id) const;
  // Copies per block the namespace asked for (a later non-zero request replaces it).
  void SetReplicas(const NamespaceId& id, uint32_t replicas);
  // The namespace's cold codec (a later non-empty request replaces it); the caller checked it.
  void SetColdCodec(const NamespaceId& id, const std::string& spec);

 private:
  const std::string secret_;
  const Limits limits_;
  std::function<void(const NamespaceId&, const std::string&)> on_open_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<NamespaceId, Entry> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::daemon
