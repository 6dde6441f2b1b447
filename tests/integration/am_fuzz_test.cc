// Regression test for issue 14, finding 3: malformed UCX active messages on one connection must
// never crash stratad. A raw UCX peer sends a burst of every kind of bad message to a real
// daemon; the daemon must stay up and keep serving a normal client byte-exactly.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <random>
#include <string>
#include <vector>

#include "common/am_wire.h"
#include "common/crc32c.h"
#include "strata/client.h"
#include "strata/v1/cache.grpc.pb.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/publish_in_one_data.h"
#include "tests/integration/raw_ucx_peer.h"
#include "tests/support/test_data.h"

namespace strata {
namespace {

namespace w = am_wire;
using testing::DaemonProcess;
using testing::PublishInOneData;
using testing::PublishInOneHeader;
using testing::RawUcxPeer;
using testing::RandomBlocks;
using testing::Tokens;

constexpr uint32_t kTokensPerBlock = 16;

NamespaceSpec Spec() { return testing::SmallSpec("am-fuzz"); }

bool Alive(pid_t pid) { return waitpid(pid, nullptr, WNOHANG) == 0; }

std::string U64(uint64_t v) {
  std::string s(8, '\0');
  w::PutU64(s.data(), v);
  return s;
}
std::string U32(uint32_t v) {
  std::string s(4, '\0');
  w::PutU32(s.data(), v);
  return s;
}
std::string FetchHeader(uint64_t request, uint64_t lease, uint32_t count) {
  return U64(request) + U64(lease) + U32(count) + U32(0);
}
std::string Extent(uint64_t offset, uint64_t size) { return U64(offset) + U64(size); }
// A serialized ReserveRequest of `n` copies of one id (sizes `size`), and a CommitRequest.
std::string ReserveData(const std::string& ns, const std::string& id, int n, uint64_t size) {
  strata::v1::ReserveRequest req;
  req.set_namespace_id(ns);
  std::string ids;
  for (int i = 0; i < n; ++i) {
    ids += id;
    req.add_sizes(size);
  }
  req.set_ids(ids);
  return req.SerializeAsString();
}
std::string CommitData(uint64_t reservation, int crcs) {
  strata::v1::CommitRequest req;
  req.set_reservation_id(reservation);
  for (int i = 0; i < crcs; ++i) req.add_crc32c(static_cast<uint32_t>(i));
  return req.SerializeAsString();
}

struct Connected {
  std::string worker_address;
  uint64_t arena_bytes = 0;
};

// The daemon's Cache service over plain gRPC, each call with a 5 s deadline.
std::unique_ptr<v1::Cache::Stub> CacheStub(const DaemonProcess& d) {
  return v1::Cache::NewStub(grpc::CreateChannel(d.endpoint(), grpc::InsecureChannelCredentials()));
}
void WithDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
}

Connected ConnectRaw(const DaemonProcess& d, const std::string& client_name = "am-fuzz") {
  auto stub = CacheStub(d);
  grpc::ClientContext ctx;
  WithDeadline(&ctx);
  v1::ConnectRequest req;
  req.set_client_name(client_name);
  v1::ConnectResponse resp;
  EXPECT_TRUE(stub->Connect(&ctx, req, &resp).ok());
  return {resp.worker_address(), resp.arena_bytes()};
}

// A real lease on published blocks, so fetch requests can lie about otherwise valid extents.
v1::AcquireResponse AcquireRaw(const DaemonProcess& d, const NamespaceId& ns,
                               const std::vector<BlockId>& ids) {
  auto stub = CacheStub(d);
  grpc::ClientContext ctx;
  WithDeadline(&ctx);
  v1::AcquireRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  std::string packed;
  for (const auto& id : ids) packed.append(reinterpret_cast<const char*>(id.bytes.data()), 32);
  req.set_ids(packed);
  v1::AcquireResponse resp;
  EXPECT_TRUE(stub->Acquire(&ctx, req, &resp).ok());
  return resp;
}

// A reservation of `ids`, each `size` bytes, made over gRPC for messages that then name it.
v1::ReserveResponse ReserveRaw(const DaemonProcess& d, const NamespaceId& ns,
                               const std::vector<BlockId>& ids, uint64_t size) {
  auto stub = CacheStub(d);
  grpc::ClientContext ctx;
  WithDeadline(&ctx);
  v1::ReserveRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  for (const BlockId& id : ids) {
    req.mutable_ids()->append(std::string(id.AsBytes()));
    req.add_sizes(size);
  }
  v1::ReserveResponse resp;
  EXPECT_TRUE(stub->Reserve(&ctx, req, &resp).ok());
  return resp;
}

absl::StatusOr<std::unique_ptr<Client>> ClientOf(const DaemonProcess& d) {
  ClientOptions o;
  o.endpoint = d.endpoint();
  return Client::Connect(o);
}

// The normal client still publishes, looks up and fetches byte-exactly.
void ExpectServes(const DaemonProcess& d, uint32_t seed) {
  auto client = ClientOf(d);
  ASSERT_TRUE(client.ok()) << client.status();
  auto ns = (*client)->OpenNamespace(Spec(), "tenant");
  ASSERT_TRUE(ns.ok()) << ns.status();
  auto tokens = Tokens(4 * kTokensPerBlock, seed);
  auto blocks = RandomBlocks(4, 64 << 10, seed + 1);
  auto pub = (*client)->Publish(*ns, tokens, testing::BufferViews(blocks));
  ASSERT_TRUE(pub.ok()) << pub.status();
  auto look = (*client)->Lookup(*ns, tokens);
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->prefix_blocks, 4u);
  auto ids = ComputeBlockIds(*ns, kTokensPerBlock, tokens);
  std::vector<std::vector<uint8_t>> out(4, std::vector<uint8_t>(64 << 10));
  std::vector<MutableBuffer> bufs;
  for (auto& b : out) bufs.push_back({b.data(), b.size()});
  auto f = (*client)->Fetch(*ns, ids, bufs);
  ASSERT_TRUE(f.ok()) << f.status();
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(f->status[i], BlockStatus::kOk) << i;
    EXPECT_TRUE(out[i] == blocks[i]) << i;
  }
}

