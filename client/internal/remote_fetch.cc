#include "client/internal/remote_fetch.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace strata::client {

void RemoteFetch::FetchMissing(DaemonLink& local, const NamespaceId& ns,
                               std::span<const BlockId> ids, const FetchLanding& into,
                               FetchResult* r) {
  std::vector<size_t> missing;  // index into ids
  for (size_t i = 0; i < ids.size(); ++i)
    if (r->status[i] == BlockStatus::kNotFound) missing.push_back(i);
  if (missing.empty()) return;
  const std::string& self = local.control().node_id();
  const std::string ns_key(ns.AsBytes());
  // The node that served this namespace's last remote fetch is asked first, without a Locate
  // (a gRPC call that asks the directory's owner in turn: most of a small remote fetch's
  // latency). An engine fed by one prefill node finds its next blocks there too; where it does
  // not, the miss costs one acquire round trip and the hint goes.
  std::optional<Holder> hint;
  Holder best;  // the node that served the most blocks: the next fetch's hint
  size_t best_served = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = hints_.find(ns_key); it != hints_.end()) hint = it->second;
  }
  if (hint && hint->node != self) {
    std::vector<bool> served =
        FetchFrom(hint->node, hint->address, ns, ids, into, missing, local.control(), r);
    std::vector<size_t> left;
    for (size_t j = 0; j < missing.size(); ++j)
      if (!served[j]) left.push_back(missing[j]);
    best_served = missing.size() - left.size();
    best = *hint;
    if (best_served == 0) {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = hints_.find(ns_key); it != hints_.end() && it->second.node == hint->node)
        hints_.erase(it);
    }
    missing = std::move(left);
    if (missing.empty()) return;
  }
  std::vector<BlockId> missing_ids;
  for (size_t i : missing) missing_ids.push_back(ids[i]);
  auto located = local.control().Locate(ns, missing_ids);
  if (!located.ok()) return;  // the local answer stands: those blocks are misses
  std::vector<size_t> attempt(missing.size(), 0);  // next holder to try, per missing block
  auto holder_of = [&](size_t k) -> const BlockHolder* {
    const auto& hs = (*located)[k];
    while (attempt[k] < hs.size() && hs[attempt[k]].node == self) ++attempt[k];
    return attempt[k] < hs.size() ? &hs[attempt[k]] : nullptr;
  };
  std::vector<size_t> pending(missing.size());  // index into missing
  for (size_t k = 0; k < missing.size(); ++k) pending[k] = k;
  while (!pending.empty()) {
    std::map<std::string, std::vector<size_t>> by_node;
    std::map<std::string, std::string> address;
    for (size_t k : pending) {
      if (const BlockHolder* h = holder_of(k)) {
        by_node[h->node].push_back(k);
        address[h->node] = h->address;
      }
    }
    pending.clear();
    for (const auto& [node, ks] : by_node) {
      std::vector<size_t> which;
      for (size_t k : ks) which.push_back(missing[k]);
      std::vector<bool> served =
          FetchFrom(node, address[node], ns, ids, into, which, local.control(), r);
      size_t count = 0;
      for (size_t j = 0; j < ks.size(); ++j) {
        if (served[j]) {
          ++count;
          continue;
        }
        ++attempt[ks[j]];
        pending.push_back(ks[j]);
      }
      if (count > best_served) {
        best_served = count;
        best = {node, address[node]};
      }
    }
  }
  if (best_served > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    hints_[ns_key] = std::move(best);
  }
}

std::vector<bool> RemoteFetch::FetchFrom(const std::string& node, const std::string& address,
                                         const NamespaceId& ns, std::span<const BlockId> ids,
                                         const FetchLanding& into, const std::vector<size_t>& which,
                                         const ControlChannel& local, FetchResult* r) {
  std::vector<BlockId> sub_ids;
  std::vector<MutableBuffer> sub_buffers;
  for (size_t i : which) {
    sub_ids.push_back(ids[i]);
    sub_buffers.push_back(into.buffers[i]);
  }
  FetchLanding sub_into = into;
  sub_into.buffers = sub_buffers;
  absl::StatusOr<FetchResult> got = absl::UnavailableError("not tried");
  auto peer = Peer(node, address, ns, local);
  if (peer.ok()) got = (*peer)->Fetch(ns, sub_ids, sub_into);
  std::vector<bool> served(which.size(), false);
  if (!got.ok()) return served;
  for (size_t j = 0; j < which.size(); ++j) {
    const size_t i = which[j];
    if (got->status[j] == BlockStatus::kCrcMismatch)
      r->status[i] = BlockStatus::kCrcMismatch;  // reported unless another holder serves it
    if (got->status[j] != BlockStatus::kOk) continue;
    served[j] = true;
    r->status[i] = BlockStatus::kOk;
    r->sizes[i] = got->sizes[j];
    ++r->fetched;
    r->bytes_received += got->sizes[j];
    ++r->remote;
  }
  return served;
}

absl::StatusOr<std::shared_ptr<DaemonLink>> RemoteFetch::Peer(const std::string& node,
                                                              const std::string& address,
                                                              const NamespaceId& ns,
                                                              const ControlChannel& local) {
  std::shared_ptr<DaemonLink> peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(node);
    if (it != peers_.end() && it->second->options().endpoint == address) peer = it->second;
  }
  if (!peer) {
    ClientOptions o = local_options_;
    o.endpoint = address;
    o.remote_fetch = false;
    o.same_node = false;
    o.client_name = absl::StrCat(local_options_.client_name, "->", node);
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<DaemonLink> made, DaemonLink::Connect(o));
    peer = std::move(made);
    std::lock_guard<std::mutex> lock(mu_);
    peers_[node] = peer;
  }
  if (!peer->control().Opened(ns)) {
    std::optional<OpenedNamespace> open = local.Opened(ns);
    if (!open)
      return absl::FailedPreconditionError(
          absl::StrCat("namespace ", ns.ShortHex(), " was not opened by this client"));
    STRATA_ASSIGN_OR_RETURN(NamespaceId there,
                            peer->control().OpenNamespace(open->spec, open->tenant));
    if (there != ns)
      return absl::FailedPreconditionError(absl::StrCat(
          "node ", node, " derives a different namespace id: its cluster secret differs"));
  }
  return peer;
}

}  // namespace strata::client
