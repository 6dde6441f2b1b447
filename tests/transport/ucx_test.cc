#include "transport/ucx.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "tests/support/scoped_env.h"

namespace strata::transport {
namespace {

// A client side: its own context and worker, and an endpoint to a worker's address (destroyed
// in reverse order: the endpoint first, the context last). Fails the test where a step fails.
struct TestClient {
  std::shared_ptr<Context> ctx;
  std::unique_ptr<Worker> worker;
  std::unique_ptr<Endpoint> ep;
};
void ConnectTestClient(const std::string& address, TestClient* c) {
  auto ctx = Context::Create(false);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  c->ctx = *ctx;
  auto worker = Worker::Create(c->ctx);
  ASSERT_TRUE(worker.ok()) << worker.status();
  c->worker = std::move(*worker);
  auto ep = c->worker->Connect(address);
  ASSERT_TRUE(ep.ok()) << ep.status();
  c->ep = std::move(*ep);
}

// A "daemon" side (allocated region, progress thread) and a "client" side (own context and
// worker, registered buffer) in one process: exercises the same calls stratad and libstrata make.
TEST(UcxTest, PutThenGetThroughAllocatedRegion) {
  auto server_ctx = Context::Create(/*wakeup=*/true);
  ASSERT_TRUE(server_ctx.ok()) << server_ctx.status();
  auto server = Worker::Create(*server_ctx);
  ASSERT_TRUE(server.ok()) << server.status();
  auto region = (*server_ctx)->Allocate(4 << 20);
  ASSERT_TRUE(region.ok()) << region.status();
  ProgressThread progress(server->get());
  auto rkey = (*region)->PackRkey();
  ASSERT_TRUE(rkey.ok());

  TestClient client;
  ASSERT_NO_FATAL_FAILURE(ConnectTestClient((*server)->address(), &client));
  ASSERT_TRUE(client.ep->SetRemoteKey(*rkey).ok());

  std::vector<uint8_t> src(3 << 20), dst(3 << 20, 0);
  std::iota(src.begin(), src.end(), 0);
  auto src_mr = client.ctx->Register(src.data(), src.size());
  ASSERT_TRUE(src_mr.ok());
  uint64_t remote = reinterpret_cast<uint64_t>((*region)->data()) + 4096;
  RmaOp put{RmaOp::kPut, src.data(), src.size(), remote, (*src_mr)->handle()};
  ASSERT_TRUE(client.ep->Transfer({&put, 1}, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(std::memcmp((*region)->data() + 4096, src.data(), src.size()), 0);

  // Two gets in one batch, unregistered destination.
  RmaOp gets[2] = {{RmaOp::kGet, dst.data(), 1 << 20, remote},
                   {RmaOp::kGet, dst.data() + (1 << 20), 2 << 20, remote + (1 << 20)}};
  ASSERT_TRUE(client.ep->Transfer(gets, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(src, dst);
}

TEST(UcxTest, TransferWithoutRemoteKeyIsRefused) {
  auto ctx = Context::Create(true);
  ASSERT_TRUE(ctx.ok());
  auto a = Worker::Create(*ctx);
  auto b = Worker::Create(*ctx);
  ProgressThread progress(a->get());
  auto ep = (*b)->Connect((*a)->address());
  ASSERT_TRUE(ep.ok());
  char buf[8];
  RmaOp op{RmaOp::kGet, buf, 8, 0};
  EXPECT_EQ((*ep)->Transfer({&op, 1}, absl::Now() + absl::Seconds(1)).code(),
            absl::StatusCode::kFailedPrecondition);
}

// A large active message arrives by rendezvous: a handler installed with SetAmHandler (eager
// only) never sees it, one installed with SetAmRendezvousHandler gets it, keeps it and receives
// the bytes; small messages reach both kinds.
TEST(UcxTest, RendezvousMessagesReachOnlyRendezvousHandlers) {
  constexpr uint16_t kAsk = 7, kEagerOnly = 8, kEither = 9;
  static std::vector<char> big(4 << 20);
  std::iota(big.begin(), big.end(), 0);
  auto server_ctx = Context::Create(/*wakeup=*/true);
  ASSERT_TRUE(server_ctx.ok());
  auto server = Worker::Create(*server_ctx);
  ASSERT_TRUE(server.ok());
  Worker* sw = server->get();
  // On request: the big payload (rendezvous) and a small one to each of the client's handlers.
  ASSERT_TRUE(sw->SetAmHandler(kAsk, [sw](const AmMessage& m) {
                  for (uint16_t id : {kEagerOnly, kEither}) {
                    sw->AmSendZeroCopy(m.reply_ep, id, "big", big.data(), big.size(), nullptr);
                    sw->AmSendZeroCopy(m.reply_ep, id, "small", big.data(), 100, nullptr,
                                       /*eager=*/true);
                  }
                }).ok());
  ProgressThread progress(sw);

  auto client_ctx = Context::Create(false);
  ASSERT_TRUE(client_ctx.ok());
  auto client = Worker::Create(*client_ctx);
  ASSERT_TRUE(client.ok());
  Worker* cw = client->get();
  int eager_only_small = 0, eager_only_big = 0, either_small = 0;
  void* kept = nullptr;
  size_t kept_length = 0;
  ASSERT_TRUE(cw->SetAmHandler(kEagerOnly, [&](const AmMessage& m) {
                  (m.header == "big" ? eager_only_big : eager_only_small)++;
                }).ok());
  ASSERT_TRUE(cw->SetAmRendezvousHandler(kEither, [&](const AmMessage& m) {
                  if (!m.rendezvous) {
                    ++either_small;
                    return false;
                  }
                  kept = m.desc;
                  kept_length = m.length;
                  return true;
                }).ok());
  auto ep = cw->Connect(sw->address());
  ASSERT_TRUE(ep.ok()) << ep.status();
  ASSERT_TRUE((*ep)->AmPost(kAsk, "", "").ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while ((kept == nullptr || either_small == 0 || eager_only_small == 0) && absl::Now() < deadline)
    cw->Progress();
  ASSERT_NE(kept, nullptr) << "the rendezvous handler got no large message";
  ASSERT_EQ(kept_length, big.size());
  std::vector<char> got(big.size());
  auto r = cw->AmRecvData(kept, got.data(), got.size(), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  while (*r != nullptr && Worker::RequestState(*r) == 0 && absl::Now() < deadline) cw->Progress();
  if (*r != nullptr) {
    EXPECT_EQ(Worker::RequestState(*r), 1);
    Worker::RequestFree(*r);
  }
  EXPECT_EQ(got, big);
  for (int i = 0; i < 1000; ++i) cw->Progress();  // anything late still gets its chance
  EXPECT_EQ(either_small, 1);
  EXPECT_EQ(eager_only_small, 1);
  EXPECT_EQ(eager_only_big, 0) << "an eager-only handler saw a rendezvous message";
}

// What an authenticating daemon asks UCX for: the operator's choice of transports, never tcp.
TEST(TransportsWithoutTcpTest, KeepsEveryOtherTransport) {
  EXPECT_EQ(*TransportsWithoutTcp(nullptr), "^tcp");
  EXPECT_EQ(*TransportsWithoutTcp(""), "^tcp");
  EXPECT_EQ(*TransportsWithoutTcp("tcp,sm,self"), "sm,self");
  EXPECT_EQ(*TransportsWithoutTcp("rc,tcp:aux,ud"), "rc,ud");
  EXPECT_EQ(*TransportsWithoutTcp("^cma"), "^cma,tcp");
  EXPECT_EQ(*TransportsWithoutTcp("^tcp,cma"), "^tcp,cma");
  EXPECT_EQ(*TransportsWithoutTcp("posix"), "posix");
}

TEST(TransportsWithoutTcpTest, RefusesWhatCannotBeNarrowed) {
  auto only = TransportsWithoutTcp("tcp");
  ASSERT_FALSE(only.ok());
  EXPECT_NE(only.status().message().find("leaves no transport"), std::string::npos);
  auto all = TransportsWithoutTcp("all");
  ASSERT_FALSE(all.ok());
  EXPECT_NE(all.status().message().find("^tcp"), std::string::npos);
}

// UCX refuses an empty UCX_TLS ("The TLs list is empty"); an operator who exported it empty
// gets UCX's default transports, with tcp or without.
TEST(TransportsWithoutTcpTest, AnEmptyUcxTlsMeansTheDefault) {
  const char* saved = std::getenv("UCX_TLS");
  const std::string kept = saved ? saved : "";
  setenv("UCX_TLS", "", 1);
  for (bool tcp : {true, false}) {
    ContextOptions o;
    o.tcp = tcp;
    auto ctx = Context::Create(o);
    EXPECT_TRUE(ctx.ok()) << "tcp " << tcp << ": " << ctx.status();
    if (ctx.ok()) {
      EXPECT_TRUE(Worker::Create(*ctx).ok());
    }
  }
  if (saved) setenv("UCX_TLS", kept.c_str(), 1); else unsetenv("UCX_TLS");
}

// A context without tcp still connects over shared memory (tenant_memory_test shows its
// daemon opens no tcp port).
TEST(TransportsWithoutTcpTest, ContextWithoutTcpStillConnectsLocally) {
  ContextOptions o;
  o.wakeup = true;
  o.tcp = false;
  auto ctx = Context::Create(o);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto worker = Worker::Create(*ctx);
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto client_ctx = Context::Create(false);
  ASSERT_TRUE(client_ctx.ok());
  auto client = Worker::Create(*client_ctx);
  ASSERT_TRUE(client.ok());
  auto ep = (*client)->Connect((*worker)->address());
  ASSERT_TRUE(ep.ok()) << ep.status();
  EXPECT_FALSE((*ep)->MessagesOverTcp());  // pushes then come whole (DataMover)
}

// Where UCX_TLS leaves tcp alone, an endpoint says its messages travel over it.
TEST(UcxTest, AnEndpointTellsWhetherItsMessagesTravelOverTcp) {
  ::strata::testing::ScopedEnv tcp_only("UCX_TLS", "tcp");
  auto server_ctx = Context::Create(true);
  ASSERT_TRUE(server_ctx.ok()) << server_ctx.status();
  auto server = Worker::Create(*server_ctx);
  ASSERT_TRUE(server.ok()) << server.status();
  TestClient client;
  ASSERT_NO_FATAL_FAILURE(ConnectTestClient((*server)->address(), &client));
  EXPECT_TRUE(client.ep->MessagesOverTcp());
}

// UCX's memory units, as UCX reads UCX_TCP_RX_SEG_SIZE; anything else is UCX's default.
TEST(UcxTest, TcpReceiveSegmentBytesReadsUcxMemoryUnits) {
  const std::pair<const char*, uint64_t> cases[] = {
      {"65536", 65536},   {"64K", 64 << 10},  {"64kb", 64 << 10}, {"256KB", 256 << 10},
      {"1m", 1 << 20},    {"2MB", 2 << 20},   {"1G", 1ull << 30}, {"", 64 << 10},
      {"K", 64 << 10},    {"12x", 64 << 10},  {"0", 64 << 10},    {"32K ", 64 << 10},
      {"inf", 64 << 10},  {"auto", 64 << 10}, {"8192", 8192}};
  for (const auto& [text, bytes] : cases) {
    ::strata::testing::ScopedEnv segment("UCX_TCP_RX_SEG_SIZE", text);
    EXPECT_EQ(TcpReceiveSegmentBytes(), bytes) << "'" << text << "'";
  }
}

// A waiting caller's progress (Worker::ProgressWaiting) polls, then yields, then sleeps on the
// event fd (1 ms naps until an event); nothing sleeps before the spin and yield windows have
// passed, nor while the caller's own transfers are in flight and moved within
// Worker::kInFlightPoll. A sleep is told by the thread's voluntary context switches, not by the
// time a call took: on a loaded host a yield alone can take a millisecond.
TEST(UcxTest, AWaitingCallerPollsThenYieldsThenSleepsUntilAnEvent) {
  using Clock = Worker::Clock;
  auto ctx = Context::Create(/*wakeup=*/true);
  ASSERT_TRUE(ctx.ok());
  auto w = Worker::Create(*ctx);
  ASSERT_TRUE(w.ok());
  Worker* worker = w->get();
  const absl::Time until = absl::Now() + absl::Seconds(5);
  struct Call {
    int64_t micros;
    long sleeps;  // a yield that lets another thread run is an involuntary switch, not these
  };
  auto one_call = [&](Clock::time_point idle_since, bool may_sleep = true) {
    rusage before{}, after{};
    getrusage(RUSAGE_THREAD, &before);
    const auto t0 = Clock::now();
    worker->ProgressWaiting(&idle_since, until, may_sleep);
    const auto micros =
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
    getrusage(RUSAGE_THREAD, &after);
    return Call{micros, after.ru_nvcsw - before.ru_nvcsw};
  };
  const auto long_idle = Clock::now() - std::chrono::seconds(1);
  // Polls only: an infinite spin (the default) never sleeps.
  EXPECT_EQ(one_call(long_idle).sleeps, 0);
  // Within the yield window: a yield, no sleep.
  worker->SetWaitSpin(absl::ZeroDuration(), absl::InfiniteDuration());
  EXPECT_EQ(one_call(long_idle).sleeps, 0);
  // Past both: a nap on the event fd (up to 1 ms, ~0.5 ms or more even on a busy host)...
  worker->SetWaitSpin(absl::ZeroDuration(), absl::ZeroDuration());
  int64_t napped = 0;
  long sleeps = 0;
  for (int i = 0; i < 5; ++i) {
    const Call c = one_call(long_idle);
    napped = std::max<int64_t>(napped, c.micros);
    sleeps += c.sleeps;
  }
  EXPECT_GE(napped, 500);
  EXPECT_GE(sleeps, 1);
  // ... unless the caller's own transfers are in flight and moved lately: those move only
  // while polled. Stalled for longer than kInFlightPoll, they wait asleep too.
  long busy = 0;
  for (int i = 0; i < 5; ++i) {
    const auto moved_lately = Clock::now() - Worker::kInFlightPoll / 2;
    busy += one_call(moved_lately, /*may_sleep=*/false).sleeps;
  }
  EXPECT_EQ(busy, 0);
  long stalled = 0;
  for (int i = 0; i < 5; ++i) stalled += one_call(long_idle, /*may_sleep=*/false).sleeps;
  EXPECT_GE(stalled, 1);
  // ... but not when the last event was just now.
  worker->SetWaitSpin(absl::Milliseconds(100), absl::ZeroDuration());
  EXPECT_EQ(one_call(Clock::now()).sleeps, 0);
}

// How many of the process's other threads are runnable (state R: running or waiting for a
// core; a polling thread is, even on a loaded host), at 20 moments over `span`.
int RunnableOtherThreadsSeen(absl::Duration span) {
  const std::string self = std::to_string(gettid());
  int seen = 0;
  for (int i = 0; i < 20; ++i) {
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
      if (task.path().filename() == self) continue;
      std::ifstream in(task.path() / "stat");
      std::string stat((std::istreambuf_iterator<char>(in)), {});
      const size_t paren = stat.rfind(')');
      if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'R') {
        ++seen;
        break;
      }
    }
    absl::SleepFor(span / 20);
  }
  return seen;
}

// A handler may ask the progress thread to sleep once idle (ProgressThread::SleepWhenIdle):
// the thread then stops polling at once instead of after its busy-poll window (a poll keeps it
// runnable throughout, and burning CPU where it gets any).
TEST(UcxTest, AProgressThreadAskedToSleepStopsPollingAtOnce) {
  constexpr uint16_t kPing = 11;
  auto server_ctx = Context::Create(/*wakeup=*/true);
  ASSERT_TRUE(server_ctx.ok());
  auto server = Worker::Create(*server_ctx);
  ASSERT_TRUE(server.ok());
  std::atomic<int> handled{0};
  ProgressThread* progress = nullptr;
  ASSERT_TRUE((*server)->SetAmHandler(kPing, [&](const AmMessage& m) {
                  if (m.header == "sleep") progress->SleepWhenIdle();
                  handled.fetch_add(1);
                }).ok());
  ProgressThread thread((*server).get(), /*busy_poll=*/absl::Seconds(1));
  progress = &thread;
  TestClient client;
  ASSERT_NO_FATAL_FAILURE(ConnectTestClient((*server)->address(), &client));
  auto process_cpu = [] {
    rusage r{};
    getrusage(RUSAGE_SELF, &r);
    return absl::DurationFromTimeval(r.ru_utime) + absl::DurationFromTimeval(r.ru_stime);
  };
  auto ping = [&](const std::string& what) {
    const int before = handled.load();
    EXPECT_TRUE(client.ep->AmPost(kPing, what, "").ok());
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (handled.load() == before && absl::Now() < deadline) client.worker->Progress();
    EXPECT_EQ(handled.load(), before + 1) << what;
  };
  // Within its busy-poll window the thread polls: runnable whenever looked at.
  ping("poll");
  EXPECT_GE(RunnableOtherThreadsSeen(absl::Milliseconds(100)), 18);
  // Asked to sleep: it sleeps until an event or its 100 ms wait runs out, and this thread
  // sleeping too, the process burns (next to) no CPU.
  ping("sleep");
  absl::SleepFor(absl::Milliseconds(2));
  const absl::Duration cpu0 = process_cpu();
  EXPECT_LE(RunnableOtherThreadsSeen(absl::Milliseconds(60)), 2);
  EXPECT_LT(process_cpu() - cpu0, absl::Milliseconds(20));
}

// PeerFailure::kWatch over tcp: the endpoint asks UCX for no error handling (so keeps tcp's
// zero-copy rendezvous); its watch, on a worker of its own, reports the peer's death, which the
// endpoint then shows as failed. Without the watch (kIgnore) nothing reports it. The peer goes
// as a dead process's would: its worker, and with it every socket, is destroyed.
TEST(UcxTest, AWatchedEndpointFailsWhenItsPeerGoes) {
  ::strata::testing::ScopedEnv tcp_only("UCX_TLS", "tcp");
  auto client_ctx = Context::Create(false);
  ASSERT_TRUE(client_ctx.ok()) << client_ctx.status();
  auto client = Worker::Create(*client_ctx);
  ASSERT_TRUE(client.ok());
  for (auto mode : {Worker::PeerFailure::kWatch, Worker::PeerFailure::kIgnore}) {
    const bool watched = mode == Worker::PeerFailure::kWatch;
    auto server_ctx = Context::Create(true);
    ASSERT_TRUE(server_ctx.ok()) << server_ctx.status();
    auto server = Worker::Create(*server_ctx);
    ASSERT_TRUE(server.ok());
    auto progress = std::make_unique<ProgressThread>(server->get());
    auto ep = (*client)->Connect((*server)->address(), mode);
    ASSERT_TRUE(ep.ok()) << ep.status();
    EXPECT_EQ((*ep)->peer_failure_detection(), watched);
    const absl::Time settle = absl::Now() + absl::Milliseconds(200);
    while (absl::Now() < settle) (*client)->Progress();
    ASSERT_FALSE((*ep)->failed()) << "the peer is alive";
    progress.reset();
    server->reset();
    const absl::Time stop = absl::Now() + absl::Seconds(watched ? 5 : 1);
    while (!(*ep)->failed() && absl::Now() < stop) (*client)->Progress();
    EXPECT_EQ((*ep)->failed(), watched) << (watched ? "the watch missed the peer's death"
                                                    : "an unwatched endpoint reported it");
    ep->reset();
  }
}

}  // namespace
}  // namespace strata::transport
