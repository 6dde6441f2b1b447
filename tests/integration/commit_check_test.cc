// Commit re-reads published blocks unless the client wrote them through its own mapping of the
// arena, taking each CRC in the same pass (CommitRequest.crcs_taken_while_writing): a daemon
// whose clients may map the arena trusts those CRCs, one whose clients may not ignores the claim.
// Either way a reader still checks every block against its CRC.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "tests/integration/auth_fixture.h"

namespace strata {
namespace {

using namespace auth_fixture;  // NOLINT(build/namespaces): the shared fixture of these tests

// Reserves one 4 KiB block of `ns` (as `token`) and commits it with a CRC that is not the
// CRC of what the arena holds; returns the block's commit status.
v1::BlockStatus CommitWithWrongCrc(const DaemonProcess& d, const std::string& token,
                                   const NamespaceId& ns, const BlockId& id, bool claim) {
  auto cache = v1::Cache::NewStub(Channel(d));
  v1::ReserveRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_ids(std::string(id.AsBytes()));
  req.add_sizes(4096);
  v1::ReserveResponse res;
  grpc::Status s = cache->Reserve(Ctx(token).get(), req, &res);
  EXPECT_TRUE(s.ok()) << s.error_message();
  if (!s.ok() || res.status_size() != 1 || res.status(0) != v1::BLOCK_OK) return v1::BLOCK_INVALID;
  v1::CommitRequest commit;
  commit.set_reservation_id(res.reservation_id());
  commit.add_crc32c(0xDEADBEEF);
  commit.set_crcs_taken_while_writing(claim);
  v1::CommitResponse cr;
  s = cache->Commit(Ctx(token).get(), commit, &cr);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return s.ok() && cr.status_size() == 1 ? cr.status(0) : v1::BLOCK_INVALID;
}

TEST(CommitCheckTest, WhereClientsMapTheArenaTheWritersCrcIsKeptAndReadersCatchAMismatch) {
  DaemonProcess d("host_tier:\n  capacity: 64MiB\n");  // no authentication: clients map the arena
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = ConnectAs(d, "");
  ASSERT_TRUE(client);
  auto ns = client->OpenNamespace(Spec(), "t");
  ASSERT_TRUE(ns.ok()) << ns.status();
  const auto ids = ComputeBlockIds(*ns, kTokensPerBlock, testing::Tokens(2 * kTokensPerBlock, 5));

  // Without the claim the daemon reads the block and refuses it.
  EXPECT_EQ(CommitWithWrongCrc(d, "", *ns, ids[0], /*claim=*/false), v1::BLOCK_CRC_MISMATCH);
  // With it the CRC is recorded unread; the block is stored...
  EXPECT_EQ(CommitWithWrongCrc(d, "", *ns, ids[1], /*claim=*/true), v1::BLOCK_OK);
  // ... and a fetch, which checks it, reports the mismatch instead of handing out the bytes.
  std::vector<uint8_t> out(4096);
  MutableBuffer buf{out.data(), out.size()};
  auto f = client->Fetch(*ns, {&ids[1], 1}, {&buf, 1});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->status[0], BlockStatus::kCrcMismatch);

  // A real publish through the mapping round-trips intact (its CRCs are those of its bytes).
  const auto blocks = testing::RandomBlocks(3, 1 << 20, 11);
  std::vector<ConstBuffer> views;
  for (const auto& b : blocks) views.push_back({b.data(), b.size()});
  auto pub = client->Publish(*ns, testing::Tokens(3 * kTokensPerBlock, 9), views);
  ASSERT_TRUE(pub.ok()) << pub.status();
  ASSERT_EQ(pub->stored, 3u);
  std::vector<std::vector<uint8_t>> back(3, std::vector<uint8_t>(1 << 20));
  std::vector<MutableBuffer> bufs;
  for (auto& b : back) bufs.push_back({b.data(), b.size()});
  auto g = client->Fetch(*ns, pub->ids, bufs);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->fetched, 3u);
  EXPECT_EQ(back, blocks);
}

TEST(CommitCheckTest, WhereClientsDoNotMapTheArenaTheClaimIsIgnored) {
  auto d = AuthDaemon();  // two tenants: nothing is mapped, blocks arrive by checked messages
  ASSERT_TRUE(d->ok()) << d->log();
  auto a = ConnectAs(*d, kTokenA);
  ASSERT_TRUE(a);
  auto ns = a->OpenNamespace(Spec(), "");
  ASSERT_TRUE(ns.ok()) << ns.status();
  const auto ids = ComputeBlockIds(*ns, kTokensPerBlock, testing::Tokens(kTokensPerBlock, 6));
  EXPECT_EQ(CommitWithWrongCrc(*d, kTokenA, *ns, ids[0], /*claim=*/true), v1::BLOCK_CRC_MISMATCH);
}

}  // namespace
}  // namespace strata
