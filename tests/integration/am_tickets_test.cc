// AmTickets (daemon/auth.h): what an active message's ticket stands for, and the bounds that
// keep the table from growing with every Connect.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "common/am_wire.h"
#include "daemon/auth.h"

namespace strata::daemon {
namespace {

Caller Tenant(const std::string& name) {
  Caller c;
  c.role = Role::kTenant;
  c.tenant = name;
  return c;
}

TEST(AmTicketsTest, EachTicketStandsForItsCaller) {
  AmTickets tickets;
  const std::string a = tickets.Issue(Tenant("a"));
  const std::string b = tickets.Issue(Tenant("b"));
  ASSERT_EQ(a.size(), am_wire::kTicketBytes);
  ASSERT_NE(a, b);
  EXPECT_EQ(tickets.Find(a)->tenant, "a");
  EXPECT_EQ(tickets.Find(b)->tenant, "b");
  EXPECT_FALSE(tickets.Find(std::string(am_wire::kTicketBytes, '\0')).has_value());
  EXPECT_FALSE(tickets.Find("").has_value());
  EXPECT_FALSE(tickets.Find(a.substr(1)).has_value());
}

TEST(AmTicketsTest, OldestGoFirstPastCapacityAndAllExpire) {
  AmTickets tickets(/*capacity=*/3);
  std::vector<std::string> issued;
  for (int i = 0; i < 5; ++i) issued.push_back(tickets.Issue(Tenant(std::to_string(i))));
  EXPECT_FALSE(tickets.Find(issued[0]).has_value());
  EXPECT_FALSE(tickets.Find(issued[1]).has_value());
  for (int i = 2; i < 5; ++i) EXPECT_EQ(tickets.Find(issued[i])->tenant, std::to_string(i));
  AmTickets expired(/*capacity=*/8, /*ttl=*/absl::ZeroDuration() - absl::Seconds(1));
  EXPECT_FALSE(expired.Find(expired.Issue(Tenant("a"))).has_value());
}

}  // namespace
}  // namespace strata::daemon
