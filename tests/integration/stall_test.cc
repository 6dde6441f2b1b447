// Regression test for issue 14, finding 4: a daemon that stalls longer than the lookup fast
// path's deadline (SIGSTOP) while client threads look up and fetch in a loop. Every call must
// either succeed with the right bytes or fail cleanly; the client process must not crash.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <thread>
#include <vector>

#include "strata/client.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/test_data.h"

namespace strata {
namespace {

using testing::DaemonProcess;
using testing::RandomBlocks;
using testing::Tokens;

constexpr uint32_t kTokensPerBlock = 16;
constexpr size_t kBlocks = 8;
constexpr size_t kBlockBytes = 256 << 10;

NamespaceSpec Spec() { return testing::SmallSpec("stall"); }

TEST(ClientDaemonStallTest, StalledDaemonNeverCrashesBusyClients) {
  DaemonProcess d("host_tier:\n  capacity: 128MiB\n");
  ASSERT_TRUE(d.ok()) << d.log();
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
    d.Signal(SIGSTOP);
    absl::SleepFor(absl::Milliseconds(ms));
    d.Signal(SIGCONT);
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

}  // namespace
}  // namespace strata
