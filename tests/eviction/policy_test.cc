#include <vector>

#include "gtest/gtest.h"
#include "storage/eviction/admission_policy.h"
#include "storage/eviction/eviction_policy.h"
#include "storage/eviction/ghost_list.h"
#include "storage/eviction/lru_policy.h"
#include "storage/eviction/prefix_aware_policy.h"
#include "storage/eviction/s3fifo_policy.h"
#include "tests/eviction/test_ids.h"

namespace strata {
namespace {

using testing::Id;

BlockMeta Root() { return BlockMeta{}; }
BlockMeta ChildOf(uint32_t parent) { return BlockMeta{Id(parent), 1}; }

std::vector<BlockId> Drain(EvictionPolicy& p) {
  std::vector<BlockId> out;
  while (auto v = p.PopVictim()) out.push_back(*v);
  return out;
}

std::vector<BlockId> Ids(std::initializer_list<uint32_t> ns) {
  std::vector<BlockId> out;
  for (uint32_t n : ns) out.push_back(Id(n));
  return out;
}

TEST(LruPolicy, EvictsLeastRecentlyUsed) {
  LruPolicy p;
  for (uint32_t i = 1; i <= 4; ++i) p.OnInsert(Id(i), Root());
  p.OnAccess(Id(1));
  p.OnInsert(Id(3), Root());  // already tracked: an access
  p.OnRemove(Id(4));
  p.OnAccess(Id(99));  // untracked: ignored
  EXPECT_EQ(p.size(), 3u);
  EXPECT_EQ(Drain(p), Ids({2, 1, 3}));
  EXPECT_EQ(p.PopVictim(), std::nullopt);
}

TEST(S3FifoPolicy, OneHitBlocksLeaveFromSmallAndAccessedOnesMoveToMain) {
  S3FifoPolicy p;
  for (uint32_t i = 1; i <= 10; ++i) p.OnInsert(Id(i), Root());
  p.OnAccess(Id(3));
  // Small holds all 10 (>= 10% of 10): its oldest, never accessed, leaves first.
  EXPECT_EQ(p.PopVictim(), Id(1));
  EXPECT_EQ(p.PopVictim(), Id(2));
  // 3 was accessed on probation: it moves to main and 4 leaves instead.
  EXPECT_EQ(p.PopVictim(), Id(4));
  EXPECT_TRUE(p.InMain(Id(3)));
  EXPECT_TRUE(p.InGhost(Id(1)));
  // A ghost hit enters main directly.
  p.OnInsert(Id(1), Root());
  EXPECT_TRUE(p.InMain(Id(1)));
  EXPECT_FALSE(p.InGhost(Id(1)));
  // An explicit removal leaves no ghost.
  p.OnRemove(Id(5));
  EXPECT_FALSE(p.InGhost(Id(5)));
  EXPECT_EQ(p.size(), 7u);
}

TEST(S3FifoPolicy, MainReinsertsAccessedBlocksLazily) {
  S3FifoPolicy p;
  p.OnInsert(Id(1), Root());
  p.OnInsert(Id(2), Root());
  p.OnAccess(Id(1));
  p.OnAccess(Id(2));
  p.OnInsert(Id(3), Root());
  // 1 and 2 move to main (accessed), 3 leaves.
  EXPECT_EQ(p.PopVictim(), Id(3));
  ASSERT_TRUE(p.InMain(Id(1)));
  ASSERT_TRUE(p.InMain(Id(2)));
  // Main, oldest first: 1 then 2. 1 is accessed again, so it is reinserted and 2 leaves.
  p.OnAccess(Id(1));
  EXPECT_EQ(p.PopVictim(), Id(2));
  EXPECT_EQ(p.PopVictim(), Id(1));
  EXPECT_EQ(p.PopVictim(), std::nullopt);
}

TEST(PrefixAwarePolicy, TailLeavesBeforeHead) {
  // Chains 1->2->3 and 1->4; 1 (the shared head) touched last.
  PrefixAwarePolicy p;
  p.OnInsert(Id(1), Root());
  p.OnInsert(Id(2), ChildOf(1));
  p.OnInsert(Id(3), ChildOf(2));
  p.OnInsert(Id(4), ChildOf(1));
  p.OnAccess(Id(1));
  EXPECT_EQ(p.ChildCount(Id(1)), 2u);
  // Plain LRU would pick 2 (a parent of cached 3). Leaves by recency: 3, then 2 (now a leaf),
  // then 4, then 1.
  EXPECT_EQ(Drain(p), Ids({3, 2, 4, 1}));
  EXPECT_EQ(p.ChildCount(Id(1)), 0u);
}

TEST(PrefixAwarePolicy, LruWouldPickTheHead) {
  LruPolicy lru;
  lru.OnInsert(Id(1), Root());
  lru.OnInsert(Id(2), ChildOf(1));
  EXPECT_EQ(lru.PopVictim(), Id(1));
  PrefixAwarePolicy p;
  p.OnInsert(Id(1), Root());
  p.OnInsert(Id(2), ChildOf(1));
  EXPECT_EQ(p.PopVictim(), Id(2));
}

TEST(PrefixAwarePolicy, ChildTrackedBeforeParentAndRemovals) {
  PrefixAwarePolicy p;
  p.OnInsert(Id(5), ChildOf(9));  // parent not (yet) tracked
  p.OnInsert(Id(9), Root());      // has a tracked child: not a leaf
  p.OnInsert(Id(7), ChildOf(5));
  p.OnRemove(Id(7));  // 5 is a leaf again
  EXPECT_EQ(Drain(p), Ids({5, 9}));
}

TEST(PrefixAwarePolicy, FrequencyBonusKeepsReusedBlocks) {
  auto run = [](EvictionPolicy& p) {
    for (uint32_t i = 100; i < 108; ++i) p.OnInsert(Id(i), Root());
    p.OnInsert(Id(1), BlockMeta{BlockId{}, 2});  // requested twice already
    for (uint32_t i = 200; i < 203; ++i) p.OnInsert(Id(i), Root());
    return Drain(p);
  };
  PrefixAwarePolicy lru_like;
  EXPECT_EQ(run(lru_like), Ids({100, 101, 102, 103, 104, 105, 106, 107, 1, 200, 201, 202}));
  // Bonus: 0.5 x 8 tracked blocks x (2 - 1) = 4 ticks, so 1 outlives the three later blocks.
  PrefixAwarePolicy freq(PrefixAwareOptions{.frequency_bonus = 0.5, .max_counted_accesses = 2},
                         "prefix-freq");
  EXPECT_EQ(run(freq), Ids({100, 101, 102, 103, 104, 105, 106, 107, 200, 201, 202, 1}));
}

TEST(PrefixAwarePolicy, AdaptiveBonusFollowsGhostHits) {
  PrefixAwarePolicy p(PrefixAwareOptions{.frequency_bonus = 0.5, .adaptive = true},
                      "prefix-adaptive");
  for (uint32_t i = 1; i <= 4; ++i) p.OnInsert(Id(i), Root());
  EXPECT_EQ(p.PopVictim(), Id(1));  // evicted after one access
  p.OnInsert(Id(1), Root());        // ... and wanted again: recency deserved more weight
  const double lowered = p.bonus();
  EXPECT_LT(lowered, 0.5);
  // A reused block is evicted, then wanted again: frequency deserved more weight.
  p.OnInsert(Id(9), BlockMeta{BlockId{}, 3});
  std::optional<BlockId> v;
  while ((v = p.PopVictim()) && *v != Id(9)) {
  }
  ASSERT_TRUE(v.has_value());
  p.OnInsert(Id(9), Root());
  EXPECT_GT(p.bonus(), lowered);
  // A block never seen before moves nothing.
  const double before = p.bonus();
  p.OnInsert(Id(50), Root());
  EXPECT_EQ(p.bonus(), before);
}

TEST(EvictionPolicyFactory, NamesAndErrors) {
  for (std::string_view name : OnlineEvictionPolicyNames()) {
    auto p = MakeEvictionPolicy(name);
    ASSERT_TRUE(p.ok()) << name;
    EXPECT_EQ((*p)->name(), name);
  }
  EXPECT_EQ(MakeEvictionPolicy("belady").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeEvictionPolicy("mru").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GhostList, KeepsNewestUpToCapacity) {
  GhostList g;
  g.Add(Id(1), 2);
  g.Add(Id(2), 2);
  g.Add(Id(1), 2);  // refreshed: now newer than 2
  g.Add(Id(3), 2);  // drops the oldest live entry, 2
  EXPECT_TRUE(g.Contains(Id(1)));
  EXPECT_FALSE(g.Contains(Id(2)));
  EXPECT_TRUE(g.Contains(Id(3)));
  EXPECT_TRUE(g.Erase(Id(3)));
  EXPECT_FALSE(g.Erase(Id(3)));
  for (uint32_t i = 0; i < 1000; ++i) g.Add(Id(i % 7), 5);
  EXPECT_EQ(g.size(), 5u);
}

TEST(SecondAccessAdmission, AdmitsOnSecondAccessOrGhostHit) {
  SecondAccessAdmission a(/*ghost_capacity=*/2);
  EXPECT_TRUE(a.Admit(Id(1), 2));   // hit while resident above
  EXPECT_FALSE(a.Admit(Id(2), 1));  // one-hit: rejected, remembered
  EXPECT_TRUE(a.Admit(Id(2), 1));   // came back since: admitted
  EXPECT_FALSE(a.Admit(Id(3), 1));
  EXPECT_FALSE(a.Admit(Id(4), 1));
  EXPECT_FALSE(a.Admit(Id(5), 1));  // the ghost holds 2 ids: 3 is forgotten
  EXPECT_FALSE(a.Admit(Id(3), 1));
  EXPECT_TRUE(a.Admit(Id(5), 1));
}

TEST(AdmissionFactory, NamesAndErrors) {
  EXPECT_TRUE(MakeAdmissionPolicy("always", 0).ok());
  EXPECT_TRUE(MakeAdmissionPolicy("second-access", 10).ok());
  EXPECT_FALSE(MakeAdmissionPolicy("second-access", 0).ok());
  EXPECT_FALSE(MakeAdmissionPolicy("never", 10).ok());
}

}  // namespace
}  // namespace strata