TEST(DaemonAmFuzzTest, MalformedActiveMessagesNeverCrashTheDaemon) {
  DaemonProcess d("host_tier:\n  capacity: 64MiB\n");
  ASSERT_TRUE(d.ok()) << d.log();
  // Something real to point at: published blocks, an open namespace and a live lease.
  auto client = ClientOf(d);
  ASSERT_TRUE(client.ok()) << client.status();
  auto ns = *(*client)->OpenNamespace(Spec(), "tenant");
  auto tokens = Tokens(4 * kTokensPerBlock, 7);
  auto blocks = RandomBlocks(4, 300 << 10, 8);  // over the daemon's eager push limit
  ASSERT_EQ((*client)->Publish(ns, tokens, testing::BufferViews(blocks))->stored, 4u);
  auto ids = ComputeBlockIds(ns, kTokensPerBlock, tokens);
  const v1::AcquireResponse lease = AcquireRaw(d, ns, ids);
  ASSERT_EQ(lease.offsets_size(), 4);
  const Connected daemon = ConnectRaw(d);
  ASSERT_FALSE(daemon.worker_address.empty());

  RawUcxPeer peer;
  ASSERT_TRUE(peer.ok());
  ASSERT_TRUE(peer.Connect(daemon.worker_address));
  const std::string ns_bytes(ns.AsBytes());
  const std::string id_bytes(reinterpret_cast<const char*>(ids[0].bytes.data()), 32);
  const uint32_t r = RawUcxPeer::kReply;
  const uint32_t eager = RawUcxPeer::kEager | r;
  const uint32_t rndv = RawUcxPeer::kRndv | r;
  const std::string big(1 << 20, 'x');  // rendezvous-sized on every transport
  struct Case {
    uint16_t id;
    std::string header, data;
    uint32_t flags;
  };
  std::vector<Case> cases = {
      // Unknown ids, and the ids of replies the daemon never expects.
      {0, "", "", r}, {2, U64(1) + "junk", "", r}, {4, U64(1), "", r}, {6, "", "", r},
      {7, "x", "y", r}, {63, "", "", r}, {255, "", big, rndv}, {65535, "hdr", "", eager},
      // Lookup: short, long and empty headers; ids that are not a multiple of 32 bytes; too
      // many ids; an unknown namespace; no reply endpoint; rendezvous payloads.
      {w::kLookupRequestAm, "", "", r}, {w::kLookupRequestAm, U64(1), id_bytes, r},
      {w::kLookupRequestAm, U64(1) + ns_bytes + "x", id_bytes, r},
      {w::kLookupRequestAm, U64(1) + ns_bytes, id_bytes.substr(0, 31), r},
      {w::kLookupRequestAm, U64(1) + ns_bytes, std::string(32 * (w::kMaxIds + 1), 'i'), eager},
      {w::kLookupRequestAm, U64(1) + std::string(32, 'n'), id_bytes, r},
      {w::kLookupRequestAm, U64(1) + ns_bytes, id_bytes, 0},
      {w::kLookupRequestAm, U64(1) + ns_bytes, big, rndv},
      {w::kLookupRequestAm, U64(1) + ns_bytes, id_bytes, r},  // a valid one among them
      // Fetch: truncated headers; counts that lie about the data; huge counts; extents outside
      // the arena or overflowing; an unknown lease; the real lease with lying sizes, duplicated
      // and overlapping extents; rendezvous requests.
      {w::kFetchRequestAm, "", "", r}, {w::kFetchRequestAm, U64(1), "", r},
      {w::kFetchRequestAm, FetchHeader(1, lease.lease_id(), 1).substr(0, 23), "", r},
      {w::kFetchRequestAm, FetchHeader(1, lease.lease_id(), 1) + "x", Extent(0, 1), r},
      {w::kFetchRequestAm, FetchHeader(1, lease.lease_id(), 0xffffffffu), Extent(0, 1), r},
      {w::kFetchRequestAm, FetchHeader(1, lease.lease_id(), 2), Extent(0, 1), r},
      {w::kFetchRequestAm, FetchHeader(1, lease.lease_id(), 1), Extent(0, 1) + "x", r},
      {w::kFetchRequestAm, FetchHeader(1, lease.lease_id(), 1), Extent(~0ull - 4, 16), r},
      {w::kFetchRequestAm, FetchHeader(1, lease.lease_id(), 1), Extent(16, ~0ull), r},
      {w::kFetchRequestAm, FetchHeader(1, lease.lease_id(), 1), Extent(daemon.arena_bytes, 1), r},
      {w::kFetchRequestAm, FetchHeader(1, 12345, 1), Extent(lease.offsets(0), lease.sizes(0)), r},
      {w::kFetchRequestAm, FetchHeader(1, lease.lease_id(), 1),
       Extent(lease.offsets(0), lease.sizes(0) + 1), r},
      {w::kFetchRequestAm, FetchHeader(1, lease.lease_id(), 1),
       Extent(lease.offsets(0) + 1, lease.sizes(0)), r},
      {w::kFetchRequestAm, FetchHeader(1, lease.lease_id(), 1), Extent(lease.offsets(0), 0), r},
      {w::kFetchRequestAm, FetchHeader(1, lease.lease_id(), 1),
       Extent(lease.offsets(0), lease.sizes(0)), 0},
      {w::kFetchRequestAm, FetchHeader(1, lease.lease_id(), 1),
       Extent(lease.offsets(0), lease.sizes(0)), rndv},
      {w::kFetchRequestAm, FetchHeader(1, lease.lease_id(), 1), big, rndv},
      // Piece sizes out of range (refused), and a real extent in the smallest pieces.
      {w::kFetchRequestAm, FetchHeader(1, lease.lease_id(), 1).substr(0, 20) + U32(1),
       Extent(lease.offsets(0), lease.sizes(0)), r},
      {w::kFetchRequestAm, FetchHeader(1, lease.lease_id(), 1).substr(0, 20) + U32(0xffffffffu),
       Extent(lease.offsets(0), lease.sizes(0)), r},
      {w::kFetchRequestAm, FetchHeader(1, lease.lease_id(), 1).substr(0, 20) +
       U32(w::kMinPushPieceBytes), Extent(lease.offsets(0), lease.sizes(0)), r},
      // Peer locate (daemon to daemon, reachable on the same worker): short/long headers, ids
      // that are not a multiple of 32 bytes, many ids, rendezvous.
      {w::kPeerLocateAm, "", id_bytes, r}, {w::kPeerLocateAm, U64(1) + "x", id_bytes, r},
      {w::kPeerLocateAm, U64(1), id_bytes.substr(0, 5), r},
      {w::kPeerLocateAm, U64(1), std::string(32 * 4096, 'i'), eager},
      {w::kPeerLocateAm, U64(1), big, rndv},
      // Reserve and Commit by message: bad headers, data that is no protobuf message, a
      // rendezvous payload, no reply endpoint, a reservation nobody holds, too many blocks.
      {w::kReserveRequestAm, "", "", r}, {w::kReserveRequestAm, U64(1) + ns_bytes, "\xff\xff", r},
      {w::kReserveRequestAm, U64(1) + ns_bytes, big, rndv},
      {w::kReserveRequestAm, U64(1) + ns_bytes, ReserveData(ns_bytes, id_bytes, 3, 64), 0},
      {w::kReserveRequestAm, U64(1) + ns_bytes, ReserveData(ns_bytes, id_bytes, 2, 64), r},
      {w::kReserveRequestAm, U64(1) + ns_bytes, ReserveData(ns_bytes, id_bytes, 1, ~0ull), r},
      {w::kReserveRequestAm, U64(1) + ns_bytes,
       ReserveData(std::string(32, 'n'), id_bytes, 1, 64), r},
      {w::kReserveRequestAm, U64(1) + ns_bytes, ReserveData(ns_bytes, id_bytes, 300, 64), eager},
      {w::kCommitRequestAm, U64(1), "", r}, {w::kCommitRequestAm, U64(1) + ns_bytes, "\x08", r},
      {w::kCommitRequestAm, U64(1) + ns_bytes, CommitData(987654321, 5), r},
      {w::kCommitRequestAm, U64(1) + ns_bytes, big, rndv},
      // Acquire and push: a namespace nobody opened, ids not a multiple of 32 bytes, a real
      // block (pushed back), many copies of it, no reply endpoint, a rendezvous payload.
      {w::kAcquirePushRequestAm, U64(1), id_bytes, r},
      {w::kAcquirePushRequestAm, U64(1) + std::string(32, 'n'), id_bytes, r},
      {w::kAcquirePushRequestAm, U64(1) + ns_bytes, id_bytes + "x", r},
      {w::kAcquirePushRequestAm, U64(1) + ns_bytes, id_bytes.substr(0, 32), r},
      {w::kAcquirePushRequestAm, U64(1) + ns_bytes, id_bytes.substr(0, 32), 0},
      {w::kAcquirePushRequestAm, U64(1) + ns_bytes, big, rndv},
      {w::kAcquirePushAnsweredRequestAm, U64(1), id_bytes, r},
      {w::kAcquirePushAnsweredRequestAm, U64(1) + ns_bytes, id_bytes + "x", r},
      {w::kAcquirePushAnsweredRequestAm, U64(1) + ns_bytes, id_bytes.substr(0, 32), r},
      {w::kAcquirePushAnsweredRequestAm, U64(1) + ns_bytes, id_bytes.substr(0, 32), 0},
      {w::kAcquirePushAnsweredRequestAm, U64(1) + ns_bytes, big, rndv},
      // In pieces: no prefix, a prefix alone, piece sizes out of range, the reserved word set,
      // a real block in the smallest pieces, no reply endpoint, a rendezvous payload.
      {w::kAcquirePushPiecesRequestAm, U64(1) + ns_bytes, "", r},
      {w::kAcquirePushPiecesRequestAm, U64(1) + ns_bytes, U32(65280) + U32(0), r},
      {w::kAcquirePushPiecesRequestAm, U64(1) + ns_bytes, U32(0) + U32(0) + id_bytes, r},
      {w::kAcquirePushPiecesRequestAm, U64(1) + ns_bytes, U32(1) + U32(0) + id_bytes, r},
      {w::kAcquirePushPiecesRequestAm, U64(1) + ns_bytes, U32(65280) + U32(7) + id_bytes, r},
      {w::kAcquirePushPiecesRequestAm, U64(1), U32(65280) + U32(0) + id_bytes, r},
      {w::kAcquirePushPiecesRequestAm, U64(1) + ns_bytes,
       U32(w::kMinPushPieceBytes) + U32(0) + id_bytes.substr(0, 32), r},
      {w::kAcquirePushPiecesRequestAm, U64(1) + ns_bytes, U32(65280) + U32(0) + id_bytes, 0},
      {w::kAcquirePushPiecesRequestAm, U64(1) + ns_bytes, big, rndv},
      // Published pieces: short header, nobody's reservation, outside the arena, an empty
      // piece, no reply endpoint, a rendezvous payload.
      {w::kPublishPieceAm, U64(1), "x", r},
      {w::kPublishPieceAm, w::EncodePublishPieceHeader({{1, 987654321, 0, 4096, 0}, 0}), "x", r},
      {w::kPublishPieceAm, w::EncodePublishPieceHeader({{1, 987654321, ~0ull, 4096, 0}, 0}),
       "x", r},
      {w::kPublishPieceAm, w::EncodePublishPieceHeader({{1, 987654321, 0, 4096, 0}, 0}), "", r},
      {w::kPublishPieceAm, w::EncodePublishPieceHeader({{1, 987654321, 0, 4096, 0}, 0}), "x", 0},
      {w::kPublishPieceAm, w::EncodePublishPieceHeader({{1, 987654321, 0, 1 << 20, 0}, 0}), big,
       rndv},
      // Publish in one: no data, a prefix that lies about its lengths, more blocks than bytes,
      // a block count of zero, a rendezvous payload, no reply endpoint.
      {w::kPublishInOneAm, U64(1) + ns_bytes, "", r},
      {w::kPublishInOneAm, U64(1) + ns_bytes, U32(0xffffffffu) + U32(1), r},
      {w::kPublishInOneAm, U64(1) + ns_bytes, U32(0) + U32(0), r},
      {w::kPublishInOneAm, U64(1) + ns_bytes,
       w::EncodePublishInOnePrefix(ReserveData(ns_bytes, id_bytes, 2, 4096), {{1, 2}}) + "x", r},
      {w::kPublishInOneAm, U64(1) + ns_bytes,
       w::EncodePublishInOnePrefix(ReserveData(ns_bytes, id_bytes, 1, 4), {{1}}) + "abcd", 0},
      {w::kPublishInOneAm, U64(1) + ns_bytes, big, rndv},
      // Fetch in one: ids not a multiple of 32 bytes, many copies of a real block (more than
      // one answer carries: sent back), no reply endpoint, a rendezvous payload.
      {w::kFetchInOneAm, U64(1) + ns_bytes, id_bytes + "x", r},
      {w::kFetchInOneAm, U64(1) + ns_bytes, std::string(32 * w::kMaxIds, 'i'), eager},
      {w::kFetchInOneAm, U64(1) + ns_bytes, id_bytes, 0},
      {w::kFetchInOneAm, U64(1) + ns_bytes, big, rndv},
  };
  {
    std::string copies;  // 300 KiB blocks: even one is more than an answer carries
    for (int i = 0; i < 64; ++i) copies += id_bytes;
    cases.push_back({w::kFetchInOneAm, U64(3) + ns_bytes, copies, eager});
  }
  {
    // An acquire of many copies of one block: pushed back at most an arena's worth.
    std::string copies;
    for (size_t i = 0; i < w::kMaxIds; ++i) copies += id_bytes;
    cases.push_back({w::kAcquirePushRequestAm, U64(2) + ns_bytes, copies, eager});
    // Its answer is too long to ride in a block: it comes alone.
    cases.push_back({w::kAcquirePushAnsweredRequestAm, U64(2) + ns_bytes, copies, eager});
    // And in the smallest pieces: still at most an arena's worth.
    cases.push_back({w::kAcquirePushPiecesRequestAm, U64(2) + ns_bytes,
                     U32(w::kMinPushPieceBytes) + U32(0) + copies, eager});
  }
  // A fetch of many copies of one real extent: a push amplification the daemon must bound.
  {
    std::string many;
    for (int i = 0; i < 512; ++i) many += Extent(lease.offsets(0), lease.sizes(0));
    cases.push_back({w::kFetchRequestAm, FetchHeader(9, lease.lease_id(), 512), many, eager});
  }
  // ~100 random byte strings with a fixed seed, on the known ids and on random ones.
  std::mt19937 rng(1414);
  auto random_bytes = [&](size_t n) {
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    return s;
  };
  const uint16_t known[] = {w::kLookupRequestAm,     w::kFetchRequestAm,
                            w::kPeerLocateAm,        w::kReserveRequestAm,
                            w::kCommitRequestAm,     w::kAcquirePushRequestAm,
                            w::kAcquirePushAnsweredRequestAm, w::kAcquirePushPiecesRequestAm,
                            w::kPublishPieceAm};
  constexpr size_t kKnown = sizeof(known) / sizeof(known[0]);
  for (int i = 0; i < 150; ++i) {
    const uint16_t id = rng() % 4 == 0 ? static_cast<uint16_t>(rng() % 64) : known[rng() % kKnown];
    std::string header = random_bytes(rng() % 48);
    std::string data = random_bytes(rng() % 3 == 0 ? 0 : rng() % 4096);
    // Truncated and lying valid headers: a real header with random counts or lengths.
    if (i % 5 == 0 && id == w::kFetchRequestAm)
      header = FetchHeader(rng(), lease.lease_id(), rng() % 8);
    if (i % 7 == 0 && id == w::kLookupRequestAm) header = U64(rng()) + ns_bytes;
    uint32_t flags = rng() % 4 == 0 ? 0 : r;
    if (rng() % 10 == 0) flags |= RawUcxPeer::kRndv;
    cases.push_back({id, std::move(header), std::move(data), flags});
  }
  int sent = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    if (peer.Send(c.id, c.header, c.data, c.flags)) ++sent;
    peer.Progress(std::chrono::milliseconds(2));
    ASSERT_TRUE(Alive(d.pid())) << "case " << k << " (id " << c.id << ", header "
                                << c.header.size() << " B, data " << c.data.size()
                                << " B, flags " << c.flags << ") killed stratad:\n"
                                << d.log();
    if (peer.failed()) {
      ASSERT_TRUE(peer.Connect(daemon.worker_address));
    }
  }
  peer.Progress(std::chrono::milliseconds(200));
  EXPECT_GT(sent, static_cast<int>(cases.size()) / 2);
  ASSERT_TRUE(Alive(d.pid())) << d.log();

  // Replies to an endpoint that is gone: requests that make the daemon push large blocks, then
  // the sender vanishes before they arrive. Repeated on fresh endpoints.
  for (int round = 0; round < 10; ++round) {
    ASSERT_TRUE(peer.Connect(daemon.worker_address));
    std::string all;
    for (int i = 0; i < 4; ++i) all += Extent(lease.offsets(i), lease.sizes(i));
    for (int k = 0; k < 8; ++k) {
      peer.Send(w::kFetchRequestAm, FetchHeader(100 + k, lease.lease_id(), 4), all, eager);
      // In the smallest pieces: many sends in flight when the endpoint goes.
      peer.Send(w::kFetchRequestAm,
                FetchHeader(200 + k, lease.lease_id(), 4).substr(0, 20) +
                    U32(w::kMinPushPieceBytes),
                all, eager);
      peer.Send(w::kLookupRequestAm, U64(k) + ns_bytes, id_bytes, eager);
    }
    peer.Close();
  }
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(Alive(d.pid())) << d.log();

  // The lease is released while pushes of its extents may still be under way.
  ASSERT_TRUE(peer.Connect(daemon.worker_address));
  ExpectServes(d, 21);
  ASSERT_TRUE(Alive(d.pid())) << d.log();
  // The daemon said what it dropped, briefly.
  const std::string log = d.log();
  EXPECT_NE(log.find("malformed active message"), std::string::npos) << log;
  EXPECT_LT(std::count(log.begin(), log.end(), '\n'), 200) << "log volume is not bounded";
}

