#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "codec/codec.h"
#include "codec/half.h"
#include "codec/internal/sections.h"
#include "codec/synthetic_kv.h"
#include "common/crc32c.h"
#include "gtest/gtest.h"
#include "tests/codec/test_layout.h"
#include "tests/codec/v1_blobs.inc"

namespace strata::codec {
namespace {

using test::Layout;

std::vector<float> AsFloats(const std::vector<uint8_t>& b, DType dt) {
  std::vector<float> f(b.size() / DTypeBytes(dt));
  for (size_t i = 0; i < f.size(); ++i) {
    uint16_t h;
    if (dt == DType::kFloat32) {
      std::memcpy(&f[i], b.data() + 4 * i, 4);
      continue;
    }
    std::memcpy(&h, b.data() + 2 * i, 2);
    f[i] = dt == DType::kFloat16 ? HalfToFloat(h) : BF16ToFloat(h);
  }
  return f;
}

std::vector<uint8_t> RoundTrip(const KvLayout& l, const CodecParams& p,
                               const std::vector<uint8_t>& data, size_t* blob_size = nullptr) {
  auto blob = Encode(l, p, data);
  EXPECT_TRUE(blob.ok()) << blob.status();
  if (!blob.ok()) return {};
  if (blob_size) *blob_size = blob->size();
  std::vector<uint8_t> out(data.size());
  absl::Status s = Decode(*blob, out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(Lossless, BitExactOnSyntheticAndSpecialValues) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    const KvLayout l = Layout(3, 2, 64, 32, dt);
    auto data = GenerateSyntheticKv(l, 1);
    // Sprinkle NaNs, infinities, subnormals, signed zeros.
    const uint16_t specials[] = {0x7C00, 0xFC00, 0x7E01, 0x0001, 0x8000, 0x03FF, 0x7F80, 0xFFC1};
    for (size_t i = 0; i < 64; ++i)
      std::memcpy(data.data() + 2 * (i * 97 % (data.size() / 2)), &specials[i % 8], 2);
    CodecParams p;
    p.mode = Mode::kLossless;
    size_t size = 0;
    EXPECT_EQ(RoundTrip(l, p, data, &size), data);
    EXPECT_LT(size, data.size());  // structured data compresses
  }
  // Incompressible input stays bit-exact too (and barely grows).
  const KvLayout l = Layout(1, 1, 128, 64);
  std::vector<uint8_t> noise(l.BlockBytes());
  std::mt19937 rng(4);
  for (auto& b : noise) b = static_cast<uint8_t>(rng());
  CodecParams p;
  p.mode = Mode::kLossless;
  size_t size = 0;
  EXPECT_EQ(RoundTrip(l, p, noise, &size), noise);
  EXPECT_LT(size, noise.size() + 2048);
}

// The fp16 exponent-plane layout (coder 3): the AVX-512 and scalar coders write the same bytes
// and each decodes the other's; group tails (values not a multiple of 32), every exponent,
// escapes at every width; byte-plane (coder 2) fp16 sections still decode.
TEST(Lossless, ExpPlanesScalarAndSimdAgree) {
  std::mt19937 rng(7);
  for (uint32_t dim : {128u, 40u, 8u}) {
    const KvLayout l = Layout(2, 3, dim, 37);
    auto data = GenerateSyntheticKv(l, 1);
    uint16_t* h = reinterpret_cast<uint16_t*>(data.data());
    const size_t n = data.size() / 2;
    for (size_t i = 0; i < n / 4; ++i) {  // a quarter of the values: anything at all
      h[rng() % n] = static_cast<uint16_t>(rng());
    }
    for (size_t i = 0; i < 64 && i < n; ++i) h[i] = static_cast<uint16_t>(i << 10 | i);
    CodecParams p;
    p.mode = Mode::kLossless;
    auto simd = Encode(l, p, data);
    ASSERT_TRUE(simd.ok()) << simd.status() << " dim " << dim;
    internal::ForceScalarPlanesForTesting(true);
    auto scalar = Encode(l, p, data);
    std::vector<uint8_t> out(data.size()), out2(data.size());
    const absl::Status s1 = Decode(*simd, out);
    internal::ForceScalarPlanesForTesting(false);
    ASSERT_TRUE(scalar.ok());
    EXPECT_EQ(*simd, *scalar) << "dim " << dim;
    ASSERT_TRUE(s1.ok()) << s1;
    EXPECT_EQ(out, data);
    ASSERT_TRUE(Decode(*scalar, out2).ok());
    EXPECT_EQ(out2, data);
    auto info = InspectBlob(*simd);
    ASSERT_TRUE(info.ok());
    for (const auto& sec : info->sections) EXPECT_EQ(sec.coder, 3);
  }
  // Byte-plane fp16 sections (what the encoder wrote before coder 3) still decode.
  const KvLayout l = Layout(2, 2, 64, 16);
  auto data = GenerateSyntheticKv(l, 1);
  CodecParams p;
  p.mode = Mode::kLossless;
  internal::WriteBytePlanesForTesting(true);
  auto old = Encode(l, p, data);
  internal::WriteBytePlanesForTesting(false);
  ASSERT_TRUE(old.ok());
  auto info = InspectBlob(*old);
  ASSERT_TRUE(info.ok());
  for (const auto& sec : info->sections) EXPECT_EQ(sec.coder, internal::kCoderWritten);
  std::vector<uint8_t> out(data.size());
  ASSERT_TRUE(Decode(*old, out).ok());
  EXPECT_EQ(out, data);
}

// Quant blobs of the 64-state coder (coder 2, written before coder 4 and, for 7-8 bits, before
// the split coder 5) and of the 32-state one still decode, to the same values as today's blob
// (whose <= 6-bit sections share one stream).
TEST(Compat, QuantCoder2And1BlobsDecodeLikeCoder4) {
  const KvLayout l = Layout(2, 4, 128, 64);
  auto data = GenerateSyntheticKv(l, 1);
  for (const char* spec : {"quant:k4v4", "quant:k3v4:ol", "quant:k8v8", "quant:k2v2:had"}) {
    auto p = ParseCodecSpec(spec);
    ASSERT_TRUE(p.ok());
    auto now = Encode(l, *p, data);
    ASSERT_TRUE(now.ok());
    auto ninfo = InspectBlob(*now);
    ASSERT_TRUE(ninfo.ok());
    // <= 6 bits: the shared stream (the last section); 7-8 bits: the split coder.
    for (const auto& sec : ninfo->sections) {
      if (sec.type == SectionType::kStream) {
        EXPECT_EQ(&sec, &ninfo->sections.back()) << spec;
      } else if (sec.bits <= 6) {
        EXPECT_EQ(sec.coder, internal::kCoderShared) << spec;
      } else {
        EXPECT_EQ(sec.coder, 5) << spec;
      }
    }
    std::vector<uint8_t> want(data.size());
    ASSERT_TRUE(Decode(*now, want).ok());
    for (uint8_t coder : {1, 2}) {
      internal::SetCoderWrittenForTesting(coder);
      auto old = Encode(l, *p, data);
      internal::SetCoderWrittenForTesting(0);
      ASSERT_TRUE(old.ok());
      auto info = InspectBlob(*old);
      ASSERT_TRUE(info.ok());
      for (const auto& sec : info->sections) EXPECT_EQ(sec.coder, coder);
      std::vector<uint8_t> got(data.size());
      ASSERT_TRUE(Decode(*old, got).ok()) << spec << " coder " << int(coder);
      EXPECT_EQ(got, want) << spec << " coder " << int(coder);
    }
  }
}

TEST(Lossless, RejectsFp32) {
  CodecParams p;
  p.mode = Mode::kLossless;
  const KvLayout l = Layout(1, 1, 16, 16, DType::kFloat32);
  std::vector<uint8_t> d(l.BlockBytes());
  EXPECT_EQ(Encode(l, p, d).status().code(), absl::StatusCode::kInvalidArgument);
}

// Quant with token delta off and no rotation is exactly per-channel (keys) / per-token-group
// (values) intN: every reconstruction lies within step/2 of the input (plus fp16 rounding).
TEST(Quant, ErrorWithinHalfStep) {
  // Small, and realistic (outlier channels swing widely under RoPE over 256 positions).
  for (const KvLayout& l : {Layout(2, 2, 64, 48), Layout(1, 4, 128, 256)}) {
    auto data = GenerateSyntheticKv(l, 2);
    data.erase(data.begin(), data.begin() + l.BlockBytes());  // positions T..2T-1
    const auto x = AsFloats(data, l.dtype);
    const size_t T = l.tokens_per_block, C = l.ValuesPerTokenPerTensor();
    for (bool delta : {false, true}) {
      for (uint8_t bits : {2, 3, 4, 8}) {
        CodecParams p;
        p.mode = Mode::kQuant;
        p.key_bits = p.value_bits = bits;
        p.group_size = 32;
        p.token_delta = delta;
        const auto y = AsFloats(RoundTrip(l, p, data), l.dtype);
        ASSERT_EQ(y.size(), x.size());
        const float levels = static_cast<float>((1 << bits) - 1);
        for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
          for (int tensor = 0; tensor < 2; ++tensor) {
            const size_t base = (size_t{layer} * 2 + tensor) * T * C;
            // Per-channel ranges (keys) / per token-group ranges (values).
            std::vector<float> lo(tensor == 0 ? C : T * C / 32, INFINITY), hi(lo.size(), -INFINITY);
            for (size_t t = 0; t < T; ++t)
              for (size_t c = 0; c < C; ++c) {
                const size_t k = tensor == 0 ? c : t * (C / 32) + c / 32;
                lo[k] = std::min(lo[k], x[base + t * C + c]);
                hi[k] = std::max(hi[k], x[base + t * C + c]);
              }
            for (size_t t = 0; t < T; ++t)
              for (size_t c = 0; c < C; ++c) {
                const size_t k = tensor == 0 ? c : t * (C / 32) + c / 32;
                const float step = (hi[k] - lo[k]) / levels;
                const float xv = x[base + t * C + c], yv = y[base + t * C + c];
                // 0.51: fp16 rounding of the step; + output rounding to fp16.
                ASSERT_LE(std::fabs(xv - yv), 0.51f * step + std::fabs(xv) * 1e-3f + 1e-4f)
                    << l.DebugString() << " bits " << int(bits) << " delta " << delta << " layer "
                    << layer << " tensor " << tensor << " t " << t << " c " << c << " x " << xv
                    << " y " << yv << " step " << step;
              }
          }
        }
      }
    }
  }
}

// Real KV has tokens whose values sit far from every channel's mean while spanning a narrow
// range across the channel group (the group's step is tiny, the residual against the
// prediction is not). Those residuals used to be clipped to the alphabet: errors of the
// whole offset (max |err| 3.1 on SmolLM2's KV at every bit width).
TEST(Quant, ValuesFarFromTheChannelMeansAreNotClipped) {
  const KvLayout l = Layout(1, 1, 64, 32);
  const size_t T = l.tokens_per_block, C = l.ValuesPerTokenPerTensor();
  std::mt19937 rng(7);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> x(2 * T * C);
  for (size_t i = 0; i < x.size(); ++i) x[i] = n01(rng);
  const size_t v = T * C;  // values tensor
  for (size_t c = 0; c < C; ++c) x[v + (T - 1) * C + c] = 40.0f + 0.01f * n01(rng);
  for (size_t c = 0; c < C; ++c) x[v + 5 * C + c] = -30.0f + 0.01f * n01(rng);
  std::vector<uint8_t> data(x.size() * 2);
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t h = FloatToHalf(x[i]);
    std::memcpy(data.data() + 2 * i, &h, 2);
  }
  const auto xq = AsFloats(data, l.dtype);
  for (bool delta : {false, true}) {
    for (uint8_t bits : {2, 3, 4, 8}) {
      CodecParams p;
      p.mode = Mode::kQuant;
      p.key_bits = p.value_bits = bits;
      p.group_size = 32;
      p.token_delta = delta;
      const auto y = AsFloats(RoundTrip(l, p, data), l.dtype);
      ASSERT_EQ(y.size(), xq.size());
      // The widened step spans a residual of at most ~45 in 2^(bits+1) - 1.5 steps.
      const float bound = 0.6f * 50.0f / static_cast<float>((2 << bits) - 2) + 0.05f;
      for (size_t t : {size_t{5}, T - 1}) {
        for (size_t c = 0; c < C; ++c) {
          const size_t i = v + t * C + c;
          ASSERT_LE(std::fabs(xq[i] - y[i]), bound)
              << "bits " << int(bits) << " delta " << delta << " t " << t << " c " << c;
        }
      }
    }
  }
}

