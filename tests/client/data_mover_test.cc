// The data mover against a real UCX peer on loopback (tests/client/fake_daemon.h) in this
// process. The mover itself runs unmodified.
#include "client/data_mover.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/am_wire.h"
#include "common/crc32c.h"
#include "tests/client/fake_daemon.h"
#include "tests/support/scoped_env.h"
#include "transport/ucx.h"

namespace strata::client {
namespace {

struct Dialed {
  std::unique_ptr<DataMover> mover;
  std::shared_ptr<std::atomic<int>> dials = std::make_shared<std::atomic<int>>(0);
};

Dialed ConnectTo(FakeDaemon& daemon, DataMoverOptions options = {}) {
  Dialed d;
  auto dials = d.dials;
  auto made = DataMover::Connect(std::move(options), [&daemon, dials] {
    ++*dials;
    return absl::StatusOr<ArenaEndpoint>(daemon.endpoint());
  });
  EXPECT_TRUE(made.ok()) << made.status();
  if (made.ok()) d.mover = std::move(*made);
  return d;
}

// A mover whose daemon hands out no key: published blocks go by message.
std::unique_ptr<DataMover> ConnectByMessage(FakeDaemon& daemon) {
  auto made = DataMover::Connect({}, [&daemon] {
    ArenaEndpoint e = daemon.endpoint();
    e.rma = false;
    e.publish_by_message = true;
    return absl::StatusOr<ArenaEndpoint>(e);
  });
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? std::move(*made) : nullptr;
}

// A follow-up (a lookup request carrying "commit", answered "pong" + it by the fake daemon)
// that records the CRCs it was made from in `seen`.
FollowUpFor CommitRecordingCrcs(std::vector<uint32_t>* seen) {
  return [seen](std::span<const uint32_t> crcs) {
    seen->assign(crcs.begin(), crcs.end());
    return std::optional<FollowUp>(
        FollowUp{am_wire::kLookupRequestAm, am_wire::kLookupReplyAm, std::string(8, '\0'),
                 "commit"});
  };
}

// Blocks laid out back to back in the arena from `start`, with their sources.
struct Blocks {
  std::vector<std::vector<uint8_t>> data;
  std::vector<BlockMove> puts;

  Blocks(const std::vector<size_t>& sizes, uint64_t start, uint32_t seed) {
    uint64_t offset = start;
    for (size_t i = 0; i < sizes.size(); ++i) data.push_back(RandomBytes(sizes[i], seed + i));
    for (auto& d : data) {
      puts.push_back({d.data(), d.size(), offset, Crc32c(d.data(), d.size())});
      offset += (d.size() + 4095) & ~uint64_t{4095};
    }
  }
  void CopyInto(uint8_t* arena) const {
    for (size_t i = 0; i < data.size(); ++i)
      std::memcpy(arena + puts[i].arena_offset, data[i].data(), data[i].size());
  }
  // Gets of every block into `out`, expecting the CRCs of the originals.
  std::vector<BlockMove> Gets(std::vector<std::vector<uint8_t>>* out) const {
    out->clear();
    std::vector<BlockMove> gets;
    for (const auto& p : puts) {
      out->emplace_back(p.length, 0);
      gets.push_back({out->back().data(), p.length, p.arena_offset, p.crc32c});
    }
    for (size_t i = 0; i < gets.size(); ++i) gets[i].local = (*out)[i].data();
    return gets;
  }
};

constexpr absl::Duration kLease = absl::Seconds(30);

// Fetched bytes written around the caches (non-temporal stores) or through them.
class DataMoverBypassTest : public ::testing::TestWithParam<bool> {
 protected:
  bool Around() const { return GetParam(); }
};

INSTANTIATE_TEST_SUITE_P(CacheOrNot, DataMoverBypassTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Bypassing" : "Cached";
                         });

TEST_P(DataMoverBypassTest, MappedArenaCopiesAndChecksumsInOnePass) {
  FakeDaemon daemon(FakeDaemon::ArenaKind::kAllocated, 6 << 20);
  auto d = ConnectTo(daemon);
  ASSERT_TRUE(d.mover);
  ASSERT_EQ(d.mover->route(DataMover::Direction::kGet), Route::kMapped)
      << "UCX did not map a same-node arena it allocated (shared-memory transports missing?)";
  ASSERT_EQ(d.mover->route(DataMover::Direction::kPut), Route::kMapped);
  // One byte, one block under a copy piece, one over two pieces (2 MiB each).
  Blocks blocks({1, 100 << 10, (5 << 20) / 2}, 4096, 1);
  auto put = d.mover->Put(0, blocks.puts, kLease);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->route, Route::kMapped);
  for (size_t i = 0; i < blocks.data.size(); ++i) {
    EXPECT_EQ(put->crc32c[i], blocks.puts[i].crc32c) << "block " << i;
    EXPECT_EQ(std::memcmp(daemon.arena() + blocks.puts[i].arena_offset, blocks.data[i].data(),
                          blocks.data[i].size()),
              0)
        << "block " << i;
  }
  daemon.arena()[blocks.puts[2].arena_offset + (3 << 20) / 2] ^= 0x40;  // in its second piece
  std::vector<std::vector<uint8_t>> out;
  auto got = d.mover->Get(0, blocks.Gets(&out), /*verify=*/true, kLease, 0, Around());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->route, Route::kMapped);
  EXPECT_EQ(got->intact, (std::vector<uint8_t>{1, 1, 0}));
  EXPECT_EQ(out[0], blocks.data[0]);
  EXPECT_EQ(out[1], blocks.data[1]);
  EXPECT_NE(out[2], blocks.data[2]);
  // Unverified: nothing is flagged.
  got = d.mover->Get(0, blocks.Gets(&out), /*verify=*/false, kLease, 0, Around());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->intact, (std::vector<uint8_t>{1, 1, 1}));
  EXPECT_EQ(out[1], blocks.data[1]);
  // Into a destination off a 64-byte line (an engine's buffer at any offset).
  std::vector<uint8_t> odd(blocks.data[1].size() + 64 + 5);
  uint8_t* const at =
      odd.data() + (64 - reinterpret_cast<uintptr_t>(odd.data()) % 64) % 64 + 5;
  BlockMove move = blocks.puts[1];
  move.local = at;
  got = d.mover->Get(0, {&move, 1}, /*verify=*/true, kLease, 0, Around());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->intact, (std::vector<uint8_t>{1}));
  EXPECT_EQ(std::memcmp(at, blocks.data[1].data(), blocks.data[1].size()), 0);
}