// Acquire and push with the answer in the first block (am_wire kAcquirePushAnsweredRequestAm):
// the answer rides in the first pushed block's header, eager or rendezvous, and the rest follow
// as plain blocks; the older request still gets its answer alone, then the blocks; an answer
// that pushes nothing comes alone. Asked for pieces, a larger block comes in them.
TEST(AcquirePushWireTest, TheAnswerRidesInTheFirstBlockWhereAsked) {
  DaemonProcess d("host_tier:\n  capacity: 64MiB\n");
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = ClientOf(d);
  ASSERT_TRUE(client.ok()) << client.status();
  auto ns = *(*client)->OpenNamespace(Spec(), "tenant");
  auto tokens = Tokens(2 * kTokensPerBlock, 51);
  auto blocks = RandomBlocks(2, 300 << 10, 52);  // over the eager push limit: rendezvous
  blocks[0].resize(8192);                          // and one eager
  ASSERT_EQ((*client)->Publish(ns, tokens, testing::BufferViews(blocks))->stored, 2u);
  const auto ids = ComputeBlockIds(ns, kTokensPerBlock, tokens);
  auto id_bytes = [&](size_t i) { return std::string(ids[i].AsBytes()); };
  const std::string ns_bytes(ns.AsBytes());
  RawUcxPeer peer;
  ASSERT_TRUE(peer.ok());
  ASSERT_TRUE(peer.Connect(ConnectRaw(d).worker_address));
  // Every message with AM id `am` for request `request`, waiting up to 5 s for `n` of them.
  auto of_request = [&](uint16_t am, uint64_t request, size_t n) {
    std::vector<std::pair<std::string, std::string>> out;
    for (int i = 0; i < 500 && out.size() < n; ++i) {
      peer.Progress(std::chrono::milliseconds(10));
      out.clear();
      for (auto& m : peer.replies(am))
        if (m.first.size() >= 8 && w::GetU64(m.first.data()) == request) out.push_back(m);
    }
    return out;
  };
  const uint32_t eager = RawUcxPeer::kReply | RawUcxPeer::kEager;
  for (const bool eager_first : {true, false}) {
    const uint64_t request = eager_first ? 5 : 6;
    const size_t first = eager_first ? 0 : 1, second = 1 - first;
    ASSERT_TRUE(peer.Send(w::kAcquirePushAnsweredRequestAm, U64(request) + ns_bytes,
                          id_bytes(first) + id_bytes(second), eager));
    const auto answered = of_request(w::kFetchBlockAnsweredAm, request, 1);
    ASSERT_EQ(answered.size(), 1u) << "eager first: " << eager_first;
    const auto h = w::DecodeAnsweredBlockHeader(answered[0].first);
    ASSERT_TRUE(h);
    const auto block = w::DecodeFetchBlockHeader(h->block);
    ASSERT_TRUE(block);
    EXPECT_EQ(block->index, 0u);
    EXPECT_EQ(block->code, 0u);
    w::ReplyHeader reply;
    ASSERT_TRUE(w::DecodeReplyHeader(h->reply, &reply));
    EXPECT_EQ(reply.request_id, request);
    EXPECT_TRUE(reply.complete);
    EXPECT_EQ(reply.code, 0u);
    v1::AcquireResponse lease;
    ASSERT_TRUE(lease.ParseFromString(std::string(h->answer)));
    ASSERT_EQ(lease.sizes_size(), 2);
    EXPECT_EQ(lease.sizes(0), blocks[first].size());
    EXPECT_EQ(lease.sizes(1), blocks[second].size());
    // An eager block's bytes came with it (a rendezvous one's the raw peer leaves at stratad).
    if (eager_first) {
      EXPECT_EQ(answered[0].second, std::string(blocks[0].begin(), blocks[0].end()));
    }
    const auto rest = of_request(w::kFetchBlockAm, request, 1);
    ASSERT_EQ(rest.size(), 1u);
    EXPECT_EQ(w::DecodeFetchBlockHeader(rest[0].first)->index, 1u);
    EXPECT_TRUE(of_request(w::kAcquireReplyAm, request, 0).empty());
  }
  // The older request: the answer alone, then the block.
  ASSERT_TRUE(peer.Send(w::kAcquirePushRequestAm, U64(7) + ns_bytes, id_bytes(0), eager));
  ASSERT_EQ(of_request(w::kAcquireReplyAm, 7, 1).size(), 1u);
  const auto pushed = of_request(w::kFetchBlockAm, 7, 1);
  ASSERT_EQ(pushed.size(), 1u);
  EXPECT_EQ(pushed[0].second, std::string(blocks[0].begin(), blocks[0].end()));
  EXPECT_TRUE(of_request(w::kFetchBlockAnsweredAm, 7, 0).empty());
  // A block no tier holds: answered here (a miss needs no disk read) with no lease, the answer
  // alone, nothing pushed.
  ASSERT_TRUE(peer.Send(w::kAcquirePushAnsweredRequestAm, U64(8) + ns_bytes,
                        std::string(32, 'u'), eager));
  const auto alone = of_request(w::kAcquireReplyAm, 8, 1);
  ASSERT_EQ(alone.size(), 1u);
  w::ReplyHeader reply;
  ASSERT_TRUE(w::DecodeReplyHeader(alone[0].first, &reply));
  EXPECT_TRUE(reply.complete);
  v1::AcquireResponse missed;
  ASSERT_TRUE(missed.ParseFromString(alone[0].second));
  EXPECT_EQ(missed.lease_id(), 0u);
  ASSERT_EQ(missed.status_size(), 1);
  EXPECT_EQ(missed.status(0), v1::BLOCK_NOT_FOUND);
  peer.Progress(std::chrono::milliseconds(100));
  EXPECT_TRUE(of_request(w::kFetchBlockAnsweredAm, 8, 0).empty());
  EXPECT_TRUE(of_request(w::kFetchBlockAm, 8, 0).empty());

  // In pieces of at most 64 KiB: the 8 KiB block whole with the answer, the 300 KiB one as five
  // equal pieces whose bytes make up the block; with the larger block first the answer rides in
  // its first piece.
  for (const bool small_first : {true, false}) {
    const uint64_t request = small_first ? 9 : 10;
    const size_t first = small_first ? 0 : 1, second = 1 - first;
    ASSERT_TRUE(peer.Send(w::kAcquirePushPiecesRequestAm, U64(request) + ns_bytes,
                          w::EncodePiecesRequestPrefix(64 << 10) + id_bytes(first) +
                              id_bytes(second),
                          eager));
    const size_t large_index = small_first ? 1 : 0;
    auto pieces = of_request(w::kFetchPieceAm, request, small_first ? 5 : 4);
    ASSERT_EQ(pieces.size(), small_first ? 5u : 4u) << "small first: " << small_first;
    if (!small_first) {
      const auto first = of_request(w::kFetchPieceAnsweredAm, request, 1);
      ASSERT_EQ(first.size(), 1u);
      const auto h = w::DecodeAnsweredPieceHeader(first[0].first);
      ASSERT_TRUE(h);
      w::ReplyHeader answered;
      ASSERT_TRUE(w::DecodeReplyHeader(h->reply, &answered));
      EXPECT_EQ(answered.request_id, request);
      EXPECT_TRUE(answered.complete);
      v1::AcquireResponse lease;
      ASSERT_TRUE(lease.ParseFromString(std::string(h->answer)));
      EXPECT_EQ(lease.sizes_size(), 2);
      EXPECT_EQ(w::DecodeFetchPieceHeader(h->block)->offset, 0u);
      pieces.push_back({std::string(h->block), first[0].second});
    }
    std::string large(blocks[1].size(), '\0');
    for (const auto& [header, data] : pieces) {
      const auto p = w::DecodeFetchPieceHeader(header);
      ASSERT_TRUE(p);
      EXPECT_EQ(p->block.index, large_index);
      EXPECT_EQ(p->block.code, 0u);
      EXPECT_EQ(data.size(), std::min<uint64_t>(61440, large.size() - p->offset)) << p->offset;
      ASSERT_LE(p->offset + data.size(), large.size());
      large.replace(p->offset, data.size(), data);
    }
    EXPECT_EQ(large, std::string(blocks[1].begin(), blocks[1].end()));
    if (small_first) {
      const auto answered = of_request(w::kFetchBlockAnsweredAm, request, 1);
      ASSERT_EQ(answered.size(), 1u);
      EXPECT_EQ(answered[0].second, std::string(blocks[0].begin(), blocks[0].end()));
      EXPECT_TRUE(of_request(w::kAcquireReplyAm, request, 0).empty());
    } else {
      EXPECT_TRUE(of_request(w::kAcquireReplyAm, request, 0).empty());
      EXPECT_TRUE(of_request(w::kFetchBlockAnsweredAm, request, 0).empty());
      ASSERT_EQ(of_request(w::kFetchBlockAm, request, 1).size(), 1u);
    }
  }
  // A piece size out of range: refused with the reason, nothing pushed.
  ASSERT_TRUE(peer.Send(w::kAcquirePushPiecesRequestAm, U64(11) + ns_bytes,
                        w::EncodePiecesRequestPrefix(100) + id_bytes(1), eager));
  const auto refused = of_request(w::kAcquireReplyAm, 11, 1);
  ASSERT_EQ(refused.size(), 1u);
  ASSERT_TRUE(w::DecodeReplyHeader(refused[0].first, &reply));
  EXPECT_EQ(reply.code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(refused[0].second.find("piece size"), std::string::npos) << refused[0].second;
  peer.Progress(std::chrono::milliseconds(100));
  EXPECT_TRUE(of_request(w::kFetchPieceAm, 11, 0).empty());
  ASSERT_TRUE(Alive(d.pid())) << d.log();
}

// A publish in one request (am_wire kPublishInOneAm) stores each block whose bytes are those
// its CRC was taken of, refuses the one that is not, skips what is held already, and stores
// nothing when the request lies about its sizes, is too large, or names no open namespace.
TEST(PublishInOneTest, StoresCheckedBlocksRefusesTheRestAndSkipsWhatIsHeld) {
  DaemonProcess d("host_tier:\n  capacity: 64MiB\n");
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = ClientOf(d);
  ASSERT_TRUE(client.ok()) << client.status();
  auto ns = *(*client)->OpenNamespace(Spec(), "tenant");
  const auto ids = ComputeBlockIds(ns, kTokensPerBlock, Tokens(3 * kTokensPerBlock, 41));
  std::vector<std::string> blocks;
  for (const auto& b : RandomBlocks(3, 8192, 42)) blocks.emplace_back(b.begin(), b.end());
  blocks[2].resize(100);
  RawUcxPeer peer;
  ASSERT_TRUE(peer.ok());
  ASSERT_TRUE(peer.Connect(ConnectRaw(d).worker_address));
  uint64_t request = 0;
  // Sends one request and waits for its reply: the reply's code (-1: none came), and the
  // response when the code is 0.
  auto send = [&](const NamespaceId& to, const std::string& data,
                  v1::PublishInOneResponse* resp) {
    const uint64_t id = ++request;
    // Eager even when large: a rendezvous request is dropped unanswered (not an eager message).
    EXPECT_TRUE(peer.Send(w::kPublishInOneAm, PublishInOneHeader(id, to), data,
                          RawUcxPeer::kReply | RawUcxPeer::kEager));
    for (int i = 0; i < 400; ++i) {
      peer.Progress(std::chrono::milliseconds(5));
      const auto [header, body] = peer.last_reply(w::kPublishInOneReplyAm);
      w::ReplyHeader h;
      if (!w::DecodeReplyHeader(header, &h) || h.request_id != id) continue;
      if (h.code == 0) {
        EXPECT_TRUE(h.complete);
        EXPECT_TRUE(resp->ParseFromString(body));
      }
      return static_cast<int>(h.code);
    }
    return -1;
  };
  // What a fetch of the three finds: 1 intact, 0 missing (anything else fails the test).
  auto held = [&] {
    std::vector<std::vector<uint8_t>> out;
    auto f = (*client)->FetchBlobs(ns, ids, &out);
    std::string found;
    if (!f.ok()) return std::string("fetch failed: ") + f.status().ToString();
    for (size_t i = 0; i < 3; ++i) {
      if (f->status[i] != BlockStatus::kOk) {
        found += '0';
        continue;
      }
      found += std::string(out[i].begin(), out[i].end()) == blocks[i] ? '1' : 'x';
    }
    return found;
  };
  const int invalid = static_cast<int>(absl::StatusCode::kInvalidArgument);
  v1::PublishInOneResponse resp;
  EXPECT_EQ(send(ns, PublishInOneData(ns, ids, blocks, {}, {8192, 8192, 200}), &resp), invalid);
  EXPECT_EQ(send(ns, PublishInOneData(ns, {ids.data(), 1}, {std::string(300 << 10, 'b')}), &resp),
            invalid);
  NamespaceId nobody;
  nobody.bytes.fill(7);
  EXPECT_GT(send(nobody, PublishInOneData(nobody, ids, blocks), &resp), 0);
  EXPECT_EQ(held(), "000");
  // Block 1's bytes are not what its CRC was taken of.
  std::vector<uint32_t> crcs;
  for (const auto& b : blocks) crcs.push_back(Crc32c(b.data(), b.size()));
  crcs[1] ^= 1;
  ASSERT_EQ(send(ns, PublishInOneData(ns, ids, blocks, crcs), &resp), 0);
  ASSERT_EQ(resp.status_size(), 3);
  EXPECT_EQ(resp.status(0), v1::BLOCK_OK);
  EXPECT_EQ(resp.status(1), v1::BLOCK_CRC_MISMATCH);
  EXPECT_EQ(resp.status(2), v1::BLOCK_OK);
  EXPECT_EQ(held(), "101");
  ASSERT_EQ(send(ns, PublishInOneData(ns, ids, blocks), &resp), 0);
  ASSERT_EQ(resp.status_size(), 3);
  EXPECT_EQ(resp.status(0), v1::BLOCK_EXISTS);
  EXPECT_EQ(resp.status(1), v1::BLOCK_OK);
  EXPECT_EQ(resp.status(2), v1::BLOCK_EXISTS);
  EXPECT_EQ(held(), "111");
  auto stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->open_reservations, 0u) << "a refused publish left its reservation open";
  ASSERT_TRUE(Alive(d.pid())) << d.log();
}

