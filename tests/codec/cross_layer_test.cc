// The cross-layer coder (codec/cross_layer.h) on KV whose layers share a hidden state, as a
// transformer's do: each layer's keys and values are projections of a state that every layer
// nudges, so the layer below predicts most of a layer.
#include "codec/cross_layer.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/calibration.h"
#include "codec/codec.h"
#include "codec/half.h"
#include "codec/internal/cross_layer_amx.h"
#include "codec/internal/pca_amx.h"
#include "codec/internal/sections.h"
#include "common/crc32c.h"
#include "tests/codec/test_layout.h"

namespace strata::codec {
namespace {

using test::Layout;

constexpr uint32_t kLayers = 4, kHeads = 2, kDim = 16, kTokens = 64, kHidden = 24;

// Blocks of consecutive positions: token t's state s_0 (random), s_l = s_{l-1} + 0.3 noise;
// K_l = Wk_l s_l (RoPE applied at the token's position with `theta` > 0), V_l = Wv_l s_l,
// each plus 0.05 noise; fp16.
std::vector<std::vector<uint8_t>> Blocks(const KvLayout& l, uint32_t count, uint32_t seed,
                                         double theta = 0, uint32_t first_block = 0) {
  std::mt19937 weights_rng(7);  // the same model for every call
  std::normal_distribution<float> nd;
  const size_t hd = size_t{l.num_kv_heads} * l.head_dim;
  std::vector<float> wk(size_t{l.num_layers} * hd * kHidden), wv(wk.size());
  for (float& x : wk) x = nd(weights_rng) / std::sqrt(float{kHidden});
  for (float& x : wv) x = nd(weights_rng) / std::sqrt(float{kHidden});
  std::mt19937 rng(seed);
  std::vector<std::vector<uint8_t>> out;
  for (uint32_t b = 0; b < count; ++b) {
    std::vector<uint8_t> block(l.BlockBytes());
    uint16_t* p = reinterpret_cast<uint16_t*>(block.data());
    for (uint32_t t = 0; t < l.tokens_per_block; ++t) {
      std::vector<float> s(kHidden);
      for (float& x : s) x = nd(rng);
      for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
        if (layer > 0)
          for (float& x : s) x += 0.3f * nd(rng);
        for (uint32_t tensor = 0; tensor < 2; ++tensor) {
          const float* w = (tensor == 0 ? wk : wv).data() + size_t{layer} * hd * kHidden;
          std::vector<float> row(hd);
          for (size_t i = 0; i < hd; ++i) {
            float acc = 0.05f * nd(rng);
            for (size_t j = 0; j < kHidden; ++j) acc += w[i * kHidden + j] * s[j];
            row[i] = acc;
          }
          if (tensor == 0 && theta > 0) {
            const double pos = static_cast<double>(first_block + b) * l.tokens_per_block + t;
            for (size_t h = 0; h < l.num_kv_heads; ++h)
              for (size_t j = 0; j < l.head_dim / 2; ++j) {
                const double a = pos * std::pow(theta, -2.0 * j / l.head_dim);
                float& x = row[h * l.head_dim + j];
                float& y = row[h * l.head_dim + j + l.head_dim / 2];
                const float x0 = x, y0 = y;
                x = static_cast<float>(x0 * std::cos(a) - y0 * std::sin(a));
                y = static_cast<float>(y0 * std::cos(a) + x0 * std::sin(a));
              }
          }
          uint16_t* dst = p + ((size_t{layer} * 2 + tensor) * l.tokens_per_block + t) * hd;
          for (size_t i = 0; i < hd; ++i) dst[i] = FloatToHalf(row[i]);
        }
      }
    }
    out.push_back(std::move(block));
  }
  return out;
}

std::vector<std::span<const uint8_t>> Spans(const std::vector<std::vector<uint8_t>>& blocks) {
  return {blocks.begin(), blocks.end()};
}

// Squared error over the squared values, over values [begin, end) of two fp16 blocks.
double RelError(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, size_t begin,
                size_t end) {
  const uint16_t* x = reinterpret_cast<const uint16_t*>(a.data());
  const uint16_t* y = reinterpret_cast<const uint16_t*>(b.data());
  double err = 0, energy = 0;
  for (size_t i = begin; i < end; ++i) {
    const double d = double{HalfToFloat(x[i])} - HalfToFloat(y[i]);
    err += d * d;
    energy += double{HalfToFloat(x[i])} * HalfToFloat(x[i]);
  }
  return err / energy;
}

constexpr size_t kTensorValues = size_t{kTokens} * kHeads * kDim;

double RelError(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  return RelError(a, b, 0, a.size() / 2);
}
double LayerRelError(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, size_t layer) {
  return RelError(a, b, layer * 2 * kTensorValues, (layer + 1) * 2 * kTensorValues);
}

struct Coded {
  std::vector<uint8_t> payload, decoded;
  double bits_per_value = 0;
};

// Encodes and decodes; the decode must be exactly what the encoder reconstructed (its closed
// loop predicted every layer from what the decoder has).
Coded RoundTrip(const CrossLayerCalibration& cal, const KvLayout& l,
                const std::vector<uint8_t>& block, uint64_t first_position) {
  Coded c;
  std::vector<uint8_t> reconstruction(block.size(), 0xCD);
  EXPECT_TRUE(EncodeCrossLayer(cal, l, block, first_position, &c.payload, reconstruction).ok());
  c.decoded.assign(block.size(), 0xAB);
  const absl::Status s = DecodeCrossLayer(cal, l, c.payload, first_position, c.decoded);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(c.decoded == reconstruction) << "the decoder's block is not the encoder's";
  c.bits_per_value = 8.0 * c.payload.size() / (block.size() / 2);
  return c;
}

TEST(CrossLayer, RoundTripsWithinTheStepAndKeepsTheSinkExact) {
  const KvLayout l = Layout(kLayers, kHeads, kDim, kTokens);
  const auto calib = Blocks(l, 8, 1);
  const auto eval = Blocks(l, 2, 2);
  CrossLayerOptions o;
  for (double step : {0.05, 0.5}) {
    o.step = step;
    auto cal = CalibrateCrossLayer(l, Spans(calib), o);
    ASSERT_TRUE(cal.ok()) << cal.status();
    const Coded first = RoundTrip(*cal, l, eval[0], 0);
    const Coded later = RoundTrip(*cal, l, eval[1], kTokens);
    // Uniform quantisation noise, step^2 / 12 per coordinate in units of each head's rms (plus
    // the coordinates left out and fp16's rounding): the relative error follows the step.
    for (const Coded* c : {&first, &later}) {
      const double rel = RelError(c == &first ? eval[0] : eval[1], c->decoded);
      EXPECT_LT(rel, step * step / 12 * 1.5 + 1e-4) << "step " << step;
      EXPECT_GT(rel, step * step / 12 * 0.05) << "step " << step;
    }
    // The first token of a sequence (the attention sink) decodes as given in every layer, in
    // both tensors; a later block's first token does not.
    const size_t row = size_t{kHeads} * kDim * 2;
    bool later_exact = true;
    for (uint32_t layer = 0; layer < kLayers; ++layer)
      for (uint32_t tensor = 0; tensor < 2; ++tensor) {
        const size_t at = (size_t{layer} * 2 + tensor) * kTokens * row;
        EXPECT_EQ(0, std::memcmp(first.decoded.data() + at, eval[0].data() + at, row));
        later_exact =
            later_exact && std::memcmp(later.decoded.data() + at, eval[1].data() + at, row) == 0;
      }
    EXPECT_FALSE(later_exact);
  }
}

TEST(CrossLayer, ThePredictionFromTheLayerBelowSavesBitsAndItsErrorDoesNotGrowWithDepth) {
  const KvLayout l = Layout(kLayers, kHeads, kDim, kTokens);
  const auto calib = Blocks(l, 8, 3);
  const auto eval = Blocks(l, 1, 4);
  CrossLayerOptions o;
  o.step = 0.3;
  auto predicted = CalibrateCrossLayer(l, Spans(calib), o);
  o.ridge = 1e9;  // a predictor of ~0: every layer coded on its own
  auto alone = CalibrateCrossLayer(l, Spans(calib), o);
  ASSERT_TRUE(predicted.ok() && alone.ok());
  const Coded p = RoundTrip(*predicted, l, eval[0], kTokens);
  const Coded a = RoundTrip(*alone, l, eval[0], kTokens);
  const double pe = RelError(eval[0], p.decoded), ae = RelError(eval[0], a.decoded);
  EXPECT_LT(p.bits_per_value, 0.8 * a.bits_per_value) << pe << " vs " << ae;
  EXPECT_LT(pe, 1.5 * ae);
  // Closed loop: each layer is predicted from the decoded layer below, as the decoder has it,
  // so the quantisation error of one layer does not pile up in the next.
  const double first = LayerRelError(eval[0], p.decoded, 0);
  for (size_t layer = 1; layer < kLayers; ++layer)
    EXPECT_LT(LayerRelError(eval[0], p.decoded, layer), 2.5 * first) << "layer " << layer;
}

TEST(CrossLayer, KeysWithRopeAreCodedAtTheirPositions) {
  const KvLayout l = Layout(kLayers, kHeads, kDim, kTokens);
  const double theta = 10000;
  const auto calib = Blocks(l, 8, 5, theta);
  const auto eval = Blocks(l, 1, 6, theta, /*first_block=*/3);
  CrossLayerOptions o;
  o.step = 0.3;
  o.rope_theta = theta;
  auto undone = CalibrateCrossLayer(l, Spans(calib), o);
  o.rope_theta = 0;
  auto as_given = CalibrateCrossLayer(l, Spans(calib), o);
  ASSERT_TRUE(undone.ok() && as_given.ok());
  const Coded u = RoundTrip(*undone, l, eval[0], 3 * kTokens);
  const Coded g = RoundTrip(*as_given, l, eval[0], 3 * kTokens);
  EXPECT_LT(RelError(eval[0], u.decoded), 0.3 * 0.3 / 12 * 1.5 + 1e-4);
  EXPECT_LT(u.bits_per_value, g.bits_per_value);
  // Decoded at another position, the keys come out rotated wrongly.
  std::vector<uint8_t> wrong(eval[0].size());
  ASSERT_TRUE(DecodeCrossLayer(*undone, l, u.payload, 0, wrong).ok());
  EXPECT_GT(RelError(eval[0], wrong), 10 * RelError(eval[0], u.decoded));
}

TEST(CrossLayer, ImportanceSpendsBitsWhereTheModelLooks) {
  const KvLayout l = Layout(kLayers, kHeads, kDim, kTokens);
  const auto calib = Blocks(l, 8, 7);
  const auto eval = Blocks(l, 1, 8);
  CrossLayerOptions o;
  o.step = 0.3;
  auto plain = CalibrateCrossLayer(l, Spans(calib), o);
  o.importance.assign(kLayers * 2, 1.0);
  o.importance[2 * 2 + 1] = 16;  // layer 2's values: a quarter of the error
  auto steered = CalibrateCrossLayer(l, Spans(calib), o);
  ASSERT_TRUE(plain.ok() && steered.ok());
  const Coded p = RoundTrip(*plain, l, eval[0], kTokens);
  const Coded s = RoundTrip(*steered, l, eval[0], kTokens);
  EXPECT_GT(s.bits_per_value, p.bits_per_value);
  // Layer 2's values alone: the importance lowers their error.
  auto values_error = [&](const Coded& c) {
    return RelError(eval[0], c.decoded, (2 * 2 + 1) * kTensorValues, (2 * 2 + 2) * kTensorValues);
  };
  EXPECT_LT(values_error(s), 0.5 * values_error(p));
}

// Caps the product kernels for a scope (tests that fail midway leave the default behind).
struct KernelCap {
  explicit KernelCap(internal::XlKernel k) { internal::SetXlKernelCapForTest(k); }
  ~KernelCap() { internal::SetXlKernelCapForTest(internal::XlKernel::kAmx); }
};

// Where the CPU runs a bf16 product kernel (AMX tiles, AVX512-BF16 or AVX2 FMAs), the products
// take it; the float kernels decode the same payload to within bf16's rounding, which does not
// grow through the layers, and their own payloads round-trip as the products' do.
TEST(CrossLayer, ProductKernelsAndFloatKernelsAgree) {
  if (!internal::XlProductsAvailable()) GTEST_SKIP() << "no bf16 product kernel here";
  const KvLayout l = Layout(kLayers, kHeads, kDim, kTokens);
  const auto calib = Blocks(l, 8, 12);
  const auto eval = Blocks(l, 1, 13);
  CrossLayerOptions o;
  o.step = 0.3;
  auto cal = CalibrateCrossLayer(l, Spans(calib), o);
  ASSERT_TRUE(cal.ok());
  ASSERT_NE(cal->tiles, nullptr);
  const uint64_t before = internal::XlTileProducts();
  const Coded tiles = RoundTrip(*cal, l, eval[0], kTokens);
  EXPECT_GE(internal::XlTileProducts() - before, 3u * kLayers - 1);
  std::vector<uint8_t> by_float(eval[0].size());
  absl::Status s;
  Coded floats;
  {
    KernelCap no_products(internal::XlKernel::kFloat);
    const uint64_t after = internal::XlTileProducts();
    s = DecodeCrossLayer(*cal, l, tiles.payload, kTokens, by_float);
    floats = RoundTrip(*cal, l, eval[0], kTokens);
    EXPECT_EQ(internal::XlTileProducts(), after);
  }
  ASSERT_TRUE(s.ok()) << s;
  const double noise = RelError(eval[0], tiles.decoded);
  EXPECT_LT(noise, 0.3 * 0.3 / 12 * 1.5 + 1e-4);
  EXPECT_LT(RelError(eval[0], floats.decoded), 0.3 * 0.3 / 12 * 1.5 + 1e-4);
  EXPECT_NE(tiles.decoded, by_float);  // bf16 operands: not the float kernels' bits ...
  for (size_t layer = 0; layer < kLayers; ++layer)  // ... but far closer than the step
    EXPECT_LT(LayerRelError(tiles.decoded, by_float, layer), 0.02 * noise) << layer;
}

// The product kernels this CPU runs (within STRATA_CODEC_XL_KERNEL's cap), best first.
std::vector<internal::XlKernel> SupportedXlKernels() {
  std::vector<internal::XlKernel> out;
  for (internal::XlKernel k : {internal::XlKernel::kAmx, internal::XlKernel::kAvx512Bf16,
                               internal::XlKernel::kFma}) {
    KernelCap cap(k);
    if (internal::XlKernelInUse() == k) out.push_back(k);
  }
  return out;
}

// A payload coded on one kernel decodes on every other within float rounding: the kernels share
// the bf16 operands and differ only in the order their float sums round.
TEST(CrossLayer, EveryProductKernelDecodesTheOthersPayloads) {
  const std::vector<internal::XlKernel> kernels = SupportedXlKernels();
  if (kernels.empty()) GTEST_SKIP() << "no bf16 product kernel here";
  const KvLayout l = Layout(kLayers, kHeads, kDim, kTokens);
  const auto calib = Blocks(l, 8, 21);
  const auto eval = Blocks(l, 1, 22, 10000);
  CrossLayerOptions o;
  o.step = 0.3;
  o.rope_theta = 10000;
  auto cal = CalibrateCrossLayer(l, Spans(calib), o);
  ASSERT_TRUE(cal.ok());
  ASSERT_NE(cal->tiles, nullptr);
  KernelCap cap(kernels.front());
  for (internal::XlKernel enc : kernels) {
    internal::SetXlKernelCapForTest(enc);
    ASSERT_EQ(internal::XlKernelInUse(), enc);
    const uint64_t before = internal::XlTileProducts();
    const Coded c = RoundTrip(*cal, l, eval[0], 0);
    EXPECT_GE(internal::XlTileProducts() - before, 3u * kLayers - 1);
    const double noise = RelError(eval[0], c.decoded);
    EXPECT_LT(noise, 0.3 * 0.3 / 12 * 1.5 + 1e-4) << static_cast<int>(enc);
    for (internal::XlKernel dec : kernels) {
      internal::SetXlKernelCapForTest(dec);
      std::vector<uint8_t> out(eval[0].size(), 0xAB);
      ASSERT_TRUE(DecodeCrossLayer(*cal, l, c.payload, 0, out).ok());
      if (dec == enc) {
        EXPECT_EQ(out, c.decoded) << static_cast<int>(enc) << " -> " << static_cast<int>(dec);
        continue;
      }
      for (size_t layer = 0; layer < kLayers; ++layer)
        EXPECT_LT(LayerRelError(c.decoded, out, layer), 1e-3 * noise)
            << static_cast<int>(enc) << " -> " << static_cast<int>(dec) << " layer " << layer;
    }
  }
}

// Each kernel's C (+)= A B against a double sum of the same bf16 operands, within float's
// rounding of a sum of that many products; the FMA kernel bit for bit as std::fma in pair order
// (even row, then odd); nothing written beside C's columns.
TEST(CrossLayer, ProductKernelsMatchADoubleReference) {
  const std::vector<internal::XlKernel> kernels = SupportedXlKernels();
  if (kernels.empty()) GTEST_SKIP() << "no bf16 product kernel here";
  KernelCap cap(kernels.front());
  std::mt19937 rng(31);
  std::normal_distribution<float> nd;
  struct Shape {
    size_t tokens, rows, cols;
  };
  for (const Shape sh : {Shape{32, 32, 32}, Shape{64, 64, 96}, Shape{32, 344, 512},
                         Shape{64, 512, 344}, Shape{32, 30, 20}}) {
    std::vector<float> m(sh.rows * sh.cols), row_scale(sh.rows);
    for (float& x : m) x = nd(rng);
    for (float& x : row_scale) x = std::exp(nd(rng));
    internal::XlPairs b;
    internal::BuildXlPairs(m.data(), sh.rows, sh.cols, row_scale.data(), &b);
    const size_t lda = b.rows_pad + 32, ldc = b.cols_pad + 16;
    std::vector<uint16_t> a(sh.tokens * lda, 0x7FC0);  // NaN outside the rows: never read
    std::vector<float> af(sh.rows);
    for (size_t t = 0; t < sh.tokens; ++t) {
      for (float& x : af) x = nd(rng) * 4;
      internal::XlToBf16(af.data(), sh.rows, b.rows_pad, a.data() + t * lda);
    }
    auto bw = [&](size_t i, size_t j) {
      return BF16ToFloat(b.words[(i / 2 * b.cols_pad + j) * 2 + i % 2]);
    };
    std::vector<float> c0((sh.tokens + 1) * ldc);
    for (float& x : c0) x = nd(rng);
    for (internal::XlKernel k : kernels)
      for (bool accumulate : {false, true}) {
        internal::SetXlKernelCapForTest(k);
        ASSERT_EQ(internal::XlKernelInUse(), k);
        std::vector<float> c = c0;
        internal::XlProduct(a.data(), lda, b, sh.tokens, accumulate, c.data(), ldc);
        for (size_t t = 0; t <= sh.tokens; ++t)  // and a row past the tokens
          for (size_t j = 0; j < ldc; ++j) {
            const float got = c[t * ldc + j];
            if (j >= b.cols_pad || t == sh.tokens) {
              ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(c0[t * ldc + j]));
              continue;
            }
            double ref = accumulate ? c0[t * ldc + j] : 0.0, mag = std::abs(ref);
            float fma = accumulate ? c0[t * ldc + j] : 0.0f;
            for (size_t i = 0; i < b.rows_pad; ++i) {
              const float x = BF16ToFloat(a[t * lda + i]), y = bw(i, j);
              ref += double{x} * y;
              mag += std::abs(double{x} * y);
              fma = std::fma(x, y, fma);
            }
            ASSERT_LE(std::abs(got - ref), (b.rows_pad + 1) * 0x1p-24 * mag + 1e-30)
                << static_cast<int>(k) << " " << sh.tokens << "x" << sh.rows << "x" << sh.cols
                << " t " << t << " j " << j;
            if (k == internal::XlKernel::kFma) {
              ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(fma))
                  << sh.rows << "x" << sh.cols << " t " << t << " j " << j;
            }
          }
      }
  }
}