// Quant sections of <= 6 bits share one 128-state rANS stream, the blob's last section, so the
// states are paid once per blob: a small model's sections (3 kv heads x 64 x 256 tokens = 49k
// symbols) and a short block's (16 tokens) would otherwise spend 512 bytes each on them. The
// blob decodes to the same values as one with a 128-state stream per section (coder 4).
TEST(Quant, SectionsShareOneStream) {
  for (const KvLayout& l : {Layout(2, 3, 64, 256), Layout(1, 8, 128, 256), Layout(4, 2, 64, 16)}) {
    const auto data = GenerateSyntheticKv(l, 1);
    for (const char* spec : {"quant:k2v2:ol", "quant:k4v4", "quant:k3v4:had", "quant:k6v5"}) {
      auto p = ParseCodecSpec(spec);
      ASSERT_TRUE(p.ok());
      auto blob = Encode(l, *p, data);
      ASSERT_TRUE(blob.ok()) << blob.status();
      auto info = InspectBlob(*blob);
      ASSERT_TRUE(info.ok());
      const size_t sections = size_t{l.num_layers} * 2;
      ASSERT_EQ(info->sections.size(), sections + 1) << spec;
      EXPECT_EQ(info->sections.back().type, SectionType::kStream);
      for (size_t i = 0; i < sections; ++i)
        EXPECT_EQ(info->sections[i].coder, internal::kCoderShared) << spec;
      EXPECT_EQ(CodecSpecString(info->params), spec);
      internal::SetCoderWrittenForTesting(internal::kCoderRans128);
      auto own = Encode(l, *p, data);
      internal::SetCoderWrittenForTesting(0);
      ASSERT_TRUE(own.ok());
      std::vector<uint8_t> a(data.size()), b(data.size());
      ASSERT_TRUE(Decode(*blob, a).ok());
      ASSERT_TRUE(Decode(*own, b).ok());
      EXPECT_EQ(a, b) << spec << " " << l.DebugString();
      // Saved per section but one: 512 bytes of final states, less what they carried into the
      // next section (~16 of their 32 bits on average); the stream's table entry costs 24.
      EXPECT_LT(blob->size() + (sections - 1) * 300, own->size()) << spec << " " << l.DebugString();
    }
  }
}