// Abort as a one-way message (am_wire kAbortAm) ends the reservation it names, as the gRPC
// Abort does; a malformed one and one naming no reservation change nothing.
TEST(DaemonAmFuzzTest, AbortByMessageEndsTheReservation) {
  DaemonProcess d("host_tier:\n  capacity: 64MiB\n");
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = ClientOf(d);
  ASSERT_TRUE(client.ok()) << client.status();
  auto ns = *(*client)->OpenNamespace(Spec(), "tenant");
  const v1::ReserveResponse res =
      ReserveRaw(d, ns, ComputeBlockIds(ns, kTokensPerBlock, Tokens(kTokensPerBlock, 31)), 4096);
  ASSERT_NE(res.reservation_id(), 0u);
  auto open_reservations = [&] {
    auto s = (*client)->Stats();
    return s.ok() ? s->open_reservations : ~0ull;
  };
  ASSERT_EQ(open_reservations(), 1u);
  RawUcxPeer peer;
  ASSERT_TRUE(peer.ok());
  ASSERT_TRUE(peer.Connect(ConnectRaw(d).worker_address));
  peer.Send(w::kAbortAm, "x", "", 0);                            // malformed
  peer.Send(w::kAbortAm, U64(res.reservation_id() + 1), "", 0);  // nobody's
  peer.Progress(std::chrono::milliseconds(200));
  EXPECT_EQ(open_reservations(), 1u);
  peer.Send(w::kAbortAm, U64(res.reservation_id()), "", 0);
  for (int i = 0; i < 200 && open_reservations() != 0; ++i)
    peer.Progress(std::chrono::milliseconds(10));
  EXPECT_EQ(open_reservations(), 0u);
  ASSERT_TRUE(Alive(d.pid())) << d.log();
}