// Enough bytes (over two 4 MiB chunks) that CRC checks run on the helper thread while later
// chunks still move.
// A daemon restarted on the same address is another instance with another arena; over shared
// memory nothing fails to tell (the dead one's arena stays mapped). The instance named by a
// reservation or lease makes the mover dial again, so bytes land in the arena that handed out
// the extents, never in the dead one's.
TEST(DataMoverTest, ExtentsOfAnotherDaemonInstanceAreMovedOnlyAfterDialingAgain) {
  FakeDaemon first(FakeDaemon::ArenaKind::kAllocated, 1 << 20);
  FakeDaemon second(FakeDaemon::ArenaKind::kAllocated, 1 << 20);
  std::atomic<int> serving{1};
  auto dials = std::make_shared<std::atomic<int>>(0);
  auto made = DataMover::Connect({}, [&, dials] {
    ++*dials;
    ArenaEndpoint e = serving == 1 ? first.endpoint() : second.endpoint();
    e.instance_id = serving.load();
    return absl::StatusOr<ArenaEndpoint>(e);
  });
  ASSERT_TRUE(made.ok()) << made.status();
  auto& mover = *made;
  Blocks blocks({10 << 10}, 4096, 7);
  ASSERT_TRUE(mover->Put(0, blocks.puts, kLease, /*instance_id=*/1).ok());
  EXPECT_EQ(*dials, 1);
  serving = 2;  // the daemon restarted: its next answers name instance 2
  auto put = mover->Put(0, blocks.puts, kLease, 2);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(*dials, 2);
  EXPECT_EQ(std::memcmp(second.arena() + blocks.puts[0].arena_offset, blocks.data[0].data(),
                        blocks.data[0].size()),
            0);
  std::vector<std::vector<uint8_t>> out;
  auto got = mover->Get(0, blocks.Gets(&out), /*verify=*/true, kLease, 2);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->intact, (std::vector<uint8_t>{1}));
  EXPECT_EQ(*dials, 2) << "the same instance: no new dial";
  // A lease of the instance that is gone (granted just before the restart) fails clearly.
  auto stale = mover->Get(0, blocks.Gets(&out), true, kLease, 1);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kUnavailable) << stale.status();
  // 0: a daemon that does not say; nothing is checked.
  EXPECT_TRUE(mover->Get(0, blocks.Gets(&out), true, kLease, 0).ok());
}

