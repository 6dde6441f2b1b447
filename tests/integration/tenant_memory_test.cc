// Issue 14 item 2 (finding 1): with authentication, no client gets remote access to the arena.
// Connect hands out no remote key and no address; the daemon's UCX context has no RMA, so even a
// forged key (UCX emulates RMA over tcp with messages that name raw addresses) neither reads nor
// writes a tenant's block; bytes move only as messages the daemon checks against the caller's
// own lease or reservation. Against real stratad processes.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/am_wire.h"
#include "tests/integration/auth_fixture.h"
#include "tests/integration/publish_in_one_data.h"
#include "tests/integration/raw_ucx_peer.h"
#include "tests/integration/uct_tcp_writer.h"

namespace strata {
namespace {

using namespace auth_fixture;  // NOLINT: the fixture is this file's vocabulary
using testing::RandomBlocks;
using testing::RawUcxPeer;
using testing::Tokens;

constexpr uint64_t kArenaBytes = 64ull << 20;  // AuthDaemon's host_tier.capacity

// Where the daemon's arena is mapped, read as an attacker on the node with the daemon's uid
// could: a mapping of the arena's size or, with several tenants, the common zone that starts
// the zoned arena (storage/zoned_arena.h). 0 when neither is there.
uint64_t ArenaAddress(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long long start = 0, end = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx", &start, &end) != 2) continue;
    if (end - start == kArenaBytes || line.find("memfd:strata-zone-common") != std::string::npos)
      return start;
  }
  return 0;
}

struct Victim {
  NamespaceId ns;
  std::vector<BlockId> ids;
  std::vector<std::vector<uint8_t>> blocks;
  uint64_t offset = 0;  // of the first block in the arena
};

// Tenant a publishes four blocks through libstrata and learns where its first block lives.
Victim Publish(const DaemonProcess& d, Client& a) {
  Victim v;
  auto ns = a.OpenNamespace(Spec(), "");
  EXPECT_TRUE(ns.ok()) << ns.status();
  if (!ns.ok()) return v;
  v.ns = *ns;
  v.blocks = RandomBlocks(4, 64 << 10, 7);
  std::vector<ConstBuffer> views;
  for (const auto& b : v.blocks) views.push_back({b.data(), b.size()});
  auto pub = a.Publish(*ns, Tokens(4 * kTokensPerBlock, 3), views);
  EXPECT_TRUE(pub.ok()) << pub.status();
  if (!pub.ok()) return v;
  EXPECT_EQ(pub->stored, 4u);
  v.ids = pub->ids;
  auto cache = v1::Cache::NewStub(Channel(d));
  v1::AcquireRequest q;
  q.set_namespace_id(std::string(ns->AsBytes()));
  q.set_ids(Packed({v.ids[0]}));
  v1::AcquireResponse r;
  EXPECT_TRUE(cache->Acquire(Ctx(kTokenA).get(), q, &r).ok());
  if (r.offsets_size() == 1) v.offset = r.offsets(0);
  v1::ReleaseRequest rq;
  rq.set_lease_id(r.lease_id());
  v1::ReleaseResponse rr;
  (void)cache->Release(Ctx(kTokenA).get(), rq, &rr);
  return v;
}

// Tenant a fetches its blocks and gets exactly what it published.
void ExpectIntact(Client& a, const Victim& v) { ExpectFetched(a, v.ns, v.ids, v.blocks); }

// UCX_TLS for this scope (daemons started in it inherit it); unset again however the test ends.
class ScopedUcxTls {
 public:
  explicit ScopedUcxTls(const char* tls) {
    if (*tls) setenv("UCX_TLS", tls, 1);
  }
  ~ScopedUcxTls() { unsetenv("UCX_TLS"); }
};

// An authenticating daemon, tenant a connected to it, and the blocks a published there.
// `auth_lines` as for AuthDaemon.
struct Scene {
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<Client> a;
  Victim victim;
  // Empty when a step failed (the test's ASSERT on ok() then stops it).
  bool ok() const { return a && victim.ids.size() == 4; }
  explicit Scene(const std::string& auth_lines = "") : daemon(AuthDaemon(auth_lines)) {
    if (!daemon->ok()) return;
    a = ConnectAs(*daemon, kTokenA);
    if (a) victim = Publish(*daemon, *a);
  }
};

v1::ConnectResponse ConnectRaw(const DaemonProcess& d, const std::string& token,
                               bool instance_only = false) {
  auto cache = v1::Cache::NewStub(Channel(d));
  v1::ConnectRequest q;
  q.set_instance_only(instance_only);
  v1::ConnectResponse r;
  auto s = cache->Connect(Ctx(token).get(), q, &r);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return r;
}

TEST(TenantMemoryTest, ConnectHandsOutNoRemoteKeyOrAddress) {
  auto d = AuthDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  for (const std::string& token : {kTokenA, kAdminToken}) {
    v1::ConnectResponse c = ConnectRaw(*d, token);
    EXPECT_FALSE(c.worker_address().empty());
    EXPECT_TRUE(c.arena_rkey().empty());
    EXPECT_EQ(c.arena_base(), 0u);
    EXPECT_TRUE(c.rma_off());
    EXPECT_TRUE(c.publish_by_message());
  }
}

constexpr char kTrustedTcp[] = "  ucx_tcp_trusted: true\n";

// One tenant (and the operators): nobody else's data is in the arena, so its clients keep the
// fast path and map it, once authenticated, as long as tcp is off. With tcp on they do not:
// software RMA there would serve anyone who reaches the port.
std::unique_ptr<DaemonProcess> OneTenantDaemon(const std::string& auth_lines) {
  std::string dir = testing::MakeTempDir("auth1");
  std::ofstream(dir + "/tokens") << kTokenA << " a tenant\n" << kAdminToken << " ops admin\n";
  return std::make_unique<DaemonProcess>("host_tier:\n  capacity: 64MiB\nauth:\n  tokens_file: " +
                                         dir + "/tokens\n" + auth_lines);
}

TEST(TenantMemoryTest, OneTenantMapsTheArenaOnlyWithoutTcp) {
  for (const std::string& lines : {std::string(), std::string(kTrustedTcp)}) {
    auto d = OneTenantDaemon(lines);
    ASSERT_TRUE(d->ok()) << d->log();
    const v1::ConnectResponse c = ConnectRaw(*d, kTokenA);
    const bool tcp = !lines.empty();
    EXPECT_EQ(c.arena_rkey().empty(), tcp) << lines;
    EXPECT_EQ(c.arena_base() == 0, tcp) << lines;
    EXPECT_EQ(c.rma_off(), tcp) << lines;
    // No token, no key.
    auto cache = v1::Cache::NewStub(Channel(*d));
    v1::ConnectRequest q;
    v1::ConnectResponse r;
    EXPECT_EQ(cache->Connect(Ctx("").get(), q, &r).error_code(), grpc::UNAUTHENTICATED);
    EXPECT_TRUE(r.arena_rkey().empty());
    // The tenant's own blocks round-trip on whichever path it got.
    auto a = ConnectAs(*d, kTokenA);
    ASSERT_TRUE(a);
    ExpectIntact(*a, Publish(*d, *a));
  }
}

// The attack of finding 1 over tcp: tenant b (a valid token) connects to the daemon's worker
// and reads, then overwrites, tenant a's block by one-sided RMA. With the Connect answer's key
// when a daemon still hands one out, else a forged one. On a daemon whose operator trusts the
// tcp network: UCP's emulated RMA must be off there too.
TEST(TenantMemoryTest, AnotherTenantCannotReadOrWriteTheArenaByRma) {
  ScopedUcxTls tcp("tcp");  // the attacker's transport: software RMA, raw addresses
  Scene scene(kTrustedTcp);
  ASSERT_TRUE(scene.ok()) << scene.daemon->log();
  DaemonProcess* d = scene.daemon.get();
  const Victim& v = scene.victim;

  const v1::ConnectResponse conn = ConnectRaw(*d, kTokenB);
  const uint64_t mapped = ArenaAddress(d->pid());
  // Where a daemon still says where its arena is, the lookup must agree: so it finds the
  // arena (not some other mapping of that size) where the daemon does not say.
  if (conn.arena_base() != 0) {
    EXPECT_EQ(mapped, conn.arena_base());
  }
  const uint64_t arena = conn.arena_base() != 0 ? conn.arena_base() : mapped;
  ASSERT_NE(arena, 0u) << "no mapping of the arena's size in /proc/" << d->pid() << "/maps";
  RawUcxPeer b;
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(b.Connect(conn.worker_address()));
  std::vector<uint8_t> stolen(4096, 0);
  const bool read = b.Rma(/*put=*/false, stolen.data(), stolen.size(), arena + v.offset,
                          conn.arena_rkey());
  EXPECT_FALSE(read && std::memcmp(stolen.data(), v.blocks[0].data(), stolen.size()) == 0)
      << "tenant b read tenant a's block";
  RawUcxPeer b2;  // a fresh endpoint: the failed get may have closed the first
  ASSERT_TRUE(b2.Connect(conn.worker_address()));
  std::vector<uint8_t> forged(4096, 0xEE);
  (void)b2.Rma(/*put=*/true, forged.data(), forged.size(), arena + v.offset, conn.arena_rkey(),
               std::chrono::milliseconds(1500));
  ExpectIntact(*scene.a, v);
  EXPECT_FALSE(d->WaitExit(std::chrono::milliseconds(0)).has_value()) << d->log();
}

// Below UCP: UCX's tcp transport writes wherever a peer's put request says, whatever the
// daemon's context asked for. So an authenticating daemon opens no UCX tcp port at all (unless
// the operator says its tcp network is trusted), and this attack finds nothing to write through.
TEST(TenantMemoryTest, NoUcxTcpPortTakesARawWrite) {
  Scene scene;
  ASSERT_TRUE(scene.ok()) << scene.daemon->log();
  DaemonProcess* d = scene.daemon.get();
  const Victim& v = scene.victim;
  const uint64_t arena = ArenaAddress(d->pid());
  ASSERT_NE(arena, 0u) << "no mapping of the arena's size in /proc/" << d->pid() << "/maps";
  testing::UctTcpWriter writer;
  if (!writer.Open()) {
    GTEST_SKIP() << "no non-loopback device for UCX's tcp transport";
  }
  const std::string grpc_port = d->endpoint().substr(d->endpoint().rfind(':') + 1);
  std::vector<uint8_t> forged(4096, 0xEE);
  int written = 0;
  for (uint16_t port : testing::ListeningPorts(d->pid())) {
    if (std::to_string(port) == grpc_port) continue;
    if (writer.Put(port, forged, arena + v.offset)) ++written;
  }
  EXPECT_EQ(written, 0) << "a raw tcp put request was acknowledged";
  ExpectIntact(*scene.a, v);
  EXPECT_FALSE(d->WaitExit(std::chrono::milliseconds(0)).has_value()) << d->log();
}

// Messages that name a lease or reservation: the id is the credential. Made-up ids, and a
// reservation of b's aimed at a's extent, move nothing.
// UCX_TLS that leaves only tcp: an authenticating daemon refuses to start and says why.
TEST(TenantMemoryTest, TcpOnlyTransportsAreRefusedWithAuthentication) {
  ScopedUcxTls tcp("tcp");
  auto d = AuthDaemon();
  const auto exit = d->WaitExit(std::chrono::seconds(20));
  ASSERT_TRUE(exit.has_value()) << "started with UCX_TLS=tcp and authentication on";
  EXPECT_NE(d->log().find("auth.ucx_tcp_trusted"), std::string::npos) << d->log();
  EXPECT_NE(d->log().find("leaves no transport"), std::string::npos) << d->log();
}

TEST(TenantMemoryTest, MessagesWithoutTheCallersOwnLeaseOrReservationMoveNothing) {
  Scene scene;
  ASSERT_TRUE(scene.ok()) << scene.daemon->log();
  DaemonProcess* d = scene.daemon.get();
  const Victim& v = scene.victim;
  const v1::ConnectResponse conn = ConnectRaw(*d, kTokenB);
  namespace w = am_wire;

  // b reserves a block of its own: a real reservation, but not over a's extent.
  auto cache = v1::Cache::NewStub(Channel(*d));
  const std::string b_ns = OpenRaw(*cache, kTokenB, "");
  ASSERT_EQ(b_ns.size(), 32u);
  v1::ReserveRequest rq;
  rq.set_namespace_id(b_ns);
  BlockId mine;
  mine.bytes[0] = 0xb0;
  rq.set_ids(Packed({mine}));
  rq.add_sizes(v.blocks[0].size());
  v1::ReserveResponse rr;
  ASSERT_TRUE(cache->Reserve(Ctx(kTokenB).get(), rq, &rr).ok());
  ASSERT_NE(rr.reservation_id(), 0u);
  ASSERT_NE(rr.offsets(0), v.offset);

  RawUcxPeer b;
  ASSERT_TRUE(b.Connect(conn.worker_address()));
  const std::string garbage(v.blocks[0].size(), '\xEE');
  std::mt19937_64 rng(42);
  for (uint64_t reservation : {rr.reservation_id(), uint64_t{rng()}, uint64_t{1}}) {
    for (uint32_t flags : {uint32_t{RawUcxPeer::kEager}, uint32_t{RawUcxPeer::kRndv}}) {
      const std::string h = w::EncodePublishBlockHeader(
          {7, reservation, v.offset, garbage.size(), 0});
      EXPECT_TRUE(b.Send(w::kPublishBlockAm, h, garbage, RawUcxPeer::kReply | flags));
    }
  }
  // And push fetches of a's extent under made-up leases.
  for (uint64_t lease : {uint64_t{rng()}, uint64_t{1}, rr.reservation_id()}) {
    std::string h(w::kFetchRequestHeaderBytes, '\0');
    w::PutU64(h.data(), 9);
    w::PutU64(h.data() + 8, lease);
    w::PutU32(h.data() + 16, 1);
    std::string data(16, '\0');
    w::PutU64(data.data(), v.offset);
    w::PutU64(data.data() + 8, v.blocks[0].size());
    EXPECT_TRUE(b.Send(w::kFetchRequestAm, h, data, RawUcxPeer::kReply | RawUcxPeer::kEager));
  }
  b.Progress(std::chrono::milliseconds(500));
  ExpectIntact(*scene.a, v);
  EXPECT_FALSE(d->WaitExit(std::chrono::milliseconds(0)).has_value()) << d->log();
  // The refusals are answered (an ack or a refused block for each), never with a's bytes: the
  // raw peer counts every reply, and the largest a refusal carries is its message.
  EXPECT_GE(b.replies(), 9);
}

// With authentication the fast paths (lookup, acquire, release by message) need the ticket an
// authenticated Connect issued, and it carries that caller's tenant: no ticket, a made-up one,
// or another tenant's reaches nothing. Tenant a's own client uses them.
TEST(TenantMemoryTest, FastPathsNeedTheCallersTicket) {
  Scene scene;
  ASSERT_TRUE(scene.ok()) << scene.daemon->log();
  DaemonProcess* d = scene.daemon.get();
  const Victim& v = scene.victim;
  namespace w = am_wire;
  auto counter = [&](const char* name) {
    auto stats = scene.a->Stats();
    uint64_t value = 0;
    if (stats.ok())
      for (const auto& [n, c] : stats->counters)
        if (n == name) value = c;
    return value;
  };
  const uint64_t before = counter("acquires_by_message_total");
  ExpectIntact(*scene.a, v);
  EXPECT_EQ(counter("acquires_by_message_total") - before, 1u) << "a's fetch took no fast path";

  const v1::ConnectResponse a_conn = ConnectRaw(*d, kTokenA);
  const v1::ConnectResponse b_conn = ConnectRaw(*d, kTokenB);
  ASSERT_EQ(a_conn.am_ticket().size(), w::kTicketBytes);
  ASSERT_EQ(b_conn.am_ticket().size(), w::kTicketBytes);
  EXPECT_NE(a_conn.am_ticket(), b_conn.am_ticket());
  // A client telling a restarted daemon from a slow one asks for the instance alone: no ticket
  // (tickets are bounded, and such probes must not push other clients' out).
  const v1::ConnectResponse probe = ConnectRaw(*d, kTokenA, /*instance_only=*/true);
  EXPECT_TRUE(probe.am_ticket().empty());
  EXPECT_EQ(probe.instance_id(), a_conn.instance_id());
  RawUcxPeer b;
  ASSERT_TRUE(b.Connect(b_conn.worker_address()));
  std::string ids;
  for (const BlockId& id : v.ids) ids += std::string(id.AsBytes());
  // The code of the reply to a lookup or acquire of a's blocks sent with `ticket`.
  auto ask = [&](uint16_t request, uint16_t reply, const std::string& ticket) {
    std::string h(w::kRequestHeaderBytes, '\0');
    w::PutU64(h.data(), 77);
    std::memcpy(h.data() + 8, v.ns.bytes.data(), 32);
    h += ticket;
    EXPECT_TRUE(b.Send(request, h, ids, RawUcxPeer::kReply | RawUcxPeer::kEager));
    b.Progress(std::chrono::milliseconds(300));
    w::ReplyHeader got;
    const auto [header, data] = b.last_reply(reply);
    if (!w::DecodeReplyHeader(header, &got)) return -1;
    EXPECT_TRUE(data.find(std::string(v.blocks[0].begin(), v.blocks[0].begin() + 64)) ==
                std::string::npos);
    return static_cast<int>(got.code);
  };
  const int denied = static_cast<int>(absl::StatusCode::kPermissionDenied);
  std::string made_up(w::kTicketBytes, 'x');
  for (const std::string& ticket : {std::string(), made_up, b_conn.am_ticket()}) {
    EXPECT_EQ(ask(w::kLookupRequestAm, w::kLookupReplyAm, ticket), denied) << ticket.size();
    EXPECT_EQ(ask(w::kAcquireRequestAm, w::kAcquireReplyAm, ticket), denied) << ticket.size();
  }
  // a's own ticket works from any endpoint (the ticket is the credential).
  EXPECT_EQ(ask(w::kAcquireRequestAm, w::kAcquireReplyAm, a_conn.am_ticket()), 0);
  // Nobody but a publishes into a's namespace in one request either.
  std::vector<BlockId> fresh(1);
  fresh[0].bytes.fill(0x4f);
  const std::vector<std::string> forged = {std::string(4096, 'f')};
  for (const std::string& ticket : {std::string(), made_up, b_conn.am_ticket()}) {
    EXPECT_TRUE(b.Send(w::kPublishInOneAm, testing::PublishInOneHeader(78, v.ns, ticket),
                       testing::PublishInOneData(v.ns, fresh, forged),
                       RawUcxPeer::kReply | RawUcxPeer::kEager));
    b.Progress(std::chrono::milliseconds(300));
    w::ReplyHeader got;
    ASSERT_TRUE(w::DecodeReplyHeader(b.last_reply(w::kPublishInOneReplyAm).first, &got));
    EXPECT_EQ(static_cast<int>(got.code), denied) << ticket.size();
  }
  std::vector<std::vector<uint8_t>> none;
  auto forged_fetch = scene.a->FetchBlobs(v.ns, fresh, &none);
  ASSERT_TRUE(forged_fetch.ok()) << forged_fetch.status();
  EXPECT_EQ(forged_fetch->fetched, 0u) << "a block published without a's ticket is held";
  // b cannot release a lease of a's: a gRPC lease of a's stays open after b's release.
  auto cache = v1::Cache::NewStub(Channel(*d));
  v1::AcquireRequest q;
  q.set_namespace_id(std::string(v.ns.AsBytes()));
  q.set_ids(Packed({v.ids[1]}));
  v1::AcquireResponse lease;
  ASSERT_TRUE(cache->Acquire(Ctx(kTokenA).get(), q, &lease).ok());
  auto open_leases = [&] {
    auto stats = scene.a->Stats();
    return stats.ok() ? stats->open_leases : ~uint64_t{0};
  };
  const uint64_t open = open_leases();
  ASSERT_GE(open, 1u);
  std::string rel(w::kReleaseHeaderBytes, '\0');
  w::PutU64(rel.data(), lease.lease_id());
  EXPECT_TRUE(b.Send(w::kReleaseAm, rel + b_conn.am_ticket(), "", RawUcxPeer::kEager));
  EXPECT_TRUE(b.Send(w::kReleaseAm, rel, "", RawUcxPeer::kEager));
  b.Progress(std::chrono::milliseconds(200));
  EXPECT_EQ(open_leases(), open);
  EXPECT_TRUE(b.Send(w::kReleaseAm, rel + a_conn.am_ticket(), "", RawUcxPeer::kEager));
  b.Progress(std::chrono::milliseconds(200));
  EXPECT_EQ(open_leases(), open - 1);
  EXPECT_FALSE(d->WaitExit(std::chrono::milliseconds(0)).has_value()) << d->log();
}

// Publish and fetch by messages keep working for the right tenant, on every transport.
TEST(TenantMemoryTest, OwnBlocksMoveByMessagesOnEveryTransport) {
  for (const char* tls : {"tcp", ""}) {
    ScopedUcxTls scoped(tls);
    Scene scene(kTrustedTcp);
    ASSERT_TRUE(scene.ok()) << scene.daemon->log();
    Client* a = scene.a.get();
    ExpectIntact(*a, scene.victim);
    // Large blocks travel by rendezvous.
    auto ns = a->OpenNamespace(Spec(), "");
    ASSERT_TRUE(ns.ok());
    auto big = RandomBlocks(2, 3 << 20, 11);
    std::vector<ConstBuffer> views;
    for (const auto& b : big) views.push_back({b.data(), b.size()});
    auto pub = a->Publish(*ns, Tokens(2 * kTokensPerBlock, 9), views);
    ASSERT_TRUE(pub.ok()) << pub.status();
    EXPECT_EQ(pub->stored, 2u);
    std::vector<std::vector<uint8_t>> out(2, std::vector<uint8_t>(3 << 20));
    std::vector<MutableBuffer> bufs;
    for (auto& o : out) bufs.push_back({o.data(), o.size()});
    auto f = a->Fetch(*ns, pub->ids, bufs);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->fetched, 2u);
    EXPECT_EQ(out, big) << "UCX_TLS=" << tls;
  }
}

}  // namespace
}  // namespace strata
