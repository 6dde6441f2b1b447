#include "daemon/auth.h"

#include <algorithm>

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/am_wire.h"

namespace strata::daemon {
namespace {

std::array<uint8_t, 32> Sha256(absl::string_view s) {
  std::array<uint8_t, 32> d;
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d.data());
  return d;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

constexpr absl::string_view kBearer = "Bearer ";
constexpr absl::string_view kCnPrefix = "cn:";
constexpr absl::string_view kSanPrefix = "san:";

const char* RoleName(Role r) {
  return r == Role::kTenant ? "tenant" : r == Role::kAdmin ? "admin" : "peer";
}

}  // namespace

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Parse(absl::string_view text,
                                                                    absl::string_view source) {
  auto auth = std::make_unique<Authenticator>();
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = line.substr(0, line.find('#'));
    std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (f.empty()) continue;
    auto error = [&](absl::string_view why) {
      // The line's token is never quoted: error messages end up in logs.
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": ", why));
    };
    if (f.size() != 3) return error("expected 'TOKEN TENANT ROLE' (or cn:NAME / san:VALUE)");
    Role role;
    if (f[2] == "tenant")
      role = Role::kTenant;
    else if (f[2] == "admin")
      role = Role::kAdmin;
    else if (f[2] == "peer")
      role = Role::kPeer;
    else
      return error(absl::StrCat("role '", f[2], "' is not tenant, admin or peer"));
    const bool cn = absl::StartsWith(f[0], kCnPrefix), san = absl::StartsWith(f[0], kSanPrefix);
    if (cn || san) {
      Identity id{san, std::string(f[0].substr(san ? kSanPrefix.size() : kCnPrefix.size())),
                  std::string(f[1]), role};
      if (id.name.empty()) return error("a certificate name must not be empty");
      for (const Identity& other : auth->identities_)
        if (other.san == id.san && other.name == id.name)
          return error(absl::StrCat("'", f[0], "' is listed twice"));
      auth->identities_.push_back(std::move(id));
      continue;
    }
    if (f[0].size() < 16) return error("a token must be at least 16 characters");
    Entry e{Sha256(f[0]), std::string(f[1]), role};
    if (auth->Find(f[0]) != nullptr) return error("the token is listed twice");
    auth->tokens_.push_back(std::move(e));
  }
  if (!auth->enabled()) return absl::InvalidArgumentError(absl::StrCat(source, ": no tokens"));
  return auth;
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Load(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok())
    return absl::Status(text.status().code(),
                        absl::StrCat("config field 'auth.tokens_file': ", text.status().message()));
  return Parse(*text, path);
}

const Authenticator::Entry* Authenticator::Find(absl::string_view token) const {
  const std::array<uint8_t, 32> d = Sha256(token);
  const Entry* found = nullptr;
  for (const Entry& e : tokens_)
    if (CRYPTO_memcmp(d.data(), e.digest.data(), d.size()) == 0) found = &e;
  return found;
}

const Authenticator::Identity* Authenticator::FromCertificate(const grpc::ServerContext* ctx,
                                                              std::string* seen) const {
  if (!trust_certificates_ || identities_.empty()) return nullptr;
  std::shared_ptr<const grpc::AuthContext> auth = ctx->auth_context();
  // Peer-authenticated only when the handshake verified a client certificate against
  // tls.client_ca_file; the names below are then the certificate's, not the caller's say-so.
  if (!auth || !auth->IsPeerAuthenticated()) return nullptr;
  for (const grpc::string_ref& cn : auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
    absl::string_view name(cn.data(), cn.size());
    if (seen->empty()) *seen = absl::StrCat("CN=", name);
    for (const Identity& id : identities_)
      if (!id.san && id.name == name) return &id;
  }
  for (const grpc::string_ref& v : auth->FindPropertyValues(GRPC_X509_SAN_PROPERTY_NAME)) {
    absl::string_view name(v.data(), v.size());
    if (seen->empty()) *seen = absl::StrCat("SAN ", name);
    for (const Identity& id : identities_)
      if (id.san && id.name == name) return &id;
  }
  return nullptr;
}

