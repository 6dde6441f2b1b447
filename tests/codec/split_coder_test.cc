// The split quant coder (section coder 5): high part rANS-coded, low r bits raw and bit-packed.
#include <cstring>
#include <random>
#include <vector>

#include "codec/codec.h"
#include "codec/half.h"
#include "codec/internal/low_bits.h"
#include "codec/internal/sections.h"
#include "codec/synthetic_kv.h"
#include "gtest/gtest.h"
#include "tests/codec/test_layout.h"

namespace strata::codec {
namespace {

using test::Layout;

// Restores the test hooks however a test ends.
struct Hooks {
  ~Hooks() {
    internal::SetSplitLowBitsForTesting(0);
    internal::SetCoderWrittenForTesting(0);
    internal::ForceScalarLowBitsForTesting(false);
  }
};

std::vector<uint8_t> DecodeOk(const std::vector<uint8_t>& blob, size_t size) {
  std::vector<uint8_t> out(size);
  absl::Status s = Decode(blob, out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

}  // namespace

TEST(LowBits, PackUnpackRoundTripScalarAndBmi2Agree) {
  Hooks hooks;
  std::mt19937 rng(5);
  for (int r = 1; r <= 7; ++r) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{15}, size_t{16},
                     size_t{63}, size_t{64}, size_t{65}, size_t{1000}, size_t{4099}}) {
      std::vector<uint8_t> lo(n);
      for (auto& v : lo) v = static_cast<uint8_t>(rng() & ((1u << r) - 1));
      const size_t bytes = internal::LowBitsBytes(n, r);
      std::vector<uint8_t> fast(bytes + 8), slow(bytes + 8);
      internal::PackLowBits(lo.data(), n, r, fast.data());
      internal::ForceScalarLowBitsForTesting(true);
      internal::PackLowBits(lo.data(), n, r, slow.data());
      fast.resize(bytes);
      slow.resize(bytes);
      EXPECT_EQ(fast, slow) << "r " << r << " n " << n;
      // Bit i * r + j of the string is bit j of value i.
      for (size_t i = 0; i < n; ++i)
        for (int j = 0; j < r; ++j) {
          const size_t b = i * r + j;
          ASSERT_EQ((fast[b / 8] >> (b % 8)) & 1, (lo[i] >> j) & 1) << r << " " << n << " " << i;
        }
      for (bool scalar : {true, false}) {
        internal::ForceScalarLowBitsForTesting(scalar);
        // Exactly `bytes` readable bytes: a copy in its own allocation (ASan sees overreads).
        std::vector<uint8_t> in(fast);
        std::vector<uint8_t> back(n + 8, 0xAA);
        ASSERT_TRUE(internal::UnpackLowBits(in.data(), n, r, back.data()));
        back.resize(n);
        EXPECT_EQ(back, lo) << "r " << r << " n " << n << " scalar " << scalar;
        if ((n * r) % 8 != 0) {  // a set padding bit is refused
          in.back() |= 0x80;
          EXPECT_FALSE(internal::UnpackLowBits(in.data(), n, r, back.data()));
        }
      }
      internal::ForceScalarLowBitsForTesting(false);
    }
  }
}

TEST(LowBits, ExpandRowVectorAndRunCopiesAgree) {
  Hooks hooks;
  std::mt19937 rng(7);
  for (size_t C : {size_t{1}, size_t{20}, size_t{64}, size_t{100}, size_t{128}, size_t{1024}}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<uint64_t> keep((C + 63) / 64, 0);
      size_t kept = 0;
      for (size_t c = 0; c < C; ++c)
        if (rng() % 8 != 0 || trial == 0) {  // trial 0: every channel kept
          keep[c / 64] |= uint64_t{1} << (c % 64);
          ++kept;
        }
      std::vector<uint8_t> in(kept + 64);
      for (auto& v : in) v = static_cast<uint8_t>(1 + rng() % 127);
      std::vector<uint8_t> want(C, 0);
      for (size_t c = 0, k = 0; c < C; ++c)
        if ((keep[c / 64] >> (c % 64)) & 1) want[c] = in[k++];
      for (bool scalar : {false, true}) {
        internal::ForceScalarLowBitsForTesting(scalar);
        std::vector<uint8_t> out((C + 63) / 64 * 64, 0xEE);
        EXPECT_EQ(internal::ExpandLowBitsRow(in.data(), keep.data(), C, out.data()), kept);
        out.resize(C);
        EXPECT_EQ(out, want) << "C " << C << " scalar " << scalar;
      }
    }
  }
}

