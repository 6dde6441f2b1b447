// Spare reservations (CommitRequest.spare / .rename; issue 15): a one-blob publish through the
// mapped arena asks with its Commit for a spare extent, and the next one-blob publish that fits
// it is copied there and committed with its name: no Reserve. Everything a Reserve would answer
// holds (dedup, sizes, namespaces, tenants); a spare that is gone (expired, daemon restarted)
// costs the publish nothing but the usual route; and nothing stays reserved once the client
// leaves. On the tcp pass publishes go by message and no spare is asked for.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/packed_ids.h"
#include "strata/client.h"
#include "strata/v1/cache.grpc.pb.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/client_calls.h"
#include "tests/support/free_port.h"
#include "tests/support/test_data.h"

namespace strata {
namespace {

using testing::DaemonProcess;
using testing::RandomBlocks;
using testing::Tokens;

constexpr uint32_t kTokensPerBlock = 16;

NamespaceSpec Spec() { return testing::SmallSpec("spare-reservations"); }

// Publishes go through the mapped arena (shared memory), where spares are used.
bool Mapped() {
  const char* tls = std::getenv("UCX_TLS");
  return tls == nullptr || std::string(tls) != "tcp";
}

std::unique_ptr<Client> Connect(const DaemonProcess& d) {
  return testing::ConnectClient(d.endpoint());
}
uint64_t Counter(Client& c, const std::string& name) { return testing::StatsCounter(c, name); }

uint64_t OpenReservations(Client& c) {
  auto stats = c.Stats();
  return stats.ok() ? stats->open_reservations : ~uint64_t{0};
}

// One blob under the first block of `tokens_seed`'s chain; fetched back and compared.
void PublishOneAndFetch(Client& c, const NamespaceId& ns, uint32_t tokens_seed,
                        const std::vector<uint8_t>& blob, BlockStatus want,
                        const std::string& what) {
  const ConstBuffer view{blob.data(), blob.size()};
  auto r = c.Publish(ns, Tokens(kTokensPerBlock, tokens_seed), {&view, 1});
  ASSERT_TRUE(r.ok()) << what << ": " << r.status();
  ASSERT_EQ(r->status.size(), 1u) << what;
  EXPECT_EQ(r->status[0], want) << what;
  std::vector<uint8_t> out(blob.size());
  MutableBuffer buf{out.data(), out.size()};
  auto f = c.Fetch(ns, r->ids, {&buf, 1});
  ASSERT_TRUE(f.ok()) << what << ": " << f.status();
  EXPECT_EQ(f->fetched, 1u) << what;
  EXPECT_EQ(out, blob) << what;
}

TEST(SpareReservationTest, OneBlobPublishesGoIntoSparesWhereTheyFit) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto ns = client->OpenNamespace(Spec(), "t");
  ASSERT_TRUE(ns.ok()) << ns.status();

  // Sizes in order: the first reserves as usual and asks for a spare of its size; a smaller
  // blob fits the spare (its tail goes back); a larger one does not and goes the usual way,
  // asking for a spare of its own size, which the next ones fit.
  const std::vector<size_t> sizes = {65536, 65536, 20000, 65536, 200000, 150000, 200000, 4096};
  const std::vector<bool> fits = {false, true, true, true, false, true, true, true};
  uint32_t seed = 100;
  uint64_t named = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const uint64_t before = Counter(*client, "spares_named_total");
    ++seed;
    PublishOneAndFetch(*client, *ns, seed, RandomBlocks(1, sizes[i], seed)[0], BlockStatus::kOk,
                       absl::StrCat("blob ", i, " of ", sizes[i], " bytes"));
    const uint64_t after = Counter(*client, "spares_named_total");
    EXPECT_EQ(after - before, Mapped() && fits[i] ? 1u : 0u) << "blob " << i;
    named += after - before;
  }
  if (Mapped()) {
    EXPECT_EQ(named, 6u);
    EXPECT_EQ(Counter(*client, "spares_granted_total"), sizes.size());
    // The one spare held is all that is reserved, sized as the largest blob so far.
    auto stats = client->Stats();
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->open_reservations, 1u);
    EXPECT_EQ(stats->host_reserved_bytes, 200000u);
  } else {
    EXPECT_EQ(Counter(*client, "spares_granted_total"), 0u);
    EXPECT_EQ(OpenReservations(*client), 0u);
  }

  // A blob the daemon holds already, published into a spare: deduplicated, nothing stored, and
  // the spare given back (a new one comes with the answer).
  const auto blob = RandomBlocks(1, 8192, 7)[0];
  PublishOneAndFetch(*client, *ns, 500, blob, BlockStatus::kOk, "first copy");
  const uint64_t dedup = Counter(*client, "dedup_blocks_total");
  const ConstBuffer view{blob.data(), blob.size()};
  auto again = client->Publish(*ns, Tokens(kTokensPerBlock, 500), {&view, 1});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->deduplicated, 1u);
  EXPECT_EQ(again->stored, 0u);
  EXPECT_EQ(Counter(*client, "dedup_blocks_total"), dedup + 1);
  EXPECT_EQ(OpenReservations(*client), Mapped() ? 1u : 0u);

  // Chains of several blobs reserve as before and ask for no spare.
  const uint64_t granted = Counter(*client, "spares_granted_total");
  const auto three = RandomBlocks(3, 4096, 9);
  auto chain = client->Publish(*ns, Tokens(3 * kTokensPerBlock, 600), testing::BufferViews(three));
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(chain->stored, 3u);
  EXPECT_EQ(Counter(*client, "spares_granted_total"), granted);

  // The client gone, its spare goes back with it.
  auto observer = Connect(d);
  ASSERT_TRUE(observer);
  client.reset();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (OpenReservations(*observer) != 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(OpenReservations(*observer), 0u);
}