// CpuKernels names the product kernel in use, and "float" where the cap leaves none.
TEST(CrossLayer, CpuKernelsNameTheProductKernelInUse) {
  auto xl = [] {
    for (const CpuKernel& k : CpuKernels())
      if (k.part == "xl_products") return k.kernel;
    return std::string("missing");
  };
  const std::pair<internal::XlKernel, const char*> names[] = {
      {internal::XlKernel::kAmx, "amx-bf16"},
      {internal::XlKernel::kAvx512Bf16, "avx512-bf16"},
      {internal::XlKernel::kFma, "avx2-fma"}};
  for (const auto& [kernel, name] : names) {
    KernelCap cap(kernel);
    if (internal::XlKernelInUse() == kernel) {
      EXPECT_EQ(xl(), name);
    }
  }
  {
    KernelCap cap(internal::XlKernel::kFloat);
    EXPECT_EQ(xl(), "float");
  }
  const std::string line = DescribeCpuKernels();
  for (const char* part : {"rans ", "pca_decode ", "pca_encode ", "xl_products "})
    EXPECT_NE(line.find(part), std::string::npos) << line;
}

// The vector conversions round as FloatToBF16 (nearest even, NaNs quiet), past the vectors'
// ends too, and zero the padding; AVX512-BF16's reads denormals as zero, so those are left out
// where it runs.
TEST(CrossLayer, Bf16ConversionsRoundAsTheScalarOne) {
  std::mt19937 rng(41);
  std::vector<float> src;
  for (uint32_t bits : {0x3F808000u, 0x3F818000u, 0x3F80FFFFu, 0x7F800000u, 0xFF800000u,
                        0x7FC00000u, 0x7F800001u, 0xFFFFFFFFu, 0x80000000u, 0x7F7FFFFFu,
                        0x00000001u, 0x807FFFFFu})
    src.push_back(std::bit_cast<float>(bits));
  while (src.size() < 77) src.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  for (bool avx2 : {false, true}) {
    if (avx2 && !internal::XlFmaProductsSupported()) continue;
    const bool daz = !avx2 && internal::XlBf16ProductsSupported();
    for (size_t n : {size_t{0}, size_t{7}, size_t{16}, size_t{77}}) {
      std::vector<uint16_t> out(n + 19, 0x1234);
      (avx2 ? internal::XlToBf16Avx2 : internal::XlToBf16Vector)(src.data(), n, n + 16,
                                                                  out.data());
      for (size_t i = 0; i < n; ++i) {
        const uint32_t x = std::bit_cast<uint32_t>(src[i]);
        if (daz && (x & 0x7F800000u) == 0 && (x & 0x7FFFFFu) != 0) continue;
        EXPECT_EQ(out[i], FloatToBF16(src[i])) << avx2 << " " << std::hex << x;
      }
      for (size_t i = n; i < n + 16; ++i) EXPECT_EQ(out[i], 0) << i;
      for (size_t i = n + 16; i < n + 19; ++i) EXPECT_EQ(out[i], 0x1234) << i;
    }
  }
}

