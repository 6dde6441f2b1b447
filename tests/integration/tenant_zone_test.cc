// Issue 14 item 2, several tenants: each tenant's blocks live in a zone of the arena with its
// own sealed file, and a same-node client of that tenant maps its zone read-only and fetches by
// plain copies (no push). Another tenant's ticket, a made-up one or an operator's gets no zone;
// the file a client gets cannot be written or mapped writable. Against real stratad processes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/internal/zone_window.h"
#include "common/am_wire.h"
#include "common/crc32c.h"
#include "common/zone_wire.h"
#include "tests/integration/auth_fixture.h"
#include "tests/integration/raw_ucx_peer.h"
#include "tests/support/free_port.h"

namespace strata {
namespace {

using namespace auth_fixture;  // NOLINT: the fixture is this file's vocabulary
using testing::RandomBlocks;
using testing::Tokens;

v1::ConnectResponse ConnectRaw(const DaemonProcess& d, const std::string& token) {
  auto cache = v1::Cache::NewStub(Channel(d));
  v1::ConnectRequest q;
  v1::ConnectResponse r;
  auto s = cache->Connect(Ctx(token).get(), q, &r);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return r;
}

uint64_t Counter(Client& c, const char* name) {
  auto stats = c.Stats();
  if (stats.ok())
    for (const auto& [n, v] : stats->counters)
      if (n == name) return v;
  return ~uint64_t{0};
}

// A client whose staging window (a read-only zone's) is `bytes` (STRATA_CLIENT_STAGING_BYTES).
std::unique_ptr<Client> ConnectWithStaging(const DaemonProcess& d, const std::string& token,
                                           const char* bytes) {
  setenv("STRATA_CLIENT_STAGING_BYTES", bytes, 1);
  auto c = ConnectAs(d, token);
  unsetenv("STRATA_CLIENT_STAGING_BYTES");
  return c;
}

struct Published {
  NamespaceId ns;
  std::vector<BlockId> ids;
  std::vector<std::vector<uint8_t>> blocks;
};

Published Publish(Client& c, size_t n, size_t bytes, uint32_t seed) {
  Published p;
  auto ns = c.OpenNamespace(Spec(), "");
  EXPECT_TRUE(ns.ok()) << ns.status();
  if (!ns.ok()) return p;
  p.ns = *ns;
  p.blocks = RandomBlocks(n, bytes, seed);
  std::vector<ConstBuffer> views;
  for (const auto& b : p.blocks) views.push_back({b.data(), b.size()});
  auto pub = c.Publish(*ns, Tokens(n * kTokensPerBlock, seed), views);
  EXPECT_TRUE(pub.ok()) << pub.status();
  if (pub.ok()) p.ids = pub->ids;
  return p;
}

void ExpectFetchesIntact(Client& c, const Published& p) {
  ExpectFetched(c, p.ns, p.ids, p.blocks);
}

// The arena offset of each block, from a lease of the caller's own.
std::vector<uint64_t> Offsets(const DaemonProcess& d, const std::string& token,
                              const Published& p) {
  auto cache = v1::Cache::NewStub(Channel(d));
  v1::AcquireRequest q;
  q.set_namespace_id(std::string(p.ns.AsBytes()));
  q.set_ids(Packed(p.ids));
  v1::AcquireResponse r;
  EXPECT_TRUE(cache->Acquire(Ctx(token).get(), q, &r).ok());
  std::vector<uint64_t> out(r.offsets().begin(), r.offsets().end());
  v1::ReleaseRequest rq;
  rq.set_lease_id(r.lease_id());
  v1::ReleaseResponse rr;
  (void)cache->Release(Ctx(token).get(), rq, &rr);
  return out;
}

TEST(TenantZoneTest, EachTenantMapsItsOwnZoneAndFetchesFromItWithoutPush) {
  auto d = AuthDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  auto a = ConnectAs(*d, kTokenA);
  auto b = ConnectAs(*d, kTokenB);
  ASSERT_TRUE(a && b);
  const Published pa = Publish(*a, 4, 256 << 10, 3);
  const Published pb = Publish(*b, 4, 256 << 10, 4);
  ASSERT_EQ(pa.ids.size(), 4u);
  ASSERT_EQ(pb.ids.size(), 4u);

  const v1::ConnectResponse ca = ConnectRaw(*d, kTokenA);
  const v1::ConnectResponse cb = ConnectRaw(*d, kTokenB);
  ASSERT_FALSE(ca.zone_socket().empty());
  auto wa = client::OpenZoneWindow(ca.zone_socket(), ca.am_ticket(), ca.arena_bytes(),
                                   absl::Seconds(2));
  auto wb = client::OpenZoneWindow(cb.zone_socket(), cb.am_ticket(), cb.arena_bytes(),
                                   absl::Seconds(2));
  ASSERT_TRUE(wa.ok()) << wa.status();
  ASSERT_TRUE(wb.ok()) << wb.status();
  // Disjoint zones; each tenant's blocks in its own, none in the other's.
  EXPECT_TRUE((*wa)->begin() + (*wa)->bytes() <= (*wb)->begin() ||
              (*wb)->begin() + (*wb)->bytes() <= (*wa)->begin());
  const std::vector<uint64_t> oa = Offsets(*d, kTokenA, pa);
  const std::vector<uint64_t> ob = Offsets(*d, kTokenB, pb);
  ASSERT_EQ(oa.size(), 4u);
  ASSERT_EQ(ob.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const uint64_t n = pa.blocks[i].size();
    ASSERT_TRUE((*wa)->Covers(oa[i], n)) << oa[i];
    EXPECT_FALSE((*wb)->Covers(oa[i], 1)) << "b's zone holds a's block " << i;
    EXPECT_FALSE((*wa)->Covers(ob[i], 1)) << "a's zone holds b's block " << i;
    EXPECT_EQ(std::memcmp((*wa)->At(oa[i]), pa.blocks[i].data(), n), 0) << "block " << i;
  }

  // The libstrata clients got their windows at Connect: their fetches are copies, not pushes.
  const uint64_t pushed = Counter(*a, "pushed_blocks_total");
  ASSERT_NE(pushed, ~uint64_t{0}) << "no pushed_blocks_total counter";
  ExpectFetchesIntact(*a, pa);
  ExpectFetchesIntact(*b, pb);
  EXPECT_EQ(Counter(*a, "pushed_blocks_total"), pushed);
  // Publishes go through the staging window a's client lent (the zone is read-only): the
  // daemon copies them in, and they fetch back intact.
  const uint64_t staged = Counter(*a, "published_staged_total");
  const uint64_t by_message = Counter(*a, "published_by_message_total");
  const Published more = Publish(*a, 2, 3 << 20, 9);
  ASSERT_EQ(more.ids.size(), 2u);
  ExpectFetchesIntact(*a, more);
  EXPECT_EQ(Counter(*a, "pushed_blocks_total"), pushed);
  EXPECT_EQ(Counter(*a, "published_staged_total"), staged + 2);
  EXPECT_EQ(Counter(*a, "published_by_message_total"), by_message);
  EXPECT_FALSE(d->WaitExit(std::chrono::milliseconds(0)).has_value()) << d->log();
}

// With several data-plane workers, tenants' clients that map their zones (and lend a staging
// window) copy their blocks themselves: they take the first worker, whatever turn Connect gave
// them, and the other workers answer nothing of theirs. Their blocks still fetch back intact.
TEST(TenantZoneTest, ZoneClientsTakeTheFirstWorker) {
  auto d = AuthDaemon("data_plane_workers: 3\n");
  ASSERT_TRUE(d->ok()) << d->log();
  std::vector<std::unique_ptr<Client>> clients;
  for (const std::string& token : {kTokenA, kTokenB, kTokenA, kTokenB}) {
    clients.push_back(ConnectAs(*d, token));
    ASSERT_NE(clients.back(), nullptr);
  }
  auto requests = [&](int w) {
    return Counter(*clients[0], absl::StrCat("data_plane_worker_", w, "_requests_total").c_str());
  };
  const uint64_t before[3] = {requests(0), requests(1), requests(2)};
  ASSERT_NE(before[0], ~uint64_t{0}) << "no per-worker request counters";
  const uint64_t pushed = Counter(*clients[0], "pushed_blocks_total");
  uint32_t seed = 40;
  for (auto& c : clients) {
    const Published p = Publish(*c, 2, 256 << 10, ++seed);
    ASSERT_EQ(p.ids.size(), 2u);
    ExpectFetchesIntact(*c, p);
  }
  EXPECT_EQ(Counter(*clients[0], "pushed_blocks_total"), pushed);  // copies from the zones
  EXPECT_GT(requests(0), before[0]);
  EXPECT_EQ(requests(1), before[1]);
  EXPECT_EQ(requests(2), before[2]);
}

TEST(TenantZoneTest, NoZoneWithoutATenantsOwnTicket) {
  auto d = AuthDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  const v1::ConnectResponse ca = ConnectRaw(*d, kTokenA);
  const v1::ConnectResponse admin = ConnectRaw(*d, kAdminToken);
  ASSERT_FALSE(ca.zone_socket().empty());
  EXPECT_TRUE(admin.zone_socket().empty());  // operators are not offered a zone ...
  const std::string& socket = ca.zone_socket();
  auto code = [&](const std::string& ticket) {
    auto grant = client::RequestZone(socket, ticket, absl::Seconds(2));
    if (grant.ok()) close(grant->fd);
    return grant.status().code();
  };
  // ... and refused one when they ask anyway, as are made-up and missing tickets.
  EXPECT_EQ(code(admin.am_ticket()), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(code(std::string(ca.am_ticket().size(), 'x')), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(code(""), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(code(ca.am_ticket()), absl::StatusCode::kOk);
  // A client that connects and says nothing holds the socket only until its deadline.
  {
    auto stalled = client::RequestZone(socket, std::string(zone_wire::kMaxTicketBytes + 1, 'x'),
                                       absl::Seconds(2));
    EXPECT_EQ(stalled.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_FALSE(d->WaitExit(std::chrono::milliseconds(0)).has_value()) << d->log();
}

// What a tenant's client can do with the file it is handed: read, nothing else. So a's own
// committed blocks stay as a published them, even against a's compromised client.
TEST(TenantZoneTest, TheZoneFileCannotBeWrittenByItsHolder) {
  auto d = AuthDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  auto a = ConnectAs(*d, kTokenA);
  ASSERT_TRUE(a);
  const Published pa = Publish(*a, 2, 64 << 10, 5);
  ASSERT_EQ(pa.ids.size(), 2u);
  const v1::ConnectResponse ca = ConnectRaw(*d, kTokenA);
  auto grant = client::RequestZone(ca.zone_socket(), ca.am_ticket(), absl::Seconds(2));
  ASSERT_TRUE(grant.ok()) << grant.status();
  const uint64_t at = Offsets(*d, kTokenA, pa)[0] - grant->begin;
  errno = 0;
  EXPECT_EQ(mmap(nullptr, grant->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, grant->fd, 0),
            MAP_FAILED);
  EXPECT_EQ(errno, EPERM);
  const std::string forged(4096, '\xEE');
  EXPECT_LT(pwrite(grant->fd, forged.data(), forged.size(), static_cast<off_t>(at)), 0);
  const std::string path = "/proc/self/fd/" + std::to_string(grant->fd);
  const int again = open(path.c_str(), O_RDWR);
  if (again >= 0) {
    EXPECT_EQ(mmap(nullptr, grant->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, again, 0),
              MAP_FAILED);
    EXPECT_LT(pwrite(again, forged.data(), forged.size(), static_cast<off_t>(at)), 0);
    close(again);
  }
  EXPECT_NE(ftruncate(grant->fd, 0), 0);
  close(grant->fd);
  ExpectFetchesIntact(*a, pa);
}

// auth.tenant_zones_writable: a tenant's clients map their own zone writable and publish by
// plain copies (no block message), still only into their own zone; the other tenant's zone
// and blocks stay out of reach.
TEST(TenantZoneTest, WritableZonesPublishByCopiesIntoTheTenantsOwnZoneOnly) {
  auto d = AuthDaemon("  tenant_zones_writable: true\n");
  ASSERT_TRUE(d->ok()) << d->log();
  auto a = ConnectAs(*d, kTokenA);
  auto b = ConnectAs(*d, kTokenB);
  ASSERT_TRUE(a && b);
  const uint64_t by_message = Counter(*a, "published_by_message_total");
  ASSERT_NE(by_message, ~uint64_t{0});
  const Published pa = Publish(*a, 3, 1 << 20, 21);
  const Published pb = Publish(*b, 3, 1 << 20, 22);
  ASSERT_EQ(pa.ids.size(), 3u);
  ASSERT_EQ(pb.ids.size(), 3u);
  EXPECT_EQ(Counter(*a, "published_by_message_total"), by_message) << "published by message";
  ExpectFetchesIntact(*a, pa);
  ExpectFetchesIntact(*b, pb);

  const v1::ConnectResponse cb = ConnectRaw(*d, kTokenB);
  auto grant = client::RequestZone(cb.zone_socket(), cb.am_ticket(), absl::Seconds(2));
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_TRUE(grant->writable);
  void* w = mmap(nullptr, grant->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, grant->fd, 0);
  EXPECT_NE(w, MAP_FAILED);
  if (w != MAP_FAILED) munmap(w, grant->bytes);
  close(grant->fd);
  for (uint64_t offset : Offsets(*d, kTokenA, pa))
    EXPECT_FALSE(offset >= grant->begin && offset < grant->begin + grant->bytes)
        << "a's block inside b's writable zone";
  EXPECT_FALSE(d->WaitExit(std::chrono::milliseconds(0)).has_value()) << d->log();
}

// A read-only zone's client lends the daemon a staging window (a sealed memfd of its own) and
// publishes through it: more bytes than the window holds reuse it as a ring, every byte comes
// back, and the loan ends when the client lets the window go.
// One block of `bytes` reserved in `token`'s own namespace, by a raw gRPC call.
v1::ReserveResponse ReserveOne(v1::Cache::Stub& cache, const std::string& token, uint8_t tag,
                               uint64_t bytes) {
  v1::ReserveRequest rq;
  rq.set_namespace_id(OpenRaw(cache, token, ""));
  BlockId id;
  id.bytes[0] = tag;
  rq.set_ids(Packed({id}));
  rq.add_sizes(bytes);
  v1::ReserveResponse rr;
  EXPECT_TRUE(cache.Reserve(Ctx(token).get(), rq, &rr).ok());
  return rr;
}

TEST(TenantZoneTest, ReadOnlyZonesPublishThroughALentStagingWindow) {
  auto d = AuthDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  auto a = ConnectWithStaging(*d, kTokenA, "2097152");  // a window of 2 MiB
  auto b = ConnectAs(*d, kTokenB);
  ASSERT_TRUE(a && b);
  const uint64_t lent = Counter(*a, "staging_windows_lent");
  ASSERT_NE(lent, ~uint64_t{0}) << "no staging_windows_lent gauge";
  EXPECT_GE(lent, 2u);
  const uint64_t staged = Counter(*a, "published_staged_total");
  const uint64_t by_message = Counter(*a, "published_by_message_total");
  // 12 MiB in blocks of 768 KiB through a's 2 MiB window, and b's blocks beside them.
  const Published pa = Publish(*a, 16, 768 << 10, 41);
  const Published pb = Publish(*b, 8, 256 << 10, 42);
  ASSERT_EQ(pa.ids.size(), 16u);
  ASSERT_EQ(pb.ids.size(), 8u);
  EXPECT_EQ(Counter(*a, "published_staged_total"), staged + 24);
  EXPECT_EQ(Counter(*a, "published_by_message_total"), by_message);
  ExpectFetchesIntact(*a, pa);
  ExpectFetchesIntact(*b, pb);

  const v1::ConnectResponse ca = ConnectRaw(*d, kTokenA);
  auto window = client::OpenZoneWindow(ca.zone_socket(), ca.am_ticket(), ca.arena_bytes(),
                                       absl::Seconds(2));
  ASSERT_TRUE(window.ok()) << window.status();
  ASSERT_TRUE((*window)->staging_status().ok()) << (*window)->staging_status();
  EXPECT_NE((*window)->staging().id, 0u);
  EXPECT_EQ(Counter(*a, "staging_windows_lent"), lent + 1);
  window->reset();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (Counter(*a, "staging_windows_lent") != lent && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(Counter(*a, "staging_windows_lent"), lent) << "the loan outlived its connection";
  EXPECT_FALSE(d->WaitExit(std::chrono::milliseconds(0)).has_value()) << d->log();
}

// Blocks the engine writes into a publish buffer (Client::AllocatePublishBuffer) are published
// from there without the client's copy: with no staging window of its own (size 0), the client
// still publishes them staged, and the daemon's copy is what is stored (the engine reusing the
// buffer afterwards changes nothing). Blocks from other memory go by message as before; a client
// of a daemon without zones gets ordinary memory.
TEST(TenantZoneTest, PublishBuffersAreStagedWithoutTheClientsCopy) {
  auto d = AuthDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  auto a = ConnectWithStaging(*d, kTokenA, "0");
  ASSERT_TRUE(a);
  const uint64_t lent = Counter(*a, "staging_windows_lent");
  auto buf = a->AllocatePublishBuffer(8 << 20);
  ASSERT_TRUE(buf.ok()) << buf.status();
  EXPECT_EQ(Counter(*a, "staging_windows_lent"), lent + 1);
  auto ns = a->OpenNamespace(Spec(), "");
  ASSERT_TRUE(ns.ok()) << ns.status();
  const auto blocks = RandomBlocks(8, 1 << 20, 51);
  std::vector<ConstBuffer> views;
  uint8_t* const base = static_cast<uint8_t*>(buf->data);
  for (size_t i = 0; i < blocks.size(); ++i) {
    std::memcpy(base + (i << 20), blocks[i].data(), blocks[i].size());
    views.push_back({base + (i << 20), blocks[i].size()});
  }
  const uint64_t staged = Counter(*a, "published_staged_total");
  const uint64_t by_message = Counter(*a, "published_by_message_total");
  auto pub = a->Publish(*ns, Tokens(8 * kTokensPerBlock, 52), views);
  ASSERT_TRUE(pub.ok()) << pub.status();
  ASSERT_EQ(pub->stored, 8u);
  EXPECT_EQ(Counter(*a, "published_staged_total"), staged + 8);
  EXPECT_EQ(Counter(*a, "published_by_message_total"), by_message);
  std::memset(base, 0xAB, 8 << 20);  // the engine reuses its buffer
  ExpectFetched(*a, *ns, pub->ids, blocks);

  const Published other = Publish(*a, 2, 256 << 10, 53);  // ordinary memory
  EXPECT_EQ(Counter(*a, "published_by_message_total"), by_message + 2);
  ExpectFetchesIntact(*a, other);

  DaemonProcess plain("host_tier:\n  capacity: 64MiB\n");
  ASSERT_TRUE(plain.ok()) << plain.log();
  auto c = ConnectAs(plain, "");
  ASSERT_TRUE(c);
  auto mem = c->AllocatePublishBuffer(1 << 20);
  ASSERT_TRUE(mem.ok()) << mem.status();
  auto cns = c->OpenNamespace(Spec(), "t");
  ASSERT_TRUE(cns.ok());
  std::memcpy(mem->data, blocks[0].data(), 1 << 20);
  const ConstBuffer view{mem->data, 1 << 20};
  auto cpub = c->Publish(*cns, Tokens(kTokensPerBlock, 54), {&view, 1});
  ASSERT_TRUE(cpub.ok()) << cpub.status();
  ExpectFetched(*c, *cns, cpub->ids, {blocks[0]});
}

// Publish buffers outlive the daemon they were lent to: after stratad restarts on the same
// endpoint (a new instance that knows none of them), the client lends them again on their next
// use, and blocks published from them are copied by the new daemon and fetch intact.
TEST(TenantZoneTest, PublishBuffersAreLentAgainToARestartedDaemon) {
  std::vector<std::string> listen;
  auto d = testing::OnFreePort(&listen, [](const auto& l) { return AuthDaemon("", l); });
  ASSERT_TRUE(d->ok()) << d->log();
  auto a = ConnectWithStaging(*d, kTokenA, "0");
  ASSERT_TRUE(a);
  auto buf = a->AllocatePublishBuffer(2 << 20);
  ASSERT_TRUE(buf.ok()) << buf.status();
  uint8_t* const base = static_cast<uint8_t*>(buf->data);
  auto publish_from_buffer = [&](uint32_t seed) {
    const auto blocks = RandomBlocks(2, 1 << 20, seed);
    std::vector<ConstBuffer> views;
    for (size_t i = 0; i < blocks.size(); ++i) {
      std::memcpy(base + (i << 20), blocks[i].data(), blocks[i].size());
      views.push_back({base + (i << 20), blocks[i].size()});
    }
    auto ns = a->OpenNamespace(Spec(), "");
    ASSERT_TRUE(ns.ok()) << ns.status();
    const uint64_t staged = Counter(*a, "published_staged_total");
    auto pub = a->Publish(*ns, Tokens(2 * kTokensPerBlock, seed), views);
    ASSERT_TRUE(pub.ok()) << pub.status();
    ASSERT_EQ(pub->stored, 2u);
    EXPECT_EQ(Counter(*a, "published_staged_total"), staged + 2) << "not published staged";
    std::memset(base, 0, 2 << 20);
    ExpectFetched(*a, *ns, pub->ids, blocks);
  };
  publish_from_buffer(61);
  d.reset();  // killed: the loans end with it
  d = AuthDaemon("", listen);
  ASSERT_TRUE(d->ok()) << d->log();
  // The client's first call after the restart may find the old connection broken; an engine
  // retries it.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!a->Stats().ok() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(Counter(*a, "staging_windows_lent"), 0u) << "a new daemon with windows already";
  publish_from_buffer(62);
  EXPECT_EQ(Counter(*a, "staging_windows_lent"), 1u) << "the buffer was not lent again";
}

// A client that lends no window (STRATA_CLIENT_STAGING_BYTES=0, as one refused a window would)
// still publishes into its read-only zone, by checked messages.
TEST(TenantZoneTest, WithoutAStagingWindowPublishesGoByMessages) {
  auto d = AuthDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  auto a = ConnectWithStaging(*d, kTokenA, "0");
  ASSERT_TRUE(a);
  EXPECT_EQ(Counter(*a, "staging_windows_lent"), 0u);
  const uint64_t staged = Counter(*a, "published_staged_total");
  const uint64_t by_message = Counter(*a, "published_by_message_total");
  const Published pa = Publish(*a, 3, 1 << 20, 51);
  ASSERT_EQ(pa.ids.size(), 3u);
  EXPECT_EQ(Counter(*a, "published_by_message_total"), by_message + 3);
  EXPECT_EQ(Counter(*a, "published_staged_total"), staged);
  ExpectFetchesIntact(*a, pa);
}

// The daemon maps what it is lent, so it takes only what cannot turn its copies into SIGBUS (a
// memfd sealed against shrinking, of a bounded size), only from a tenant with a zone of its
// own, and only where zones are read-only.
TEST(TenantZoneTest, StagingWindowsMustBeSealedMemfdsOfAZonesTenant) {
  auto d = AuthDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  const v1::ConnectResponse ca = ConnectRaw(*d, kTokenA);
  const v1::ConnectResponse admin = ConnectRaw(*d, kAdminToken);
  const std::string& socket = ca.zone_socket();
  ASSERT_FALSE(socket.empty());
  auto memfd = [](uint64_t bytes, unsigned seals) {
    const int fd = memfd_create("staging-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    if (seals != 0) {
      EXPECT_EQ(fcntl(fd, F_ADD_SEALS, seals), 0);
    }
    return fd;
  };
  std::vector<int> sockets;
  auto lend = [&](int fd, const std::string& ticket) {
    int sock = -1;
    auto id = client::LendStagingFd(socket, ticket, fd, absl::Seconds(2), &sock);
    close(fd);
    if (sock >= 0) sockets.push_back(sock);
    return id;
  };
  EXPECT_EQ(lend(memfd(1 << 20, 0), ca.am_ticket()).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "an unsealed memfd";
  const std::string file = testing::MakeTempDir("staging") + "/file";
  const int plain = open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(plain, 0);
  ASSERT_EQ(ftruncate(plain, 1 << 20), 0);
  EXPECT_EQ(lend(plain, ca.am_ticket()).status().code(), absl::StatusCode::kInvalidArgument)
      << "a plain file";
  EXPECT_EQ(lend(memfd(4096, F_SEAL_SHRINK), ca.am_ticket()).status().code(),
            absl::StatusCode::kInvalidArgument)
      << "too small";
  EXPECT_EQ(lend(memfd(1 << 20, F_SEAL_SHRINK), admin.am_ticket()).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "an operator has no zone";
  EXPECT_EQ(lend(memfd(1 << 20, F_SEAL_SHRINK), std::string(ca.am_ticket().size(), 'x'))
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
  auto first = lend(memfd(1 << 20, F_SEAL_SHRINK), ca.am_ticket());
  auto second = lend(memfd(1 << 20, F_SEAL_SHRINK | F_SEAL_GROW), ca.am_ticket());
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(*first, *second);
  for (int s : sockets) close(s);

  auto writable = AuthDaemon("  tenant_zones_writable: true\n");
  ASSERT_TRUE(writable->ok()) << writable->log();
  const v1::ConnectResponse wa = ConnectRaw(*writable, kTokenA);
  int sock = -1;
  const int fd = memfd(1 << 20, F_SEAL_SHRINK);
  EXPECT_EQ(client::LendStagingFd(wa.zone_socket(), wa.am_ticket(), fd, absl::Seconds(2), &sock)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition)
      << "writable zones take no staging windows";
  close(fd);
  EXPECT_FALSE(d->WaitExit(std::chrono::milliseconds(0)).has_value()) << d->log();
}

// A staged block names its staging window by id; the daemon copies from a window only into
// the zone of the tenant that lent it, from inside the window, with the CRC the sender named,
// whether it comes alone or with others in one message. A raw UCX peer tries the rest.
TEST(TenantZoneTest, AStagingWindowFillsOnlyItsOwnTenantsZone) {
  auto d = AuthDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  namespace w = am_wire;
  auto cache = v1::Cache::NewStub(Channel(*d));
  constexpr uint64_t kBytes = 64 << 10;
  const v1::ReserveResponse ra = ReserveOne(*cache, kTokenA, 0xa1, kBytes);
  const v1::ReserveResponse rb = ReserveOne(*cache, kTokenB, 0xb1, kBytes);
  ASSERT_EQ(ra.offsets_size(), 1);
  ASSERT_EQ(rb.offsets_size(), 1);

  const v1::ConnectResponse ca = ConnectRaw(*d, kTokenA);
  auto window = client::OpenZoneWindow(ca.zone_socket(), ca.am_ticket(), ca.arena_bytes(),
                                       absl::Seconds(2), 1 << 20);
  ASSERT_TRUE(window.ok()) << window.status();
  const client::ZoneWindow::Staging& staging = (*window)->staging();
  ASSERT_NE(staging.data, nullptr) << (*window)->staging_status();
  std::memset(staging.data, 0xEE, kBytes);
  const uint32_t crc = Crc32c(staging.data, kBytes);

  testing::RawUcxPeer peer;
  ASSERT_TRUE(peer.ok());
  ASSERT_TRUE(peer.Connect(ca.worker_address()));
  uint32_t index = 0;
  auto send = [&](uint64_t reservation, uint64_t offset, uint64_t window_id,
                  uint64_t window_offset, uint32_t sum) {
    const uint32_t i = index++;
    const std::string h = w::EncodePublishStagedHeader(
        w::PublishStagedHeader{{7, reservation, offset, kBytes, i}, window_id, window_offset, sum});
    EXPECT_TRUE(peer.Send(w::kPublishStagedAm, h, "",
                          testing::RawUcxPeer::kReply | testing::RawUcxPeer::kEager));
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    std::optional<w::PublishAck> ack;
    while (std::chrono::steady_clock::now() < until) {
      peer.Progress(std::chrono::milliseconds(5));
      ack = w::DecodePublishAck(peer.last_reply(w::kPublishAckAm).first);
      if (ack && ack->index == i) break;
    }
    return ack && ack->index == i ? static_cast<absl::StatusCode>(ack->code)
                                  : absl::StatusCode::kUnknown;
  };
  // b's reservation and extent through a's window: outside a's zone.
  EXPECT_EQ(send(rb.reservation_id(), rb.offsets(0), staging.id, 0, crc),
            absl::StatusCode::kPermissionDenied);
  // A made-up window; a's own extent from past the window's end.
  EXPECT_EQ(send(ra.reservation_id(), ra.offsets(0), staging.id ^ 1, 0, crc),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(send(ra.reservation_id(), ra.offsets(0), staging.id, staging.bytes - kBytes / 2, crc),
            absl::StatusCode::kInvalidArgument);
  // a's extent under b's reservation id is not b's to fill either.
  EXPECT_EQ(send(rb.reservation_id(), ra.offsets(0), staging.id, 0, crc),
            absl::StatusCode::kPermissionDenied);
  // A CRC that is not the bytes'; then a's own block, as a's client would send it.
  EXPECT_EQ(send(ra.reservation_id(), ra.offsets(0), staging.id, 0, crc ^ 1),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(send(ra.reservation_id(), ra.offsets(0), staging.id, 0, crc), absl::StatusCode::kOk);
  EXPECT_EQ(std::memcmp((*window)->At(ra.offsets(0)), staging.data, kBytes), 0);

  // Several staged blocks in one message (am_wire::kPublishStagedManyAm), as a client of a
  // daemon that offers it sends them: each block gets the checks above and is refused alone
  // with its reason; only a's own block is stored, acknowledged with the CRC stratad took. A
  // batch not laid out as the wire says is dropped whole: nothing acknowledged or written.
  EXPECT_TRUE((*window)->staged_many()) << "the zone socket did not offer kPublishStagedManyAm";
  std::memset(staging.data, 0x5C, kBytes);
  const uint32_t crc2 = Crc32c(staging.data, kBytes);
  const uint64_t res = ra.reservation_id();
  std::vector<w::PublishStagedHeader> batch = {
      {{9, res, rb.offsets(0), kBytes, 0}, staging.id, 0, crc2, 0},      // b's extent
      {{9, res, ra.offsets(0), kBytes, 1}, staging.id ^ 1, 0, crc2, 0},  // made-up window
      {{9, res, ra.offsets(0), kBytes, 2}, staging.id, staging.bytes - kBytes / 2, crc2, 0},
      {{9, res, ra.offsets(0), kBytes, 3}, staging.id, 0, crc2 ^ 1, 0},               // wrong CRC
      {{9, res, ra.offsets(0), kBytes, 4}, staging.id, 0, 0, w::kStagedCrcByDaemon},  // a's own
  };
  auto send_many = [&](uint64_t request_id, uint64_t reservation,
                       const std::vector<w::PublishStagedHeader>& blocks, uint32_t count) {
    std::string data;
    for (const auto& b : blocks) data += w::EncodePublishStagedHeader(b);
    EXPECT_TRUE(peer.Send(w::kPublishStagedManyAm,
                          w::EncodePublishStagedManyHeader(request_id, reservation, count), data,
                          testing::RawUcxPeer::kReply | testing::RawUcxPeer::kEager));
  };
  // Malformed first: a count that is not the data's, an entry of another reservation.
  send_many(9, res, batch, 4);
  auto other = batch;
  other[4].block.reservation_id = rb.reservation_id();
  send_many(9, res, other, 5);
  send_many(9, res, batch, 5);
  std::map<uint32_t, absl::StatusCode> refused;
  std::optional<w::PublishAcks> stored;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < until && (refused.size() < 4 || !stored)) {
    peer.Progress(std::chrono::milliseconds(5));
    refused.clear();
    for (const auto& [header, data] : peer.replies(w::kPublishAckAm))
      if (auto ack = w::DecodePublishAck(header); ack && ack->request_id == 9)
        refused[ack->index] = static_cast<absl::StatusCode>(ack->code);
    for (const auto& [header, data] : peer.replies(w::kPublishAcksAm))
      stored = w::DecodePublishAcks(header, data);
  }
  EXPECT_EQ(refused,
            (std::map<uint32_t, absl::StatusCode>{{0, absl::StatusCode::kPermissionDenied},
                                                  {1, absl::StatusCode::kFailedPrecondition},
                                                  {2, absl::StatusCode::kInvalidArgument},
                                                  {3, absl::StatusCode::kDataLoss}}));
  ASSERT_TRUE(stored.has_value()) << "no kPublishAcksAm for the stored block";
  ASSERT_EQ(stored->acks.size(), 1u);
  EXPECT_EQ(stored->request_id, 9u);
  EXPECT_EQ(stored->acks[0].index, 4u);
  EXPECT_EQ(stored->acks[0].crc32c, crc2);
  EXPECT_EQ(peer.replies(w::kPublishAcksAm).size(), 1u) << "a malformed batch was answered";
  EXPECT_EQ(std::memcmp((*window)->At(ra.offsets(0)), staging.data, kBytes), 0);
  EXPECT_FALSE(d->WaitExit(std::chrono::milliseconds(0)).has_value()) << d->log();
}

// More tenants than the capacity has 2 MiB zones for: the daemon still starts, says why it has
// no zones, and its tenants' blocks move by messages as before.
TEST(TenantZoneTest, TooManyTenantsForZonesFallsBackToMessages) {
  std::string dir = testing::MakeTempDir("zones");
  {
    std::ofstream tokens(dir + "/tokens");
    tokens << kTokenA << " a tenant\n";
    for (int i = 0; i < 40; ++i)
      tokens << "filler-token-" << i << "-0123456789 filler" << i << " tenant\n";
  }
  DaemonProcess d("host_tier:\n  capacity: 64MiB\nauth:\n  tokens_file: " + dir + "/tokens\n");
  ASSERT_TRUE(d.ok()) << d.log();
  EXPECT_NE(d.log().find("no tenant zones"), std::string::npos) << d.log();
  EXPECT_TRUE(ConnectRaw(d, kTokenA).zone_socket().empty());
  auto a = ConnectAs(d, kTokenA);
  ASSERT_TRUE(a);
  const Published pa = Publish(*a, 2, 256 << 10, 31);
  ASSERT_EQ(pa.ids.size(), 2u);
  const uint64_t pushed = Counter(*a, "pushed_blocks_total");
  ExpectFetchesIntact(*a, pa);
  EXPECT_EQ(Counter(*a, "pushed_blocks_total"), pushed + 2);
}

}  // namespace
}  // namespace strata
