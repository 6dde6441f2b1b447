// The daemon's table of lent device buffers (daemon/device/device_loans.h): unguessable ids,
// one tenant's loans invisible to another, limits per tenant and in all, idle loans closed,
// and a buffer in use stays open until its copy ends even when the loan is returned.
#include "daemon/device/device_loans.h"

#include <gtest/gtest.h>

#include <atomic>

namespace strata::daemon {
namespace {

std::atomic<int> open_buffers{0};

class CountedBuffer final : public PeerBuffer {
 public:
  CountedBuffer() { ++open_buffers; }
  ~CountedBuffer() override { --open_buffers; }
  uint64_t size() const override { return 4096; }
};

Caller Tenant(const std::string& t) {
  Caller c;
  c.role = Role::kTenant;
  c.tenant = t;
  return c;
}

TEST(DeviceLoansTest, LoansAreTheirTenantsBoundedAndClosedWhenIdle) {
  open_buffers = 0;
  DeviceLoans loans({/*per_tenant=*/2, /*total=*/3, /*idle=*/absl::Minutes(1)});
  const absl::Time t0 = absl::FromUnixSeconds(1000000);
  auto a1 = loans.Add(Tenant("a"), std::make_unique<CountedBuffer>(), t0);
  auto a2 = loans.Add(Tenant("a"), std::make_unique<CountedBuffer>(), t0);
  ASSERT_TRUE(a1.ok() && a2.ok());
  EXPECT_NE(*a1, *a2);
  EXPECT_NE(*a1, 0u);
  auto a3 = loans.Add(Tenant("a"), std::make_unique<CountedBuffer>(), t0);
  EXPECT_EQ(a3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(open_buffers, 2) << "a refused buffer is closed at once";
  auto b1 = loans.Add(Tenant("b"), std::make_unique<CountedBuffer>(), t0);
  ASSERT_TRUE(b1.ok());
  Caller admin;
  admin.role = Role::kAdmin;
  EXPECT_EQ(loans.Add(admin, std::make_unique<CountedBuffer>(), t0).status().code(),
            absl::StatusCode::kResourceExhausted)
      << "the daemon's total";

  EXPECT_EQ(loans.Use(*a1, Tenant("b"), t0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(loans.Return(*a1, Tenant("b")).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(loans.Use(*a1, Tenant("a"), t0).ok());
  EXPECT_TRUE(loans.Use(*a1, admin, t0).ok()) << "operators reach every loan";

  // a1 used at t0 + 50 s; at t0 + 90 s a2 and b1 (unused since t0) are closed, a1 is not.
  ASSERT_TRUE(loans.Use(*a1, Tenant("a"), t0 + absl::Seconds(50)).ok());
  EXPECT_EQ(loans.CloseIdle(t0 + absl::Seconds(90)), 2u);
  EXPECT_EQ(loans.size(), 1u);
  EXPECT_EQ(open_buffers, 1);
  EXPECT_EQ(loans.Use(*a2, Tenant("a"), t0).status().code(), absl::StatusCode::kNotFound);

  // A buffer in use outlives its loan's return until the user lets go.
  auto in_use = loans.Use(*a1, Tenant("a"), t0);
  ASSERT_TRUE(in_use.ok());
  ASSERT_TRUE(loans.Return(*a1, Tenant("a")).ok());
  EXPECT_EQ(open_buffers, 1);
  in_use->reset();
  EXPECT_EQ(open_buffers, 0);
  EXPECT_EQ(loans.size(), 0u);
  // Returned loans free their tenant's share.
  EXPECT_TRUE(loans.Add(Tenant("a"), std::make_unique<CountedBuffer>(), t0).ok());
  EXPECT_TRUE(loans.Add(Tenant("a"), std::make_unique<CountedBuffer>(), t0).ok());
}

}  // namespace
}  // namespace strata::daemon