// A blob whose shared stream, or a section's claim on it, was tampered with fails with DataLoss
// (CRC recomputed each time so the decoder gets past it): every byte of the stream flipped, the
// stream section's entry changed, a shared section's coder changed, the stream cut.
TEST(Quant, TamperedSharedStreamIsDataLoss) {
  const KvLayout l = Layout(2, 2, 64, 16);
  const auto data = GenerateSyntheticKv(l, 1);
  auto blob = Encode(l, *ParseCodecSpec("quant:k3v3"), data);
  ASSERT_TRUE(blob.ok());
  auto info = InspectBlob(*blob);
  ASSERT_TRUE(info.ok());
  const SectionEntry stream = info->sections.back();
  ASSERT_EQ(stream.type, SectionType::kStream);
  std::vector<uint8_t> out(data.size());
  auto decode_with_crc = [&](std::vector<uint8_t> bad) {
    const uint32_t crc = Crc32c(bad.data(), bad.size() - 4);
    std::memcpy(bad.data() + bad.size() - 4, &crc, 4);
    return Decode(bad, out);
  };
  auto expect_loss = [&](std::vector<uint8_t> bad, const std::string& what) {
    absl::Status st = decode_with_crc(std::move(bad));
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << what << ": " << st;
  };
  // A flipped word reaches the final-state check, which misses a few (the CRC is what catches
  // corruption; this is about bounds and clean errors): other symbols then decode, in range.
  ASSERT_GT(stream.size, 512u);
  size_t caught = 0;
  for (size_t i = 0; i < stream.size; ++i) {
    std::vector<uint8_t> bad = *blob;
    bad[stream.offset + i] ^= static_cast<uint8_t>(1u << (i % 8));
    absl::Status st = decode_with_crc(std::move(bad));
    EXPECT_TRUE(st.ok() || st.code() == absl::StatusCode::kDataLoss) << st;
    caught += st.code() == absl::StatusCode::kDataLoss;
  }
  EXPECT_GE(static_cast<double>(caught), 0.99 * static_cast<double>(stream.size));
  const size_t entry = 64 + (info->sections.size() - 1) * 24;
  for (auto [field, value] : {std::pair{0, 3}, {1, 1}, {2, 1}, {4, 4}, {5, 2}, {5, 6}}) {
    std::vector<uint8_t> bad = *blob;
    bad[entry + field] = static_cast<uint8_t>(value);
    expect_loss(bad, "stream entry field " + std::to_string(field));
  }
  for (uint8_t coder : {1, 2, 4, 5}) {
    std::vector<uint8_t> bad = *blob;
    bad[64 + 5] = coder;  // the first section leaves the stream
    expect_loss(bad, "first section coder " + std::to_string(coder));
  }
  {  // the stream's last word dropped: the section table says two bytes less
    std::vector<uint8_t> bad = *blob;
    uint64_t size = stream.size - 2;
    std::memcpy(bad.data() + entry + 16, &size, 8);
    expect_loss(bad, "stream cut");
  }
}

