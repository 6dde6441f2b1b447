// LandingChecks: blocks checked as they land, on the helper thread and the caller's.
#include "client/internal/landing_checks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <thread>
#include <vector>

#include "common/crc32c.h"

namespace strata::client {
namespace {

struct Landing {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<BlockMove> moves;
  explicit Landing(const std::vector<size_t>& sizes) {
    std::mt19937_64 rng(sizes.size());
    for (size_t n : sizes) {
      std::vector<uint8_t> b(n);
      for (auto& x : b) x = static_cast<uint8_t>(rng());
      bytes.push_back(std::move(b));
    }
    for (auto& b : bytes) moves.push_back({b.data(), b.size(), 0, Crc32c(b.data(), b.size())});
  }
};

// Sizes around every path: checked inline (small), one piece, several pieces with a short last
// one, exactly two pieces, and empty.
const std::vector<size_t> kSizes = {1000,
                                    LandingChecks::kInlineCheckBytes + 1,
                                    LandingChecks::kPieceBytes,
                                    (5 * LandingChecks::kPieceBytes) / 2,
                                    2 * LandingChecks::kPieceBytes,
                                    0,
                                    3 << 20};

TEST(LandingChecksTest, EveryBlockIsJudgedWholeWhateverOrderItLandsIn) {
  HelperThread helper;
  for (int round = 0; round < 20; ++round) {
    Landing l(kSizes);
    // Flip one byte in a later piece of some blocks: the combined CRC must catch each.
    std::vector<uint8_t> want(kSizes.size(), 1);
    std::mt19937 rng(round);
    for (size_t k = 0; k < kSizes.size(); ++k) {
      if (kSizes[k] == 0 || rng() % 2 == 0) continue;
      l.bytes[k][kSizes[k] - 1 - rng() % std::min<size_t>(kSizes[k], 4096)] ^= 0x10;
      want[k] = 0;
    }
    std::vector<size_t> order(kSizes.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::shuffle(order.begin(), order.end(), rng);
    LandingChecks checks(helper, /*verify=*/true, /*around_caches=*/false);
    checks.Expect(l.moves);
    for (size_t k : order) checks.Landed(k);
    EXPECT_EQ(checks.Finish(), want) << "round " << round;
  }
}

TEST(LandingChecksTest, BlocksLandingWhileTheHelperChecksAreAllChecked) {
  HelperThread helper;
  std::vector<size_t> sizes(64, (3 * LandingChecks::kPieceBytes) / 2);
  Landing l(sizes);
  l.bytes[63][5] ^= 1;
  l.bytes[17][LandingChecks::kPieceBytes + 9] ^= 1;  // in its second piece
  std::vector<uint8_t> want(sizes.size(), 1);
  want[63] = want[17] = 0;
  LandingChecks checks(helper, /*verify=*/true, /*around_caches=*/false);
  checks.Expect(l.moves);
  for (size_t k = 0; k < sizes.size(); ++k) {
    checks.Landed(k);
    if (k % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  EXPECT_EQ(checks.Finish(), want);
}

TEST(LandingChecksTest, CopiedBlocksKeepTheirCrcAndUnverifiedOnesAreIntact) {
  HelperThread helper;
  Landing l({100, 200});
  {
    LandingChecks checks(helper, /*verify=*/true, /*around_caches=*/false);
    checks.Expect(l.moves);
    checks.Copied(0, l.moves[0].crc32c);
    checks.Copied(1, l.moves[1].crc32c ^ 1);
    EXPECT_EQ(checks.Finish(), (std::vector<uint8_t>{1, 0}));
  }
  LandingChecks unverified(helper, /*verify=*/false, /*around_caches=*/false);
  unverified.Expect(l.moves);
  l.bytes[0][0] ^= 1;
  unverified.Landed(0);
  unverified.Landed(1);
  EXPECT_EQ(unverified.Finish(), (std::vector<uint8_t>{1, 1}));
}

TEST(LandingChecksTest, TheLastBlockToLandIsCheckedByFinish) {
  HelperThread helper;
  for (bool corrupt : {false, true}) {
    Landing l({(5 * LandingChecks::kPieceBytes) / 2});
    if (corrupt) l.bytes[0][LandingChecks::kPieceBytes * 2 + 3] ^= 4;
    LandingChecks checks(helper, /*verify=*/true, /*around_caches=*/false);
    checks.Expect(l.moves);
    checks.Landed(0);
    EXPECT_EQ(checks.Finish(), (std::vector<uint8_t>{corrupt ? uint8_t{0} : uint8_t{1}}));
  }
}

TEST(LandingChecksTest, DestroyedWithoutFinishWaitsForTheHelper) {
  HelperThread helper;
  std::vector<size_t> sizes(16, 2 * LandingChecks::kPieceBytes);
  for (int round = 0; round < 10; ++round) {
    Landing l(sizes);
    LandingChecks checks(helper, /*verify=*/true, /*around_caches=*/false);
    checks.Expect(l.moves);
    for (size_t k = 0; k < sizes.size(); ++k) checks.Landed(k);
    // Leaves scope with checks queued: the helper's job must not outlive `checks` (ASan).
  }
}

}  // namespace
}  // namespace strata::client
