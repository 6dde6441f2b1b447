// The parts of libstrata against a real stratad, without a Client: what a daemon copying blocks
// from another daemon does (a DaemonLink to the source; or its control channel and data mover,
// landing blocks in memory of its own).
#include "client/daemon_link.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/crc32c.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/test_data.h"

namespace strata::client {
namespace {

using testing::DaemonProcess;
using testing::RandomBlocks;
using testing::Tokens;

constexpr uint32_t kTokensPerBlock = 16;

NamespaceSpec Spec() { return testing::SmallSpec("link-test"); }

std::unique_ptr<DaemonLink> LinkTo(const DaemonProcess& d, bool same_node = true) {
  ClientOptions o;
  o.endpoint = d.endpoint();
  o.client_name = "daemon-link-test";
  o.same_node = same_node;
  o.remote_fetch = false;
  auto link = DaemonLink::Connect(o);
  EXPECT_TRUE(link.ok()) << link.status();
  return link.ok() ? std::move(*link) : nullptr;
}

// Opens the test namespace through `link` (the test fails when it cannot).
NamespaceId OpenTestNamespace(DaemonLink& link) {
  auto ns = link.control().OpenNamespace(Spec(), "tenant");
  EXPECT_TRUE(ns.ok()) << ns.status();
  return ns.ok() ? *ns : NamespaceId{};
}

// Blobs published through one link are fetched as stored through another, as a daemon pulling
// from a source would; a missing id is a per-block miss.
TEST(DaemonLinkTest, FetchesBlobsWithoutAClient) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto writer = LinkTo(d);
  ASSERT_TRUE(writer);
  const NamespaceId ns = OpenTestNamespace(*writer);
  std::vector<BlockId> ids = ComputeBlockIds(ns, kTokensPerBlock, Tokens(4 * kTokensPerBlock, 1));
  auto blocks = RandomBlocks(3, 40000, 2);
  std::vector<BlockId> parents = {BlockId{}, ids[0], ids[1]};
  auto pub = writer->PublishBlobs(ns, std::span(ids).first(3), parents, testing::BufferViews(blocks));
  ASSERT_TRUE(pub.ok()) << pub.status();
  EXPECT_EQ(pub->stored, 3u);
  EXPECT_EQ(pub->bytes_sent, 3u * 40000);
  const std::vector<ConstBuffer> views = testing::BufferViews(blocks);
  auto again = writer->PublishBlobs(ns, std::span(ids).first(1), {}, std::span(views).first(1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->deduplicated, 1u);

  // Another node's view: no shared memory, so the bytes travel by push or RMA.
  auto reader = LinkTo(d, /*same_node=*/false);
  ASSERT_TRUE(reader);
  auto there = reader->control().OpenNamespace(Spec(), "tenant");
  ASSERT_TRUE(there.ok() && *there == ns);
  std::vector<std::vector<uint8_t>> blobs;
  FetchLanding into;
  into.blobs = &blobs;
  auto got = reader->Fetch(ns, ids, into);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->fetched, 3u);
  EXPECT_EQ(got->status[3], BlockStatus::kNotFound);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(blobs[i], blocks[i]) << "block " << i;
  EXPECT_TRUE(blobs[3].empty());
}

// The lower level: acquire a lease, move the leased extents into registered memory of the
// caller's choosing (a daemon would reserve them in its own arena), release.
TEST(DaemonLinkTest, ControlAndMoverLandBlocksInTheCallersMemory) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto link = LinkTo(d);
  ASSERT_TRUE(link);
  const NamespaceId ns = OpenTestNamespace(*link);
  std::vector<BlockId> ids = ComputeBlockIds(ns, kTokensPerBlock, Tokens(2 * kTokensPerBlock, 3));
  auto blocks = RandomBlocks(2, 1 << 20, 4);
  ASSERT_EQ(link->PublishBlobs(ns, ids, {}, testing::BufferViews(blocks))->stored, 2u);

  auto lease = link->control().Acquire(ns, ids);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_NE(lease->id, 0u);
  std::vector<uint8_t> landing(2 << 20);
  ASSERT_TRUE(link->mover().RegisterBuffer(landing.data(), landing.size()).ok());
  std::vector<BlockMove> moves;
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(lease->status[i], BlockStatus::kOk);
    EXPECT_EQ(lease->crc32c[i], Crc32c(blocks[i].data(), blocks[i].size()));
    moves.push_back(
        {landing.data() + (i << 20), lease->sizes[i], lease->offsets[i], lease->crc32c[i]});
  }
  auto moved = link->mover().Get(lease->id, moves, /*verify=*/true, lease->expires_in);
  link->control().ReleaseAsync(lease->id);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->intact, (std::vector<uint8_t>{1, 1}));
  for (size_t i = 0; i < 2; ++i)
    EXPECT_TRUE(std::equal(blocks[i].begin(), blocks[i].end(), landing.begin() + (i << 20)));
  EXPECT_TRUE(link->mover().UnregisterBuffer(landing.data()).ok());
}

}  // namespace
}  // namespace strata::client