// Large sections build their rANS tables from a sample of the token rows; a symbol that occurs
// only in rows outside the sample must still have a code.
TEST(Quant, SampledTablesCodeSymbolsSeenOnlyOutsideTheSample) {
  const KvLayout l = Layout(1, 8, 128, 256);  // 262,144 symbols per section
  const size_t T = l.tokens_per_block, C = l.ValuesPerTokenPerTensor();
  std::mt19937 rng(3);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<uint8_t> data(2 * T * C * 2);
  std::vector<float> x(2 * T * C);
  for (size_t i = 0; i < x.size(); ++i) x[i] = n01(rng);
  // Rows 1 and 2 are outside a 1-in-3 sample of rows: extreme values there only.
  for (size_t c = 0; c < 8; ++c) x[1 * C + 5 + 97 * c] = 40.0f;
  for (size_t c = 0; c < 8; ++c) x[2 * C + 9 + 97 * c] = -40.0f;
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t h = FloatToHalf(x[i]);
    std::memcpy(data.data() + 2 * i, &h, 2);
  }
  for (uint8_t bits : {2, 4}) {
    CodecParams p;
    p.mode = Mode::kQuant;
    p.key_bits = p.value_bits = bits;
    const auto y = AsFloats(RoundTrip(l, p, data), l.dtype);
    ASSERT_EQ(y.size(), x.size());
    for (size_t c = 0; c < 8; ++c) {
      EXPECT_NEAR(y[1 * C + 5 + 97 * c], 40.0f, 41.0f / ((1 << bits) - 1)) << int(bits);
      EXPECT_NEAR(y[2 * C + 9 + 97 * c], -40.0f, 41.0f / ((1 << bits) - 1)) << int(bits);
    }
  }
}

