// How the client reads the pieces of pushed blocks (client/internal/pushed_block.h): which pieces
// it takes, which it refuses, and the CRC it hands on per block.
#include "client/internal/pushed_block.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "common/crc32c.h"

namespace strata::client {
namespace {

constexpr uint64_t kRequest = 42;
constexpr uint32_t kAsked = 4096;

struct Fetch {
  std::vector<uint64_t> lengths;
  std::vector<uint8_t> arrived;
  PushedPieces pieces;
  explicit Fetch(std::vector<uint64_t> l)
      : lengths(std::move(l)), arrived(lengths.size(), 0), pieces(kAsked, lengths.size()) {}
  PushedPieces::Piece Read(uint32_t index, uint64_t offset, size_t bytes,
                           uint64_t request = kRequest) {
    return pieces.Read(am_wire::EncodeFetchPieceHeader({{request, index, 0}, offset}), bytes,
                       kRequest, [this](size_t i) { return lengths[i]; }, arrived);
  }
};

std::vector<uint8_t> Bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

// In order the block's CRC comes out of its pieces' CRCs; in any other order the block is
// left to be checked from memory (nullopt). Either way it is whole after its last piece only.
TEST(PushedPiecesTest, TakesEachPieceOnceAndGivesTheBlocksCrcWhenInOrder) {
  const uint64_t length = 10000;  // 3 pieces of 3392, 3392, 3216
  const uint64_t piece = am_wire::PushPieceBytes(length, kAsked);
  ASSERT_EQ(piece, 3392u);
  const std::vector<uint8_t> block = Bytes(length, 1);
  for (bool reversed : {false, true}) {
    Fetch f({length, 100});
    std::vector<uint64_t> at = {0, piece, 2 * piece};
    if (reversed) std::reverse(at.begin(), at.end());
    std::optional<uint32_t> crc;
    for (size_t k = 0; k < at.size(); ++k) {
      const size_t n = std::min<uint64_t>(piece, length - at[k]);
      auto got = f.Read(0, at[k], n);
      ASSERT_EQ(got.kind, PushedPieces::kTake) << got.error;
      EXPECT_EQ(got.offset, at[k]);
      const bool whole =
          f.pieces.Took(0, at[k], n, Crc32c(block.data() + at[k], n), &crc);
      EXPECT_EQ(whole, k + 1 == at.size());
    }
    if (reversed)
      EXPECT_FALSE(crc.has_value());
    else
      EXPECT_EQ(crc, Crc32c(block.data(), block.size()));
  }
}

TEST(PushedPiecesTest, RefusesPiecesThatDoNotFitTheRequest) {
  Fetch f({10000, 4096, 20000});
  auto mismatch = [](const PushedPieces::Piece& p, const char* why) {
    EXPECT_EQ(p.kind, PushedPieces::kMismatch);
    EXPECT_NE(p.error.message().find(why), std::string::npos) << p.error;
  };
  mismatch(f.Read(1, 0, 2048), "comes whole");          // a block of at most the piece size
  mismatch(f.Read(3, 0, 3392), "no such block");
  mismatch(f.Read(0, 100, 3292), "wrong offset or size");  // not on a piece boundary
  mismatch(f.Read(0, 0, 3000), "wrong offset or size");    // short
  mismatch(f.Read(0, 3 * 3392, 10), "wrong offset or size");  // past the end
  mismatch(f.Read(0, 2 * 3392, 3392), "wrong offset or size");  // the last one is shorter
  ASSERT_EQ(f.Read(0, 0, 3392).kind, PushedPieces::kTake);
  mismatch(f.Read(0, 0, 3392), "came twice");
  f.arrived[2] = 1;
  mismatch(f.Read(2, 0, am_wire::PushPieceBytes(20000, kAsked)), "whole already");
  // Another request's piece, or a header that is no piece's: not this fetch's business.
  EXPECT_EQ(f.Read(0, 3392, 3392, kRequest + 1).kind, PushedPieces::kNotOurs);
  EXPECT_EQ(f.pieces
                .Read("short", 3392, kRequest, [&](size_t i) { return f.lengths[i]; }, f.arrived)
                .kind,
            PushedPieces::kNotOurs);
  // A fetch that asked for no pieces takes none.
  PushedPieces none(0, 1);
  std::vector<uint8_t> arrived(1, 0);
  mismatch(none.Read(am_wire::EncodeFetchPieceHeader({{kRequest, 0, 0}, 0}), 3392, kRequest,
                     [](size_t) { return uint64_t{10000}; }, arrived),
           "no pieces were asked for");
}

}  // namespace
}  // namespace strata::client