// The calibration as an artefact: parsed back it decodes the same payload to the same bytes and
// serializes to the same bytes (so the same id); anything malformed is DataLoss.
TEST(CrossLayer, CalibrationSerializesAndRefusesCorruptArtefacts) {
  const KvLayout l = Layout(kLayers, kHeads, kDim, kTokens);
  const auto calib = Blocks(l, 6, 14);
  const auto eval = Blocks(l, 1, 15);
  CrossLayerOptions o;
  o.step = 0.3;
  o.rope_theta = 10000;
  auto cal = CalibrateCrossLayer(l, Spans(calib), o);
  ASSERT_TRUE(cal.ok());
  const std::vector<uint8_t> bytes = cal->Serialize();
  auto back = CrossLayerCalibration::Parse(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->Serialize(), bytes);
  EXPECT_EQ(back->Id(), cal->Id());
  EXPECT_EQ(back->tiles != nullptr, cal->tiles != nullptr);
  EXPECT_EQ(back->version, 1u);
  EXPECT_FLOAT_EQ(back->step, 0.3f);
  // The rate of the first samples, as their payloads measure it.
  std::vector<uint8_t> sample_payload;
  ASSERT_TRUE(EncodeCrossLayer(*cal, l, calib[0], 0, &sample_payload).ok());
  const double values = static_cast<double>(l.BlockBytes()) / 2;
  EXPECT_GT(back->sample_bits, 0.5 * 8.0 * sample_payload.size() / values);
  EXPECT_LT(back->sample_bits, 2.0 * 8.0 * sample_payload.size() / values);
  const Coded c = RoundTrip(*cal, l, eval[0], 0);
  std::vector<uint8_t> again(eval[0].size());
  ASSERT_TRUE(DecodeCrossLayer(*back, l, c.payload, 0, again).ok());
  EXPECT_EQ(again, c.decoded);
  // Another calibration, another id.
  o.step = 0.4;
  auto other = CalibrateCrossLayer(l, Spans(calib), o);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->Id(), cal->Id());
  // Truncations, flipped bits (the CRC), and well-formed artefacts with bad contents.
  for (size_t n : {size_t{0}, size_t{20}, bytes.size() / 2, bytes.size() - 1})
    EXPECT_EQ(CrossLayerCalibration::Parse(std::span(bytes).first(n)).status().code(),
              absl::StatusCode::kDataLoss);
  for (size_t at = 0; at < bytes.size(); at += 997) {
    std::vector<uint8_t> flipped = bytes;
    flipped[at] ^= 1;
    EXPECT_EQ(CrossLayerCalibration::Parse(flipped).status().code(), absl::StatusCode::kDataLoss);
  }
  auto with_crc = [](std::vector<uint8_t> b) {
    const uint32_t crc = Crc32c(b.data(), b.size() - 4);
    std::memcpy(b.data() + b.size() - 4, &crc, 4);
    return b;
  };
  auto refused = [&](std::vector<uint8_t> b, const char* what) {
    auto p = CrossLayerCalibration::Parse(with_crc(std::move(b)));
    EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss) << what;
    EXPECT_NE(p.status().message().find(what), std::string::npos) << p.status();
  };
  std::vector<uint8_t> b = bytes;
  b[4] = 1;  // format 1 (no version, step or sample rate)
  refused(b, "unknown format");
  b = bytes;
  const uint32_t huge = 1u << 30;
  std::memcpy(b.data() + 16, &huge, 4);  // kv heads
  refused(b, "geometry");
  b = bytes;
  const float nan = std::nanf("");
  std::memcpy(b.data() + 36, &nan, 4);  // the first scale
  refused(b, "scale");
  b = bytes;
  std::memcpy(b.data() + 28, &nan, 4);  // the step asked for
  refused(b, "step or sample bits");
  b = bytes;
  const float negative = -1;
  std::memcpy(b.data() + 32, &negative, 4);  // the samples' rate
  refused(b, "step or sample bits");
  b = bytes;
  const size_t step_at = bytes.size() - 8;  // the last layer's last step
  const float zero = 0;
  std::memcpy(b.data() + step_at, &zero, 4);
  refused(b, "step");
  b = bytes;
  b.insert(b.end() - 4, {0, 0, 0, 0});
  refused(b, "trailing");
}