// Pieces of published blocks (am_wire kPublishPieceAm) from a raw peer: a block whose pieces
// come in order is acknowledged once, after its last; a piece that does not continue its block
// is refused; and a block that starts over after it was whole, or never finished, is read again
// at Commit, so a CRC stratad noted earlier never vouches for bytes written since.
TEST(PublishPiecesTest, InOrderOnlyAndCommitReadsAgainWhatChangedSince) {
  DaemonProcess d("host_tier:\n  capacity: 64MiB\n");
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = ClientOf(d);
  ASSERT_TRUE(client.ok()) << client.status();
  auto ns = *(*client)->OpenNamespace(Spec(), "tenant");
  auto stub = CacheStub(d);
  constexpr uint64_t kBlock = 200000, kPiece = 65536;  // four pieces, the last 3,392 bytes
  const auto ids = ComputeBlockIds(ns, kTokensPerBlock, Tokens(3 * kTokensPerBlock, 41));
  auto reserve = [&](size_t first, size_t n) {
    return ReserveRaw(d, ns, std::vector<BlockId>(ids.begin() + first, ids.begin() + first + n),
                      kBlock);
  };
  auto commit = [&](uint64_t reservation, const std::vector<uint32_t>& crcs) {
    v1::CommitRequest req;
    req.set_reservation_id(reservation);
    for (uint32_t c : crcs) req.add_crc32c(c);
    v1::CommitResponse res;
    grpc::ClientContext ctx;
    WithDeadline(&ctx);
    EXPECT_TRUE(stub->Commit(&ctx, req, &res).ok());
    return std::vector<int>(res.status().begin(), res.status().end());
  };
  const auto blocks = RandomBlocks(3, kBlock, 42);
  const auto garbage = RandomBlocks(1, kPiece, 43)[0];
  RawUcxPeer peer;
  ASSERT_TRUE(peer.ok());
  ASSERT_TRUE(peer.Connect(ConnectRaw(d).worker_address));
  const uint32_t eager = RawUcxPeer::kReply | RawUcxPeer::kEager;
  uint64_t request = 100;
  auto send_piece = [&](const v1::ReserveResponse& r, uint32_t index, uint64_t at,
                        const std::vector<uint8_t>& from, uint64_t from_at) {
    const uint64_t n = std::min(kPiece, kBlock - at);
    return peer.Send(w::kPublishPieceAm,
                     w::EncodePublishPieceHeader(
                         {{request, r.reservation_id(), r.offsets(index), kBlock, index}, at}),
                     std::string_view(reinterpret_cast<const char*>(from.data()) + from_at, n),
                     eager);
  };
  // The acknowledgements of `request`, after waiting up to `tries` x 10 ms for `n` of them.
  auto acks = [&](size_t n, int tries = 200) {
    std::vector<w::PublishAck> out;
    for (int i = 0; i < tries && out.size() < n; ++i) {
      peer.Progress(std::chrono::milliseconds(10));
      out.clear();
      for (auto& [header, data] : peer.replies(w::kPublishAckAm)) {
        auto a = w::DecodePublishAck(header);
        if (a && a->request_id == request) out.push_back(*a);
      }
    }
    return out;
  };
  const auto two = reserve(0, 2);
  ASSERT_EQ(two.offsets_size(), 2);
  for (uint32_t k = 0; k < 2; ++k) {
    for (uint64_t at = 0; at < kBlock; at += kPiece) {
      ASSERT_TRUE(send_piece(two, k, at, blocks[k], at));
      if (at + kPiece < kBlock) {
        EXPECT_TRUE(acks(1, 5).empty()) << "acknowledged before its end";
      }
    }
    const auto a = acks(1);
    ASSERT_EQ(a.size(), 1u);
    EXPECT_EQ(a[0].index, k);
    EXPECT_EQ(a[0].code, 0u);
    ++request;
  }
  // Block 0 starts over with other bytes and never ends: Commit reads it again and refuses it.
  ASSERT_TRUE(send_piece(two, 0, 0, garbage, 0));
  EXPECT_TRUE(acks(1, 5).empty());
  const std::vector<uint32_t> crcs = {Crc32c(blocks[0].data(), kBlock),
                                      Crc32c(blocks[1].data(), kBlock)};
  EXPECT_EQ(commit(two.reservation_id(), crcs),
            (std::vector<int>{v1::BLOCK_CRC_MISMATCH, v1::BLOCK_OK}));

  // Out of order: refused at once, and the block is not taken.
  ++request;
  const auto one = reserve(2, 1);
  ASSERT_EQ(one.offsets_size(), 1);
  ASSERT_TRUE(send_piece(one, 0, kPiece, blocks[2], kPiece));
  const auto refused = acks(1);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  // A piece outside its block, or of a block outside the arena: refused, nothing written.
  ++request;
  ASSERT_TRUE(peer.Send(w::kPublishPieceAm,
                        w::EncodePublishPieceHeader({{request, one.reservation_id(),
                                                      one.offsets(0), kBlock, 0}, kBlock}),
                        "x", eager));
  ASSERT_TRUE(peer.Send(w::kPublishPieceAm,
                        w::EncodePublishPieceHeader({{request, one.reservation_id(), ~0ull - 8,
                                                      kBlock, 0}, 0}),
                        "x", eager));
  const auto outside = acks(2);
  ASSERT_EQ(outside.size(), 2u);
  for (const auto& a : outside)
    EXPECT_EQ(a.code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(commit(one.reservation_id(), {Crc32c(blocks[2].data(), kBlock)}),
            (std::vector<int>{v1::BLOCK_CRC_MISMATCH}));
  ASSERT_TRUE(Alive(d.pid())) << d.log();
  ASSERT_NO_FATAL_FAILURE(ExpectServes(d, 44));
}

// The table of blocks being published in pieces is shared by every caller: blocks of
// reservations that ended (here aborted after their first piece, 4,096 of them: the table's
// size for a 16 MiB arena) leave no entry that refuses another caller's block, and a block too
// small to come in pieces is refused.
TEST(PublishPiecesTest, EndedReservationsLeaveNoEntriesThatRefuseOthers) {
  DaemonProcess d("host_tier:\n  capacity: 16MiB\n");
  ASSERT_TRUE(d.ok()) << d.log();
  auto client = ClientOf(d);
  ASSERT_TRUE(client.ok()) << client.status();
  auto ns = *(*client)->OpenNamespace(Spec(), "tenant");
  constexpr uint64_t kBlock = 8192, kPiece = 4096;
  RawUcxPeer peer;
  ASSERT_TRUE(peer.ok());
  ASSERT_TRUE(peer.Connect(ConnectRaw(d).worker_address));
  const uint32_t eager = RawUcxPeer::kReply | RawUcxPeer::kEager;
  const std::string half(kPiece, 'h');
  uint64_t request = 1;
  for (uint32_t round = 0; round < 64; ++round) {
    const auto r = ReserveRaw(
        d, ns, ComputeBlockIds(ns, kTokensPerBlock, Tokens(64 * kTokensPerBlock, 1000 + round)),
        kBlock);
    ASSERT_EQ(r.offsets_size(), 64) << round;
    for (uint32_t k = 0; k < 64; ++k)
      ASSERT_TRUE(peer.Send(w::kPublishPieceAm,
                            w::EncodePublishPieceHeader(
                                {{request++, r.reservation_id(), r.offsets(k), kBlock, k}, 0}),
                            half, eager));
    ASSERT_TRUE(peer.Send(w::kAbortAm, U64(r.reservation_id()), "", 0));  // after its pieces
    peer.Progress(std::chrono::milliseconds(1));
  }
  auto acks_of = [&](uint64_t id) {
    std::vector<w::PublishAck> out;
    for (int i = 0; i < 300 && out.empty(); ++i) {
      peer.Progress(std::chrono::milliseconds(10));
      for (auto& [header, data] : peer.replies(w::kPublishAckAm)) {
        auto a = w::DecodePublishAck(header);
        if (a && a->request_id == id) out.push_back(*a);
      }
    }
    return out;
  };
  const auto one =
      ReserveRaw(d, ns, ComputeBlockIds(ns, kTokensPerBlock, Tokens(kTokensPerBlock, 7)), kBlock);
  ASSERT_EQ(one.offsets_size(), 1);
  const uint64_t last = request++;
  for (uint64_t at = 0; at < kBlock; at += kPiece)
    ASSERT_TRUE(peer.Send(w::kPublishPieceAm,
                          w::EncodePublishPieceHeader(
                              {{last, one.reservation_id(), one.offsets(0), kBlock, 0}, at}),
                          half, eager));
  const auto got = acks_of(last);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].code, 0u) << "the table refused a block of an open reservation";

  const auto tiny =
      ReserveRaw(d, ns, ComputeBlockIds(ns, kTokensPerBlock, Tokens(kTokensPerBlock, 8)), 2);
  ASSERT_EQ(tiny.offsets_size(), 1);
  const uint64_t small = request++;
  ASSERT_TRUE(peer.Send(
      w::kPublishPieceAm,
      w::EncodePublishPieceHeader({{small, tiny.reservation_id(), tiny.offsets(0), 2, 0}, 0}),
      "x", eager));
  const auto refused = acks_of(small);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].code, static_cast<uint32_t>(absl::StatusCode::kInvalidArgument));
  ASSERT_TRUE(Alive(d.pid())) << d.log();
}

