#include "daemon/auth.h"

#include <algorithm>

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

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
    if (f.size() != 3) return error("expected 'TOKEN TENANT ROLE'");
    if (f[0].size() < 16) return error("a token must be at least 16 characters");
    Entry e{Sha256(f[0]), std::string(f[1]), Role::kTenant};
    if (f[2] == "tenant")
      e.role = Role::kTenant;
    else if (f[2] == "admin")
      e.role = Role::kAdmin;
    else if (f[2] == "peer")
      e.role = Role::kPeer;
    else
      return error(absl::StrCat("role '", f[2], "' is not tenant, admin or peer"));
    if (auth->Find(f[0]) != nullptr) return error("the token is listed twice");
    auth->tokens_.push_back(std::move(e));
  }
  if (auth->tokens_.empty())
    return absl::InvalidArgumentError(absl::StrCat(source, ": no tokens"));
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

grpc::Status Authenticator::Check(const grpc::ServerContext* ctx, RoleSet allowed,
                                  Caller* caller) const {
  if (!enabled()) {
    *caller = Caller{Role::kAdmin, "", /*trusted=*/true};
    return grpc::Status::OK;
  }
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end())
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "stratad requires a bearer token (ClientOptions::auth_token)");
  absl::string_view value(it->second.data(), it->second.size());
  const Entry* e = nullptr;
  if (value.substr(0, kBearer.size()) == kBearer) e = Find(value.substr(kBearer.size()));
  if (e == nullptr)
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the bearer token is not valid");
  if ((allowed & static_cast<uint8_t>(e->role)) == 0)
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("this call is not open to the token's role (",
                                     e->role == Role::kTenant  ? "tenant"
                                     : e->role == Role::kAdmin ? "admin"
                                                               : "peer",
                                     ")"));
  *caller = Caller{e->role, e->tenant, /*trusted=*/false};
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
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace strata::daemon
