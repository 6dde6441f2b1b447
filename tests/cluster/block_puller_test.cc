// The BlockPuller of an in-process node copying blocks from a real stratad on loopback into a
// real host-tier store: bytes intact, held blocks skipped, failures reported per block and
// counted, and a move's removal at the source.
#include "daemon/cluster/block_puller.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "strata/client.h"
#include "tests/cluster/test_node.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/free_port.h"
#include "tests/support/test_data.h"

namespace strata {
namespace {

using testing::DaemonProcess;
using testing::MakeTempDir;
using testing::TestClusterConfig;

constexpr char kSecret[] = "puller-test-secret-0123456789";
constexpr uint32_t kTokensPerBlock = 16;
constexpr size_t kBlockBytes = 64 << 10;
constexpr size_t kBlocks = 8;

NamespaceSpec Spec() { return testing::SmallSpec("puller-test"); }

class BlockPullerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("puller");
    std::ofstream(dir_ + "/secret") << kSecret << "\n";
    source_ = std::make_unique<DaemonProcess>(absl::StrCat(
        "node_id: src\ncluster_secret_file: ", dir_, "/secret\nhost_tier:\n  capacity: 16MiB\n"));
    ASSERT_TRUE(source_->ok()) << source_->log();
    ClientOptions o;
    o.endpoint = source_->endpoint();
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    auto ns = client_->OpenNamespace(Spec(), "tenant-a");
    ASSERT_TRUE(ns.ok()) << ns.status();
    ns_ = *ns;
    blocks_ = testing::RandomBlocks(kBlocks, kBlockBytes, 5);
    std::vector<ConstBuffer> views;
    for (const auto& b : blocks_) views.push_back({b.data(), b.size()});
    auto r = client_->Publish(ns_, testing::Tokens(kBlocks * kTokensPerBlock, 5), views);
    ASSERT_TRUE(r.ok()) << r.status();
    ids_ = r->ids;
    MakeLocal(kSecret);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void MakeLocal(const std::string& secret) {
    puller_.reset();
    namespaces_ = std::make_unique<daemon::NamespaceRegistry>(secret);
    node_ = std::make_unique<testing::TestNode>("local", TestClusterConfig(2));
    node_->announcer->Start();
    puller_ = std::make_unique<daemon::BlockPuller>(*node_->ctx, *node_->store, *namespaces_,
                                                    *node_->announcer);
  }

  std::vector<BlockStatus> Pull(std::span<const BlockId> ids, std::span<const BlockId> parents = {},
                                const std::string& address = "") {
    return puller_->Pull(Spec(), "tenant-a", 0, ids, parents, "src",
                         address.empty() ? source_->endpoint() : address,
                         absl::Now() + absl::Seconds(10));
  }

  std::string dir_;
  std::unique_ptr<DaemonProcess> source_;
  std::unique_ptr<Client> client_;
  NamespaceId ns_;
  std::vector<std::vector<uint8_t>> blocks_;
  std::vector<BlockId> ids_;
  std::unique_ptr<daemon::NamespaceRegistry> namespaces_;
  std::unique_ptr<testing::TestNode> node_;
  std::unique_ptr<daemon::BlockPuller> puller_;
};

TEST_F(BlockPullerTest, CopiesBlocksIntoTheStoreByteForByte) {
  auto st = Pull(ids_);
  for (BlockStatus s : st) EXPECT_EQ(s, BlockStatus::kOk);
  EXPECT_EQ(node_->ctx->counters.pulled.load(), kBlocks);
  AcquireResult a = node_->store->Acquire(ns_, ids_);
  for (size_t i = 0; i < kBlocks; ++i) {
    ASSERT_EQ(a.status[i], BlockStatus::kOk) << i;
    ASSERT_EQ(a.sizes[i], kBlockBytes);
    EXPECT_EQ(
        std::memcmp(node_->store->arena_base() + a.offsets[i], blocks_[i].data(), kBlockBytes), 0)
        << i;
  }
  EXPECT_TRUE(node_->store->Release(a.lease_id).ok());
}

// A block the reservation refuses (here: the same id twice) must not shift where the blocks
// after it are written.
TEST_F(BlockPullerTest, ARefusedBlockDoesNotMoveTheOthersExtents) {
  const std::vector<BlockId> ids = {ids_[0], ids_[0], ids_[1]};
  auto st = Pull(ids);
  EXPECT_EQ(st[0], BlockStatus::kOk);
  EXPECT_NE(st[1], BlockStatus::kOk);
  EXPECT_EQ(st[2], BlockStatus::kOk);
  AcquireResult a = node_->store->Acquire(ns_, {ids_.data(), 2});
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_EQ(a.status[i], BlockStatus::kOk) << i;
    EXPECT_EQ(
        std::memcmp(node_->store->arena_base() + a.offsets[i], blocks_[i].data(), kBlockBytes), 0)
        << i;
  }
  EXPECT_TRUE(node_->store->Release(a.lease_id).ok());
}

