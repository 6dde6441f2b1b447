// Helpers the Cache service's handlers share across its source files (cache_service.cc,
// cache_publish.cc). Not part of any interface.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/auth.h"
#include "daemon/namespace_registry.h"
#include "strata/block_status.h"
#include "strata/v1/cache.pb.h"

namespace strata::daemon::cache_internal {

// The registry's answer to "is this namespace open here", for the request checks.
inline auto IsOpenIn(const NamespaceRegistry& reg) {
  return [&reg](const NamespaceId& id) { return reg.Check(id); };
}

template <typename Repeated>
void AddStatuses(const std::vector<BlockStatus>& in, Repeated* out) {
  out->Reserve(static_cast<int>(in.size()));
  for (BlockStatus s : in) out->Add(static_cast<v1::BlockStatus>(s));
}

// Another tenant's reservation or lease reads like a guessed id: the answer tells a prober
// nothing about which ids are live.
inline grpc::Status UnknownId(const char* what, uint64_t id) {
  return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat(what, " ", id, " is unknown"));
}

// Who an active message comes from when authentication is off: anyone, trusted (as gRPC's
// callers are then).
inline Caller TrustedCaller() {
  Caller c;
  c.trusted = true;
  return c;
}

}  // namespace strata::daemon::cache_internal
