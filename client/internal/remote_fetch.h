// Fetches the blocks the local daemon lacks from the other nodes holding them, found through
// the local daemon's directory (Locate). Each missing block tries its holders in turn: a node
// that fails (dead, timed out, lost the block) passes the block on to the next holder. The node
// that served most of a namespace's last remote fetch is asked first next time, before any
// Locate (a hint, dropped when it serves none).
//
// Holds one DaemonLink per peer node, made on first use and kept; thread-safe.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/daemon_link.h"
#include "strata/client.h"

namespace strata::client {

class RemoteFetch {
 public:
  // `local`: the options of the link to the local daemon; peers' links derive theirs from them.
  explicit RemoteFetch(const ClientOptions& local) : local_options_(local) {}

  // Completes `r`, the local daemon's answer to fetching `ids` into `into.buffers`: every block
  // it reported kNotFound is fetched from a holder elsewhere when one serves it. `local` is the
  // link to the local daemon (its directory, and the namespace as opened there).
  void FetchMissing(DaemonLink& local, const NamespaceId& ns, std::span<const BlockId> ids,
                    const FetchLanding& into, FetchResult* r);

 private:
  // The link to `node` at `address`, with `ns` opened there.
  absl::StatusOr<std::shared_ptr<DaemonLink>> Peer(const std::string& node,
                                                   const std::string& address,
                                                   const NamespaceId& ns,
                                                   const ControlChannel& local);
  // Fetches ids[which[j]] from one node into `into` and records in `r` what it served;
  // served[j] says whether it did.
  std::vector<bool> FetchFrom(const std::string& node, const std::string& address,
                              const NamespaceId& ns, std::span<const BlockId> ids,
                              const FetchLanding& into, const std::vector<size_t>& which,
                              const ControlChannel& local, FetchResult* r);

  struct Holder {
    std::string node, address;
  };

  const ClientOptions local_options_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<DaemonLink>> peers_;  // by node id
  std::map<std::string, Holder> hints_;  // by namespace id (its bytes): the last good holder
};

}  // namespace strata::client
