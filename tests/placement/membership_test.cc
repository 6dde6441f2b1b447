#include "placement/membership.h"

#include "gtest/gtest.h"

namespace strata::placement {
namespace {

NodeRecord Rec(std::string id, std::string addr = "127.0.0.1:1") {
  NodeRecord r;
  r.id = std::move(id);
  r.address = std::move(addr);
  r.host_capacity = 1 << 30;
  r.version = "0.1.0";
  return r;
}

TEST(StaticMembershipTest, AloneByDefault) {
  auto m = NewStaticMembership({});
  EXPECT_EQ(m->kind(), "static");
  ASSERT_TRUE(m->Start(Rec("self")).ok());
  auto v = m->View();
  EXPECT_EQ(v.epoch, 1u);
  ASSERT_EQ(v.nodes.size(), 1u);
  EXPECT_EQ(v.nodes[0], Rec("self"));
  std::string detail = "x";
  EXPECT_TRUE(m->healthy(&detail));
  EXPECT_TRUE(detail.empty());
  EXPECT_TRUE(m->Leave().ok());
  EXPECT_TRUE(m->Leave().ok());
}

TEST(StaticMembershipTest, ListAddsSelfSortedAndNotifiesOnce) {
  auto m = NewStaticMembership({Rec("c"), Rec("a"), Rec("self", "stale:1")});
  int calls = 0;
  MembershipView seen;
  m->SetListener([&](const MembershipView& v) {
    ++calls;
    seen = v;
  });
  ASSERT_TRUE(m->Start(Rec("self", "127.0.0.1:7000")).ok());
  auto v = m->View();
  EXPECT_EQ(v.Ids(), (std::vector<std::string>{"a", "c", "self"}));
  ASSERT_NE(v.Find("self"), nullptr);
  EXPECT_EQ(v.Find("self")->address, "127.0.0.1:7000");  // self's own record wins
  EXPECT_EQ(v.Find("b"), nullptr);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen.nodes, v.nodes);
  EXPECT_FALSE(m->Start(Rec("self")).ok());  // once
}

TEST(StaticMembershipTest, RejectsDuplicatesAndEmptyIds) {
  EXPECT_FALSE(NewStaticMembership({Rec("a"), Rec("a")})->Start(Rec("self")).ok());
  EXPECT_FALSE(NewStaticMembership({Rec("")})->Start(Rec("self")).ok());
  EXPECT_FALSE(NewStaticMembership({})->Start(Rec("")).ok());
}

}  // namespace
}  // namespace strata::placement