TEST(Quant, DeterministicAndSmallerWithDelta) {
  const KvLayout l = Layout(2, 4, 128, 64);
  auto data = GenerateSyntheticKv(l, 1);
  CodecParams p;
  p.mode = Mode::kQuant;
  p.key_bits = 4;
  p.value_bits = 4;
  auto a = Encode(l, p, data);
  auto b = Encode(l, p, data);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  CodecParams nd = p;
  nd.token_delta = false;
  auto c = Encode(l, nd, data);
  ASSERT_TRUE(c.ok());
  // The generator has correlated neighbouring tokens; prediction must pay for its side info.
  EXPECT_LT(a->size(), c->size());
  // Fewer bits, smaller blobs.
  CodecParams p3 = p;
  p3.key_bits = p3.value_bits = 3;
  auto d = Encode(l, p3, data);
  ASSERT_TRUE(d.ok());
  EXPECT_LT(d->size(), a->size());
}

TEST(Quant, HadamardRoundTripAndRelativeError) {
  const KvLayout l = Layout(2, 2, 128, 32);
  auto data = GenerateSyntheticKv(l, 1);
  const auto x = AsFloats(data, l.dtype);
  for (bool had : {false, true}) {
    CodecParams p;
    p.mode = Mode::kQuant;
    p.key_bits = p.value_bits = 8;
    p.hadamard = had;
    const auto y = AsFloats(RoundTrip(l, p, data), l.dtype);
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      num += (x[i] - y[i]) * (x[i] - y[i]);
      den += x[i] * x[i];
    }
    EXPECT_LT(num / den, 1e-4) << had;
  }
}

