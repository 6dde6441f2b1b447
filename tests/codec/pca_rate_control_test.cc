// A pca bit budget coded in one pass (codec/pca_rate_control.cc): once an encoder has coded a
// block of a calibration and budget, each block alike takes one encode, holds the budget,
// spends it as fully as the search does, and keeps its sections' codes close together; blocks
// unlike the last one (louder, quieter) still hold it, and blocks the last one says little
// about go to the search.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "codec/calibration.h"
#include "codec/codec.h"
#include "codec/half.h"
#include "codec/synthetic_kv.h"
#include "tests/codec/fp16_error.h"
#include "tests/codec/test_layout.h"

namespace strata::codec {
namespace {

using test::RelMse;

// 8 layers of 2 heads of 64, 128 tokens: 16 sections, enough for the plan to matter.
const KvLayout kLayout = test::Layout(8, 2, 64, 128);

struct Namespace {
  std::vector<uint8_t> kv;
  CalibrationSet set;
  CodecParams p;
  // `reshape`, where given, changes the blocks before they are calibrated on.
  explicit Namespace(uint32_t blocks,
                     const std::function<void(std::vector<uint8_t>*)>& reshape = nullptr) {
    SyntheticKvParams g;
    g.seed = 77;
    kv = GenerateSyntheticKv(kLayout, blocks, g);
    if (reshape) reshape(&kv);
    std::vector<std::span<const uint8_t>> samples;
    for (size_t i = 0; i < 4; ++i) samples.push_back(Block(i));
    CalibrateOptions o;
    o.bits_per_value = 1.6;
    auto cal = Calibrate(kLayout, samples, o);
    EXPECT_TRUE(cal.ok()) << cal.status();
    if (!cal.ok()) return;
    p.mode = Mode::kPca;
    p.calibration_id = set.Add(std::make_shared<const Calibration>(*std::move(cal)));
  }
  std::span<const uint8_t> Block(size_t i) const {
    return std::span<const uint8_t>(kv).subspan(i * kLayout.BlockBytes(), kLayout.BlockBytes());
  }
  void Use(Encoder* e, bool one_pass) const {
    e->set_calibrations(&set);
    e->set_pca_one_pass(one_pass);
  }
};

// Block `b` with every value times `gain` (fp16, clamped to its finite range).
std::vector<uint8_t> Scaled(std::span<const uint8_t> b, float gain) {
  std::vector<uint8_t> out(b.begin(), b.end());
  for (size_t i = 0; i + 1 < out.size(); i += 2) {
    uint16_t h;
    std::memcpy(&h, out.data() + i, 2);
    h = FloatToHalf(std::clamp(HalfToFloat(h) * gain, -65000.0f, 65000.0f));
    std::memcpy(out.data() + i, &h, 2);
  }
  return out;
}

std::vector<int> StepCodes(std::span<const uint8_t> blob) {
  std::vector<int> codes;
  auto v = ParseBlob(blob);
  EXPECT_TRUE(v.ok()) << v.status();
  if (v.ok())
    for (const SectionEntry& e : v->sections)
      if (e.type == SectionType::kPca) codes.push_back(e.bits);
  return codes;
}

// After its first block an encoder codes every block in one pass; each blob is within the
// budget, at least as large as the search's blob less a hundredth of the budget, no worse in
// error than the search's by more than 3 %, and its sections' codes lie within 12 of the
// search's common code.
TEST(PcaOnePass, HoldsTheBudgetInOneEncodeAndSpendsItAsTheSearchDoes) {
  Namespace ns(16);
  const double values = kLayout.BlockBytes() / 2.0;
  for (float rate : {1.2f, 1.6f, 2.2f}) {
    SCOPED_TRACE(::testing::Message() << "budget " << rate);
    Encoder one, search;
    ns.Use(&one, true);
    ns.Use(&search, false);
    Decoder dec;
    dec.set_calibrations(&ns.set);
    CodecParams q = ns.p;
    q.rate_bits = rate;
    const double budget = std::floor(rate * values / 8.0);
    for (size_t i = 4; i < 16; ++i) {
      SCOPED_TRACE(::testing::Message() << "block " << i);
      q.first_position = uint64_t{i} * kLayout.tokens_per_block;
      std::vector<uint8_t> blob, searched, out(kLayout.BlockBytes()), ref(kLayout.BlockBytes());
      const uint64_t before = one.budget_trial_encodes();
      const uint64_t passes = one.budget_one_pass_encodes();
      ASSERT_TRUE(one.Encode(kLayout, q, ns.Block(i), &blob).ok());
      if (i > 4) {
        EXPECT_EQ(one.budget_trial_encodes() - before, 1u);
        EXPECT_EQ(one.budget_one_pass_encodes() - passes, 1u);
      }
      ASSERT_TRUE(search.Encode(kLayout, q, ns.Block(i), &searched).ok());
      EXPECT_LE(blob.size(), budget);
      EXPECT_GE(blob.size(), searched.size() - budget / 100);
      ASSERT_TRUE(dec.Decode(blob, out).ok());
      ASSERT_TRUE(dec.Decode(searched, ref).ok());
      EXPECT_LE(RelMse(ns.Block(i), out), 1.03 * RelMse(ns.Block(i), ref));
      const std::vector<int> common = StepCodes(searched);
      ASSERT_FALSE(common.empty());
      for (int c : StepCodes(blob)) EXPECT_NEAR(c, common[0], 12);
      EXPECT_EQ(search.budget_one_pass_encodes(), 0u);
    }
  }
}

// Codes `blocks` in turn with one encoder at 1.6 bits per value: after the first, each in one
// encode, within the budget, as large and as close to the block as the search's blob (less a
// hundredth of the budget, at most 5 % more error). Returns the blobs.
std::vector<std::vector<uint8_t>> CodeInTurn(const Namespace& ns,
                                             const std::vector<std::vector<uint8_t>>& blocks) {
  const double budget = std::floor(1.6 * kLayout.BlockBytes() / 2.0 / 8.0);
  Encoder enc;
  ns.Use(&enc, true);
  Decoder dec;
  dec.set_calibrations(&ns.set);
  CodecParams q = ns.p;
  q.rate_bits = 1.6f;
  std::vector<std::vector<uint8_t>> blobs;
  for (size_t i = 0; i < blocks.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "block " << i);
    std::vector<uint8_t>& blob = blobs.emplace_back();
    std::vector<uint8_t> out(kLayout.BlockBytes());
    const uint64_t before = enc.budget_trial_encodes();
    const uint64_t passes = enc.budget_one_pass_encodes();
    EXPECT_TRUE(enc.Encode(kLayout, q, blocks[i], &blob).ok());
    if (i > 0) {
      EXPECT_EQ(enc.budget_trial_encodes() - before, 1u);
      EXPECT_EQ(enc.budget_one_pass_encodes() - passes, 1u);
    }
    EXPECT_LE(blob.size(), budget);
    EXPECT_TRUE(dec.Decode(blob, out).ok());
    // The search's blob of the same block, from an encoder that searches every block.
    Encoder searching;
    ns.Use(&searching, false);
    std::vector<uint8_t> searched, ref(kLayout.BlockBytes());
    EXPECT_TRUE(searching.Encode(kLayout, q, blocks[i], &searched).ok());
    EXPECT_TRUE(dec.Decode(searched, ref).ok());
    EXPECT_GE(blob.size(), searched.size() - budget / 100);
    EXPECT_LE(RelMse(blocks[i], out), 1.05 * RelMse(blocks[i], ref));
  }
  return blobs;
}

std::vector<std::vector<uint8_t>> Plain(const Namespace& ns, size_t from, size_t to) {
  std::vector<std::vector<uint8_t>> blocks;
  for (size_t i = from; i < to; ++i) blocks.emplace_back(ns.Block(i).begin(), ns.Block(i).end());
  return blocks;
}

// Blocks unlike the one before (4x and 1/4x its values, then plain again): the plan starts
// from the last block's, two octaves off, and still holds the budget and spends it.
TEST(PcaOnePass, BlocksUnlikeTheLastStillHoldTheBudget) {
  Namespace ns(10);
  std::vector<std::vector<uint8_t>> blocks = Plain(ns, 4, 10);
  blocks[2] = Scaled(blocks[2], 4.0f);
  blocks[3] = Scaled(blocks[3], 0.25f);
  CodeInTurn(ns, blocks);
}

// The last block's last section was one token repeated (a few bytes, whatever the model said),
// this block's is not: the plan counts on almost nothing for it and spends the budget before
// it. That section is then coded again at coarser codes until the blob fits.
TEST(PcaOnePass, ALastSectionThatMissesIsCodedAgainCoarser) {
  Namespace ns(8);
  std::vector<std::vector<uint8_t>> blocks = Plain(ns, 4, 8);
  const size_t section_bytes = kLayout.BlockBytes() / (2 * kLayout.num_layers);
  const size_t row = size_t{kLayout.num_kv_heads} * kLayout.head_dim * 2;
  uint8_t* last = blocks[1].data() + blocks[1].size() - section_bytes;
  for (size_t t = 1; t < kLayout.tokens_per_block; ++t) std::memcpy(last + t * row, last, row);
  const std::vector<std::vector<uint8_t>> blobs = CodeInTurn(ns, blocks);
  const std::vector<int> codes = StepCodes(blobs[2]);
  ASSERT_FALSE(codes.empty());
  EXPECT_GT(codes.back(), codes.front() + 8);  // coded again, coarser
}

// Value sections whose tokens are loud one in eight (4x, the rest 1/4x): the size model (a
// Laplacian of each coordinate's spread) takes their bytes for several times what the coder
// spends, the keys' for about what it does. Each section's own ratio of coded to modelled
// bytes, learnt from the block before, keeps a block's codes together once the one pass has
// coded a block (spans of 4-8 codes here); one ratio for every section would code the keys
// finer and the values coarser, their codes 20-27 apart in every block.
TEST(PcaOnePass, EachSectionsOwnRatioKeepsTheCodesTogether) {
  const size_t section_bytes = kLayout.BlockBytes() / (2 * kLayout.num_layers);
  const size_t row = size_t{kLayout.num_kv_heads} * kLayout.head_dim * 2;
  Namespace ns(12, [&](std::vector<uint8_t>* kv) {
    for (size_t at = section_bytes; at < kv->size(); at += 2 * section_bytes)
      for (size_t t = 0; t < kLayout.tokens_per_block; ++t) {
        uint8_t* r = kv->data() + at + t * row;
        const float gain = t % 8 == 3 ? 4.0f : 0.25f;
        for (size_t i = 0; i < row; i += 2) {
          uint16_t h;
          std::memcpy(&h, r + i, 2);
          h = FloatToHalf(HalfToFloat(h) * gain);
          std::memcpy(r + i, &h, 2);
        }
      }
  });
  Encoder enc;
  ns.Use(&enc, true);
  CodecParams q = ns.p;
  q.rate_bits = 1.6f;
  for (size_t i = 4; i < 12; ++i) {
    SCOPED_TRACE(::testing::Message() << "block " << i);
    q.first_position = uint64_t{i} * kLayout.tokens_per_block;
    std::vector<uint8_t> blob;
    ASSERT_TRUE(enc.Encode(kLayout, q, ns.Block(i), &blob).ok());
    const std::vector<int> codes = StepCodes(blob);
    ASSERT_EQ(codes.size(), 2u * kLayout.num_layers);
    // Blocks 4 (searched) and 5 (its ratio the block's) aside, after the values' ratios have
    // been learnt once.
    if (i < 7) continue;
    EXPECT_LE(*std::max_element(codes.begin(), codes.end()) -
                  *std::min_element(codes.begin(), codes.end()),
              12);
  }
}

// Blocks the last one says little about go to the search, where a plan would code some sections
// far coarser or finer than the rest: a plain block after one 1000x louder (its largest values
// at the fp16 limit; it fits no code of 1.6 bits, stored at the coarsest as the search does),
// whose plan coded its first sections 40 codes coarser than its last (7 % more error than the
// search's); and at a budget of 12 bits a block 30x louder than the last, whose first section
// the plan codes finest and the next a code 58 coarser (27 % more error). The blocks after them
// go in one pass again.
TEST(PcaOnePass, BlocksTheLastSaysLittleAboutGoToTheSearch) {
  Namespace ns(10);
  Decoder dec;
  dec.set_calibrations(&ns.set);
  struct Case {
    const char* what;
    float rate, gain;
    std::vector<bool> one_pass;  // per block
  };
  const std::vector<Case> cases = {
      {"after a block far louder", 1.6f, 1000.0f, {false, true, false, false, true}},
      {"a plan that jumps", 12.0f, 30.0f, {false, true, false, true, true}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Encoder enc, searching;
    ns.Use(&enc, true);
    ns.Use(&searching, false);
    CodecParams q = ns.p;
    q.rate_bits = c.rate;
    const double budget = std::floor(c.rate * kLayout.BlockBytes() / 2.0 / 8.0);
    std::vector<std::vector<uint8_t>> blocks = Plain(ns, 4, 9);
    blocks[2] = Scaled(blocks[2], c.gain);
    for (size_t i = 0; i < blocks.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "block " << i);
      q.first_position = uint64_t{i + 4} * kLayout.tokens_per_block;
      std::vector<uint8_t> blob, searched, out(kLayout.BlockBytes()), ref(kLayout.BlockBytes());
      const uint64_t passes = enc.budget_one_pass_encodes();
      ASSERT_TRUE(enc.Encode(kLayout, q, blocks[i], &blob).ok());
      ASSERT_TRUE(searching.Encode(kLayout, q, blocks[i], &searched).ok());
      EXPECT_EQ(enc.budget_one_pass_encodes() - passes, c.one_pass[i] ? 1u : 0u);
      EXPECT_LE(blob.size(), std::max<double>(budget, searched.size()));
      ASSERT_TRUE(dec.Decode(blob, out).ok());
      ASSERT_TRUE(dec.Decode(searched, ref).ok());
      EXPECT_LE(RelMse(blocks[i], out), 1.05 * RelMse(blocks[i], ref));
    }
  }
}

// One encoder for blocks of two budgets and two calibrations in turn (a transcoder's victims
// from several namespaces): each keeps its own record of the last block, so every block after
// the first of its kind goes in one pass and holds its budget; a fifth kind in turn with four
// others pushes the oldest out, and that one is searched again.
TEST(PcaOnePass, BudgetsAndCalibrationsInTurnEachKeepTheirOwnRecord) {
  Namespace ns(12);
  CalibrateOptions o;
  o.bits_per_value = 2.4;
  std::vector<std::span<const uint8_t>> samples;
  for (size_t i = 4; i < 8; ++i) samples.push_back(ns.Block(i));
  auto other = Calibrate(kLayout, samples, o);
  ASSERT_TRUE(other.ok()) << other.status();
  const uint64_t other_id = ns.set.Add(std::make_shared<const Calibration>(*std::move(other)));
  Encoder enc;
  ns.Use(&enc, true);
  Decoder dec;
  dec.set_calibrations(&ns.set);
  struct Kind {
    uint64_t id;
    float rate;
  };
  auto code = [&](const Kind& k, size_t block) {
    CodecParams q = ns.p;
    q.calibration_id = k.id;
    q.rate_bits = k.rate;
    std::vector<uint8_t> blob, out(kLayout.BlockBytes());
    const uint64_t passes = enc.budget_one_pass_encodes();
    EXPECT_TRUE(enc.Encode(kLayout, q, ns.Block(block), &blob).ok());
    EXPECT_LE(blob.size(), std::floor(k.rate * kLayout.BlockBytes() / 2.0 / 8.0));
    EXPECT_TRUE(dec.Decode(blob, out).ok());
    return enc.budget_one_pass_encodes() - passes;
  };
  const std::vector<Kind> four = {
      {ns.p.calibration_id, 1.2f}, {ns.p.calibration_id, 1.6f}, {other_id, 1.6f}, {other_id, 2.0f}};
  for (size_t round = 0; round < 3; ++round)
    for (const Kind& k : four) {
      SCOPED_TRACE(::testing::Message() << "round " << round << " rate " << k.rate);
      EXPECT_EQ(code(k, 8 + round), round == 0 ? 0u : 1u);
    }
  EXPECT_EQ(code({ns.p.calibration_id, 1.4f}, 11), 0u);  // a fifth: searched
  EXPECT_EQ(code(four[0], 11), 0u);                       // the oldest, pushed out
  EXPECT_EQ(code(four[3], 11), 1u);                       // the newest, kept
}

}  // namespace
}  // namespace strata::codec