// A spare that is gone by the time a publish would use it costs that publish nothing but the
// usual route: one that expired, and one held in the arena of a daemon since restarted.
TEST(SpareReservationTest, AGoneSpareLeavesThePublishToTheUsualRoute) {
  std::vector<std::string> listen;
  const std::string dir = testing::MakeTempDir("spares");
  std::ofstream(dir + "/secret") << "spare-reservation-secret-0123456789\n";
  const std::string config = "cluster_secret_file: " + dir +
                             "/secret\nreservation_timeout: 1s\nhost_tier:\n  capacity: 64MiB\n";
  auto d = testing::OnFreePort(
      &listen, [&](const auto& l) { return std::make_unique<DaemonProcess>(config, l); });
  ASSERT_TRUE(d->ok()) << d->log();
  auto client = Connect(*d);
  ASSERT_TRUE(client);
  auto ns = client->OpenNamespace(Spec(), "t");
  ASSERT_TRUE(ns.ok()) << ns.status();
  uint32_t seed = 700;
  auto publish = [&](const char* when) {
    const absl::Time t0 = absl::Now();
    ++seed;
    PublishOneAndFetch(*client, *ns, seed, RandomBlocks(1, 32768, seed)[0], BlockStatus::kOk,
                       when);
    EXPECT_LT(absl::Now() - t0, absl::Seconds(2)) << when << ": no deadline waited out";
  };
  publish("asking for a spare");
  publish("into the spare");
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));  // the spare expires
  publish("after the spare expired");
  d.reset();  // SIGKILL, with a spare held
  d = std::make_unique<DaemonProcess>(config, listen);
  ASSERT_TRUE(d->ok()) << d->log();
  publish("right after a restart");
  publish("into the new daemon's spare");
  EXPECT_EQ(Counter(*client, "spares_named_total"), Mapped() ? 1u : 0u);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// A Commit that names a spare's block is checked as a Reserve of that block would be.
TEST(SpareReservationTest, ACommitNamingASpareIsCheckedAsAReserveIs) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = Connect(d);
  ASSERT_TRUE(client);
  auto ns = client->OpenNamespace(Spec(), "t");
  ASSERT_TRUE(ns.ok()) << ns.status();
  auto stub =
      v1::Cache::NewStub(grpc::CreateChannel(d.endpoint(), grpc::InsecureChannelCredentials()));
  auto call = [&](const v1::CommitRequest& req, v1::CommitResponse* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub->Commit(&ctx, req, resp);
  };
  const std::string ns_bytes(ns->AsBytes());
  const BlockId a = ComputeBlockId(*ns, std::vector<uint32_t>{1}),
                b = ComputeBlockId(*ns, std::vector<uint32_t>{2});
  // A spare, asked for by the Commit of an ordinary reservation of an empty-looking block.
  v1::ReserveRequest reserve;
  reserve.set_namespace_id(ns_bytes);
  reserve.set_ids(PackIds(std::vector<BlockId>{a}));
  reserve.add_sizes(4096);
  v1::ReserveResponse reserved;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ASSERT_TRUE(stub->Reserve(&ctx, reserve, &reserved).ok());
  }
  auto spare_for = [&](uint64_t reservation, uint32_t crc) {
    v1::CommitRequest req;
    req.set_reservation_id(reservation);
    req.add_crc32c(crc);
    req.mutable_spare()->set_namespace_id(ns_bytes);
    req.mutable_spare()->set_bytes(4096);
    v1::CommitResponse resp;
    EXPECT_TRUE(call(req, &resp).ok());
    EXPECT_NE(resp.spare().reservation_id(), 0u);
    EXPECT_EQ(resp.spare().status_size(), 1);
    return resp.spare().reservation_id();
  };
  // The bytes were never written: whatever the arena holds there fails its CRC or not; the
  // spare comes either way.
  const uint64_t spare = spare_for(reserved.reservation_id(), 0);
  ASSERT_NE(spare, 0u);

  auto rename = [&](uint64_t reservation, const std::string& ns_raw, std::vector<BlockId> ids,
                    std::vector<uint64_t> sizes, v1::CommitResponse* resp) {
    v1::CommitRequest req;
    req.set_reservation_id(reservation);
    req.add_crc32c(0);
    req.mutable_rename()->set_namespace_id(ns_raw);
    req.mutable_rename()->set_ids(PackIds(ids));
    for (uint64_t s : sizes) req.mutable_rename()->add_sizes(s);
    return call(req, resp);
  };
  v1::CommitResponse resp;
  // Refused with an error, the spare kept: two blocks, a namespace nobody opened, a reservation
  // nobody holds.
  EXPECT_EQ(rename(spare, ns_bytes, {a, b}, {100, 100}, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  const std::string nobody(32, 'x');
  EXPECT_FALSE(rename(spare, nobody, {a}, {100}, &resp).ok());
  EXPECT_EQ(rename(spare + 1, ns_bytes, {a}, {100}, &resp).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(OpenReservations(*client), 1u);
  // Larger than the spare: answered INVALID, and the spare is gone.
  resp.Clear();
  ASSERT_TRUE(rename(spare, ns_bytes, {b}, {4097}, &resp).ok());
  ASSERT_EQ(resp.status_size(), 1);
  EXPECT_EQ(resp.status(0), v1::BLOCK_INVALID);
  EXPECT_EQ(OpenReservations(*client), 0u);
  EXPECT_EQ(rename(spare, ns_bytes, {b}, {100}, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace strata