TEST(Quant, PerLayerBitsAndOtherLayouts) {
  // bf16, MLA latent, head_dim not a multiple of 16 (single rANS context), fp32.
  for (const KvLayout& l : {Layout(3, 2, 64, 16, DType::kBFloat16),
                            Layout(2, 1, 96, 24, DType::kFloat16, KvKind::kMlaLatent),
                            Layout(2, 3, 40, 8), Layout(1, 2, 32, 8, DType::kFloat32)}) {
    auto data = GenerateSyntheticKv(l, 1);
    CodecParams p;
    p.mode = Mode::kQuant;
    p.group_size = 8;
    p.layer_key_bits.assign(l.num_layers, 3);
    p.layer_value_bits.assign(l.num_layers, 5);
    p.layer_key_bits[0] = 8;
    auto blob = Encode(l, p, data);
    ASSERT_TRUE(blob.ok()) << blob.status() << " " << l.DebugString();
    auto info = InspectBlob(*blob);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->params.KeyBits(0), 8);
    if (l.num_layers > 1) {
      EXPECT_EQ(info->params.KeyBits(1), 3);
      if (l.kind == KvKind::kSeparateKV) {
        EXPECT_EQ(info->params.ValueBits(1), 5);
      }
    }
    std::vector<uint8_t> out(data.size());
    ASSERT_TRUE(Decode(*blob, out).ok()) << l.DebugString();
    const auto x = AsFloats(data, l.dtype), y = AsFloats(out, l.dtype);
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      num += (x[i] - y[i]) * (x[i] - y[i]);
      den += x[i] * x[i];
    }
    EXPECT_LT(num / den, 0.05) << l.DebugString();
  }
}

TEST(Quant, RejectsNonFinite) {
  const KvLayout l = Layout(1, 1, 16, 16);
  auto data = GenerateSyntheticKv(l, 1);
  const uint16_t inf = 0x7C00;
  std::memcpy(data.data() + 10, &inf, 2);
  CodecParams p;
  p.mode = Mode::kQuant;
  EXPECT_EQ(Encode(l, p, data).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Groupwise, MatchesPlainQuantisation) {
  const KvLayout l = Layout(1, 2, 64, 8);
  auto data = GenerateSyntheticKv(l, 1);
  const auto x = AsFloats(data, l.dtype);
  for (uint8_t bits : {2, 3, 4, 5, 8}) {
    CodecParams p;
    p.mode = Mode::kGroupwise;
    p.key_bits = p.value_bits = bits;
    p.group_size = 64;
    size_t size = 0;
    const auto y = AsFloats(RoundTrip(l, p, data, &size), l.dtype);
    const size_t n = x.size();
    EXPECT_EQ(size, kHeaderBytes + 2 * kSectionEntryBytes + kTrailerBytes + 2 * 3 + n / 64 * 4 +
                        2 * ((n / 2 * bits + 7) / 8));
    for (size_t g = 0; g < n / 64; ++g) {
      float lo = INFINITY, hi = -INFINITY;
      for (size_t i = g * 64; i < g * 64 + 64; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
      }
      const float step = (hi - lo) / static_cast<float>((1 << bits) - 1);
      for (size_t i = g * 64; i < g * 64 + 64; ++i)
        ASSERT_LE(std::fabs(x[i] - y[i]),
                  0.51f * step + std::fabs(lo) * 1e-3f + 1e-3f * std::fabs(x[i]) + 1e-4f)
            << int(bits) << " " << i;
    }
  }
}

// A value that is not finite is refused with the reason, as quant and pca refuse it (a NaN
// rounded to no defined code); a blob whose scale or zero is not finite decodes to no NaNs.
TEST(Groupwise, RefusesValuesThatAreNotFinite) {
  const KvLayout l = Layout(1, 2, 64, 8);
  const size_t n = l.ValuesPerTokenPerTensor() * l.tokens_per_block * 2;
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    KvLayout ld = l;
    ld.dtype = dt;
    const auto clean = GenerateSyntheticKv(ld, 1);
    const size_t eb = clean.size() / n;
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      for (size_t at : {size_t{0}, size_t{70}, n - 1}) {  // first of a group, within one, last
        std::vector<uint8_t> data = clean;
        if (dt == DType::kFloat32) {
          std::memcpy(data.data() + at * eb, &bad, 4);
        } else {
          uint32_t bits;  // bf16: the float's high half; fp16: its own (FloatToHalf saturates)
          std::memcpy(&bits, &bad, 4);
          const uint16_t fp16 = std::isnan(bad) ? 0x7E00 : bad > 0 ? 0x7C00 : 0xFC00;
          const uint16_t h =
              dt == DType::kBFloat16 ? static_cast<uint16_t>(bits >> 16) : fp16;
          std::memcpy(data.data() + at * eb, &h, 2);
        }
        auto blob = Encode(ld, *ParseCodecSpec("int4-g64"), data);
        EXPECT_EQ(blob.status().code(), absl::StatusCode::kInvalidArgument)
            << int(dt) << " " << bad << " at " << at;
        EXPECT_NE(blob.status().message().find("finite"), std::string_view::npos);
      }
    }
  }
  const auto data = GenerateSyntheticKv(l, 1);
  auto blob = Encode(l, *ParseCodecSpec("int4-g64"), data);
  ASSERT_TRUE(blob.ok()) << blob.status();
  auto info = InspectBlob(*blob);
  ASSERT_TRUE(info.ok());
  const size_t groups = n / 2 / 64;
  std::vector<uint8_t> out(data.size());
  for (size_t word : {size_t{0}, groups - 1, groups, 2 * groups - 1}) {  // scales, then zeros
    for (uint16_t h : {uint16_t{0x7E00}, uint16_t{0x7C00}, uint16_t{0xFC00}}) {
      std::vector<uint8_t> bad = *blob;
      std::memcpy(bad.data() + info->sections[1].offset + 3 + 2 * word, &h, 2);
      const uint32_t crc = Crc32c(bad.data(), bad.size() - 4);
      std::memcpy(bad.data() + bad.size() - 4, &crc, 4);
      const absl::Status st = Decode(bad, out);
      EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << word << " " << h << ": " << st;
    }
  }
  EXPECT_TRUE(Decode(*blob, out).ok());
}