// Large coordinates (a fine step and a token far from the calibration) take the float
// reconstruction on both sides; the decode stays the encoder's.
TEST(CrossLayer, LargeCoordinatesDecodeAsTheEncoderReconstructed) {
  const KvLayout l = Layout(kLayers, kHeads, kDim, kTokens);
  const auto calib = Blocks(l, 8, 16);
  auto eval = Blocks(l, 1, 17);
  uint16_t* p = reinterpret_cast<uint16_t*>(eval[0].data());
  const size_t row = size_t{kHeads} * kDim;
  for (uint32_t layer = 0; layer < kLayers; ++layer)  // token 5, ten times larger
    for (uint32_t tensor = 0; tensor < 2; ++tensor)
      for (size_t i = 0; i < row; ++i) {
        uint16_t& x = p[((size_t{layer} * 2 + tensor) * kTokens + 5) * row + i];
        x = FloatToHalf(10 * HalfToFloat(x));
      }
  CrossLayerOptions o;
  o.step = 0.02;
  auto cal = CalibrateCrossLayer(l, Spans(calib), o);
  ASSERT_TRUE(cal.ok());
  const Coded c = RoundTrip(*cal, l, eval[0], kTokens);
  EXPECT_LT(RelError(eval[0], c.decoded), 1e-3);
  uint16_t maxq = 0;  // layer 0's header, after the magic and the stream's offset
  std::memcpy(&maxq, c.payload.data() + 8, 2);
  EXPECT_GT(maxq, 256);
}

