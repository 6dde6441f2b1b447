// What every part of one daemon's cluster layer shares: its configuration, who this node is,
// the current ring, the channels to its peers, and the counters operators scrape. The Cluster
// owns it; the parts (Announcer, Locator, BlockPuller, BlockMover) hold a reference.
#pragma once

#include <atomic>
#include <cstdint>

#include "client/channel.h"
#include "config/daemon_config.h"
#include "daemon/cluster/locate_wire.h"
#include "daemon/cluster/peer_stubs.h"
#include "daemon/cluster/ring.h"
#include "placement/directory.h"
#include "placement/membership.h"
#include "strata/v1/cache.pb.h"

namespace strata::daemon {

struct ClusterCounters {
  std::atomic<uint64_t> announced{0};  // ids sent to owners (refreshes included)
  std::atomic<uint64_t> withdrawn{0};
  std::atomic<uint64_t> peer_failures{0};  // peer calls that failed or timed out
  std::atomic<uint64_t> replicated{0};     // copies made on other nodes after a commit
  std::atomic<uint64_t> replication_failed{0};
  std::atomic<uint64_t> pulled{0};          // blocks copied into this node from another
  std::atomic<uint64_t> rereplicated{0};    // copies made to replace ones a departed node held
  std::atomic<uint64_t> remote_located{0};  // lookup blocks found on other nodes
  // Announced ids refused: their node held cluster.max_directory_entries_per_node entries here.
  std::atomic<uint64_t> directory_refused{0};
};

struct ClusterContext {
  ClusterContext(ClusterConfig config, placement::NodeRecord self,
                 client::ChannelSecurity peer_security = {})
      : config(std::move(config)),
        self(std::move(self)),
        peer_security(std::move(peer_security)),
        peers(this->peer_security) {}
  ClusterContext(const ClusterContext&) = delete;
  ClusterContext& operator=(const ClusterContext&) = delete;

  const ClusterConfig config;
  const placement::NodeRecord self;
  // Every call to another node: its peer token (auth.peer_token_file) and TLS with the
  // cluster CA and this node's certificate (tls.peer_ca_file, tls.cert_file).
  const client::ChannelSecurity peer_security;
  CurrentRing ring;
  PeerStubs peers;
  ClusterCounters counters;
};

}  // namespace strata::daemon
