// Etcd membership against a real etcd server (Debian's etcd-server package) on loopback.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "placement/internal/etcd_client.h"
#include "placement/membership.h"
#include "tests/support/etcd_server.h"

extern char** environ;

namespace strata::placement {
namespace {

namespace fs = std::filesystem;

bool WaitFor(const std::function<bool()>& cond, absl::Duration limit) {
  absl::Time deadline = absl::Now() + limit;
  while (absl::Now() < deadline) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return cond();
}

using testing::EtcdServer;
using testing::FindEtcd;
using testing::FreePort;

// Starts `server` and waits until its JSON gateway answers.
bool StartEtcd(EtcdServer& server) {
  internal::EtcdClient probe({server.endpoint()}, absl::Milliseconds(500));
  return server.Start([&] { return probe.RangePrefix("/probe/").ok(); });
}

NodeRecord Rec(std::string id) {
  NodeRecord r;
  r.id = id;
  r.address = "127.0.0.1:" + std::to_string(7000 + id.size());
  r.host_capacity = (uint64_t{1} << 40) + 3;
  r.nvme_capacity = 18'000'000'000'000'000'123ULL;  // not exact as a double: parsed as text
  r.version = "0.1.0 \"q\"";
  return r;
}

class EtcdMembershipTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (FindEtcd().empty()) return;
    server_ = new EtcdServer;
    if (!StartEtcd(*server_)) {
      FAIL() << "etcd did not start: " << server_->log();
    }
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    if (FindEtcd().empty()) {
      GTEST_SKIP() << "etcd binary not found (apt-get install etcd-server): skipping the etcd "
                      "membership tests";
    }
    ASSERT_NE(server_, nullptr);
  }

  // A unique key prefix per test, so tests sharing the server never see each other.
  EtcdMembershipOptions Options(const EtcdServer& server) {
    EtcdMembershipOptions o;
    o.endpoints = {server.endpoint()};
    o.prefix = absl::StrCat("/strata-test/",
                            ::testing::UnitTest::GetInstance()->current_test_info()->name(), "/");
    o.lease_ttl = absl::Seconds(2);
    o.call_timeout = absl::Milliseconds(500);
    return o;
  }

  static EtcdServer* server_;
};

EtcdServer* EtcdMembershipTest::server_ = nullptr;

std::vector<std::string> Ids(const Membership& m) { return m.View().Ids(); }

TEST_F(EtcdMembershipTest, TwoMembersSeeEachOther) {
  auto opts = Options(*server_);
  auto a = NewEtcdMembership(opts);
  EXPECT_EQ(a->kind(), "etcd");
  absl::Mutex mu;
  std::vector<MembershipView> seen;
  std::atomic<std::thread::id> listener_thread;
  a->SetListener([&](const MembershipView& v) {
    absl::MutexLock lock(&mu);
    seen.push_back(v);
    listener_thread = std::this_thread::get_id();
  });
  ASSERT_TRUE(a->Start(Rec("node-a")).ok());
  EXPECT_EQ(Ids(*a), (std::vector<std::string>{"node-a"}));  // self is in the view at once
  auto b = NewEtcdMembership(opts);
  ASSERT_TRUE(b->Start(Rec("node-b")).ok());
  EXPECT_EQ(Ids(*b), (std::vector<std::string>{"node-a", "node-b"}));
  ASSERT_TRUE(WaitFor([&] { return Ids(*a).size() == 2; }, absl::Seconds(3)));
  auto view = a->View();
  ASSERT_NE(view.Find("node-b"), nullptr);
  EXPECT_EQ(*view.Find("node-b"), Rec("node-b"));  // the record round-trips exactly
  std::string detail;
  EXPECT_TRUE(a->healthy(&detail)) << detail;
  {
    absl::MutexLock lock(&mu);
    ASSERT_FALSE(seen.empty());
    EXPECT_EQ(seen.back().nodes, view.nodes);
    EXPECT_EQ(seen.back().epoch, view.epoch);
    for (size_t i = 1; i < seen.size(); ++i) EXPECT_GT(seen[i].epoch, seen[i - 1].epoch);
    EXPECT_NE(listener_thread.load(), std::this_thread::get_id());
  }
  EXPECT_TRUE(b->Leave().ok());
  EXPECT_TRUE(a->Leave().ok());
}

