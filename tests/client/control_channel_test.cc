// The control channel without a daemon: its status mapping, its deadline messages, and the
// lookup fast path answered by a stand-in daemon's worker (tests/client/fake_daemon.h) while
// the gRPC endpoint has nobody behind it, so only the active-message route can succeed.
#include "client/control_channel.h"

#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/internal/logging.h"
#include "proto/convert.h"
#include "proto/grpc_status.h"
#include "tests/client/fake_daemon.h"
#include "tests/support/free_port.h"

namespace strata::client {
namespace {

TEST(ControlChannelTest, GrpcCodesMapToTheSameAbslCodes) {
  const std::pair<grpc::StatusCode, absl::StatusCode> pairs[] = {
      {grpc::StatusCode::CANCELLED, absl::StatusCode::kCancelled},
      {grpc::StatusCode::UNKNOWN, absl::StatusCode::kUnknown},
      {grpc::StatusCode::INVALID_ARGUMENT, absl::StatusCode::kInvalidArgument},
      {grpc::StatusCode::DEADLINE_EXCEEDED, absl::StatusCode::kDeadlineExceeded},
      {grpc::StatusCode::NOT_FOUND, absl::StatusCode::kNotFound},
      {grpc::StatusCode::ALREADY_EXISTS, absl::StatusCode::kAlreadyExists},
      {grpc::StatusCode::PERMISSION_DENIED, absl::StatusCode::kPermissionDenied},
      {grpc::StatusCode::UNAUTHENTICATED, absl::StatusCode::kUnauthenticated},
      {grpc::StatusCode::RESOURCE_EXHAUSTED, absl::StatusCode::kResourceExhausted},
      {grpc::StatusCode::FAILED_PRECONDITION, absl::StatusCode::kFailedPrecondition},
      {grpc::StatusCode::ABORTED, absl::StatusCode::kAborted},
      {grpc::StatusCode::OUT_OF_RANGE, absl::StatusCode::kOutOfRange},
      {grpc::StatusCode::UNIMPLEMENTED, absl::StatusCode::kUnimplemented},
      {grpc::StatusCode::INTERNAL, absl::StatusCode::kInternal},
      {grpc::StatusCode::UNAVAILABLE, absl::StatusCode::kUnavailable},
      {grpc::StatusCode::DATA_LOSS, absl::StatusCode::kDataLoss},
  };
  for (auto [from, to] : pairs) {
    absl::Status s = strata::FromGrpcStatus(grpc::Status(from, "why"));
    EXPECT_EQ(s.code(), to) << from;
    EXPECT_EQ(s.message(), "why");
  }
  EXPECT_TRUE(strata::FromGrpcStatus(grpc::Status::OK).ok());
}

ControlOptions NobodyListening(absl::Duration rpc_timeout = absl::Milliseconds(500)) {
  ControlOptions o;
  o.endpoint = absl::StrCat("127.0.0.1:", testing::FreePort());
  o.rpc_timeout = rpc_timeout;
  return o;
}

TEST(ControlChannelTest, CallsToAnAbsentDaemonSayWhoDidNotAnswer) {
  ControlChannel channel(NobodyListening());
  v1::StatsRequest req;
  v1::StatsResponse resp;
  const absl::Time t0 = absl::Now();
  absl::Status s = channel.Rpc(
      "Stats", [&](grpc::ClientContext* c) { return channel.stub().Stats(c, req, &resp); });
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
  EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable ||
              s.code() == absl::StatusCode::kDeadlineExceeded)
      << s;
  EXPECT_NE(s.message().find(absl::StrCat("stratad at ", channel.options().endpoint,
                                          " did not answer Stats within 500ms")),
            std::string::npos)
      << s;
  EXPECT_FALSE(channel.ConnectDataPlane().ok());
}

// A mover connected to the stand-in daemon, for the channel's fast path.
std::unique_ptr<DataMover> MoverTo(FakeDaemon& daemon) {
  auto made = DataMover::Connect(
      {}, [&daemon] { return absl::StatusOr<ArenaEndpoint>(daemon.endpoint()); });
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? std::move(*made) : nullptr;
}

std::vector<BlockId> Ids(size_t n) {
  std::vector<BlockId> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i].bytes[0] = static_cast<uint8_t>(i + 1);
  return ids;
}

TEST(ControlChannelTest, LookupsUpToTheCapTakeTheActiveMessagePath) {
  FakeDaemon daemon(FakeDaemon::ArenaKind::kRegistered, 1 << 20);
  daemon.on_lookup = FakeDaemon::OnLookup::kAnswer;
  auto mover = MoverTo(daemon);
  ASSERT_TRUE(mover);
  ControlChannel channel(NobodyListening());
  channel.UseFastPath(mover.get());
  auto ids = Ids(5);
  auto resp = channel.Lookup(NamespaceId{}, ids);
  ASSERT_TRUE(resp.ok()) << resp.status();  // gRPC has nobody to ask: the fast path answered
  EXPECT_EQ(resp->prefix_blocks(), 5u);
  EXPECT_EQ(resp->tiers_size(), 5);
  EXPECT_EQ(daemon.lookups.load(), 1);
  // Over the cap: gRPC only (which fails here), the fast path is not asked.
  auto too_many = channel.Lookup(NamespaceId{}, Ids(am_wire::kMaxIds + 1));
  EXPECT_FALSE(too_many.ok());
  EXPECT_EQ(daemon.lookups.load(), 1);
}

