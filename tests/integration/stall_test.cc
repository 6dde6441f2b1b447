// Regression test for issue 14, finding 4: a daemon that stalls longer than the lookup fast
// path's deadline (SIGSTOP) while client threads look up and fetch in a loop. Every call must
// either succeed with the right bytes or fail cleanly; the client process must not crash.
//
// A stopped daemon alone does not block the client's small fast-path sends (on shared memory
// they land in the daemon's receive FIFO without it), so the second test also has another
// UCX peer fill that FIFO while the daemon is stopped. The client's lookup send then cannot
// complete within its deadline: before the fix that closed the endpoint, unmapped the arena,
// and the fetch threads copying through the old mapping faulted (SEGV, or an ASan report).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "strata/client.h"
#include "strata/v1/cache.grpc.pb.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/raw_ucx_peer.h"
#include "tests/support/test_data.h"

namespace strata {
namespace {

using testing::DaemonProcess;
using testing::RawUcxPeer;
using testing::RandomBlocks;
using testing::Tokens;

constexpr uint32_t kTokensPerBlock = 16;
constexpr size_t kBlocks = 8;
constexpr size_t kBlockBytes = 256 << 10;

NamespaceSpec Spec() { return testing::SmallSpec("stall"); }

// The daemon's UCX worker address, as any client gets it.
std::string WorkerAddress(const DaemonProcess& d) {
  auto stub =
      v1::Cache::NewStub(grpc::CreateChannel(d.endpoint(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ConnectRequest req;
  req.set_client_name("stall-flood");
  v1::ConnectResponse resp;
  if (!stub->Connect(&ctx, req, &resp).ok()) return "";
  return resp.worker_address();
}

// Busy client threads (lookups, fetches through the shared-memory mapping, publishes) while
// the daemon stalls several times; `on_stop` runs right after each SIGSTOP.
void StallUnderBusyClients(DaemonProcess& d, const std::function<void()>& on_stop,
                           const std::function<void()>& on_cont) {
  ClientOptions o;
  o.endpoint = d.endpoint();
  o.rpc_timeout = absl::Seconds(3);
  // Short enough that transfers, too, time out during a stall and close their endpoint.
  o.transfer_timeout = absl::Milliseconds(300);
  auto connected = Client::Connect(o);
  ASSERT_TRUE(connected.ok()) << connected.status();
  Client& client = **connected;
  auto ns = *client.OpenNamespace(Spec(), "tenant");
  auto tokens = Tokens(kBlocks * kTokensPerBlock, 3);
  auto blocks = RandomBlocks(kBlocks, kBlockBytes, 4);
  std::vector<ConstBuffer> views;
  for (const auto& b : blocks) views.push_back({b.data(), b.size()});
  ASSERT_EQ(client.Publish(ns, tokens, views)->stored, kBlocks);
  const auto ids = ComputeBlockIds(ns, kTokensPerBlock, tokens);

  std::atomic<bool> stop{false};
  std::atomic<int> ok_calls{0}, failed_calls{0}, wrong_bytes{0}, wrong_prefix{0};
  auto worker = [&](int seed) {
    std::vector<std::vector<uint8_t>> out(kBlocks, std::vector<uint8_t>(kBlockBytes));
    std::vector<MutableBuffer> bufs;
    for (auto& b : out) bufs.push_back({b.data(), b.size()});
    // Lookups of longer prompts than were published (misses past the prefix), and publishes
    // of fresh blocks, keep every path busy: fast path, reserve/commit, fetch.
    auto more = Tokens(2 * kTokensPerBlock, 1000 + seed);
    auto fresh = RandomBlocks(2, kBlockBytes, 2000 + seed);
    std::vector<ConstBuffer> fresh_views = {{fresh[0].data(), fresh[0].size()},
                                            {fresh[1].data(), fresh[1].size()}};
    for (int i = 0; !stop.load(); ++i) {
      auto look = client.Lookup(ns, tokens);
      if (look.ok()) {
        ++ok_calls;
        if (look->prefix_blocks != kBlocks) ++wrong_prefix;
      } else {
        ++failed_calls;
      }
      auto f = client.Fetch(ns, ids, bufs);
      if (!f.ok()) {
        ++failed_calls;
      } else {
        ++ok_calls;
        for (size_t k = 0; k < kBlocks; ++k)
          if (f->status[k] == BlockStatus::kOk && out[k] != blocks[k]) ++wrong_bytes;
      }
      if (i % 4 == seed % 4) {
        auto p = client.Publish(ns, more, fresh_views);
        p.ok() ? ++ok_calls : ++failed_calls;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t);
  // Several stalls of 400 to 1000 ms, each longer than the fast path's 250 ms deadline.
  const int stall_ms[] = {400, 1000, 600, 800, 450};
  for (int ms : stall_ms) {
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_TRUE(d.Stop());
    on_stop();
    absl::SleepFor(absl::Milliseconds(ms));
    d.Signal(SIGCONT);
    on_cont();
  }
  absl::SleepFor(absl::Milliseconds(500));
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_GT(ok_calls.load(), 0);
  EXPECT_EQ(wrong_bytes.load(), 0);
  EXPECT_EQ(wrong_prefix.load(), 0);

  // Once the daemon runs again, the same client serves correctly (it redials as needed).
  std::vector<std::vector<uint8_t>> out(kBlocks, std::vector<uint8_t>(kBlockBytes));
  std::vector<MutableBuffer> bufs;
  for (auto& b : out) bufs.push_back({b.data(), b.size()});
  absl::StatusOr<FetchResult> f;
  for (int attempt = 0; attempt < 5; ++attempt) {
    f = client.Fetch(ns, ids, bufs);
    if (f.ok() && f->fetched == kBlocks) break;
  }
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->fetched, kBlocks);
  for (size_t k = 0; k < kBlocks; ++k) EXPECT_TRUE(out[k] == blocks[k]) << k;
  auto look = client.Lookup(ns, tokens);
  ASSERT_TRUE(look.ok()) << look.status();
  EXPECT_EQ(look->prefix_blocks, kBlocks);
}

TEST(ClientDaemonStallTest, StalledDaemonNeverCrashesBusyClients) {
  DaemonProcess d("host_tier:\n  capacity: 128MiB\n");
  ASSERT_TRUE(d.ok()) << d.log();
  StallUnderBusyClients(d, [] {}, [] {});
}

// The daemon's receive FIFO is full while it is stopped, so the client's fast-path lookup
// cannot even be sent: the lookup must fall back, and no endpoint or mapping the fetch threads
// use may go away under them.
TEST(ClientDaemonStallTest, BlockedFastPathSendNeverUnmapsTheArenaUnderFetches) {
  DaemonProcess d("host_tier:\n  capacity: 128MiB\n");
  ASSERT_TRUE(d.ok()) << d.log();
  RawUcxPeer flood;
  ASSERT_TRUE(flood.ok());
  const std::string address = WorkerAddress(d);
  ASSERT_FALSE(address.empty());
  // Shared memory, as the client's own endpoint: the same receive FIFO in the daemon.
  ASSERT_TRUE(flood.Connect(address, /*detect_peer_failure=*/false));
  // Wired up before the first stall, so the flood's sends go out at once.
  ASSERT_TRUE(flood.Send(0xfff0, "", "x", RawUcxPeer::kEager));
  // Eager messages on an id the daemon has no handler for (it drops and counts them once it
  // runs): far more than the shared-memory FIFO's 64 slots, each in one slot.
  const std::string payload(2048, 'f');
  auto fill = [&] {
    for (int i = 0; i < 256; ++i)
      flood.Send(0xfff0, "", payload, RawUcxPeer::kEager, std::chrono::milliseconds(0));
  };
  // Once the daemon runs again the queued messages drain; the flood's own sends complete.
  auto drain = [&] { flood.Progress(std::chrono::milliseconds(100)); };
  StallUnderBusyClients(d, fill, drain);
  flood.Close();
}

}  // namespace
}  // namespace strata
