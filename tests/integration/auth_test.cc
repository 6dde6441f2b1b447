// Issue 14 items 1-2: unguessable reservation and lease ids, bearer tokens with roles, and the
// safe default for non-loopback listen addresses, against real stratad processes.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <bit>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "proto/convert.h"
#include "strata/admin_client.h"
#include "strata/client.h"
#include "strata/v1/admin.grpc.pb.h"
#include "strata/v1/cache.grpc.pb.h"
#include "strata/v1/calibration.grpc.pb.h"
#include "strata/v1/peer.grpc.pb.h"

#include "tests/integration/auth_fixture.h"

namespace strata {
namespace {

using namespace auth_fixture;  // NOLINT: the fixture is this file's vocabulary

using testing::DaemonProcess;
using testing::RandomBlocks;
using testing::Tokens;

// ---- Item 1: reservation and lease ids ------------------------------------------------------

// The generator stratad used before: splitmix64 over a counter. One output gives its state
// (every step of the finalizer is invertible), hence every later id.
uint64_t SplitmixNextAfter(uint64_t z) {
  auto unshift = [](uint64_t v, int s) {
    uint64_t r = v;
    for (int i = 0; i < 64 / s + 1; ++i) r = v ^ (r >> s);
    return r;
  };
  z = unshift(z, 31);
  z *= 0x319642b2d24d8ec3ull;  // inverse of 0x94D049BB133111EB mod 2^64
  z = unshift(z, 27);
  z *= 0x96de1b173f119089ull;  // inverse of 0xBF58476D1CE4E5B9
  z = unshift(z, 30);
  uint64_t s = z + 0x9E3779B97F4A7C15ull;  // the state after the next step
  s = (s ^ (s >> 30)) * 0xBF58476D1CE4E5B9ull;
  s = (s ^ (s >> 27)) * 0x94D049BB133111EBull;
  return s ^ (s >> 31);
}

// Reserves one fresh block per call on a daemon without auth; the reservation ids.
std::vector<uint64_t> ReservationIds(v1::Cache::Stub& stub, const std::string& ns, int n) {
  std::vector<uint64_t> ids;
  for (int i = 0; i < n; ++i) {
    v1::ReserveRequest req;
    req.set_namespace_id(ns);
    BlockId id;
    id.bytes[0] = static_cast<uint8_t>(i);
    id.bytes[1] = static_cast<uint8_t>(i >> 8);
    id.bytes[31] = 0x5a;
    req.set_ids(Packed({id}));
    req.add_sizes(4096);
    v1::ReserveResponse resp;
    auto s = stub.Reserve(Ctx("").get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    ids.push_back(resp.reservation_id());
  }
  return ids;
}


TEST(AuthIdsTest, ReservationIdsAreNotPredictableFromEachOther) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto stub = v1::Cache::NewStub(Channel(d));
  grpc::Status opened;
  std::string ns = OpenRaw(*stub, "", "t", &opened);
  ASSERT_TRUE(opened.ok()) << opened.error_code() << " " << opened.error_message();
  std::vector<uint64_t> ids = ReservationIds(*stub, ns, 64);
  std::set<uint64_t> distinct(ids.begin(), ids.end());
  EXPECT_EQ(distinct.size(), ids.size());
  EXPECT_FALSE(distinct.contains(0));
  int predicted = 0, sequential = 0;
  double ones = 0, flipped = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    ones += std::popcount(ids[i]);
    if (i == 0) continue;
    predicted += SplitmixNextAfter(ids[i - 1]) == ids[i];
    sequential += ids[i] - ids[i - 1] == 1 || ids[i - 1] - ids[i] == 1;
    flipped += std::popcount(ids[i] ^ ids[i - 1]);
  }
  // Before the fix every id followed from the one before (predicted == 63).
  EXPECT_EQ(predicted, 0) << "ids follow the old splitmix64 sequence";
  EXPECT_EQ(sequential, 0);
  // Statistical sanity: about half the bits set, about half flip between consecutive ids
  // (bounds are > 6 sigma wide for 4,096 and 4,032 bits).
  EXPECT_NEAR(ones / (64.0 * ids.size()), 0.5, 0.05);
  EXPECT_NEAR(flipped / (64.0 * (ids.size() - 1)), 0.5, 0.05);
}

TEST(AuthIdsTest, GuessedIdsNearARealOneAreNotFoundAndLeaveItAlone) {
  DaemonProcess d;
  ASSERT_TRUE(d.ok()) << d.log();
  auto stub = v1::Cache::NewStub(Channel(d));
  std::string ns = OpenRaw(*stub, "", "victim");
  const uint64_t victim = ReservationIds(*stub, ns, 1)[0];
  ASSERT_NE(victim, 0u);
  for (uint64_t guess : {victim + 1, victim - 1, victim ^ 1, victim ^ (uint64_t{1} << 63),
                         SplitmixNextAfter(victim)}) {
    v1::AbortRequest a;
    a.set_reservation_id(guess);
    v1::AbortResponse ar;
    grpc::Status s = stub->Abort(Ctx("").get(), a, &ar);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
    EXPECT_NE(s.error_message().find("unknown"), std::string::npos) << s.error_message();
    v1::CommitRequest c;
    c.set_reservation_id(guess);
    c.add_crc32c(0);
    v1::CommitResponse cr;
    s = stub->Commit(Ctx("").get(), c, &cr);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  }
  // The victim's reservation is untouched: it aborts (it would commit) normally.
  v1::AbortRequest a;
  a.set_reservation_id(victim);
  v1::AbortResponse ar;
  EXPECT_TRUE(stub->Abort(Ctx("").get(), a, &ar).ok());
  // Leases likewise: a guessed Release is unknown and the real lease stays held.
  v1::ReleaseRequest r;
  r.set_lease_id(victim + 1);
  v1::ReleaseResponse rr;
  EXPECT_EQ(stub->Release(Ctx("").get(), r, &rr).error_code(), grpc::StatusCode::NOT_FOUND);
}

// ---- Item 2: tokens and roles ----------------------------------------------------------------

// Every method of the three services, called with `token` on a daemon with auth; the codes.
std::map<std::string, grpc::StatusCode> CallEverything(const DaemonProcess& d,
                                                       const std::string& token,
                                                       const std::string& ns,
                                                       v1::ConnectResponse* connect = nullptr) {
  auto ch = Channel(d);
  auto cache = v1::Cache::NewStub(ch);
  auto admin = v1::Admin::NewStub(ch);
  auto peer = v1::Peer::NewStub(ch);
  auto calibrations = v1::Calibrations::NewStub(ch);
  std::map<std::string, grpc::StatusCode> codes;
  BlockId id;
  id.bytes[0] = 7;
  auto code = [&](const char* name, grpc::Status s) { codes[name] = s.error_code(); };
#define STRATA_CALL(stub, Method, Req, Resp, fill)                       \
  {                                                                      \
    v1::Req req;                                                         \
    v1::Resp resp;                                                       \
    fill;                                                                \
    code(#stub "." #Method, stub->Method(Ctx(token).get(), req, &resp)); \
  }
  v1::ConnectResponse scratch;
  code("cache.Connect",
       cache->Connect(Ctx(token).get(), v1::ConnectRequest(), connect ? connect : &scratch));
  {
    grpc::Status s;
    OpenRaw(*cache, token, "", &s);
    code("cache.OpenNamespace", s);
  }
  STRATA_CALL(cache, Lookup, LookupRequest, LookupResponse,
              (req.set_namespace_id(ns), req.set_ids(Packed({id}))));
  {
    auto ctx = Ctx(token);
    auto stream = cache->LookupStream(ctx.get());
    v1::LookupRequest req;
    req.set_namespace_id(ns);
    req.set_ids(Packed({id}));
    stream->Write(req);
    stream->WritesDone();
    v1::LookupResponse resp;
    while (stream->Read(&resp)) {
    }
    code("cache.LookupStream", stream->Finish());
  }
  STRATA_CALL(cache, Reserve, ReserveRequest, ReserveResponse,
              (req.set_namespace_id(ns), req.set_ids(Packed({id})), req.add_sizes(64)));
  STRATA_CALL(cache, Commit, CommitRequest, CommitResponse, req.set_reservation_id(1));
  STRATA_CALL(cache, Abort, AbortRequest, AbortResponse, req.set_reservation_id(1));
  STRATA_CALL(cache, Acquire, AcquireRequest, AcquireResponse,
              (req.set_namespace_id(ns), req.set_ids(Packed({id}))));
  STRATA_CALL(cache, Release, ReleaseRequest, ReleaseResponse, req.set_lease_id(1));
  STRATA_CALL(cache, Evict, EvictRequest, EvictResponse,
              (req.set_namespace_id(ns), req.set_ids(Packed({id}))));
  STRATA_CALL(cache, Pin, PinRequest, PinResponse,
              (req.set_namespace_id(ns), req.set_ids(Packed({id})), req.set_ttl_ms(1000)));
  STRATA_CALL(cache, Unpin, UnpinRequest, UnpinResponse,
              (req.set_namespace_id(ns), req.set_ids(Packed({id}))));
  STRATA_CALL(cache, Stats, StatsRequest, StatsResponse, (void)req);
  STRATA_CALL(cache, Locate, LocateRequest, LocateResponse,
              (req.set_namespace_id(ns), req.set_ids(Packed({id}))));
  STRATA_CALL(cache, Reposition, RepositionRequest, RepositionResponse,
              (req.set_namespace_id(ns), req.set_ids(Packed({id}))));
  STRATA_CALL(admin, Drain, DrainRequest, DrainResponse, (void)req);
  STRATA_CALL(admin, ListNodes, ListNodesRequest, ListNodesResponse, (void)req);
  STRATA_CALL(admin, ListNamespaces, ListNamespacesRequest, ListNamespacesResponse, (void)req);
  STRATA_CALL(admin, ListBlocks, ListBlocksRequest, ListBlocksResponse, req.set_namespace_id(ns));
  STRATA_CALL(admin, InspectBlocks, InspectBlocksRequest, InspectBlocksResponse,
              req.set_ids(Packed({id})));
  STRATA_CALL(peer, Announce, AnnounceRequest, AnnounceResponse,
              (req.set_node_id("x"), req.set_ids(Packed({id}))));
  STRATA_CALL(peer, Locate, PeerLocateRequest, PeerLocateResponse, req.set_ids(Packed({id})));
  STRATA_CALL(peer, Pull, PullRequest, PullResponse,
              (req.set_ids(Packed({id})), req.set_source_node("evil"),
               req.set_source_address("127.0.0.1:1")));
  STRATA_CALL(peer, GetCalibration, GetCalibrationRequest, GetCalibrationResponse,
              req.set_namespace_id(ns));
  STRATA_CALL(peer, PutCalibration, PutCalibrationRequest, PutCalibrationResponse,
              (req.set_namespace_id(ns), req.set_artefact("x")));
  STRATA_CALL(calibrations, Put, PutCalibrationRequest, PutCalibrationResponse,
              (req.set_namespace_id(ns), req.set_artefact("x")));
  STRATA_CALL(calibrations, Get, GetCalibrationRequest, GetCalibrationResponse,
              req.set_namespace_id(ns));
  STRATA_CALL(calibrations, List, ListCalibrationsRequest, ListCalibrationsResponse,
              req.set_namespace_id(ns));
#undef STRATA_CALL
  return codes;
}

TEST(AuthTest, WithoutAValidTokenEveryCallIsUnauthenticated) {
  auto d = AuthDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  const std::string ns(32, '\1');
  for (const std::string& token : {std::string(), std::string("not-a-known-token-xxxxxx")}) {
    v1::ConnectResponse connect;
    auto codes = CallEverything(*d, token, ns, &connect);
    EXPECT_EQ(codes.size(), 28u);
    for (const auto& [method, c] : codes)
      EXPECT_EQ(c, grpc::StatusCode::UNAUTHENTICATED) << method << " with token '" << token << "'";
    // No data-plane endpoint: neither the worker address nor the arena's key.
    EXPECT_TRUE(connect.worker_address().empty());
    EXPECT_TRUE(connect.arena_rkey().empty());
  }
  // libstrata without a token cannot connect at all.
  ClientOptions o;
  o.endpoint = d->endpoint();
  auto c = Client::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnauthenticated) << c.status();
}

TEST(AuthTest, RolesReachOnlyTheirServices) {
  auto d = AuthDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  auto cache = v1::Cache::NewStub(Channel(*d));
  const std::string ns = OpenRaw(*cache, kTokenA, "");
  ASSERT_EQ(ns.size(), 32u);
  auto is_admin = [](const std::string& m) { return m.rfind("admin.", 0) == 0; };
  auto is_peer = [](const std::string& m) { return m.rfind("peer.", 0) == 0; };
  // A tenant: the Cache service only, and the calibrations of its own namespaces (this one is
  // tenant a's).
  for (const auto& [m, c] : CallEverything(*d, kTokenB, ns)) {
    if (is_admin(m) || is_peer(m) || m.rfind("calibrations.", 0) == 0) {
      EXPECT_EQ(c, grpc::StatusCode::PERMISSION_DENIED) << m;
    }
  }
  // Tenant a reaches its own namespace's (it has none; and an opaque namespace takes none).
  auto own = CallEverything(*d, kTokenA, ns);
  EXPECT_EQ(own["calibrations.List"], grpc::StatusCode::OK);
  EXPECT_EQ(own["calibrations.Get"], grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(own["calibrations.Put"], grpc::StatusCode::FAILED_PRECONDITION);
  // The admin: Admin (and Cache, for operator tools), never Peer.
  for (const auto& [m, c] : CallEverything(*d, kAdminToken, ns)) {
    if (is_peer(m)) {
      EXPECT_EQ(c, grpc::StatusCode::PERMISSION_DENIED) << m;
    }
    if (is_admin(m)) {
      EXPECT_NE(c, grpc::StatusCode::PERMISSION_DENIED) << m;
    }
    EXPECT_NE(c, grpc::StatusCode::UNAUTHENTICATED) << m;
  }
  // A peer: Peer (and Cache, which pulls read from), never Admin; a pull from a node outside
  // the cluster view is refused before anything is dialed.
  auto codes = CallEverything(*d, kPeerToken, ns);
  for (const auto& [m, c] : codes) {
    if (is_admin(m)) {
      EXPECT_EQ(c, grpc::StatusCode::PERMISSION_DENIED) << m;
    }
    EXPECT_NE(c, grpc::StatusCode::UNAUTHENTICATED) << m;
  }
  EXPECT_EQ(codes["peer.Locate"], grpc::StatusCode::OK);
  EXPECT_EQ(codes["peer.Pull"], grpc::StatusCode::PERMISSION_DENIED);
}

TEST(AuthTest, TenantBCannotReadWriteEvictPinOrListTenantAsBlocks) {
  auto d = AuthDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  // Tenant a publishes through libstrata (fast paths off: gRPC lookups, RMA transfers).
  auto a = ConnectAs(*d, kTokenA);
  ASSERT_TRUE(a);
  auto ns = a->OpenNamespace(Spec(), "a");  // naming its own tenant is fine
  ASSERT_TRUE(ns.ok()) << ns.status();
  auto tokens = Tokens(4 * kTokensPerBlock, 1);
  auto blocks = RandomBlocks(4, 8192, 2);
  std::vector<ConstBuffer> views;
  for (const auto& b : blocks) views.push_back({b.data(), b.size()});
  auto pub = a->Publish(*ns, tokens, views);
  ASSERT_TRUE(pub.ok()) << pub.status();
  ASSERT_EQ(pub->stored, 4u);
  const std::string raw_ns(ns->AsBytes());
  const std::string ids = Packed(pub->ids);

  auto ch = Channel(*d);
  auto cache = v1::Cache::NewStub(ch);
  const auto kDenied = grpc::StatusCode::PERMISSION_DENIED;
  // b cannot open a namespace as a, and a namespace it opens lands under b (another id).
  grpc::Status s;
  OpenRaw(*cache, kTokenB, "a", &s);
  EXPECT_EQ(s.error_code(), kDenied) << s.error_message();
  EXPECT_NE(OpenRaw(*cache, kTokenB, ""), raw_ns);
  {
    v1::LookupRequest q;
    q.set_namespace_id(raw_ns);
    q.set_ids(ids);
    v1::LookupResponse r;
    EXPECT_EQ(cache->Lookup(Ctx(kTokenB).get(), q, &r).error_code(), kDenied);
    v1::LocateRequest lq;
    lq.set_namespace_id(raw_ns);
    lq.set_ids(ids);
    v1::LocateResponse lr;
    EXPECT_EQ(cache->Locate(Ctx(kTokenB).get(), lq, &lr).error_code(), kDenied);
  }
  {
    v1::AcquireRequest q;
    q.set_namespace_id(raw_ns);
    q.set_ids(ids);
    v1::AcquireResponse r;
    EXPECT_EQ(cache->Acquire(Ctx(kTokenB).get(), q, &r).error_code(), kDenied);
    EXPECT_EQ(r.lease_id(), 0u);
  }
  {
    BlockId fresh;
    fresh.bytes[5] = 9;
    v1::ReserveRequest q;
    q.set_namespace_id(raw_ns);
    q.set_ids(Packed({fresh}));
    q.add_sizes(64);
    v1::ReserveResponse r;
    EXPECT_EQ(cache->Reserve(Ctx(kTokenB).get(), q, &r).error_code(), kDenied);
  }
  {
    v1::EvictRequest q;
    q.set_namespace_id(raw_ns);
    q.set_ids(ids);
    q.set_force(true);
    v1::EvictResponse r;
    EXPECT_EQ(cache->Evict(Ctx(kTokenB).get(), q, &r).error_code(), kDenied);
    v1::PinRequest pq;
    pq.set_namespace_id(raw_ns);
    pq.set_ids(ids);
    pq.set_ttl_ms(60000);
    v1::PinResponse pr;
    EXPECT_EQ(cache->Pin(Ctx(kTokenB).get(), pq, &pr).error_code(), kDenied);
    v1::UnpinRequest uq;
    uq.set_namespace_id(raw_ns);
    uq.set_ids(ids);
    v1::UnpinResponse ur;
    EXPECT_EQ(cache->Unpin(Ctx(kTokenB).get(), uq, &ur).error_code(), kDenied);
    v1::RepositionRequest rq;
    rq.set_namespace_id(raw_ns);
    rq.set_ids(ids);
    v1::RepositionResponse rr;
    EXPECT_EQ(cache->Reposition(Ctx(kTokenB).get(), rq, &rr).error_code(), kDenied);
  }
  {
    // Listing is the admin's: b gets nothing.
    auto admin = v1::Admin::NewStub(ch);
    v1::ListNamespacesRequest q;
    v1::ListNamespacesResponse r;
    EXPECT_EQ(admin->ListNamespaces(Ctx(kTokenB).get(), q, &r).error_code(), kDenied);
    EXPECT_EQ(r.namespaces_size(), 0);
    v1::ListBlocksRequest bq;
    bq.set_namespace_id(raw_ns);
    v1::ListBlocksResponse br;
    EXPECT_EQ(admin->ListBlocks(Ctx(kTokenB).get(), bq, &br).error_code(), kDenied);
  }
  {
    // a's live reservation and lease: b's Commit, Abort and Release read "unknown", and a's
    // own calls still work afterwards.
    BlockId fresh;
    fresh.bytes[6] = 3;
    v1::ReserveRequest q;
    q.set_namespace_id(raw_ns);
    q.set_ids(Packed({fresh}));
    q.add_sizes(64);
    v1::ReserveResponse res;
    ASSERT_TRUE(cache->Reserve(Ctx(kTokenA).get(), q, &res).ok());
    ASSERT_NE(res.reservation_id(), 0u);
    v1::AcquireRequest aq;
    aq.set_namespace_id(raw_ns);
    aq.set_ids(ids);
    v1::AcquireResponse lease;
    ASSERT_TRUE(cache->Acquire(Ctx(kTokenA).get(), aq, &lease).ok());
    ASSERT_NE(lease.lease_id(), 0u);
    v1::AbortRequest ab;
    ab.set_reservation_id(res.reservation_id());
    v1::AbortResponse abr;
    EXPECT_EQ(cache->Abort(Ctx(kTokenB).get(), ab, &abr).error_code(), grpc::StatusCode::NOT_FOUND);
    v1::CommitRequest cm;
    cm.set_reservation_id(res.reservation_id());
    cm.add_crc32c(0);
    v1::CommitResponse cmr;
    EXPECT_EQ(cache->Commit(Ctx(kTokenB).get(), cm, &cmr).error_code(),
              grpc::StatusCode::NOT_FOUND);
    v1::ReleaseRequest rl;
    rl.set_lease_id(lease.lease_id());
    v1::ReleaseResponse rlr;
    EXPECT_EQ(cache->Release(Ctx(kTokenB).get(), rl, &rlr).error_code(),
              grpc::StatusCode::NOT_FOUND);
    EXPECT_TRUE(cache->Release(Ctx(kTokenA).get(), rl, &rlr).ok());
    EXPECT_TRUE(cache->Abort(Ctx(kTokenA).get(), ab, &abr).ok());
  }
  // Nothing of a's changed; a reads its blocks back byte for byte.
  auto look = a->Lookup(*ns, tokens);
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->prefix_blocks, 4u);
  std::vector<std::vector<uint8_t>> out(4, std::vector<uint8_t>(8192));
  std::vector<MutableBuffer> bufs;
  for (auto& b : out) bufs.push_back({b.data(), b.size()});
  auto fetched = a->Fetch(*ns, look->ids, bufs);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->fetched, 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(out[i], blocks[i]) << i;
}

TEST(AuthTest, AdminListsAndEvictsAnyTenantsBlocks) {
  auto d = AuthDaemon();
  ASSERT_TRUE(d->ok()) << d->log();
  auto a = ConnectAs(*d, kTokenA);
  ASSERT_TRUE(a);
  auto ns = *a->OpenNamespace(Spec(), "");
  auto blocks = RandomBlocks(2, 4096, 5);
  std::vector<ConstBuffer> views;
  for (const auto& b : blocks) views.push_back({b.data(), b.size()});
  auto tokens = Tokens(2 * kTokensPerBlock, 5);
  auto pub = a->Publish(ns, tokens, views);
  ASSERT_TRUE(pub.ok()) << pub.status();

  AdminClientOptions o;
  o.endpoint = d->endpoint();
  auto tenant_admin = [&](const std::string& token) {
    o.auth_token = token;
    return std::move(*AdminClient::Connect(o));
  };
  // A tenant's token is no admin's.
  EXPECT_EQ(tenant_admin(kTokenA)->ListNamespaces().status().code(),
            absl::StatusCode::kPermissionDenied);
  auto admin = tenant_admin(kAdminToken);
  auto listed = admin->ListNamespaces();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].tenant, "a");
  EXPECT_EQ((*listed)[0].id, ns);
  auto evicted = admin->Evict(ns, pub->ids, /*cascade=*/false, /*force=*/false);
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  EXPECT_EQ(evicted->removed_blocks, 2u);
  EXPECT_EQ(a->Lookup(ns, tokens)->prefix_blocks, 0u);
}