TEST(DataMoverTest, RmaMovesBytesAndFlagsCorruptBlocksWhilePipelining) {
  FakeDaemon daemon(FakeDaemon::ArenaKind::kRegistered, 12 << 20);
  DataMoverOptions o;
  o.fetch_transfer = "rma";
  auto d = ConnectTo(daemon, o);
  ASSERT_TRUE(d.mover);
  ASSERT_EQ(d.mover->route(DataMover::Direction::kGet), Route::kRma);
  Blocks blocks(std::vector<size_t>(6, (3 << 20) / 2), 0, 10);
  std::vector<uint8_t> registered(1 << 20);  // a registered source takes the memh path
  ASSERT_TRUE(d.mover->RegisterBuffer(registered.data(), registered.size()).ok());
  auto put = d.mover->Put(0, blocks.puts, kLease);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->route, Route::kRma);
  daemon.SettleArena();
  for (size_t i = 0; i < blocks.data.size(); ++i) {
    EXPECT_EQ(put->crc32c[i], blocks.puts[i].crc32c);
    EXPECT_EQ(std::memcmp(daemon.arena() + blocks.puts[i].arena_offset, blocks.data[i].data(),
                          blocks.data[i].size()),
              0)
        << "block " << i;
  }
  daemon.arena()[blocks.puts[1].arena_offset] ^= 1;
  daemon.arena()[blocks.puts[4].arena_offset + blocks.puts[4].length - 1] ^= 1;
  daemon.SettleArena();
  std::vector<std::vector<uint8_t>> out;
  auto got = d.mover->Get(0, blocks.Gets(&out), /*verify=*/true, kLease);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->route, Route::kRma);
  EXPECT_EQ(got->intact, (std::vector<uint8_t>{1, 0, 1, 1, 0, 1}));
  for (size_t i : {0, 2, 3, 5}) EXPECT_EQ(out[i], blocks.data[i]) << "block " << i;
  EXPECT_TRUE(d.mover->UnregisterBuffer(registered.data()).ok());
  EXPECT_EQ(d.mover->UnregisterBuffer(registered.data()).code(), absl::StatusCode::kNotFound);
}

// Small blocks arrive eagerly (copied), large ones by rendezvous straight into the buffer.
TEST_P(DataMoverBypassTest, PushReceivesEagerAndRendezvousBlocksAndFlagsCorruptOnes) {
  FakeDaemon daemon(FakeDaemon::ArenaKind::kRegistered, 4 << 20);
  DataMoverOptions o;
  o.fetch_transfer = "push";
  auto d = ConnectTo(daemon, o);
  ASSERT_TRUE(d.mover);
  ASSERT_EQ(d.mover->route(DataMover::Direction::kGet), Route::kPush);
  // Publishing never goes by push: the ladder puts by RMA.
  ASSERT_EQ(d.mover->route(DataMover::Direction::kPut), Route::kRma);
  Blocks blocks({1000, 1 << 20, 3000, (3 << 20) / 2}, 0, 20);
  blocks.CopyInto(daemon.arena());
  daemon.arena()[blocks.puts[2].arena_offset + 7] ^= 1;  // an eager one
  daemon.arena()[blocks.puts[3].arena_offset + 7] ^= 1;  // a rendezvous one
  std::vector<std::vector<uint8_t>> out;
  auto got =
      d.mover->Get(/*lease_id=*/77, blocks.Gets(&out), /*verify=*/true, kLease, 0, Around());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->route, Route::kPush);
  EXPECT_EQ(daemon.pushed.load(), 4);
  EXPECT_EQ(daemon.last_lease.load(), 77u);
  EXPECT_EQ(got->intact, (std::vector<uint8_t>{1, 1, 0, 0}));
  EXPECT_EQ(out[0], blocks.data[0]);
  EXPECT_EQ(out[1], blocks.data[1]);
}

