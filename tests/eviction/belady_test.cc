#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "bench/replay/tier_manager.h"
#include "gtest/gtest.h"
#include "storage/eviction/belady_policy.h"
#include "tests/eviction/test_ids.h"

namespace strata {
namespace {

using testing::Id;

std::vector<uint64_t> NextUses(const std::vector<uint32_t>& seq) {
  std::vector<uint64_t> next(seq.size(), NextUseOracle::kNever);
  std::map<uint32_t, uint64_t> later;
  for (size_t i = seq.size(); i-- > 0;) {
    auto it = later.find(seq[i]);
    if (it != later.end()) next[i] = it->second;
    later[seq[i]] = i;
  }
  return next;
}

// Most hits any cache of `capacity` blocks can get on `seq` (blocks 0..n-1, n <= 16), where a
// missed block may be kept or not: exhaustive search over every eviction choice, memoized on
// (position, resident set).
uint64_t BruteForceOptimum(const std::vector<uint32_t>& seq, int capacity) {
  std::map<std::pair<size_t, uint32_t>, uint64_t> memo;
  auto best = [&](auto&& self, size_t t, uint32_t resident) -> uint64_t {
    if (t == seq.size()) return 0;
    auto key = std::make_pair(t, resident);
    if (auto it = memo.find(key); it != memo.end()) return it->second;
    const uint32_t bit = 1u << seq[t];
    uint64_t result;
    if (resident & bit) {
      result = 1 + self(self, t + 1, resident);
    } else {
      const uint32_t with = resident | bit;
      if (__builtin_popcount(with) <= capacity) {
        result = self(self, t + 1, with);
      } else {
        result = 0;
        for (uint32_t b = 0; b < 32; ++b) {  // evict any one, the new block included
          if (with & (1u << b)) result = std::max(result, self(self, t + 1, with & ~(1u << b)));
        }
      }
    }
    memo[key] = result;
    return result;
  };
  return best(best, 0, 0);
}

// Belady as a single cache: insert on a miss, then evict while over capacity.
uint64_t BeladyHits(const std::vector<uint32_t>& seq, size_t capacity) {
  NextUseOracle oracle;
  BeladyPolicy p(&oracle);
  const auto next = NextUses(seq);
  std::vector<bool> resident(64, false);
  uint64_t hits = 0;
  for (size_t t = 0; t < seq.size(); ++t) {
    oracle.Set(Id(seq[t]), next[t]);
    if (resident[seq[t]]) {
      ++hits;
      p.OnAccess(Id(seq[t]));
      continue;
    }
    p.OnInsert(Id(seq[t]), BlockMeta{});
    resident[seq[t]] = true;
    while (p.size() > capacity) {
      auto v = p.PopVictim();
      EXPECT_TRUE(v.has_value());
      if (!v.has_value()) break;
      for (uint32_t b = 0; b < 64; ++b) {
        if (Id(b) == *v) resident[b] = false;
      }
    }
  }
  return hits;
}

TEST(BeladyPolicy, EvictsFurthestNextUse) {
  NextUseOracle oracle;
  BeladyPolicy p(&oracle);
  oracle.Set(Id(1), 10);
  oracle.Set(Id(2), 5);
  // 3 is never used again (unknown to the oracle).
  p.OnInsert(Id(1), BlockMeta{});
  p.OnInsert(Id(2), BlockMeta{});
  p.OnInsert(Id(3), BlockMeta{});
  EXPECT_EQ(p.PopVictim(), Id(3));
  oracle.Set(Id(2), 20);  // 2 accessed again; next use moves out
  p.OnAccess(Id(2));
  EXPECT_EQ(p.PopVictim(), Id(2));
  EXPECT_EQ(p.PopVictim(), Id(1));
  EXPECT_EQ(p.PopVictim(), std::nullopt);
}

TEST(BeladyPolicy, MatchesBruteForceOptimum) {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 200; ++trial) {
    const int blocks = 3 + static_cast<int>(rng() % 4);    // 3..6 distinct blocks
    const int capacity = 1 + static_cast<int>(rng() % 3);  // 1..3
    const size_t length = 6 + rng() % 9;                   // 6..14 accesses
    std::vector<uint32_t> seq(length);
    for (auto& s : seq) s = rng() % blocks;
    ASSERT_EQ(BeladyHits(seq, capacity), BruteForceOptimum(seq, capacity))
        << "trial " << trial << " capacity " << capacity;
  }
}

TEST(BeladyPolicy, HandCheckedSequence) {
  // a b c a b d a b c, capacity 2: keeping a and b and bypassing c and d gives 4 hits; keeping
  // c for its reuse costs a slot for six steps and loses two of them. LRU gets 0.
  const std::vector<uint32_t> seq = {0, 1, 2, 0, 1, 3, 0, 1, 2};
  EXPECT_EQ(BruteForceOptimum(seq, 2), 4u);
  EXPECT_EQ(BeladyHits(seq, 2), 4u);
}

// Through the real TierManager: Belady in both tiers (host 2 + NVMe 3 blocks, exclusive, host
// victims demoted) gets exactly the single-cache optimum of 5 blocks.
TEST(BeladyPolicy, TwoTierManagerReachesOptimumOfCombinedCapacity) {
  std::mt19937 rng(777);
  for (int trial = 0; trial < 100; ++trial) {
    const int blocks = 6 + static_cast<int>(rng() % 4);
    std::vector<uint32_t> seq(8 + rng() % 8);
    for (auto& s : seq) s = rng() % blocks;
    const auto next = NextUses(seq);

    NextUseOracle oracle;
    TierManagerOptions options;
    options.host.capacity_bytes = 2 * 10;
    options.nvme.capacity_bytes = 3 * 10;
    auto tm = TierManager::Create(options, MakeBeladyPolicy(&oracle), MakeBeladyPolicy(&oracle),
                                  std::make_unique<AlwaysAdmit>());
    ASSERT_TRUE(tm.ok()) << tm.status();
    uint64_t hits = 0;
    for (size_t t = 0; t < seq.size(); ++t) {
      oracle.Set(Id(seq[t]), next[t]);
      if ((*tm)->Access(Id(seq[t])).found != Tier::kNone) {
        ++hits;
      } else {
        ASSERT_TRUE((*tm)->Insert(Id(seq[t]), BlockId{}, 10).ok());
      }
    }
    ASSERT_EQ(hits, BruteForceOptimum(seq, 5)) << "trial " << trial;
  }
}

}  // namespace
}  // namespace strata