TEST_F(EtcdMembershipTest, SilentMemberDisappearsAfterLeaseTtl) {
  auto opts = Options(*server_);
  auto a = NewEtcdMembership(opts);
  ASSERT_TRUE(a->Start(Rec("node-a")).ok());
  auto b = NewEtcdMembership(opts);
  ASSERT_TRUE(b->Start(Rec("node-b")).ok());
  ASSERT_TRUE(WaitFor([&] { return Ids(*a).size() == 2; }, absl::Seconds(3)));
  // Destroying without Leave stops the keepalives, as a crash would; etcd expires the lease.
  absl::Time stopped = absl::Now();
  b.reset();
  absl::SleepFor(absl::Milliseconds(800));
  EXPECT_EQ(Ids(*a).size(), 2u) << "gone before its lease could have expired";
  ASSERT_TRUE(WaitFor([&] { return Ids(*a).size() == 1; }, absl::Seconds(6)));
  absl::Duration took = absl::Now() - stopped;
  EXPECT_GE(took, absl::Seconds(1));
  EXPECT_LE(took, absl::Seconds(5)) << "lease_ttl is 2s";
  EXPECT_EQ(Ids(*a), (std::vector<std::string>{"node-a"}));
  EXPECT_TRUE(a->Leave().ok());
}

TEST_F(EtcdMembershipTest, LeaveRemovesPromptly) {
  auto opts = Options(*server_);
  auto a = NewEtcdMembership(opts);
  ASSERT_TRUE(a->Start(Rec("node-a")).ok());
  auto b = NewEtcdMembership(opts);
  ASSERT_TRUE(b->Start(Rec("node-b")).ok());
  ASSERT_TRUE(WaitFor([&] { return Ids(*a).size() == 2; }, absl::Seconds(3)));
  absl::Time left = absl::Now();
  ASSERT_TRUE(b->Leave().ok());
  EXPECT_TRUE(b->Leave().ok());  // idempotent
  ASSERT_TRUE(WaitFor([&] { return Ids(*a).size() == 1; }, absl::Seconds(2)));
  EXPECT_LT(absl::Now() - left, absl::Milliseconds(500));
  EXPECT_TRUE(a->Leave().ok());
}

TEST_F(EtcdMembershipTest, LostLeaseReRegisters) {
  auto opts = Options(*server_);
  auto a = NewEtcdMembership(opts);
  ASSERT_TRUE(a->Start(Rec("node-a")).ok());
  auto b = NewEtcdMembership(opts);
  ASSERT_TRUE(b->Start(Rec("node-b")).ok());
  ASSERT_TRUE(WaitFor([&] { return Ids(*a).size() == 2; }, absl::Seconds(3)));
  // Revoke b's lease behind its back (what etcd does when b was cut off past the TTL).
  internal::EtcdClient admin({server_->endpoint()}, absl::Seconds(1));
  auto range = admin.RangePrefix(opts.prefix + "node-b");
  ASSERT_TRUE(range.ok()) << range.status();
  ASSERT_EQ(range->kvs.size(), 1u);
  int64_t old_lease = range->kvs[0].lease;
  ASSERT_NE(old_lease, 0);
  ASSERT_TRUE(admin.Revoke(old_lease).ok());
  // b notices at its next keepalive (TTL/3) and comes back under a new lease.
  ASSERT_TRUE(WaitFor(
      [&] {
        auto r = admin.RangePrefix(opts.prefix + "node-b");
        return r.ok() && r->kvs.size() == 1 && r->kvs[0].lease != old_lease;
      },
      absl::Seconds(4)));
  ASSERT_TRUE(
      WaitFor([&] { return Ids(*a).size() == 2 && Ids(*b).size() == 2; }, absl::Seconds(3)));
  EXPECT_TRUE(b->Leave().ok());
  EXPECT_TRUE(a->Leave().ok());
}