// Over tcp, blocks larger than a receive segment come in pieces, each copied into place and
// checked as it arrives; in any order. A piece that comes twice fails the fetch.
TEST_P(DataMoverBypassTest, PushOverTcpTakesLargeBlocksInPiecesInAnyOrder) {
  ::strata::testing::ScopedEnv tcp_only("UCX_TLS", "tcp");  // read by each new UCX context
  ::strata::testing::ScopedEnv segment("UCX_TCP_RX_SEG_SIZE", "64K");  // UCX's default
  FakeDaemon daemon(FakeDaemon::ArenaKind::kRegistered, 8 << 20);
  DataMoverOptions o;
  o.fetch_transfer = "push";
  auto d = ConnectTo(daemon, o);
  ASSERT_TRUE(d.mover);
  const uint32_t piece = d.mover->push_piece_bytes();
  // What fits one receive segment.
  EXPECT_EQ(piece, (64 << 10) - DataMover::kPieceHeadroom);
  // Whole, 2 pieces (a 64 KiB block: two of 32 KiB), 17, 25, and 5 pieces.
  Blocks blocks({1000, 64 << 10, 1 << 20, (3 << 20) / 2 + 17, 300000}, 0, 70);
  blocks.CopyInto(daemon.arena());
  daemon.arena()[blocks.puts[2].arena_offset + 900000] ^= 1;  // in a late piece
  daemon.arena()[blocks.puts[4].arena_offset + 3] ^= 1;       // in the first
  for (auto order : {FakeDaemon::Pieces::kInOrder, FakeDaemon::Pieces::kReversed}) {
    daemon.pieces = order;
    daemon.pieces_sent = 0;
    daemon.SettleArena();
    std::vector<std::vector<uint8_t>> out;
    auto got = d.mover->Get(1, blocks.Gets(&out), /*verify=*/true, kLease, 0, Around());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(daemon.last_piece_bytes.load(), piece);
    EXPECT_EQ(daemon.pieces_sent.load(), 2 + 17 + 25 + 5);
    EXPECT_EQ(got->intact, (std::vector<uint8_t>{1, 1, 0, 1, 0}));
    for (size_t i : {0, 1, 3}) EXPECT_EQ(out[i], blocks.data[i]) << "block " << i;
    // The damaged block's other bytes landed too.
    EXPECT_EQ(0, std::memcmp(out[2].data(), blocks.data[2].data(), 900000));
  }
  daemon.pieces = FakeDaemon::Pieces::kFirstTwice;
  std::vector<std::vector<uint8_t>> out;
  auto got = d.mover->Get(2, blocks.Gets(&out), true, kLease, 0, Around());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal) << got.status();
  EXPECT_NE(got.status().message().find("came twice"), std::string::npos) << got.status();
}

// Over tcp a block larger than the eager limit is published in pieces, all eager: the
// follow-up (a Commit) goes right behind them, and the daemon has written every block before it
// reads it. Without pieces such a block goes by rendezvous and nothing follows it.
TEST(DataMoverTest, PublishOverTcpSendsLargeBlocksInPiecesWithTheFollowUpBehind) {
  ::strata::testing::ScopedEnv tcp_only("UCX_TLS", "tcp");
  ::strata::testing::ScopedEnv segment("UCX_TCP_RX_SEG_SIZE", "64K");
  FakeDaemon daemon(FakeDaemon::ArenaKind::kRegistered, 8 << 20);
  Dialed d;
  d.mover = ConnectByMessage(daemon);
  ASSERT_TRUE(d.mover);
  ASSERT_EQ(d.mover->route(DataMover::Direction::kPut), Route::kPush);
  daemon.hold_publish_acks = true;  // released by the follow-up: it must come after them all
  // Whole (eager), 5 pieces, 17 pieces.
  Blocks blocks({1000, 300000, (1 << 20) + 17}, 0, 90);
  std::vector<uint32_t> crcs_seen;
  auto put = d.mover->Put(/*reservation_id=*/9, blocks.puts, absl::Seconds(5), 0,
                          CommitRecordingCrcs(&crcs_seen));
  ASSERT_TRUE(put.ok()) << put.status();
  ASSERT_TRUE(put->follow_up_reply.has_value());
  ASSERT_TRUE(put->follow_up_reply->ok()) << put->follow_up_reply->status();
  EXPECT_EQ(daemon.published_pieces.load(), 5 + 17);
  EXPECT_EQ(daemon.published_before_lookup.load(), 3);
  ASSERT_EQ(crcs_seen.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(crcs_seen[i], blocks.puts[i].crc32c) << i;
  EXPECT_EQ(put->crc32c, crcs_seen);
  daemon.SettleArena();
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(0, std::memcmp(daemon.arena() + blocks.puts[i].arena_offset, blocks.data[i].data(),
                             blocks.data[i].size()))
        << i;
}

// Pieces are asked for only where configured and offered: 0 or a daemon that does not offer
// them gets whole blocks.
TEST(DataMoverTest, PushInPiecesOnlyWhereAskedAndOffered) {
  ::strata::testing::ScopedEnv tcp_only("UCX_TLS", "tcp");
  for (int c = 0; c < 3; ++c) {
    FakeDaemon daemon(FakeDaemon::ArenaKind::kRegistered, 4 << 20);
    DataMoverOptions o;
    o.fetch_transfer = "push";
    if (c == 0) o.push_piece_bytes = 0;
    if (c == 1) daemon.offer_pieces = false;
    if (c == 2) o.push_piece_bytes = 100000;  // a size of one's own
    auto d = ConnectTo(daemon, o);
    ASSERT_TRUE(d.mover);
    EXPECT_EQ(d.mover->push_piece_bytes(), c == 2 ? 100000u : 0u) << c;
    Blocks blocks({1 << 20, 5000}, 0, 80);
    blocks.CopyInto(daemon.arena());
    daemon.SettleArena();
    std::vector<std::vector<uint8_t>> out;
    auto got = d.mover->Get(1, blocks.Gets(&out), true, kLease);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->intact, (std::vector<uint8_t>{1, 1}));
    EXPECT_EQ(out[0], blocks.data[0]);
    EXPECT_EQ(daemon.pieces_sent.load(), c == 2 ? 11 : 0) << c;
  }
}