// Two nodes with tokens and peer tokens: replication (a Peer.Pull to n1, whose puller reads
// through n0's Cache service) works, since every daemon-to-daemon call carries the peer token.
TEST(AuthTest, ClusterOfTwoReplicatesWithPeerTokens) {
  std::string dir = testing::MakeTempDir("auth-cluster");
  std::ofstream(dir + "/tokens") << kTokenA << " a tenant\n" << kPeerToken << " - peer\n";
  std::ofstream(dir + "/peer") << kPeerToken << "\n";
  std::ofstream(dir + "/secret") << "auth-cluster-secret-0123456789\n";
  std::vector<std::unique_ptr<DaemonProcess>> nodes;
  for (int attempt = 0; attempt < 3 && !(nodes.size() == 2 && testing::AllServing(nodes));
       ++attempt) {
    nodes.clear();
    std::string addrs[2] = {"127.0.0.1:" + std::to_string(testing::FreePort()),
                            "127.0.0.1:" + std::to_string(testing::FreePort())};
    for (int i = 0; i < 2; ++i)
      nodes.push_back(std::make_unique<DaemonProcess>(
          "node_id: n" + std::to_string(i) + "\ncluster_secret_file: " + dir +
              "/secret\nhost_tier:\n  capacity: 64MiB\nauth:\n  tokens_file: " + dir +
              "/tokens\n  peer_token_file: " + dir +
              "/peer\ncluster:\n  membership: static\n  static_nodes: [\"n0@" + addrs[0] +
              "\", \"n1@" + addrs[1] + "\"]\n  peer_timeout: 500ms\n",
          std::vector<std::string>{"--listen", addrs[i]}));
  }
  ASSERT_TRUE(testing::AllServing(nodes)) << testing::AllLogs(nodes);
  auto a0 = ConnectAs(*nodes[0], kTokenA);
  ASSERT_TRUE(a0);
  auto blocks = RandomBlocks(3, 4096, 8);
  std::vector<ConstBuffer> views;
  for (const auto& b : blocks) views.push_back({b.data(), b.size()});
  // Replicated: n1 pulls each block from n0 before Commit returns.
  auto rep = *a0->OpenNamespace(Spec(), "", /*replicas=*/2);
  auto rep_tokens = Tokens(3 * kTokensPerBlock, 8);
  ASSERT_TRUE(a0->Publish(rep, rep_tokens, views).ok());
  auto a1 = ConnectAs(*nodes[1], kTokenA);
  ASSERT_TRUE(a1);
  ASSERT_EQ(*a1->OpenNamespace(Spec(), "a"), rep);
  std::vector<std::vector<uint8_t>> out(3, std::vector<uint8_t>(4096));
  std::vector<MutableBuffer> bufs;
  for (auto& b : out) bufs.push_back({b.data(), b.size()});
  auto look = a1->Lookup(rep, rep_tokens);
  ASSERT_TRUE(look.ok()) << look.status();
  ASSERT_EQ(look->prefix_blocks, 3u) << testing::AllLogs(nodes);
  auto fetched = a1->Fetch(rep, look->ids, bufs);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->fetched, 3u) << testing::AllLogs(nodes);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(out[i], blocks[i]) << i;
  std::filesystem::remove_all(dir);
}

// ---- Item 3: the safe default ----------------------------------------------------------------

TEST(AuthDefaultsTest, NonLoopbackListenWithoutAuthNeedsInsecure) {
  {
    DaemonProcess d("", {"--listen", "0.0.0.0:0"});
    EXPECT_FALSE(d.ok());
    auto code = d.WaitExit(std::chrono::seconds(10));
    EXPECT_EQ(code, std::optional<int>(2));
    EXPECT_NE(d.log().find("insecure"), std::string::npos) << d.log();
  }
  {
    DaemonProcess d("", {"--listen", "0.0.0.0:0", "--insecure"});
    ASSERT_TRUE(d.ok()) << d.log();
    EXPECT_NE(d.log().find("INSECURE"), std::string::npos) << d.log();
  }
}

}  // namespace
}  // namespace strata