// Blobs written before the 64-state rANS coder (section coder 1, 32 states) still decode: the
// lossless one to the exact input, the quant one to what the current encoder reconstructs
// (the quantiser is unchanged; only the entropy-coded stream layout differs).
TEST(Compat, Coder1BlobsStillDecode) {
  KvLayout l;
  l.num_layers = 1;
  l.num_kv_heads = 2;
  l.head_dim = 64;
  l.tokens_per_block = 16;
  l.dtype = DType::kFloat16;
  const std::vector<uint8_t> input = GenerateSyntheticKv(l, 1, SyntheticKvParams{});
  std::vector<uint8_t> out(l.BlockBytes());
  ASSERT_TRUE(Decode(std::span<const uint8_t>(kLosslessV1, sizeof(kLosslessV1)), out).ok());
  EXPECT_EQ(out, input);
  auto info = InspectBlob(std::span<const uint8_t>(kQuantV1, sizeof(kQuantV1)));
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->sections[0].coder, 1);
  ASSERT_TRUE(Decode(std::span<const uint8_t>(kQuantV1, sizeof(kQuantV1)), out).ok());
  auto fresh = Encode(l, *ParseCodecSpec("quant:k4v4:ol"), input);
  ASSERT_TRUE(fresh.ok());
  auto finfo = InspectBlob(*fresh);
  ASSERT_TRUE(finfo.ok());
  EXPECT_EQ(finfo->sections[0].coder, internal::kCoderShared);
  std::vector<uint8_t> out2(l.BlockBytes());
  ASSERT_TRUE(Decode(*fresh, out2).ok());
  EXPECT_EQ(out, out2);
  // An unknown coder id is a clean DataLoss (CRC recomputed so the parser reaches the section).
  std::vector<uint8_t> bad(kQuantV1, kQuantV1 + sizeof(kQuantV1));
  bad[64 + 5] = 7;
  const uint32_t crc = Crc32c(bad.data(), bad.size() - 4);
  std::memcpy(bad.data() + bad.size() - 4, &crc, 4);
  absl::Status st = Decode(bad, out);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
}

TEST(Spec, ParseAndPrint) {
  for (const char* s : {"raw", "lossless", "int4-g64", "int2-g128", "quant:k4v4",
                        "quant:k2v3:g32:had", "quant:k8v8:nodelta"}) {
    auto p = ParseCodecSpec(s);
    ASSERT_TRUE(p.ok()) << s << p.status();
    EXPECT_EQ(CodecSpecString(*p), s);
  }
  for (const char* s : {"", "int9-g64", "int4-g0", "quant:k9v4", "quant:zz", "zstd"})
    EXPECT_FALSE(ParseCodecSpec(s).ok()) << s;
}

