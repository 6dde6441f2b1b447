#include "placement/rendezvous.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace strata::placement {
namespace {

std::vector<std::string> Nodes(int n, int first = 0) {
  std::vector<std::string> out;
  for (int i = first; i < first + n; ++i) out.push_back(absl::StrCat("node-", i));
  return out;
}

std::vector<uint64_t> Keys(size_t n, uint64_t seed = 42) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> out(n);
  for (auto& k : out) k = rng();
  return out;
}

// Owners of `key` as node ids (indexes differ between node sets).
std::vector<std::string> Owners(const Rendezvous& r, uint64_t key, size_t n) {
  std::vector<uint32_t> idx;
  r.TopR(key, n, &idx);
  std::vector<std::string> out;
  for (uint32_t i : idx) out.push_back(r.node(i));
  return out;
}

TEST(RendezvousTest, OrderIsStableAndIndependentOfInputOrder) {
  auto ids = Nodes(20);
  Rendezvous a(ids);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  ids.push_back("node-3");  // duplicates collapse
  Rendezvous b(ids);
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  for (uint64_t key : Keys(500)) {
    EXPECT_EQ(Owners(a, key, 3), Owners(b, key, 3));
    // TopR is the head of the full ranking, best first, by descending score.
    std::vector<uint32_t> all;
    a.TopR(key, a.size(), &all);
    ASSERT_EQ(all.size(), a.size());
    for (size_t i = 1; i < all.size(); ++i) {
      EXPECT_GE(Score(key, NodeHash(a.node(all[i - 1]))), Score(key, NodeHash(a.node(all[i]))));
    }
    std::vector<uint32_t> top3;
    a.TopR(key, 3, &top3);
    EXPECT_TRUE(std::equal(top3.begin(), top3.end(), all.begin()));
  }
}

TEST(RendezvousTest, BlockIdOverloadsUseTheFirstEightBytes) {
  Rendezvous r(Nodes(8));
  BlockId id;
  for (int i = 0; i < 32; ++i) id.bytes[i] = static_cast<uint8_t>(i * 37 + 1);
  std::vector<uint32_t> via_key;
  r.TopR(KeyOf(id), 2, &via_key);
  EXPECT_EQ(r.TopR(id, 2), via_key);
  auto rank = r.Rank(id);
  ASSERT_EQ(rank.size(), 8u);
  EXPECT_EQ(rank[0], via_key[0]);
  EXPECT_EQ(r.TopR(id, 100).size(), 8u);  // capped at the node count
  EXPECT_TRUE(Rendezvous({}).TopR(id, 2).empty());
  EXPECT_EQ(KeyOf(id), 0x04dfba95704b2601ULL);  // bytes 0..7, little-endian
}

// Pinned: every daemon and every version must agree (computed with Python's hashlib).
TEST(RendezvousTest, NodeHashKnownAnswers) {
  EXPECT_EQ(NodeHash("node-0"), 0x8c28c4e90b6fabc9ULL);
  EXPECT_EQ(NodeHash(""), 0xdaa110b1c9dca8a1ULL);
  EXPECT_EQ(Score(1, 2), Mix64(3));
}

TEST(RendezvousTest, IndexOf) {
  Rendezvous r({"b", "a", "c"});
  EXPECT_EQ(r.IndexOf("a"), 0);
  EXPECT_EQ(r.IndexOf("c"), 2);
  EXPECT_EQ(r.IndexOf("zz"), -1);
}

TEST(RendezvousTest, AddingANodeMovesAboutOneNthOnlyToIt) {
  const int n = 10;
  const size_t r = 2;
  Rendezvous before(Nodes(n));
  Rendezvous after(Nodes(n + 1));
  const std::string added = "node-10";
  size_t moved = 0, keys = 20000;
  for (uint64_t key : Keys(keys)) {
    auto a = Owners(before, key, r), b = Owners(after, key, r);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (a == b) continue;
    ++moved;
    // The new owner set is the old one with exactly one member replaced by the new node.
    ASSERT_NE(std::find(b.begin(), b.end(), added), b.end());
    std::vector<std::string> common;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
    EXPECT_EQ(common.size(), r - 1);
  }
  // Ideal: a key gains the new node among its top R with probability R/(N+1).
  double ideal = static_cast<double>(r) / (n + 1);
  EXPECT_NEAR(static_cast<double>(moved) / keys, ideal, 0.02);
}

TEST(RendezvousTest, RemovingANodeMovesOnlyItsKeys) {
  const size_t r = 2;
  Rendezvous before(Nodes(10));
  auto ids = Nodes(10);
  const std::string gone = "node-4";
  ids.erase(std::find(ids.begin(), ids.end(), gone));
  Rendezvous after(ids);
  size_t moved = 0, keys = 20000;
  for (uint64_t key : Keys(keys)) {
    auto a = Owners(before, key, r), b = Owners(after, key, r);
    bool owned = std::find(a.begin(), a.end(), gone) != a.end();
    if (!owned) {
      EXPECT_EQ(a, b);
      continue;
    }
    ++moved;
    // The surviving owners keep their order; the next node in the ranking fills the hole.
    a.erase(std::find(a.begin(), a.end(), gone));
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin()));
  }
  EXPECT_NEAR(static_cast<double>(moved) / keys, static_cast<double>(r) / 10, 0.02);
}

TEST(RendezvousTest, BalanceOverTenNodes) {
  Rendezvous r(Nodes(10));
  std::vector<size_t> primary(10), all(10);
  std::vector<uint32_t> owners;
  for (uint64_t key : Keys(10000)) {
    r.TopR(key, 2, &owners);
    ASSERT_EQ(owners.size(), 2u);
    ASSERT_NE(owners[0], owners[1]);
    ++primary[owners[0]];
    for (uint32_t o : owners) ++all[o];
  }
  for (int i = 0; i < 10; ++i) {
    // Mean 1,000 (binomial sd ~30): 15% is about 5 sd.
    EXPECT_NEAR(primary[i], 1000.0, 150.0) << r.node(i);
    EXPECT_NEAR(all[i], 2000.0, 300.0) << r.node(i);
  }
}

}  // namespace
}  // namespace strata::placement
