// Cluster membership: which daemons exist right now, and how to reach them.
//
// - static: a fixed list from the config (the embedded default is this node alone). Nodes never
//   die in its view; a dead peer shows up as failed calls, which callers bound by deadlines.
// - etcd: each daemon keeps one key `<prefix><node id>` bound to a lease it keeps alive; the
//   value is the node record as JSON. A watch on the prefix turns puts into joins and deletes
//   (a lease that expired because its daemon died, or a graceful Leave) into departures.
//   While etcd is unreachable the last view stays in force and healthy() is false: daemons keep
//   serving what they hold and report degraded readiness.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata::placement {

struct NodeRecord {
  std::string id;
  std::string address;  // gRPC "HOST:PORT" of its Cache and Peer services
  uint64_t host_capacity = 0;
  uint64_t nvme_capacity = 0;
  std::string version;

  bool operator==(const NodeRecord&) const = default;
};

// One consistent view: nodes sorted by id; `epoch` grows by one at every change.
struct MembershipView {
  uint64_t epoch = 0;
  std::vector<NodeRecord> nodes;

  const NodeRecord* Find(std::string_view id) const;
  std::vector<std::string> Ids() const;
};

class Membership {
 public:
  using Listener = std::function<void(const MembershipView&)>;

  virtual ~Membership() = default;

  // Joins as `self` and starts following the cluster. The view includes `self` once this
  // returns OK.
  virtual absl::Status Start(const NodeRecord& self) = 0;
  virtual MembershipView View() const = 0;
  // Called (from the membership's own thread, never under a lock the caller could hold) after
  // every change of the view. Set before Start.
  virtual void SetListener(Listener listener) = 0;
  // False while the backing store cannot be reached; `detail` says why.
  virtual bool healthy(std::string* detail) const = 0;
  // Leaves the cluster (graceful shutdown or drain): others see this node depart promptly.
  // Idempotent; the object stops following the cluster.
  virtual absl::Status Leave() = 0;
  virtual std::string kind() const = 0;  // "static" | "etcd"
};

// `nodes` need not include self; Start adds it.
std::unique_ptr<Membership> NewStaticMembership(std::vector<NodeRecord> nodes);

struct EtcdMembershipOptions {
  std::vector<std::string> endpoints;  // "http://127.0.0.1:2379"; tried in order
  std::string prefix = "/strata/nodes/";
  absl::Duration lease_ttl = absl::Seconds(10);    // a dead daemon leaves the view after this
  absl::Duration call_timeout = absl::Seconds(2);  // every etcd request has this deadline
  // Start keeps trying while etcd is unreachable for this long (a node and etcd started
  // together, or etcd restarting), then fails; other errors fail at once.
  absl::Duration start_timeout = absl::Seconds(30);
};

// Fails (with the endpoint and etcd's answer in the message) when Start cannot register.
std::unique_ptr<Membership> NewEtcdMembership(EtcdMembershipOptions options);

}  // namespace strata::placement
