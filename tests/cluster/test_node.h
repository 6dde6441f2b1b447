// One in-process node of a test cluster, for tests that drive the parts of the cluster layer
// directly: a small host tier behind a HostBlockStore, the node's ClusterContext, Directory,
// Announcer and Locator, and a PeerEndpoint through which the other test nodes reach it. With a
// UCX context, the node also answers peer locates as active messages on a worker of its own,
// as stratad's data-plane worker does.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/am_wire.h"
#include "common/crc32c.h"
#include "daemon/cluster/announcer.h"
#include "daemon/cluster/context.h"
#include "daemon/cluster/locator.h"
#include "placement/directory.h"
#include "storage/arena.h"
#include "storage/host_block_store.h"
#include "storage/host_tier.h"
#include "tests/cluster/peer_endpoint.h"
#include "transport/ucx.h"

namespace strata::testing {

inline ClusterConfig TestClusterConfig(uint32_t owners) {
  ClusterConfig c;
  c.membership = "static";
  c.directory_owners = owners;
  c.directory_ttl = absl::Seconds(30);
  c.replicas = 1;
  c.peer_timeout = absl::Milliseconds(500);
  return c;
}

inline BlockId TestId(int i) {
  return ComputeBlockId(Digest{}, std::vector<uint32_t>{static_cast<uint32_t>(i), 0x5eed});
}

class TestNode {
 public:
  TestNode(const std::string& id, const ClusterConfig& config,
           std::shared_ptr<transport::Context> ucx = nullptr) {
    arena_ = *MmapArena::Create(4 << 20, /*huge_pages=*/false);
    HostTierOptions o;
    o.high_watermark = 1.0;
    o.low_watermark = 1.0;
    tier_ = std::make_unique<HostTier>(arena_->data(), arena_->size(), o);
    store = std::make_unique<HostBlockStore>(tier_.get());
    PeerEndpoint::Handlers h;
    h.announce = [this](const v1::AnnounceRequest& req, std::span<const BlockId> ids) {
      announcer->HandleAnnounce(req, ids);
    };
    h.locate = [this](std::span<const BlockId> ids, v1::PeerLocateResponse* resp) {
      locator->HandleLocate(ids, resp);
    };
    h.worker_address = [this] { return worker_ ? worker_->address() : std::string(); };
    auto endpoint = std::make_unique<PeerEndpoint>(std::move(h));
    ctx = std::make_unique<daemon::ClusterContext>(
        config, placement::NodeRecord{id, endpoint->address(), 0, 0, "test"});
    announcer = std::make_unique<daemon::Announcer>(*ctx, directory, *store);
    locator = std::make_unique<daemon::Locator>(*ctx, directory, ucx);
    if (ucx) {
      worker_ = *transport::Worker::Create(ucx);
      auto* w = worker_.get();
      EXPECT_TRUE(w->SetAmHandler(am_wire::kPeerLocateAm, [this, w](const transport::AmMessage& m) {
                     locator->HandleAmLocate(m, w);
                   }).ok());
      progress_ = std::make_unique<transport::ProgressThread>(w);
    }
    endpoint_ = std::move(endpoint);
  }

  ~TestNode() { store->SetChangeHook(nullptr); }

  const std::string& id() const { return ctx->self.id; }
  PeerEndpoint& endpoint() { return *endpoint_; }

  // Publishes block `i` (`bytes` of a pattern) into this node's store.
  BlockId Publish(const NamespaceId& ns, int i, size_t bytes = 4096) {
    const BlockId id = TestId(i);
    ReserveItem item{id, BlockId{}, bytes};
    ReserveResult r = store->Reserve(ns, {&item, 1});
    EXPECT_EQ(r.status[0], BlockStatus::kOk);
    uint8_t* p = store->arena_base() + r.offsets[0];
    std::memset(p, i & 0xff, bytes);
    const uint32_t crc = Crc32c(p, bytes);
    auto c = store->Commit(r.reservation_id, {&crc, 1});
    EXPECT_TRUE(c.ok() && (*c)[0] == BlockStatus::kOk);
    return id;
  }

 private:
  std::unique_ptr<MmapArena> arena_;
  std::unique_ptr<HostTier> tier_;

 public:
  std::unique_ptr<HostBlockStore> store;
  std::unique_ptr<daemon::ClusterContext> ctx;
  placement::Directory directory;
  std::unique_ptr<daemon::Announcer> announcer;
  std::unique_ptr<daemon::Locator> locator;

 private:
  std::unique_ptr<transport::Worker> worker_;
  // Destroyed first: nothing calls into the parts above once these are gone.
  std::unique_ptr<PeerEndpoint> endpoint_;
  std::unique_ptr<transport::ProgressThread> progress_;
};

// Every node gets the view of all `nodes` at `epoch` (as membership would deliver it).
inline placement::MembershipView ViewOf(const std::vector<TestNode*>& nodes, uint64_t epoch) {
  placement::MembershipView v;
  v.epoch = epoch;
  for (TestNode* n : nodes) v.nodes.push_back(n->ctx->self);
  std::sort(v.nodes.begin(), v.nodes.end(),
            [](const auto& a, const auto& b) { return a.id < b.id; });
  return v;
}

inline void InstallView(const std::vector<TestNode*>& nodes, uint64_t epoch) {
  const placement::MembershipView v = ViewOf(nodes, epoch);
  for (TestNode* n : nodes) {
    std::shared_ptr<const daemon::Ring> prev;
    EXPECT_TRUE(n->ctx->ring.Replace(daemon::Ring::Make(v, n->id()), &prev));
  }
}

}  // namespace strata::testing