// The encoder's in-place compaction of T rows keeps exactly the kept channels' values, in order,
// with vpcompressb and with moves of runs; and ExpandLowBitsRow gives each row back.
TEST(LowBits, CompactRowsVectorAndRunMovesAgree) {
  Hooks hooks;
  std::mt19937 rng(11);
  for (size_t C : {size_t{1}, size_t{20}, size_t{64}, size_t{100}, size_t{192}, size_t{1024}}) {
    for (int trial = 0; trial < 10; ++trial) {
      const size_t T = 1 + rng() % 9;
      std::vector<uint64_t> keep((C + 63) / 64, 0);
      for (size_t c = 0; c < C; ++c)
        if (rng() % 8 != 0 || trial == 0) keep[c / 64] |= uint64_t{1} << (c % 64);
      std::vector<uint8_t> rows(T * C);
      for (auto& v : rows) v = static_cast<uint8_t>(1 + rng() % 127);
      std::vector<uint8_t> want;
      for (size_t t = 0; t < T; ++t)
        for (size_t c = 0; c < C; ++c)
          if ((keep[c / 64] >> (c % 64)) & 1) want.push_back(rows[t * C + c]);
      for (bool scalar : {false, true}) {
        internal::ForceScalarLowBitsForTesting(scalar);
        std::vector<uint8_t> lo = rows;
        ASSERT_EQ(internal::CompactLowBits(lo.data(), T, C, keep.data()), want.size());
        EXPECT_TRUE(std::equal(want.begin(), want.end(), lo.begin()))
            << "C " << C << " T " << T << " scalar " << scalar;
        lo.resize(want.size() + 64);
        size_t at = 0;
        for (size_t t = 0; t < T; ++t) {
          std::vector<uint8_t> row((C + 63) / 64 * 64);
          at += internal::ExpandLowBitsRow(lo.data() + at, keep.data(), C, row.data());
          for (size_t c = 0; c < C; ++c)
            EXPECT_EQ(row[c], (keep[c / 64] >> (c % 64)) & 1 ? rows[t * C + c] : 0);
        }
      }
    }
  }
}

// Every r the split coder can take decodes to exactly what the plain 64-state coder decodes to
// (the quantiser is untouched), with and without outliers and rotation, 7 and 8 bits.
TEST(SplitCoder, EveryLowBitCountDecodesLikeThePlainCoder) {
  Hooks hooks;
  const KvLayout l = Layout(2, 4, 128, 64);
  const auto data = GenerateSyntheticKv(l, 1);
  for (const char* spec : {"quant:k8v8", "quant:k8v8:ol", "quant:k7v7:had", "quant:k8v7:had:ol",
                           "quant:k8v8:nodelta"}) {
    auto p = ParseCodecSpec(spec);
    ASSERT_TRUE(p.ok()) << spec;
    internal::SetCoderWrittenForTesting(2);
    auto plain = Encode(l, *p, data);
    internal::SetCoderWrittenForTesting(0);
    ASSERT_TRUE(plain.ok());
    const auto want = DecodeOk(*plain, data.size());
    for (int r = 1; r <= 7; ++r) {
      internal::SetSplitLowBitsForTesting(r);
      auto blob = Encode(l, *p, data);
      internal::SetSplitLowBitsForTesting(0);
      ASSERT_TRUE(blob.ok());
      auto info = InspectBlob(*blob);
      ASSERT_TRUE(info.ok());
      int split = 0;
      // The split sections' high parts share the blob's stream (its last section).
      ASSERT_EQ(info->sections.back().type, SectionType::kStream);
      for (const auto& s : info->sections) {
        if (s.type == SectionType::kStream) continue;
        // r >= bits, or a high part wider than a byte, falls back to the plain coder.
        EXPECT_TRUE(s.coder == internal::kCoderSplit || s.coder == internal::kCoderRans64);
        split += s.coder == internal::kCoderSplit;
        if (r < s.bits && r >= s.bits - 4) {
          EXPECT_EQ(s.coder, internal::kCoderSplit);
        }
      }
      if (r <= 6) {
        EXPECT_GT(split, 0) << spec << " r " << r;
      }
      EXPECT_EQ(DecodeOk(*blob, data.size()), want) << spec << " r " << r;
      internal::ForceScalarLowBitsForTesting(true);
      EXPECT_EQ(DecodeOk(*blob, data.size()), want) << spec << " r " << r << " scalar";
      internal::ForceScalarLowBitsForTesting(false);
    }
    // The encoder's own choice, and its determinism.
    auto a = Encode(l, *p, data), b = Encode(l, *p, data);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b);
    EXPECT_EQ(DecodeOk(*a, data.size()), want) << spec;
  }
}