grpc::Status Authenticator::Check(const grpc::ServerContext* ctx, RoleSet allowed,
                                  Caller* caller) const {
  if (!enabled()) {
    *caller = Caller{Role::kAdmin, "", /*trusted=*/true};
    return grpc::Status::OK;
  }
  std::string certificate;
  Role role;
  const std::string* tenant;
  const char* by;
  if (const Identity* id = FromCertificate(ctx, &certificate)) {
    role = id->role;
    tenant = &id->tenant;
    by = "client certificate";
  } else {
    const auto& md = ctx->client_metadata();
    auto it = md.find("authorization");
    if (it == md.end())
      return grpc::Status(
          grpc::StatusCode::UNAUTHENTICATED,
          certificate.empty()
              ? "stratad requires a bearer token (ClientOptions::auth_token) or a client "
                "certificate it knows"
              : absl::StrCat("the client certificate (", certificate,
                             ") is not mapped in auth.tokens_file, and no bearer token was sent"));
    absl::string_view value(it->second.data(), it->second.size());
    const Entry* e = nullptr;
    if (value.substr(0, kBearer.size()) == kBearer) e = Find(value.substr(kBearer.size()));
    if (e == nullptr)
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the bearer token is not valid");
    role = e->role;
    tenant = &e->tenant;
    by = "token";
  }
  if ((allowed & static_cast<uint8_t>(role)) == 0)
    return grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        absl::StrCat("this call is not open to the ", by, "'s role (", RoleName(role), ")"));
  *caller = Caller{role, *tenant, /*trusted=*/false};
  return grpc::Status::OK;
}

void IdOwners::Add(uint64_t id, const std::string& tenant, absl::Duration ttl) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  // Ids that were never committed, aborted or released expire with their reservation or lease.
  if (++adds_since_prune_ >= 1024) {
    absl::erase_if(owners_, [&](const auto& kv) { return kv.second.expires < now; });
    adds_since_prune_ = 0;
  }
  owners_[id] = Owner{tenant, now + ttl + absl::Seconds(1)};
}

bool IdOwners::Allowed(uint64_t id, const Caller& caller) const {
  if (caller.trusted || caller.role != Role::kTenant) return true;
  absl::MutexLock lock(&mu_);
  auto it = owners_.find(id);
  return it == owners_.end() || it->second.tenant == caller.tenant;
}

void IdOwners::Forget(uint64_t id) {
  absl::MutexLock lock(&mu_);
  owners_.erase(id);
}

std::string AmTickets::Issue(const Caller& caller) {
  std::string ticket(am_wire::kTicketBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(ticket.data()),
                 static_cast<int>(ticket.size())) != 1)
    return {};
  absl::MutexLock lock(&mu_);
  while (order_.size() >= capacity_) {
    tickets_.erase(order_.front());
    order_.pop_front();
  }
  tickets_[ticket] = Entry{caller, absl::Now() + ttl_};
  order_.push_back(ticket);
  return ticket;
}

std::optional<Caller> AmTickets::Find(std::string_view ticket) const {
  if (ticket.size() != am_wire::kTicketBytes) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto it = tickets_.find(std::string(ticket));
  if (it == tickets_.end() || it->second.expires < absl::Now()) return std::nullopt;
  return it->second.caller;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok())
    return absl::Status(text.status().code(), absl::StrCat("config field 'auth.peer_token_file': ",
                                                           text.status().message()));
  std::string token(absl::StripAsciiWhitespace(*text));
  token = token.substr(0, token.find_first_of(" \t\r\n"));
  if (token.empty())
    return absl::InvalidArgumentError(
        absl::StrCat("config field 'auth.peer_token_file': ", path, " holds no token"));
  return token;
}

}  // namespace strata::daemon

namespace strata::daemon {

std::vector<std::string> Authenticator::tenants() const {
  std::vector<std::string> out;
  for (const Entry& e : tokens_)
    if (e.role == Role::kTenant) out.push_back(e.tenant);
  for (const Identity& i : identities_)
    if (i.role == Role::kTenant) out.push_back(i.tenant);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace strata::daemon