TEST_F(EtcdMembershipTest, StartFailsWithTheEndpointInTheMessage) {
  EtcdMembershipOptions o;
  o.endpoints = {absl::StrCat("http://127.0.0.1:", FreePort())};
  o.call_timeout = absl::Milliseconds(300);
  o.start_timeout = absl::Milliseconds(300);
  auto m = NewEtcdMembership(o);
  auto st = m->Start(Rec("node-a"));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(o.endpoints[0]), std::string::npos) << st;
  // A second endpoint that works is tried after the dead one.
  auto opts = Options(*server_);
  opts.endpoints.insert(opts.endpoints.begin(), o.endpoints[0]);
  auto m2 = NewEtcdMembership(opts);
  ASSERT_TRUE(m2->Start(Rec("node-a")).ok());
  EXPECT_TRUE(m2->Leave().ok());
}

TEST_F(EtcdMembershipTest, EtcdDownKeepsTheViewAndRecovers) {
  EtcdServer own;
  ASSERT_TRUE(StartEtcd(own)) << own.log();
  auto opts = Options(own);
  auto a = NewEtcdMembership(opts);
  ASSERT_TRUE(a->Start(Rec("node-a")).ok());
  auto b = NewEtcdMembership(opts);
  ASSERT_TRUE(b->Start(Rec("node-b")).ok());
  ASSERT_TRUE(WaitFor([&] { return Ids(*a).size() == 2; }, absl::Seconds(3)));
  auto before = a->View();

  own.Kill();
  std::string detail;
  ASSERT_TRUE(WaitFor([&] { return !a->healthy(&detail); }, absl::Seconds(3)));
  EXPECT_FALSE(detail.empty());
  // Longer than the lease TTL: the last view stays in force while etcd is away.
  absl::SleepFor(absl::Milliseconds(2500));
  EXPECT_FALSE(a->healthy(&detail));
  EXPECT_EQ(a->View().nodes, before.nodes);
  EXPECT_EQ(a->View().epoch, before.epoch);

  ASSERT_TRUE(StartEtcd(own)) << own.log();
  ASSERT_TRUE(WaitFor([&] { return a->healthy(&detail) && b->healthy(&detail); }, absl::Seconds(5)))
      << detail;
  // Both keys are back in etcd (same lease if etcd kept it, or re-registered) and both views
  // hold both nodes.
  internal::EtcdClient admin({own.endpoint()}, absl::Seconds(1));
  ASSERT_TRUE(WaitFor(
      [&] {
        auto r = admin.RangePrefix(opts.prefix);
        return r.ok() && r->kvs.size() == 2;
      },
      absl::Seconds(4)));
  ASSERT_TRUE(
      WaitFor([&] { return Ids(*a).size() == 2 && Ids(*b).size() == 2; }, absl::Seconds(3)));
  EXPECT_TRUE(b->Leave().ok());
  ASSERT_TRUE(WaitFor([&] { return Ids(*a).size() == 1; }, absl::Seconds(2)));
  EXPECT_TRUE(a->Leave().ok());
}

// A node started before etcd answers (a DaemonSet and etcd coming up together) waits for it
// instead of failing; with etcd never there it gives up after start_timeout, saying why.
TEST_F(EtcdMembershipTest, StartWaitsForEtcdToComeUpThenGivesUp) {
  EtcdServer late;
  auto opts = Options(late);
  opts.start_timeout = absl::Seconds(20);
  auto a = NewEtcdMembership(opts);
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    ASSERT_TRUE(late.Spawn());
  });
  const absl::Time t0 = absl::Now();
  absl::Status st = a->Start(Rec("early"));
  starter.join();
  ASSERT_TRUE(st.ok()) << st << "\n" << late.log();
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(600));
  EXPECT_EQ(Ids(*a), (std::vector<std::string>{"early"}));
  EXPECT_TRUE(a->Leave().ok());

  EtcdServer never;
  auto none = Options(never);
  none.start_timeout = absl::Milliseconds(800);
  auto b = NewEtcdMembership(none);
  const absl::Time t1 = absl::Now();
  st = b->Start(Rec("alone"));
  EXPECT_TRUE(absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st)) << st;
  EXPECT_NE(st.message().find("within"), absl::string_view::npos) << st;
  EXPECT_LT(absl::Now() - t1, absl::Seconds(4));
}

}  // namespace
}  // namespace strata::placement