// The default choice on the generator: the split coder for 7-8-bit sections, within 1% of the
// plain coder's size (usually smaller: its tables are smaller), and <= 6-bit sections unchanged.
TEST(SplitCoder, ChosenForWideSymbolsAndKeepsTheSize) {
  const KvLayout l = Layout(2, 8, 128, 256);
  const auto data = GenerateSyntheticKv(l, 1);
  Hooks hooks;
  for (const char* spec : {"quant:k8v8", "quant:k8v8:ol", "quant:k7v7"}) {
    auto p = ParseCodecSpec(spec);
    auto blob = Encode(l, *p, data);
    internal::SetCoderWrittenForTesting(2);
    auto plain = Encode(l, *p, data);
    internal::SetCoderWrittenForTesting(0);
    ASSERT_TRUE(blob.ok() && plain.ok());
    auto info = InspectBlob(*blob);
    ASSERT_TRUE(info.ok());
    ASSERT_EQ(info->sections.back().type, SectionType::kStream);
    for (const auto& s : info->sections) {
      if (s.type != SectionType::kStream) {
        EXPECT_EQ(s.coder, internal::kCoderSplit) << spec;
      }
    }
    EXPECT_LT(static_cast<double>(blob->size()), 1.01 * static_cast<double>(plain->size())) << spec;
  }
  auto p4 = ParseCodecSpec("quant:k4v4");
  auto b4 = Encode(l, *p4, data);
  ASSERT_TRUE(b4.ok());
  auto i4 = InspectBlob(*b4);
  ASSERT_TRUE(i4.ok());
  for (const auto& s : i4->sections) {
    if (s.type != SectionType::kStream) {
      EXPECT_EQ(s.coder, internal::kCoderShared);
    }
  }
}

// Hostile split sections: every field out of range, truncation anywhere, trailing bytes and set
// padding bits are DataLoss, never a crash (ASan in the fuzz build covers the reads).
TEST(SplitCoder, HostileSectionsAreDataLoss) {
  Hooks hooks;
  // One key section: 3 tokens x 20 channels (one rANS context), r = 3: 180 low bits, so the last
  // byte has 4 padding bits.
  internal::TensorShape s;
  s.tokens = 3;
  s.heads = 1;
  s.head_dim = 20;
  s.is_key = true;
  std::mt19937 rng(3);
  std::vector<uint16_t> in(s.values());
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (auto& h : in) h = FloatToHalf(g(rng));
  CodecParams p;
  p.mode = Mode::kQuant;
  p.key_bits = p.value_bits = 8;
  internal::SectionScratch sc;
  std::vector<uint8_t> payload;
  uint8_t coder = internal::kCoderSplit;
  internal::SetSplitLowBitsForTesting(3);
  ASSERT_TRUE(internal::EncodeQuant(reinterpret_cast<const uint8_t*>(in.data()), s, 8, p, &sc,
                                    &payload, nullptr, nullptr, &coder, nullptr)
                  .ok());
  internal::SetSplitLowBitsForTesting(0);
  ASSERT_EQ(coder, internal::kCoderSplit);
  std::vector<uint8_t> out(s.bytes()), want(s.bytes());
  auto dec = [&](const std::vector<uint8_t>& b) {
    return internal::DecodeQuant(b, s, 8, internal::kCoderSplit, &sc, out.data(), nullptr);
  };
  ASSERT_TRUE(dec(payload).ok());
  want = out;
  // Header: bits, axis, flags, ctx, u16 group, mu[C] fp16, a[C], step[C] fp16; then r, coder, base.
  const size_t at = 6 + 2 * 20 + 20 + 2 * 20;
  ASSERT_EQ(payload[at], 3);
  auto expect_loss = [&](std::vector<uint8_t> b, const char* what) {
    absl::Status st = dec(b);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << what << ": " << st;
  };
  for (uint8_t r : {0, 8, 9, 255}) {
    auto b = payload;
    b[at] = r;
    expect_loss(b, "r");
  }
  for (uint8_t c : {0, 3, 5, 6, 255}) {
    auto b = payload;
    b[at + 1] = c;
    expect_loss(b, "high-part coder");
  }
  for (uint16_t base : {uint16_t{128}, uint16_t{0xFFFF}}) {  // 1024 >> 3 = 128 high symbols
    auto b = payload;
    std::memcpy(b.data() + at + 2, &base, 2);
    expect_loss(b, "base");
  }
  for (size_t k = 1; k <= payload.size(); ++k)
    expect_loss(std::vector<uint8_t>(payload.begin(), payload.end() - k), "truncated");
  auto longer = payload;
  longer.push_back(0);
  expect_loss(longer, "trailing byte");
  auto pad = payload;
  ASSERT_GT(pad.size(), at + 4);
  pad[pad.size() - 1] = static_cast<uint8_t>(pad[pad.size() - 1] | 0x80);
  expect_loss(pad, "padding bit");
  // Random mutations of the split fields and the rest never crash.
  for (int i = 0; i < 2000; ++i) {
    auto b = payload;
    b[at + rng() % (b.size() - at)] = static_cast<uint8_t>(rng());
    (void)dec(b);
  }
  ASSERT_TRUE(dec(payload).ok());
  EXPECT_EQ(out, want);
}

}  // namespace strata::codec