// With data_plane_workers: 3, Connect hands clients the three workers in turn, and another
// daemon (a client named stratad:...) always the first, whose worker answers the cluster's
// messages; a count past 64 stops the daemon with an error that names the key.
TEST(DataPlaneWorkersTest, ConnectSpreadsClientsOverTheWorkers) {
  DaemonProcess d("host_tier:\n  capacity: 64MiB\ndata_plane_workers: 3\n");
  ASSERT_TRUE(d.ok()) << d.log();
  std::vector<std::string> seen;
  for (int i = 0; i < 4; ++i) seen.push_back(ConnectRaw(d).worker_address);
  for (const std::string& a : seen) ASSERT_FALSE(a.empty());
  EXPECT_NE(seen[0], seen[1]);
  EXPECT_NE(seen[1], seen[2]);
  EXPECT_NE(seen[0], seen[2]);
  EXPECT_EQ(seen[3], seen[0]);
  EXPECT_EQ(ConnectRaw(d, "stratad:n2:directory").worker_address, seen[0]);
  EXPECT_EQ(ConnectRaw(d).worker_address, seen[1]);  // the turn goes on after a daemon's
  DaemonProcess bad("host_tier:\n  capacity: 64MiB\ndata_plane_workers: 65\n");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.log().find("data_plane_workers"), std::string::npos) << bad.log();
}

}  // namespace
}  // namespace strata