TEST_F(BlockPullerTest, BlocksAlreadyHeldAreNotFetchedAgain) {
  Pull(std::span<const BlockId>(ids_).first(3));
  auto st = Pull(ids_);
  for (size_t i = 0; i < kBlocks; ++i)
    EXPECT_EQ(st[i], i < 3 ? BlockStatus::kExists : BlockStatus::kOk) << i;
  EXPECT_EQ(node_->ctx->counters.pulled.load(), kBlocks);
}

// An id held here in another namespace (ids of the vllm scheme carry none) is not the block
// asked for: not answered kExists, which would let a drain or move drop the source's only copy,
// and the other namespace's block stays as it was.
TEST_F(BlockPullerTest, AnIdHeldInAnotherNamespaceIsNotTheBlock) {
  NamespaceId other = ns_;
  other.bytes[0] ^= 1;
  const std::vector<uint8_t> theirs(kBlockBytes, 0x5A);
  ReserveItem item{ids_[0], {}, kBlockBytes};
  ReserveResult rr = node_->store->Reserve(other, {&item, 1});
  ASSERT_EQ(rr.status[0], BlockStatus::kOk);
  std::memcpy(node_->store->arena_base() + rr.offsets[0], theirs.data(), kBlockBytes);
  const uint32_t crc = Crc32c(theirs.data(), kBlockBytes);
  auto c = node_->store->Commit(rr.reservation_id, {&crc, 1});
  ASSERT_TRUE(c.ok() && (*c)[0] == BlockStatus::kOk);

  auto st = Pull(std::span<const BlockId>(ids_).first(2));
  EXPECT_NE(st[0], BlockStatus::kExists);
  EXPECT_NE(st[0], BlockStatus::kOk);
  EXPECT_EQ(st[1], BlockStatus::kOk);
  AcquireResult a = node_->store->Acquire(other, {ids_.data(), 1});
  ASSERT_EQ(a.status[0], BlockStatus::kOk);
  EXPECT_EQ(std::memcmp(node_->store->arena_base() + a.offsets[0], theirs.data(), kBlockBytes), 0);
  EXPECT_TRUE(node_->store->Release(a.lease_id).ok());
}

TEST_F(BlockPullerTest, ParentsComeAlong) {
  std::vector<BlockId> parents = {BlockId{}};
  for (size_t i = 1; i < kBlocks; ++i) parents.push_back(ids_[i - 1]);
  Pull(ids_, parents);
  auto info = node_->store->Inspect(ids_);
  ASSERT_EQ(info.size(), kBlocks);
  for (const BlockInfo& b : info) {
    size_t i = std::find(ids_.begin(), ids_.end(), b.id) - ids_.begin();
    EXPECT_EQ(b.parent, parents[i]) << i;
  }
  // The chain is whole here: a cascade from the first block removes every one.
  EXPECT_EQ(node_->store->Evict(ns_, {&ids_[0], 1}, /*cascade=*/true, false).removed_blocks,
            kBlocks);
}

TEST_F(BlockPullerTest, AnUnreachableSourceIsReportedAndCounted) {
  auto st = Pull(ids_, {}, absl::StrCat("127.0.0.1:", testing::FreePort()));
  for (BlockStatus s : st) EXPECT_EQ(s, BlockStatus::kNotFound);
  EXPECT_EQ(node_->ctx->counters.peer_failures.load(), 1u);
  EXPECT_EQ(node_->store->Stats().host.blocks, 0u);
}

TEST_F(BlockPullerTest, ASourceWithAnotherClusterSecretIsRefused) {
  MakeLocal("another-secret-0123456789abcdef");
  auto st = Pull(ids_);
  for (BlockStatus s : st) EXPECT_EQ(s, BlockStatus::kNotFound);
  EXPECT_EQ(node_->store->Stats().host.blocks, 0u);
}

TEST_F(BlockPullerTest, ANamespaceThatCannotOpenHereIsInvalid) {
  auto st = puller_->Pull(Spec(), /*tenant=*/"", 0, ids_, {}, "src", source_->endpoint(),
                          absl::Now() + absl::Seconds(5));
  for (BlockStatus s : st) EXPECT_EQ(s, BlockStatus::kInvalid);
}

TEST_F(BlockPullerTest, EvictAtSourceRemovesTheBlocksThere) {
  auto entry = namespaces_->Find(*namespaces_->Open(Spec(), "tenant-a"));
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(puller_->EvictAtSource("src", source_->endpoint(), *entry,
                                   std::span<const BlockId>(ids_).first(3)),
            3u);
  auto left = client_->LookupIds(ns_, ids_);
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(*left, 0u) << "the first block of the prefix is gone";
  EXPECT_EQ(
      puller_->EvictAtSource("src", absl::StrCat("127.0.0.1:", testing::FreePort()), *entry, ids_),
      0u);
}

}  // namespace
}  // namespace strata