TEST(Params, Validation) {
  const KvLayout l = Layout(2, 2, 48, 16);
  std::vector<uint8_t> d(l.BlockBytes());
  CodecParams p;
  p.mode = Mode::kQuant;
  p.hadamard = true;  // 48 is not a power of two
  EXPECT_FALSE(Encode(l, p, d).ok());
  p.hadamard = false;
  p.layer_key_bits = {4};  // one layer named out of two
  EXPECT_FALSE(Encode(l, p, d).ok());
  p.layer_key_bits.clear();
  p.key_bits = 1;
  EXPECT_FALSE(Encode(l, p, d).ok());
  p.key_bits = 4;
  std::vector<uint8_t> wrong(d.size() + 2);
  EXPECT_EQ(Encode(l, p, wrong).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Encode(l, p, d).ok());  // all zeros is fine
}

}  // namespace
}  // namespace strata::codec

namespace strata::codec {
namespace {

// Encoder and Decoder keep scratch between calls; reuse must not change any output.
TEST(Codec, ReusedEncoderAndDecoderMatchFreshOnes) {
  const KvLayout l = Layout(2, 4, 128, 256);
  auto data = GenerateSyntheticKv(l, 3);
  for (const char* spec : {"quant:k4v4", "quant:k3v3:had", "lossless", "int4-g64"}) {
    auto p = ParseCodecSpec(spec);
    ASSERT_TRUE(p.ok());
    Encoder enc;
    Decoder dec;
    for (uint32_t b = 0; b < 3; ++b) {
      std::span<const uint8_t> block(data.data() + b * l.BlockBytes(), l.BlockBytes());
      std::vector<uint8_t> blob;
      {
        auto st = enc.Encode(l, *p, block, &blob);
        ASSERT_TRUE(st.ok()) << st << spec;
      }
      auto fresh = Encode(l, *p, block);
      ASSERT_TRUE(fresh.ok());
      EXPECT_EQ(blob, *fresh) << spec << " block " << b;
      std::vector<uint8_t> a(l.BlockBytes()), c(l.BlockBytes());
      ASSERT_TRUE(dec.Decode(blob, a).ok());
      ASSERT_TRUE(Decode(blob, c).ok());
      EXPECT_EQ(a, c) << spec << " block " << b;
    }
  }
}

}  // namespace
}  // namespace strata::codec

namespace strata::codec {
namespace {

// With `ol`, each head's largest key channel (the generator's outliers are >16x the median
// energy) comes back bit-exact, and the logit-relevant error drops.
TEST(Quant, KeyOutlierChannelsAreExact) {
  const KvLayout l = Layout(2, 2, 128, 64);
  auto data = GenerateSyntheticKv(l, 1);
  auto p = ParseCodecSpec("quant:k3v4:ol");
  ASSERT_TRUE(p.ok());
  std::vector<uint8_t> out = RoundTrip(l, *p, data);
  ASSERT_EQ(out.size(), data.size());
  const size_t T = l.tokens_per_block, C = l.ValuesPerTokenPerTensor(), D = l.head_dim;
  const uint16_t* x = reinterpret_cast<const uint16_t*>(data.data());
  const uint16_t* y = reinterpret_cast<const uint16_t*>(out.data());
  for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
    const size_t base = size_t{layer} * 2 * T * C;  // K of this layer
    for (size_t h = 0; h < l.num_kv_heads; ++h) {
      size_t best = h * D;
      double best_ms = -1;
      for (size_t c = h * D; c < (h + 1) * D; ++c) {
        double ms = 0;
        for (size_t t = 0; t < T; ++t) {
          const double v = HalfToFloat(x[base + t * C + c]);
          ms += v * v;
        }
        if (ms > best_ms) {
          best_ms = ms;
          best = c;
        }
      }
      for (size_t t = 0; t < T; ++t)
        ASSERT_EQ(x[base + t * C + best], y[base + t * C + best]) << layer << " " << h << " " << t;
    }
  }
  // Not stored exactly without `ol`.
  auto q = ParseCodecSpec("quant:k3v4");
  ASSERT_TRUE(q.ok());
  std::vector<uint8_t> out2 = RoundTrip(l, *q, data);
  EXPECT_NE(out2, out);
}

}  // namespace
}  // namespace strata::codec