TEST(DataMoverTest, LadderPrefersMappedThenPushWithoutRdmaThenRma) {
  FakeDaemon mapped(FakeDaemon::ArenaKind::kAllocated, 1 << 20);
  FakeDaemon unmapped(FakeDaemon::ArenaKind::kRegistered, 1 << 20);
  struct Case {
    FakeDaemon* daemon;
    std::string mode;
    bool rdma;
    Route get, put;
  };
  for (const Case& c : {Case{&mapped, "push", false, Route::kMapped, Route::kMapped},
                        Case{&mapped, "rma", true, Route::kMapped, Route::kMapped},
                        Case{&unmapped, "auto", false, Route::kPush, Route::kRma},
                        Case{&unmapped, "auto", true, Route::kRma, Route::kRma},
                        Case{&unmapped, "push", true, Route::kPush, Route::kRma},
                        Case{&unmapped, "rma", false, Route::kRma, Route::kRma}}) {
    DataMoverOptions o;
    o.fetch_transfer = c.mode;
    o.rdma_device = c.rdma;
    auto d = ConnectTo(*c.daemon, o);
    ASSERT_TRUE(d.mover);
    const std::string what = c.mode + (c.rdma ? " with" : " without") + " RDMA, " +
                             (c.daemon == &mapped ? "mapped" : "unmapped");
    EXPECT_EQ(RouteName(d.mover->route(DataMover::Direction::kGet)), RouteName(c.get)) << what;
    EXPECT_EQ(RouteName(d.mover->route(DataMover::Direction::kPut)), RouteName(c.put)) << what;
  }
}

// A daemon that takes the request and never sends a block: the fetch ends at its deadline, and
// the next one dials again (the endpoint was aborted so no late block lands).
TEST(DataMoverTest, SilentPushPeerFailsAtTheDeadlineAndTheNextFetchRedials) {
  FakeDaemon daemon(FakeDaemon::ArenaKind::kRegistered, 2 << 20);
  DataMoverOptions o;
  o.fetch_transfer = "push";
  o.transfer_timeout = absl::Milliseconds(500);
  auto d = ConnectTo(daemon, o);
  ASSERT_TRUE(d.mover);
  Blocks blocks({4096, 512 << 10}, 0, 30);
  blocks.CopyInto(daemon.arena());
  daemon.on_fetch = FakeDaemon::OnFetch::kIgnore;
  std::vector<std::vector<uint8_t>> out;
  const absl::Time t0 = absl::Now();
  auto got = d.mover->Get(1, blocks.Gets(&out), true, kLease);
  const absl::Duration took = absl::Now() - t0;
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_NE(got.status().message().find("fetch transfer failed"), std::string::npos);
  EXPECT_GE(took, absl::Milliseconds(450));
  EXPECT_LT(took, absl::Seconds(3));
  EXPECT_EQ(d.dials->load(), 1);

  daemon.on_fetch = FakeDaemon::OnFetch::kPush;
  got = d.mover->Get(2, blocks.Gets(&out), true, kLease);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->intact, (std::vector<uint8_t>{1, 1}));
  EXPECT_EQ(out[1], blocks.data[1]);
  EXPECT_EQ(d.dials->load(), 2);
}

// The deadline is the shorter of transfer_timeout and 80% of what the lease has left.
TEST(DataMoverTest, ShortLeaseBoundsThePushDeadline) {
  FakeDaemon daemon(FakeDaemon::ArenaKind::kRegistered, 1 << 20);
  DataMoverOptions o;
  o.fetch_transfer = "push";
  auto d = ConnectTo(daemon, o);
  ASSERT_TRUE(d.mover);
  daemon.on_fetch = FakeDaemon::OnFetch::kIgnore;
  Blocks blocks({4096}, 0, 40);
  std::vector<std::vector<uint8_t>> out;
  const absl::Time t0 = absl::Now();
  auto got = d.mover->Get(1, blocks.Gets(&out), true, absl::Milliseconds(250));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
}

TEST(DataMoverTest, RefusedPushIsReportedWithTheDaemonsCode) {
  FakeDaemon daemon(FakeDaemon::ArenaKind::kRegistered, 1 << 20);
  DataMoverOptions o;
  o.fetch_transfer = "push";
  auto d = ConnectTo(daemon, o);
  ASSERT_TRUE(d.mover);
  daemon.on_fetch = FakeDaemon::OnFetch::kRefuse;
  Blocks blocks({4096}, 0, 50);
  std::vector<std::vector<uint8_t>> out;
  auto got = d.mover->Get(1, blocks.Gets(&out), true, kLease);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
  EXPECT_NE(got.status().message().find("lease expired"), std::string::npos) << got.status();
}

