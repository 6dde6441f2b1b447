// Who is calling: bearer tokens (config `auth.tokens_file`) mapped to a tenant and a role, the
// one check every gRPC handler of the daemon runs before it does anything (issue 14, item 1).
// The same file may map verified TLS client certificates (by subject CN or a subjectAltName) to
// a tenant and a role: such a caller needs no token.
//
// Without a tokens file authentication is off: every caller is trusted, which stratad allows
// only on a loopback or Unix-socket listen address unless the operator says `insecure: true`.
#pragma once

#include <grpcpp/grpcpp.h>

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace strata::daemon {

enum class Role : uint8_t {
  kTenant = 1,  // the Cache service, on namespaces of its own tenant only
  kAdmin = 2,   // the Admin service, and the Cache service on any namespace (operator tools)
  kPeer = 4,    // another stratad: the Peer service, and the Cache service on any namespace
                // (a pull reads the source daemon's blocks the way a client does)
};
using RoleSet = uint8_t;
constexpr RoleSet operator|(Role a, Role b) {
  return static_cast<RoleSet>(static_cast<uint8_t>(a) | static_cast<uint8_t>(b));
}
constexpr RoleSet kAnyRole = static_cast<RoleSet>(Role::kTenant | Role::kAdmin) |
                             static_cast<uint8_t>(Role::kPeer);

// An authenticated caller. With authentication off every caller is `trusted`.
struct Caller {
  Role role = Role::kAdmin;
  std::string tenant;  // kTenant: the only tenant whose namespaces it may use
  bool trusted = false;
  // Whether the caller may act on a namespace of `tenant`.
  bool MayUse(std::string_view ns_tenant) const {
    return trusted || role != Role::kTenant || ns_tenant == tenant;
  }
};

class Authenticator {
 public:
  // Authentication off.
  Authenticator() = default;
  // Lines `TOKEN TENANT ROLE`, `cn:NAME TENANT ROLE` or `san:VALUE TENANT ROLE` ('#' starts a
  // comment); `source` names the text in errors.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Parse(absl::string_view text,
                                                              absl::string_view source);
  static absl::StatusOr<std::unique_ptr<Authenticator>> Load(const std::string& path);

  bool enabled() const { return !tokens_.empty() || !identities_.empty(); }
  // Whether the file maps certificate identities (cn: / san: lines).
  bool maps_certificates() const { return !identities_.empty(); }
  // Client certificates are verified by the TLS handshake (tls.client_ca_file): only then does
  // Check believe a certificate's names. Off by default, so a server that does not verify them
  // can never let a self-made certificate pick its identity.
  void TrustVerifiedClientCertificates() { trust_certificates_ = true; }
  // The tenants the tokens file names for tenant-role tokens and certificates, sorted, each once.
  std::vector<std::string> tenants() const;

  // The caller of a call, if its role is in `allowed`: from the call's verified TLS client
  // certificate when a cn:/san: line maps it, else from its `authorization: Bearer TOKEN`
  // metadata. UNAUTHENTICATED without either, PERMISSION_DENIED for another role. Never from
  // anything the request itself says.
  grpc::Status Check(const grpc::ServerContext* ctx, RoleSet allowed, Caller* caller) const;

 private:
  struct Entry {
    std::array<uint8_t, 32> digest;  // SHA-256 of the token: the token itself is never kept
    std::string tenant;
    Role role;
  };
  // A certificate name: not a secret (the handshake proved the caller holds its key).
  struct Identity {
    bool san;  // a subjectAltName (DNS, URI, e-mail, IP as text); else the subject CN
    std::string name;
    std::string tenant;
    Role role;
  };
  // Every entry is compared, in constant time each, so how long a check takes says nothing
  // about how close a guess was.
  const Entry* Find(absl::string_view token) const;
  // The entry of the call's verified client certificate, if one maps it; `seen` gets the
  // certificate's CN (for the error message) when there was a certificate.
  const Identity* FromCertificate(const grpc::ServerContext* ctx, std::string* seen) const;

  std::vector<Entry> tokens_;
  std::vector<Identity> identities_;
  bool trust_certificates_ = false;
};

// Which tenant holds each live reservation and lease id: a tenant's Commit, Abort or Release
// of an id another tenant holds reads "unknown", like a guessed one. Ids are random (so not
// guessable) already; this keeps one leaked id from crossing tenants.
class IdOwners {
 public:
  void Add(uint64_t id, const std::string& tenant, absl::Duration ttl);
  // Whether `caller` may use `id` (an id this map never saw, e.g. from before a restart, is
  // left to the store, which answers it is unknown).
  bool Allowed(uint64_t id, const Caller& caller) const;
  void Forget(uint64_t id);

 private:
  mutable absl::Mutex mu_;
  struct Owner {
    std::string tenant;
    absl::Time expires;
  };
  absl::flat_hash_map<uint64_t, Owner> owners_ ABSL_GUARDED_BY(mu_);
  size_t adds_since_prune_ ABSL_GUARDED_BY(mu_) = 0;
};

// Tickets for the active-message fast paths under authentication. An active message carries no
// token, so an authenticated Connect gets a ticket: 16 random bytes that stand for its caller
// (tenant and role) in lookup, acquire and release messages. Bounded: past `capacity` the
// oldest ticket goes (its client falls back to gRPC, or connects again), and a ticket ends
// `ttl` after it was issued.
class AmTickets {
 public:
  explicit AmTickets(size_t capacity = 1 << 16, absl::Duration ttl = absl::Hours(24))
      : capacity_(capacity), ttl_(ttl) {}
  // A fresh ticket for `caller`; empty if no random bytes could be drawn.
  std::string Issue(const Caller& caller);
  // The caller a ticket stands for; nullopt for an unknown or expired one.
  std::optional<Caller> Find(std::string_view ticket) const;

 private:
  struct Entry {
    Caller caller;
    absl::Time expires;
  };
  const size_t capacity_;
  const absl::Duration ttl_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> tickets_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);  // oldest first
};

// A token file's first token (spaces and newlines trimmed): `auth.peer_token_file`.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace strata::daemon