// One rANS stream for the block (SXL2) instead of one per layer (SXL1, 128 states each): the
// same symbols, so the same decoded block, in fewer bytes; both payloads decode, and a layer
// stream's states do not pass for the other format's.
TEST(CrossLayer, OneStreamPerBlockDecodesAsAStreamPerLayer) {
  const KvLayout l = Layout(kLayers, kHeads, kDim, kTokens);
  const auto calib = Blocks(l, 8, 20);
  const auto eval = Blocks(l, 2, 21);
  for (double step : {0.05, 0.7}) {
    CrossLayerOptions o;
    o.step = step;
    auto cal = CalibrateCrossLayer(l, Spans(calib), o);
    ASSERT_TRUE(cal.ok()) << cal.status();
    for (uint64_t first : {uint64_t{0}, uint64_t{kTokens}}) {
      const Coded shared = RoundTrip(*cal, l, eval[1], first);
      internal::XlWriteLayerStreamsForTesting(true);
      const Coded layered = RoundTrip(*cal, l, eval[1], first);
      internal::XlWriteLayerStreamsForTesting(false);
      EXPECT_EQ(std::string(shared.payload.begin(), shared.payload.begin() + 4), "SXL2");
      EXPECT_EQ(std::string(layered.payload.begin(), layered.payload.begin() + 4), "SXL1");
      EXPECT_EQ(shared.decoded, layered.decoded) << "step " << step;
      // Up to (kLayers - 1) * 128 states of 4 bytes saved (less what the states carried over
      // hold of the next layer's symbols, and the offset's 4 bytes).
      ASSERT_LT(shared.payload.size(), layered.payload.size());
      const size_t saved = layered.payload.size() - shared.payload.size();
      EXPECT_GT(saved, (kLayers - 1) * 256) << "step " << step;
      EXPECT_LE(saved, (kLayers - 1) * 512) << "step " << step;
      std::vector<uint8_t> relabelled = layered.payload;  // SXL1 read as SXL2
      std::memcpy(relabelled.data(), "SXL2", 4);
      const uint32_t crc = Crc32c(relabelled.data(), relabelled.size() - 4);
      std::memcpy(relabelled.data() + relabelled.size() - 4, &crc, 4);
      std::vector<uint8_t> out(l.BlockBytes());
      EXPECT_EQ(DecodeCrossLayer(*cal, l, relabelled, first, out).code(),
                absl::StatusCode::kDataLoss);
    }
  }
}