// RMA to a peer whose worker nobody progresses: over TCP (UCX emulates RMA with messages the
// peer must answer) nothing completes, and the transfer must end at its deadline. Once the peer
// progresses again, the next transfer dials a new endpoint and succeeds.
TEST(DataMoverTest, RmaToAStalledPeerFailsAtTheDeadlineThenRecovers) {
  ::strata::testing::ScopedEnv tcp_only("UCX_TLS", "tcp");  // read by each new UCX context
  {
    FakeDaemon daemon(FakeDaemon::ArenaKind::kRegistered, 1 << 20, /*progress=*/false);
    DataMoverOptions o;
    o.fetch_transfer = "rma";
    o.transfer_timeout = absl::Milliseconds(500);
    auto d = ConnectTo(daemon, o);
    ASSERT_TRUE(d.mover);
    Blocks blocks({64 << 10, 64 << 10}, 0, 60);
    std::vector<std::vector<uint8_t>> out;
    const absl::Time t0 = absl::Now();
    auto got = d.mover->Get(1, blocks.Gets(&out), true, kLease);
    const absl::Duration took = absl::Now() - t0;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
    EXPECT_LT(took, absl::Seconds(4));
    daemon.StartProgress();
    auto put = d.mover->Put(0, blocks.puts, kLease);
    ASSERT_TRUE(put.ok()) << put.status();
    EXPECT_EQ(d.dials->load(), 2);
    daemon.SettleArena();
    EXPECT_EQ(std::memcmp(daemon.arena(), blocks.data[0].data(), blocks.data[0].size()), 0);
  }
}

TEST(DataMoverTest, ExtentOutsideTheArenaIsRefusedOnEveryRoute) {
  FakeDaemon mapped(FakeDaemon::ArenaKind::kAllocated, 1 << 20);
  FakeDaemon unmapped(FakeDaemon::ArenaKind::kRegistered, 1 << 20);
  std::vector<uint8_t> buf(8192);
  for (auto [daemon, mode] :
       {std::pair{&mapped, "rma"}, std::pair{&unmapped, "rma"}, std::pair{&unmapped, "push"}}) {
    // Straddles the arena's end (UCX may have rounded the allocation up).
    const BlockMove beyond[] = {{buf.data(), buf.size(), daemon->endpoint().bytes - 4096, 0}};
    DataMoverOptions o;
    o.fetch_transfer = mode;
    auto d = ConnectTo(*daemon, o);
    ASSERT_TRUE(d.mover);
    auto got = d.mover->Get(1, beyond, true, kLease);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal)
        << RouteName(d.mover->route(DataMover::Direction::kGet)) << ": " << got.status();
    auto put = d.mover->Put(0, beyond, kLease);
    EXPECT_EQ(put.status().code(), absl::StatusCode::kInternal) << put.status();
  }
  EXPECT_EQ(unmapped.pushed.load(), 0);
}

TEST(DataMoverTest, ExchangeMatchesTheReplyAndTimesOutOnASilentPeer) {
  FakeDaemon daemon(FakeDaemon::ArenaKind::kRegistered, 1 << 20);
  auto d = ConnectTo(daemon);
  ASSERT_TRUE(d.mover);
  auto reply = d.mover->Exchange(am_wire::kLookupRequestAm, std::string(8, '\0'), "ping",
                                 am_wire::kLookupReplyAm, absl::Seconds(5));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->data, "pongping");
  daemon.on_lookup = FakeDaemon::OnLookup::kIgnore;
  const absl::Time t0 = absl::Now();
  reply = d.mover->Exchange(am_wire::kLookupRequestAm, std::string(8, '\0'), "ping",
                            am_wire::kLookupReplyAm, absl::Milliseconds(200));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded) << reply.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
  // A late answer to the abandoned request must not satisfy the next one.
  daemon.on_lookup = FakeDaemon::OnLookup::kEcho;
  reply = d.mover->Exchange(am_wire::kLookupRequestAm, std::string(8, '\0'), "again",
                            am_wire::kLookupReplyAm, absl::Seconds(5));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->data, "pongagain");
}