TEST(ControlChannelTest, FastPathCanBeSwitchedOff) {
  FakeDaemon daemon(FakeDaemon::ArenaKind::kRegistered, 1 << 20);
  daemon.on_lookup = FakeDaemon::OnLookup::kAnswer;
  auto mover = MoverTo(daemon);
  ASSERT_TRUE(mover);
  ControlOptions o = NobodyListening();
  o.lookup_fast_path = false;
  ControlChannel channel(o);
  channel.UseFastPath(mover.get());
  EXPECT_FALSE(channel.Lookup(NamespaceId{}, Ids(3)).ok());
  EXPECT_EQ(daemon.lookups.load(), 0);
}

// A daemon that never answers the fast path costs a short wait per lookup, three times; then
// the channel stops asking it and says so through the log sink.
TEST(ControlChannelTest, SilentFastPathSwitchesItselfOffAndTellsTheSink) {
  FakeDaemon daemon(FakeDaemon::ArenaKind::kRegistered, 1 << 20);
  daemon.on_lookup = FakeDaemon::OnLookup::kIgnore;
  auto mover = MoverTo(daemon);
  ASSERT_TRUE(mover);
  std::mutex mu;
  std::vector<std::pair<LogLevel, std::string>> logged;
  ControlOptions o = NobodyListening();
  o.log = [&](LogLevel level, std::string_view message) {
    std::lock_guard<std::mutex> lock(mu);
    logged.emplace_back(level, std::string(message));
  };
  ControlChannel channel(o);
  channel.UseFastPath(mover.get());
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(channel.Lookup(NamespaceId{}, Ids(2)).ok());
  EXPECT_EQ(daemon.lookups.load(), 3);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_EQ(logged[0].first, LogLevel::kWarning);
  EXPECT_NE(logged[0].second.find("active-message fast path disabled after 3 timeouts"), std::string::npos)
      << logged[0].second;
}

// A daemon's Acquire answer whose extents lie outside its arena (a broken or hostile daemon, or
// a peer a daemon pulls from) is refused before anything is sized by it: a fetch into blobs
// allocated each block's size as given, up to 2^62 bytes, before the extents were checked.
TEST(ControlChannelTest, ALeaseOutsideTheDaemonsArenaIsRefused) {
  ControlChannel channel(NobodyListening());
  channel.SetArenaBytesForTesting(1 << 20);
  auto reply = [](std::vector<std::pair<uint64_t, uint64_t>> extents, v1::BlockStatus status) {
    v1::AcquireResponse resp;
    resp.set_lease_id(7);
    for (auto [offset, size] : extents) {
      resp.add_status(status);
      resp.add_offsets(offset);
      resp.add_sizes(size);
      resp.add_crc32c(0);
    }
    am_wire::ReplyHeader h;
    h.prefix = static_cast<uint32_t>(extents.size());
    h.complete = true;
    return AmReply{am_wire::EncodeReplyHeader(h), resp.SerializeAsString()};
  };
  auto fits = channel.LeaseFromPushReply(reply({{0, 4096}, {(1 << 20) - 8, 8}}, v1::BLOCK_OK), 2);
  ASSERT_TRUE(fits.has_value());
  EXPECT_EQ(fits->sizes, (std::vector<uint64_t>{4096, 8}));
  for (auto bad : {std::pair<uint64_t, uint64_t>{0, uint64_t{1} << 62}, {0, (1 << 20) + 1},
                   {(1 << 20) - 8, 9}, {~uint64_t{0}, 16}}) {
    EXPECT_FALSE(channel.LeaseFromPushReply(reply({{0, 64}, bad}, v1::BLOCK_OK), 2).has_value())
        << bad.first << " " << bad.second;
  }
  // A block not granted carries no extent to check.
  EXPECT_TRUE(channel.LeaseFromPushReply(reply({{0, uint64_t{1} << 62}}, v1::BLOCK_NOT_FOUND), 1)
                  .has_value());
}

TEST(LoggingTest, WithoutASinkWarningsGoToStderrAndChatterIsDropped) {
  ::testing::internal::CaptureStderr();
  Log(nullptr, LogLevel::kInfo, "chatter");
  Log(nullptr, LogLevel::kWarning, "something odd");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "libstrata: something odd\n");
  std::string got;
  Log([&](LogLevel, std::string_view m) { got = m; }, LogLevel::kDebug, "to the sink");
  EXPECT_EQ(got, "to the sink");
}

}  // namespace
}  // namespace strata::client