// Payloads whose CRC holds but whose fields do not: DataLoss, naming the fault.
TEST(CrossLayer, MalformedFieldsBehindAGoodCrcAreDataLoss) {
  const KvLayout l = Layout(kLayers, kHeads, kDim, kTokens);
  const auto calib = Blocks(l, 4, 18);
  auto cal = CalibrateCrossLayer(l, Spans(calib), CrossLayerOptions{});
  ASSERT_TRUE(cal.ok());
  std::vector<uint8_t> payload;
  ASSERT_TRUE(EncodeCrossLayer(*cal, l, Blocks(l, 1, 19)[0], 0, &payload).ok());
  auto decode = [&](std::vector<uint8_t> b) {
    const uint32_t crc = Crc32c(b.data(), b.size() - 4);
    std::memcpy(b.data() + b.size() - 4, &crc, 4);
    std::vector<uint8_t> out(l.BlockBytes());
    return DecodeCrossLayer(*cal, l, b, 0, out);
  };
  auto set16 = [&](size_t at, uint16_t v) {
    std::vector<uint8_t> b = payload;
    std::memcpy(b.data() + at, &v, 2);
    return b;
  };
  // Magic (4), the stream's offset (4); layer 0: maxq (2), exact count (2), token index (2), the
  // token's rows, tables; ... the stream.
  struct Case {
    std::vector<uint8_t> bytes;
    const char* what;
  };
  uint32_t stream_offset;
  std::memcpy(&stream_offset, payload.data() + 4, 4);
  std::vector<uint8_t> trailing = payload;  // a byte between the last layer and the stream
  trailing.insert(trailing.begin() + stream_offset, uint8_t{0});
  ++stream_offset;
  std::memcpy(trailing.data() + 4, &stream_offset, 4);
  std::vector<uint8_t> far = payload;
  const uint32_t past = static_cast<uint32_t>(payload.size());
  std::memcpy(far.data() + 4, &past, 4);
  const std::vector<Case> cases = {
      {set16(8, 3000), "header"},            // maxq beyond the alphabet
      {set16(10, kTokens + 1), "header"},    // more exact tokens than the block has
      {set16(12, kTokens), "exact tokens"},  // an exact token past the end
      {set16(12, 5), "exact token"},         // a coded token named exact: it has coordinates
      {trailing, "trailing"},
      {far, "stream offset"},
  };
  for (const Case& c : cases) {
    const absl::Status s = decode(c.bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << c.what;
    EXPECT_NE(s.message().find(c.what), std::string::npos) << s;
  }
  // A payload whose maxq is lowered decodes its symbols against another alphabet: the stream
  // or the symbols' checks refuse it, it never decodes.
  uint16_t maxq;
  std::memcpy(&maxq, payload.data() + 8, 2);
  ASSERT_GT(maxq, 0);
  EXPECT_EQ(decode(set16(8, maxq - 1)).code(), absl::StatusCode::kDataLoss);
  // Without the payload's own CRC (a caller that checked the blob's, or a fuzzer), a good
  // payload with a bad CRC decodes and the fields behind it are still checked.
  std::vector<uint8_t> bad_crc = payload;
  bad_crc.back() ^= 1;
  std::vector<uint8_t> out(l.BlockBytes()), want(l.BlockBytes());
  ASSERT_TRUE(DecodeCrossLayer(*cal, l, payload, 0, want).ok());
  EXPECT_EQ(DecodeCrossLayer(*cal, l, bad_crc, 0, out).code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(DecodeCrossLayer(*cal, l, bad_crc, 0, out, 1.0f, /*verify_crc=*/false).ok());
  EXPECT_EQ(out, want);
  for (const Case& c : cases)
    EXPECT_EQ(DecodeCrossLayer(*cal, l, c.bytes, 0, out, 1.0f, false).code(),
              absl::StatusCode::kDataLoss)
        << c.what;
  // Blocks of fp8 cannot be coded.
  const KvLayout fp8 = Layout(kLayers, kHeads, kDim, kTokens, DType::kFloat8E4M3);
  EXPECT_EQ(cal->Matches(fp8).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CrossLayer, RefusesWhatItCannotCodeAndDetectsCorruption) {
  const KvLayout l = Layout(kLayers, kHeads, kDim, kTokens);
  const auto calib = Blocks(l, 4, 9);
  CrossLayerOptions o;
  auto cal = CalibrateCrossLayer(l, Spans(calib), o);
  ASSERT_TRUE(cal.ok());
  // Options and samples.
  CrossLayerOptions bad = o;
  bad.step = 0;
  EXPECT_EQ(CalibrateCrossLayer(l, Spans(calib), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = o;
  bad.importance = {1, 2, 3};
  EXPECT_EQ(CalibrateCrossLayer(l, Spans(calib), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CalibrateCrossLayer(l, {}, o).status().code(), absl::StatusCode::kInvalidArgument);
  const KvLayout odd = Layout(kLayers, kHeads, kDim, 40);
  EXPECT_EQ(CalibrateCrossLayer(odd, Spans(Blocks(odd, 2, 1)), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Blocks of another geometry, non-finite values, the wrong output size.
  std::vector<uint8_t> payload;
  const KvLayout other = Layout(kLayers, kHeads, 2 * kDim, kTokens);
  EXPECT_EQ(EncodeCrossLayer(*cal, other, Blocks(other, 1, 1)[0], 0, &payload).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> block = Blocks(l, 1, 10)[0];
  std::vector<uint8_t> nan = block;
  const uint16_t half_nan = 0x7E00;
  std::memcpy(nan.data() + 100, &half_nan, 2);
  EXPECT_EQ(EncodeCrossLayer(*cal, l, nan, 0, &payload).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(payload.empty());
  std::vector<std::vector<uint8_t>> nan_samples = {nan};
  EXPECT_EQ(CalibrateCrossLayer(l, Spans(nan_samples), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(EncodeCrossLayer(*cal, l, block, 0, &payload).ok());
  std::vector<uint8_t> out(block.size());
  std::vector<uint8_t> short_out(block.size() - 2);
  EXPECT_EQ(DecodeCrossLayer(*cal, l, payload, 0, short_out).code(),
            absl::StatusCode::kInvalidArgument);
  // Every truncation and a flipped bit anywhere: DataLoss, never a wrong decode.
  for (size_t n : {size_t{0}, size_t{7}, payload.size() / 2, payload.size() - 1})
    EXPECT_EQ(DecodeCrossLayer(*cal, l, std::span(payload).first(n), 0, out).code(),
              absl::StatusCode::kDataLoss)
        << n;
  for (size_t at = 0; at < payload.size(); at += 37) {
    std::vector<uint8_t> flipped = payload;
    flipped[at] ^= 0x10;
    EXPECT_EQ(DecodeCrossLayer(*cal, l, flipped, 0, out).code(), absl::StatusCode::kDataLoss) << at;
  }
}

// Codec mode xl: blobs name their cross-layer calibration by id, as pca blobs do, and decode to
// exactly what the payload coder reconstructs.
TEST(CrossLayerBlob, RoundTripsThroughTheEncoderAndDecoder) {
  const KvLayout l = Layout(kLayers, kHeads, kDim, kTokens);
  const auto calib = Blocks(l, 6, 14, 10000);
  const auto eval = Blocks(l, 2, 15, 10000, 6);
  CrossLayerOptions o;
  o.step = 0.3;
  o.rope_theta = 10000;
  o.version = 3;
  auto made = CalibrateCrossLayer(l, Spans(calib), o);
  ASSERT_TRUE(made.ok()) << made.status();
  // The namespace artefact: Calibration::Parse takes the cross-layer serialization.
  const std::vector<uint8_t> artefact = made->Serialize();
  auto parsed = Calibration::Parse(artefact);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_NE(parsed->cross_layer, nullptr);
  EXPECT_EQ(parsed->ModeName(), "xl");
  EXPECT_EQ(parsed->Id(), made->Id());
  EXPECT_EQ(parsed->Serialize(), artefact);
  EXPECT_EQ(parsed->version, 3u);
  EXPECT_EQ(parsed->num_layers, kLayers);
  EXPECT_FLOAT_EQ(parsed->rope_theta, 10000.0f);
  EXPECT_FLOAT_EQ(parsed->sample_bits, made->sample_bits);
  EXPECT_TRUE(parsed->Validate().ok());
  EXPECT_TRUE(parsed->Matches(l).ok());
  KvLayout other = l;
  other.head_dim = 32;
  EXPECT_FALSE(parsed->Matches(other).ok());

  CalibrationSet set;
  const uint64_t id = set.Add(std::make_shared<const Calibration>(*parsed));
  auto spec = ParseCodecSpec(absl::StrCat("xl:", CalibrationIdString(id)));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->mode, Mode::kCrossLayer);
  Encoder enc;
  enc.set_calibrations(&set);
  Decoder dec;
  dec.set_calibrations(&set);
  for (uint32_t b = 0; b < eval.size(); ++b) {
    CodecParams p = *spec;
    p.first_position = (6 + b) * uint64_t{kTokens};
    std::vector<uint8_t> blob;
    ASSERT_TRUE(enc.Encode(l, p, eval[b], &blob).ok());
    std::vector<uint8_t> payload, want(eval[b].size());
    ASSERT_TRUE(EncodeCrossLayer(*made, l, eval[b], p.first_position, &payload, want).ok());
    EXPECT_LT(blob.size(), payload.size() + 128) << "a header, one section and a trailer";
    std::vector<uint8_t> got(eval[b].size());
    ASSERT_TRUE(dec.Decode(blob, got).ok());
    EXPECT_EQ(got, want) << "block " << b;
    EXPECT_LT(RelError(eval[b], got), 0.05);
    auto info = InspectBlob(blob);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->params.mode, Mode::kCrossLayer);
    EXPECT_EQ(info->params.calibration_id, id);
    EXPECT_EQ(info->params.first_position, p.first_position);
    // Without the calibration: NotFound, nothing written.
    Decoder bare;
    std::vector<uint8_t> untouched(eval[b].size(), 0xee);
    EXPECT_EQ(bare.Decode(blob, untouched).code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(untouched, std::vector<uint8_t>(eval[b].size(), 0xee));
    // Every flipped bit of the blob: DataLoss (the blob's CRC; behind it, the payload's own).
    for (size_t at = 0; at < blob.size(); at += 61) {
      std::vector<uint8_t> flipped = blob;
      flipped[at] ^= 4;
      EXPECT_EQ(dec.Decode(flipped, got).code(), absl::StatusCode::kDataLoss) << "byte " << at;
      if (at >= 64 + 24) {  // in the payload: its CRC, the blob's unchecked
        DecodeOptions unchecked;
        unchecked.verify_crc = false;
        EXPECT_EQ(dec.Decode(flipped, got, unchecked).code(), absl::StatusCode::kDataLoss)
            << "byte " << at;
      }
    }
  }
}

TEST(CrossLayerBlob, ACalibrationServesItsOwnModeOnly) {
  const KvLayout l = Layout(kLayers, kHeads, kDim, kTokens);
  const auto calib = Blocks(l, 6, 14);
  const auto eval = Blocks(l, 1, 15);
  CrossLayerOptions o;
  o.step = 0.3;
  auto xl = CalibrateCrossLayer(l, Spans(calib), o);
  ASSERT_TRUE(xl.ok()) << xl.status();
  CalibrateOptions po;
  po.bits_per_value = 2;
  auto pca = Calibrate(l, Spans(calib), po);
  ASSERT_TRUE(pca.ok()) << pca.status();
  CalibrationSet set;
  const uint64_t xl_id = set.Add(std::make_shared<const Calibration>(
      Calibration::OfCrossLayer(std::make_shared<const CrossLayerCalibration>(*xl))));
  const uint64_t pca_id = set.Add(std::make_shared<const Calibration>(*pca));
  Encoder enc;
  enc.set_calibrations(&set);
  std::vector<uint8_t> blob;
  CodecParams p;
  p.mode = Mode::kPca;
  p.calibration_id = xl_id;
  auto wrong = enc.Encode(l, p, eval[0], &blob);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument) << wrong;
  EXPECT_NE(wrong.message().find("is for mode xl"), std::string::npos) << wrong;
  p.mode = Mode::kCrossLayer;
  p.calibration_id = pca_id;
  EXPECT_EQ(enc.Encode(l, p, eval[0], &blob).code(), absl::StatusCode::kInvalidArgument);
  p.calibration_id = xl_id;
  p.first_position = 64;  // no RoPE: recorded all the same (a re-coder keeps no sink here)
  ASSERT_TRUE(enc.Encode(l, p, eval[0], &blob).ok());
  auto info = InspectBlob(blob);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->params.first_position, 64u);
  Decoder dec;
  dec.set_calibrations(&set);
  std::vector<uint8_t> out(eval[0].size());
  auto with_crc = [](std::vector<uint8_t> b) {
    const uint32_t crc = Crc32c(b.data(), b.size() - 4);
    std::memcpy(b.data() + b.size() - 4, &crc, 4);
    return b;
  };
  auto refused = [&](const std::vector<uint8_t>& b, const char* what) {
    auto st = dec.Decode(with_crc(b), out);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << what << ": " << st;
    EXPECT_NE(st.message().find(what), std::string::npos) << st;
  };
  // An xl blob whose header names the pca calibration (its CRC made good) is refused, and a pca
  // blob naming the xl calibration.
  std::vector<uint8_t> b = blob;
  std::memcpy(b.data() + 56, &pca_id, 8);
  refused(b, "which is for mode pca");
  std::vector<uint8_t> pca_blob;
  CodecParams pp;
  pp.mode = Mode::kPca;
  pp.calibration_id = pca_id;
  ASSERT_TRUE(enc.Encode(l, pp, eval[0], &pca_blob).ok());
  b = pca_blob;
  std::memcpy(b.data() + 56, &xl_id, 8);
  refused(b, "which is for mode xl");
  // The xl blob's one section: another type, a coder or another layer are refused.
  for (const auto& [at, value] : {std::pair<size_t, uint8_t>{64, 6}, {64 + 5, 1}, {64 + 2, 1}}) {
    b = blob;
    b[at] = value;
    refused(b, "one cross-layer section");
  }
}

// An artefact whose header claims more layers than its bytes can hold (every layer needs its
// mean, and all but the first a predictor) is refused before anything is allocated for them.
TEST(CrossLayer, AnArtefactClaimingMoreThanItHoldsIsRefusedAtOnce) {
  std::vector<uint8_t> b(8 << 20, 0);  // 8 MiB of zeros after the header
  auto put32 = [&](size_t at, uint32_t v) { std::memcpy(b.data() + at, &v, 4); };
  auto putf = [&](size_t at, float v) { std::memcpy(b.data() + at, &v, 4); };
  put32(0, kCrossLayerMagic);
  b[4] = kCrossLayerFormat;
  put32(8, 1);                // version
  put32(12, (8 << 20) / 8);   // layers: one scale pair each would fill the bytes
  put32(16, 1);               // kv heads
  put32(20, 1);               // head dim: width 2
  putf(28, 0.5f);             // step
  const uint32_t crc = Crc32c(b.data(), b.size() - 4);
  std::memcpy(b.data() + b.size() - 4, &crc, 4);
  auto p = CrossLayerCalibration::Parse(b);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss) << p.status();
  EXPECT_NE(p.status().message().find("geometry"), std::string::npos) << p.status();
  KvLayout l = Layout(2, 1, 1, 16);
  EXPECT_EQ(CrossLayerCalibration::MinSerializedBytes(l),
            44u + 2 * 2 * 4 + 2 * (4 + 2 * 4) + 1 * 2 * 2 * 4);
}

TEST(CrossLayerBlob, SpecsNameAStepOrACalibration) {
  auto s = ParseCodecSpec("xl:s0.7");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->mode, Mode::kCrossLayer);
  EXPECT_FLOAT_EQ(s->xl_step, 0.7f);
  EXPECT_EQ(s->calibration_id, 0u);
  EXPECT_EQ(CodecSpecString(*s), "xl:s0.7");
  const KvLayout l = Layout(kLayers, kHeads, kDim, kTokens);
  EXPECT_FALSE(s->Validate(l).ok()) << "no calibration id yet";
  auto id = ParseCodecSpec("xl:00000000000000ab");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->calibration_id, 0xabu);
  EXPECT_EQ(CodecSpecString(*id), "xl:00000000000000ab");
  EXPECT_TRUE(id->Validate(l).ok());
  for (const char* spec : {"xl:s0.7:r1.5", "xl:00000000000000ab:r2", "xl:r1.5"}) {
    auto capped = ParseCodecSpec(spec);
    ASSERT_TRUE(capped.ok()) << spec << ": " << capped.status();
    EXPECT_EQ(CodecSpecString(*capped), spec);
    EXPECT_GT(capped->rate_bits, 0);
  }
  CodecParams capped = *id;
  capped.error_target = 0.1f;
  EXPECT_FALSE(capped.Validate(l).ok()) << "an error target is quant's";
  for (const char* bad : {"xl", "xl:s0", "xl:s-1", "xl:s17", "xl:snan", "xl:b1.5", "xl:s0.7:r0",
                          "xl:s0.7:r17", "xl:s0.7:e0.1", "xl:r1:r1", "xl:0000000000000000",
                          "xl:00ab"})
    EXPECT_FALSE(ParseCodecSpec(bad).ok()) << bad;
}

// xl:<id>:rC: every block at most C bits per value, the calibration's steps scaled by the
// finest common code that fits (as pca's budget); the blob's section carries the code and the
// decode is what the coder reconstructed at that scale.
// An xl calibration (step 0.3, RoPE at theta 10000) of `calib` in a set, with an encoder and a
// decoder that find it, and params of mode xl that name it.
struct XlBudgetCodec {
  absl::StatusOr<CrossLayerCalibration> made;
  CalibrationSet set;
  Encoder enc;
  Decoder dec;
  CodecParams p;
  XlBudgetCodec(const KvLayout& l, const std::vector<std::vector<uint8_t>>& calib) {
    CrossLayerOptions o;
    o.step = 0.3;
    o.rope_theta = 10000;
    made = CalibrateCrossLayer(l, Spans(calib), o);
    if (!made.ok()) return;
    p.mode = Mode::kCrossLayer;
    p.calibration_id = set.Add(std::make_shared<const Calibration>(
        Calibration::OfCrossLayer(std::make_shared<const CrossLayerCalibration>(*made))));
    enc.set_calibrations(&set);
    dec.set_calibrations(&set);
  }
};

TEST(CrossLayerBlob, ABitBudgetHoldsForEveryBlock) {
  const KvLayout l = Layout(kLayers, kHeads, kDim, kTokens);
  const auto eval = Blocks(l, 3, 15, 10000, 6);
  XlBudgetCodec codec(l, Blocks(l, 6, 14, 10000));
  ASSERT_TRUE(codec.made.ok()) << codec.made.status();
  auto& [made, set, enc, dec, p] = codec;
  const double values = static_cast<double>(l.BlockBytes()) / 2;
  for (uint32_t b = 0; b < eval.size(); ++b) {
    p.first_position = (6 + b) * uint64_t{kTokens};
    p.rate_bits = 0;
    std::vector<uint8_t> plain, blob;
    ASSERT_TRUE(enc.Encode(l, p, eval[b], &plain).ok());
    std::vector<uint8_t> plain_out(eval[b].size()), out(eval[b].size());
    ASSERT_TRUE(dec.Decode(plain, plain_out).ok());
    const double plain_bits = 8.0 * plain.size() / values;
    for (double cap : {0.6 * plain_bits, 1.5 * plain_bits}) {
      p.rate_bits = static_cast<float>(cap);
      ASSERT_TRUE(enc.Encode(l, p, eval[b], &blob).ok());
      EXPECT_LE(8.0 * blob.size(), p.rate_bits * values) << "block " << b << " cap " << cap;
      auto info = InspectBlob(blob);
      ASSERT_TRUE(info.ok()) << info.status();
      const uint8_t code = info->sections[0].bits;
      ASSERT_TRUE(dec.Decode(blob, out).ok());
      std::vector<uint8_t> payload, want(eval[b].size());
      ASSERT_TRUE(EncodeCrossLayer(*made, l, eval[b], p.first_position, &payload, want,
                                   internal::PcaStepScale(code))
                      .ok());
      EXPECT_EQ(out, want) << "block " << b << " code " << int{code};
      if (cap < plain_bits) {  // coarser steps: fewer bits, more error
        EXPECT_GT(code, 128);
        EXPECT_GT(RelError(eval[b], out), RelError(eval[b], plain_out));
      } else {  // room to spare: finer steps than calibrated, so less error
        EXPECT_LT(code, 128);
        EXPECT_LT(RelError(eval[b], out), RelError(eval[b], plain_out));
        EXPECT_GT(8.0 * blob.size(), 0.8 * p.rate_bits * values) << "the budget is mostly used";
      }
    }
  }
  // A budget nothing meets: stored at the coarsest code, not refused.
  p.rate_bits = 0.01f;
  std::vector<uint8_t> blob;
  ASSERT_TRUE(enc.Encode(l, p, eval[0], &blob).ok());
  auto info = InspectBlob(blob);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->sections[0].bits, 255);
  std::vector<uint8_t> out(eval[0].size());
  EXPECT_TRUE(dec.Decode(blob, out).ok());
}

// With one budget over a sequence's blocks, the search starts where the last block ended and
// lets the size model (from each trial's residuals) pick the next code: at most 1.75 trial
// encodes per block once the encoder has seen a few, and still the finest code that fits.
TEST(CrossLayerBlob, ABitBudgetSearchTakesFewTrialsOnAlikeBlocks) {
  const KvLayout l = Layout(kLayers, kHeads, 64, 256);
  const auto eval = Blocks(l, 14, 22, 10000, 6);
  XlBudgetCodec codec(l, Blocks(l, 6, 21, 10000));
  ASSERT_TRUE(codec.made.ok()) << codec.made.status();
  auto& [made, set, enc, dec, p] = codec;
  const double values = static_cast<double>(l.BlockBytes()) / 2;
  p.first_position = 6 * uint64_t{l.tokens_per_block};
  std::vector<uint8_t> plain;
  ASSERT_TRUE(enc.Encode(l, p, eval[0], &plain).ok());
  p.rate_bits = static_cast<float>(0.9 * 8.0 * plain.size() / values);
  uint64_t late_trials = 0, late_blocks = 0;
  for (uint32_t b = 0; b < eval.size(); ++b) {
    SCOPED_TRACE(::testing::Message() << "block " << b);
    p.first_position = (6 + b) * uint64_t{l.tokens_per_block};
    std::vector<uint8_t> blob, finer_blob;
    const uint64_t trials_before = enc.budget_trial_encodes();
    ASSERT_TRUE(enc.Encode(l, p, eval[b], &blob).ok());
    const uint64_t trials = enc.budget_trial_encodes() - trials_before;
    ASSERT_GE(trials, 1u);  // counted, so the bound below means something
    EXPECT_LE(8.0 * blob.size(), p.rate_bits * values);
    auto info = InspectBlob(blob);
    ASSERT_TRUE(info.ok()) << info.status();
    const uint8_t code = info->sections[0].bits;
    ASSERT_GT(code, 1);
    CodecParams finer = p;
    finer.rate_bits = 0;
    finer.pca_step_code = static_cast<uint8_t>(code - 1);
    ASSERT_TRUE(enc.Encode(l, finer, eval[b], &finer_blob).ok());
    EXPECT_GT(8.0 * finer_blob.size(), p.rate_bits * values) << "code " << int{code};
    if (b >= 6) {
      late_trials += trials;
      ++late_blocks;
    }
  }
  EXPECT_LE(late_trials, late_blocks * 7 / 4) << late_trials << " trials for " << late_blocks;
}

}  // namespace
}  // namespace strata::codec