// A publish by message with a follow-up (a Commit, in DaemonLink): the request goes right
// behind the blocks, before their acknowledgements are back. The daemon here holds every
// acknowledgement until the follow-up arrives, so a mover that waited for them first would
// never send it and time out.
TEST(DataMoverTest, AFollowUpGoesBehindThePublishedBlocksWithoutWaitingForTheirAcks) {
  FakeDaemon daemon(FakeDaemon::ArenaKind::kRegistered, 4 << 20);
  daemon.hold_publish_acks = true;
  std::unique_ptr<DataMover> made = ConnectByMessage(daemon);
  ASSERT_TRUE(made);
  DataMover& mover = *made;
  ASSERT_EQ(mover.route(DataMover::Direction::kPut), Route::kPush);
  Blocks blocks({1000, 64 << 10, 200 << 10}, 0, 30);
  std::vector<uint32_t> crcs_seen;
  auto put = mover.Put(/*reservation_id=*/5, blocks.puts, absl::Seconds(5), 0,
                       CommitRecordingCrcs(&crcs_seen));
  ASSERT_TRUE(put.ok()) << put.status();
  ASSERT_TRUE(put->follow_up_reply.has_value());
  ASSERT_TRUE(put->follow_up_reply->ok()) << put->follow_up_reply->status();
  EXPECT_EQ((*put->follow_up_reply)->data, "pongcommit");
  // Every block was in the arena before the follow-up was read, and the CRCs it was built from
  // are the blocks'.
  EXPECT_EQ(daemon.published_before_lookup.load(), 3);
  ASSERT_EQ(crcs_seen.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(crcs_seen[i], blocks.puts[i].crc32c);
  EXPECT_EQ(put->crc32c, crcs_seen);
  daemon.SettleArena();
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(0, std::memcmp(daemon.arena() + blocks.puts[i].arena_offset, blocks.data[i].data(),
                             blocks.data[i].size()));

  // A block over the eager size takes the usual route: no follow-up, acks awaited first.
  daemon.hold_publish_acks = false;
  Blocks large({(256 << 10) + 1}, 1 << 20, 40);
  bool asked = false;
  auto plain =
      mover.Put(6, large.puts, absl::Milliseconds(300), 0, [&](std::span<const uint32_t>) {
        asked = true;
        return std::optional<FollowUp>();
      });
  EXPECT_FALSE(asked);
  // (The fake daemon takes eager blocks only, so this one is never acknowledged.)
  EXPECT_FALSE(plain.ok());
}

// Acquire and push in one request: the plan made from the answer says where each pushed block
// lands (or that it is dropped); CRCs are checked as for a push fetch. The same whether the
// answer comes alone or inside the first block (the parameter: the request's AM id).
class AcquireAndGetTest : public ::testing::TestWithParam<uint16_t> {};

TEST_P(AcquireAndGetTest, LandsWhatThePlanSaysAndChecksIt) {
  FakeDaemon daemon(FakeDaemon::ArenaKind::kRegistered, 4 << 20);
  DataMoverOptions o;
  o.fetch_transfer = "push";
  auto d = ConnectTo(daemon, o);
  ASSERT_TRUE(d.mover);
  ASSERT_EQ(d.mover->route(DataMover::Direction::kGet), Route::kPush);
  // Ids 0, 1 and 3 held (an eager block, one the plan drops, a rendezvous one); id 2 not.
  Blocks blocks({1000, 64 << 10, 300 << 10}, 0, 50);
  blocks.CopyInto(daemon.arena());
  daemon.arena()[blocks.puts[2].arena_offset + 9] ^= 1;  // the rendezvous one is damaged
  auto leased = [&](size_t k) {
    return FakeDaemon::Leased{blocks.puts[k].arena_offset, blocks.puts[k].length,
                              blocks.puts[k].crc32c};
  };
  daemon.leased = {leased(0), leased(1), {}, leased(2)};
  daemon.SettleArena();  // the progress thread then sees the arena and the lease
  std::vector<uint8_t> out0(1000), out3(300 << 10);
  auto plan = [&](const AmReply& reply) -> std::optional<DataMover::PushLanding> {
    am_wire::ReplyHeader h;
    v1::AcquireResponse resp;
    if (!am_wire::DecodeReplyHeader(reply.header, &h) || !h.complete ||
        !resp.ParseFromString(reply.data))
      return std::nullopt;
    EXPECT_EQ(resp.lease_id(), 99u);
    DataMover::PushLanding l{std::vector<BlockMove>(4), absl::Seconds(30)};
    l.moves[0] = {out0.data(), 1000, resp.offsets(0), resp.crc32c(0)};
    l.moves[1] = {nullptr, resp.sizes(1), resp.offsets(1), 0};  // comes, dropped
    l.moves[3] = {out3.data(), out3.size(), resp.offsets(3), resp.crc32c(3)};
    return l;
  };
  FollowUp request{GetParam(), am_wire::kAcquireReplyAm,
                   std::string(am_wire::kRequestHeaderBytes, '\0'), std::string(4 * 32, '\0')};
  const bool in_pieces = GetParam() == am_wire::kAcquirePushPiecesRequestAm;
  if (in_pieces) {  // the dropped block and the damaged one go in 16 KiB pieces
    request.push_piece_bytes = 16 << 10;
    request.data = am_wire::EncodePiecesRequestPrefix(16 << 10) + request.data;
  }
  auto got = d.mover->AcquireAndGet(request, plan, /*verify=*/true, absl::Seconds(5),
                                    /*around_caches=*/true);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->pushed);
  EXPECT_EQ(daemon.pushed.load(), 3);
  ASSERT_EQ(got->intact.size(), 4u);
  EXPECT_EQ(got->intact[0], 1);
  EXPECT_EQ(got->intact[3], 0);  // the damaged one
  EXPECT_EQ(out0, blocks.data[0]);
  EXPECT_EQ(daemon.pieces_sent.load(), in_pieces ? 4 + 19 : 0);
  if (in_pieces) {  // undamaged, the same block lands whole and intact
    daemon.arena()[blocks.puts[2].arena_offset + 9] ^= 1;
    daemon.SettleArena();
    got = d.mover->AcquireAndGet(request, plan, true, absl::Seconds(5));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->intact[3], 1);
    EXPECT_EQ(out3, blocks.data[2]);
    EXPECT_EQ(daemon.pushed.load(), 6);
    // The pieced block alone: the answer rides in its first piece.
    daemon.SettleArena();  // the progress thread's reads of `leased` before this write
    daemon.leased = {leased(2)};
    daemon.pieces_sent = 0;
    daemon.SettleArena();
    std::fill(out3.begin(), out3.end(), 0);
    auto plan_large = [&](const AmReply& reply) -> std::optional<DataMover::PushLanding> {
      am_wire::ReplyHeader h;
      v1::AcquireResponse resp;
      if (!am_wire::DecodeReplyHeader(reply.header, &h) || !h.complete ||
          !resp.ParseFromString(reply.data))
        return std::nullopt;
      DataMover::PushLanding l{std::vector<BlockMove>(1), absl::Seconds(30)};
      l.moves[0] = {out3.data(), out3.size(), resp.offsets(0), resp.crc32c(0)};
      return l;
    };
    FollowUp one = request;
    one.data = am_wire::EncodePiecesRequestPrefix(16 << 10) + std::string(32, '\0');
    got = d.mover->AcquireAndGet(one, plan_large, true, absl::Seconds(5));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->intact, (std::vector<uint8_t>{1}));
    EXPECT_EQ(out3, blocks.data[2]);
    EXPECT_EQ(daemon.pieces_sent.load(), 19);
  }

  // No lease in the answer: nothing comes, nothing is waited for.
  daemon.grant_lease = false;
  const int pushed_before = daemon.pushed.load();
  got = d.mover->AcquireAndGet(request, plan, true, absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->pushed);
  EXPECT_EQ(daemon.pushed.load(), pushed_before);

  // An answered block whose answer is cut short: an error at once, not a wait for the deadline.
  if (GetParam() != am_wire::kAcquirePushAnsweredRequestAm) return;
  // One eager block only: a rendezvous send the client never takes would outlive the fake daemon.
  daemon.grant_lease = true;
  daemon.garble_answered = true;
  daemon.SettleArena();  // the progress thread's reads of `leased` before this write
  daemon.leased = {leased(0)};
  daemon.SettleArena();
  auto plan_one = [&](const AmReply&) -> std::optional<DataMover::PushLanding> {
    DataMover::PushLanding l{std::vector<BlockMove>(1), absl::Seconds(30)};
    l.moves[0] = {out0.data(), 1000, blocks.puts[0].arena_offset, blocks.puts[0].crc32c};
    return l;
  };
  request.data.resize(32);
  const absl::Time t0 = absl::Now();
  got = d.mover->AcquireAndGet(request, plan_one, true, absl::Seconds(20));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal) << got.status();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));
}

INSTANTIATE_TEST_SUITE_P(AnswerAloneOrInFirstBlock, AcquireAndGetTest,
                         ::testing::Values(am_wire::kAcquirePushRequestAm,
                                           am_wire::kAcquirePushAnsweredRequestAm,
                                           am_wire::kAcquirePushPiecesRequestAm));

TEST(DataMoverTest, FailedDialFailsConnect) {
  auto made = DataMover::Connect({}, [] {
    return absl::StatusOr<ArenaEndpoint>(absl::UnavailableError("stratad is not there"));
  });
  EXPECT_EQ(made.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(made.status().message().find("stratad is not there"), std::string::npos);
}

}  // namespace
}  // namespace strata::client
