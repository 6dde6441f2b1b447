// The pca sections against a plain scalar reference of the same definition: the encoder's
// coordinates (projection in float, d order; round to nearest even; exact tokens by relative
// error) and the decoder's reconstruction (here in double, coordinates in ascending order), on
// random calibrations and data. The decoder's output must equal the reference's within float
// rounding, which also checks that the encoder chose the same symbols.
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "codec/calibration.h"
#include "codec/codec.h"
#include "codec/half.h"
#include "codec/internal/kernels.h"
#include "codec/internal/pca_amx.h"
#include "codec/internal/pca_avx2.h"
#include "codec/internal/pca_avx512.h"
#include "gtest/gtest.h"
#include "hwy/targets.h"
#include "tests/codec/calibrated_synthetic.h"
#include "tests/codec/test_layout.h"

namespace strata::codec {
namespace {

using test::Layout;

struct Case {
  uint32_t layers, heads, dim, tokens;
  DType dtype = DType::kFloat16;
  KvKind kind = KvKind::kSeparateKV;
  float rope_theta = 0;
  uint64_t seed = 1;
  // Heads (index into Calibration::heads) whose coordinates are all dropped.
  std::vector<size_t> dropped_heads;
  // Token 3's scale: an outlier (exact token, coordinates beyond 256 steps), or not (1).
  double outlier = 20.0;
  // The block begins its sequence (position 0): its first token is kept exact.
  bool sequence_start = false;
  // The block's step scale code (CodecParams::pca_step_code; 0: the calibrated steps).
  uint8_t step_code = 0;
};

// Random orthonormal basis (Gram-Schmidt in double), decreasing variances, steps with about a
// quarter of the coordinates dropped.
Calibration RandomCalibration(const Case& c, std::mt19937& rng) {
  std::normal_distribution<double> g;
  std::uniform_real_distribution<double> u(0, 1);
  Calibration cal;
  cal.num_layers = c.layers;
  cal.num_kv_heads = c.heads;
  cal.head_dim = c.dim;
  cal.kind = c.kind;
  cal.rope_theta = c.rope_theta;
  cal.target_bits = 2;
  cal.sample_bits = 2;
  const size_t D = c.dim;
  cal.heads.resize(size_t{c.layers} * cal.TensorsPerLayer() * c.heads);
  for (size_t hi = 0; hi < cal.heads.size(); ++hi) {
    HeadTransform& ht = cal.heads[hi];
    ht.mean.resize(D);
    for (float& m : ht.mean) m = static_cast<float>(0.5 * g(rng));
    std::vector<double> b(D * D);
    for (size_t i = 0; i < D; ++i) {
      for (size_t j = 0; j < D; ++j) b[i * D + j] = g(rng);
      for (size_t p = 0; p < i; ++p) {
        double dot = 0;
        for (size_t j = 0; j < D; ++j) dot += b[i * D + j] * b[p * D + j];
        for (size_t j = 0; j < D; ++j) b[i * D + j] -= dot * b[p * D + j];
      }
      double norm = 0;
      for (size_t j = 0; j < D; ++j) norm += b[i * D + j] * b[i * D + j];
      for (size_t j = 0; j < D; ++j) b[i * D + j] /= std::sqrt(norm);
    }
    ht.basis.assign(b.begin(), b.end());
    ht.variance.resize(D);
    ht.step.resize(D);
    const bool dropped =
        std::find(c.dropped_heads.begin(), c.dropped_heads.end(), hi) != c.dropped_heads.end();
    for (size_t i = 0; i < D; ++i) {
      ht.variance[i] = static_cast<float>(4.0 * std::pow(0.93, static_cast<double>(i)));
      ht.step[i] = dropped || u(rng) < 0.25
                       ? 0.0f
                       : static_cast<float>(std::sqrt(ht.variance[i]) * (0.05 + 2 * u(rng)));
    }
  }
  EXPECT_TRUE(cal.Validate().ok()) << cal.Validate();
  return cal;
}

float Load(const uint8_t* p, DType dt) {
  if (dt == DType::kFloat32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dt == DType::kFloat16 ? HalfToFloat(h) : BF16ToFloat(h);
}

void Store(double x, uint8_t* p, DType dt) {
  const float f = static_cast<float>(x);
  if (dt == DType::kFloat32) {
    std::memcpy(p, &f, 4);
    return;
  }
  const uint16_t h = dt == DType::kFloat16 ? FloatToHalf(f) : FloatToBF16(f);
  std::memcpy(p, &h, 2);
}

// Block data near the calibration's subspaces, token 3 of every section an outlier.
std::vector<uint8_t> RandomBlock(const Case& c, const Calibration& cal, std::mt19937& rng) {
  const KvLayout layout = Layout(c.layers, c.heads, c.dim, c.tokens, c.dtype, c.kind);
  const size_t D = c.dim, es = DTypeBytes(c.dtype);
  std::normal_distribution<double> g;
  std::vector<uint8_t> block(layout.BlockBytes());
  size_t v = 0;
  for (uint32_t l = 0; l < c.layers; ++l)
    for (uint32_t t = 0; t < cal.TensorsPerLayer(); ++t)
      for (uint32_t tok = 0; tok < c.tokens; ++tok)
        for (uint32_t h = 0; h < c.heads; ++h) {
          const HeadTransform& ht = cal.At(l, t, h);
          std::vector<double> x(ht.mean.begin(), ht.mean.end());
          for (size_t i = 0; i < D; ++i) {
            const double coef = g(rng) * std::sqrt(ht.variance[i]) * (tok == 3 ? c.outlier : 1.0);
            for (size_t j = 0; j < D; ++j) x[j] += coef * ht.basis[i * D + j];
          }
          for (size_t j = 0; j < D; ++j, ++v) Store(x[j] + 0.01 * g(rng), &block[v * es], c.dtype);
        }
  return block;
}

// The scalar reference of one section [T][H][D]: the decoded values and, per value, a bound
// on float rounding (1e-5 of the summed magnitudes of its terms).
void ReferenceSection(const Calibration& cal, uint32_t layer, uint32_t tensor, const uint8_t* in,
                      DType dt, size_t T, uint64_t first_position, uint8_t step_code,
                      std::vector<double>* out, std::vector<double>* slack) {
  const size_t H = cal.num_kv_heads, D = cal.head_dim, es = DTypeBytes(dt);
  const bool fused = internal::FusesMultiplyAdds();
  // Every step times 2^((code - 128) / 32), rounded to float (code 0: times 1).
  const float scale =
      step_code == 0 ? 1.0f : static_cast<float>(std::exp2((step_code - 128) / 32.0));
  std::vector<float> x(T * H * D);
  for (size_t i = 0; i < x.size(); ++i) x[i] = Load(in + i * es, dt);
  const bool rope = tensor == 0 && cal.rope_theta > 0;
  const size_t half = D / 2;
  std::vector<float> cs(T * half), sn(T * half);
  if (rope) {
    for (size_t tok = 0; tok < T; ++tok)
      for (size_t j = 0; j < half; ++j) {
        const double inv = std::pow(static_cast<double>(cal.rope_theta), -2.0 * j / D);
        const double ang = static_cast<double>(first_position + tok) * inv;
        cs[tok * half + j] = static_cast<float>(std::cos(ang));
        sn[tok * half + j] = static_cast<float>(std::sin(ang));
      }
    for (size_t tok = 0; tok < T; ++tok)
      for (size_t h = 0; h < H; ++h) {
        float* v = &x[(tok * H + h) * D];
        for (size_t j = 0; j < half; ++j) {
          const float a = v[j], b = v[j + half], c = cs[tok * half + j], s = -sn[tok * half + j];
          v[j] = a * c - b * s;
          v[j + half] = b * c + a * s;
        }
      }
  }
  // Coordinates per (token, head, coordinate), and the per-token errors.
  // (Every head's centred energy first, then every head's quantisation terms.)
  std::vector<int32_t> q(T * H * D, 0);
  std::vector<double> norm2(T, 0.0), err2(T, 0.0);
  std::vector<float> centred(T * H * D);
  for (size_t tok = 0; tok < T; ++tok)
    for (size_t h = 0; h < H; ++h) {
      const HeadTransform& ht = cal.At(layer, tensor, static_cast<uint32_t>(h));
      const float* xv = &x[(tok * H + h) * D];
      float* xc = &centred[(tok * H + h) * D];
      for (size_t d = 0; d < D; ++d) {
        xc[d] = xv[d] - ht.mean[d];
        norm2[tok] += double{xv[d]} * xv[d];
        err2[tok] += double{xc[d]} * xc[d];
      }
    }
  for (size_t tok = 0; tok < T; ++tok)
    for (size_t h = 0; h < H; ++h) {
      const HeadTransform& ht = cal.At(layer, tensor, static_cast<uint32_t>(h));
      const float* xc = &centred[(tok * H + h) * D];
      float gain = 0;  // the head's error terms in float, added to the token's once
      for (size_t c = 0; c < D; ++c) {
        if (ht.step[c] == 0) continue;
        float y = 0;  // as the kernels add: fused where the target has FMA
        for (size_t d = 0; d < D; ++d)
          y = fused ? std::fma(xc[d], ht.basis[c * D + d], y) : y + xc[d] * ht.basis[c * D + d];
        const float step = ht.step[c] * scale;
        const float inv = 1.0f / step;
        const float qv = std::min(2047.0f, std::max(-2047.0f, std::nearbyint(y * inv)));
        const float e = y - qv * step;
        gain += e * e - y * y;
        q[(tok * H + h) * D + c] = static_cast<int32_t>(qv);
      }
      err2[tok] += gain;
    }
  std::vector<double> rel(T);
  for (size_t tok = 0; tok < T; ++tok) rel[tok] = std::max(err2[tok], 0.0) / std::max(norm2[tok], 1e-30);
  std::vector<double> sorted = rel;
  std::sort(sorted.begin(), sorted.end());
  const double limit = 8.0 * sorted[T / 2];
  std::vector<uint32_t> order(T);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return rel[a] > rel[b]; });
  std::vector<bool> exact(T, false);
  if (first_position == 0) exact[0] = true;  // the sequence's sink, whatever its error
  for (size_t i = 0; i < std::max<size_t>(1, T / 128) && rel[order[i]] > limit; ++i)
    exact[order[i]] = true;
  out->assign(T * H * D, 0.0);
  slack->assign(T * H * D, 0.0);
  for (size_t tok = 0; tok < T; ++tok)
    for (size_t h = 0; h < H; ++h) {
      const HeadTransform& ht = cal.At(layer, tensor, static_cast<uint32_t>(h));
      const size_t o = (tok * H + h) * D;
      if (exact[tok]) {
        for (size_t d = 0; d < D; ++d) (*out)[o + d] = Load(in + (o + d) * es, dt);
        continue;
      }
      std::vector<double> r(D), mag(D);
      for (size_t d = 0; d < D; ++d) {
        r[d] = ht.mean[d];
        mag[d] = std::abs(ht.mean[d]);
        for (size_t c = 0; c < D; ++c) {
          if (ht.step[c] == 0) continue;
          const double term =
              double{static_cast<float>(q[o + c]) * (ht.step[c] * scale)} * ht.basis[c * D + d];
          r[d] += term;
          mag[d] += std::abs(term);
        }
      }
      for (size_t j = 0; j < half && rope; ++j) {
        const double a = r[j], b = r[j + half], c = cs[tok * half + j], s = sn[tok * half + j];
        r[j] = a * c - b * s;
        r[j + half] = b * c + a * s;
        const double m = mag[j] + mag[j + half];
        mag[j] = mag[j + half] = m;
      }
      for (size_t d = 0; d < D; ++d) {
        (*out)[o + d] = r[d];
        (*slack)[o + d] = 1e-5 * mag[d];
      }
    }
}

// Runs `check` once per compiled SIMD target this machine supports, each with the kernels
// dispatched to that target.
template <typename F>
void OnEveryTarget(F&& check) {
  for (int64_t t = hwy::SupportedTargets() & HWY_TARGETS; t != 0; t &= t - 1) {
    const int64_t target = t & -t;
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    check();
  }
  hwy::SetSupportedTargetsForTest(0);
}

// The reconstruction's kernels to check: the float ones and, where the CPU has them, the AMX
// tiles (internal/pca_amx.h), each on every SIMD target. The encoder projects with the float
// kernels: their coordinates are the reference's (AmxEncoderMatchesTheFloatKernels covers the
// encoder's tiles).
template <typename F>
void OnEveryKernel(F&& check) {
  internal::SetPcaAmxEncodeEnabledForTest(false);
  internal::SetPcaVnniEnabledForTest(false);  // not the float sum: VnniDecoder... below
  for (const bool amx : {false, true}) {
    if (amx && !internal::PcaAmxSupported()) continue;
    internal::SetPcaAmxEnabledForTest(amx);
    SCOPED_TRACE(amx ? "AMX tiles" : "float kernels");
    OnEveryTarget(check);
  }
  internal::SetPcaAmxEnabledForTest(true);
  internal::SetPcaAmxEncodeEnabledForTest(true);
  internal::SetPcaVnniEnabledForTest(true);
}

void CheckAgainstReference(const Case& c) {
  SCOPED_TRACE(::testing::Message() << "D=" << c.dim << " H=" << c.heads << " T=" << c.tokens
                                    << " dtype=" << static_cast<int>(c.dtype) << " kind="
                                    << static_cast<int>(c.kind) << " theta=" << c.rope_theta);
  std::mt19937 rng(static_cast<uint32_t>(c.seed));
  auto cal = std::make_shared<const Calibration>(RandomCalibration(c, rng));
  const KvLayout layout = Layout(c.layers, c.heads, c.dim, c.tokens, c.dtype, c.kind);
  CalibrationSet set;
  CodecParams p;
  p.mode = Mode::kPca;
  p.calibration_id = set.Add(cal);
  p.first_position = c.sequence_start ? 0 : 3 * c.tokens;
  p.pca_step_code = c.step_code;
  Encoder enc;
  Decoder dec;
  enc.set_calibrations(&set);
  dec.set_calibrations(&set);
  for (int rep = 0; rep < 2; ++rep) {  // twice: scratch and plan reuse
    const std::vector<uint8_t> block = RandomBlock(c, *cal, rng);
    std::vector<uint8_t> blob, out(block.size());
    ASSERT_TRUE(enc.Encode(layout, p, block, &blob).ok());
    ASSERT_TRUE(dec.Decode(blob, out).ok());
    const size_t es = DTypeBytes(c.dtype);
    const size_t section = size_t{c.tokens} * c.heads * c.dim;
    size_t equal = 0, total = 0;
    for (uint32_t l = 0; l < c.layers; ++l)
      for (uint32_t t = 0; t < cal->TensorsPerLayer(); ++t) {
        const size_t base = (size_t{l} * cal->TensorsPerLayer() + t) * section;
        std::vector<double> ref, slack;
        ReferenceSection(*cal, l, t, block.data() + base * es, c.dtype, c.tokens,
                         p.first_position, c.step_code, &ref, &slack);
        for (size_t i = 0; i < section; ++i) {
          const float got = Load(out.data() + (base + i) * es, c.dtype);
          std::vector<uint8_t> rb(es);
          Store(ref[i], rb.data(), c.dtype);
          const double rounded = Load(rb.data(), c.dtype);
          // One unit in the last place of the output type, plus float rounding of the sums.
          const double ulp = c.dtype == DType::kFloat32 ? std::abs(rounded) * 0x1p-23
                             : c.dtype == DType::kFloat16 ? std::abs(rounded) * 0x1p-10 + 0x1p-24
                                                          : std::abs(rounded) * 0x1p-7;
          ASSERT_LE(std::abs(got - ref[i]), ulp + slack[i])
              << "layer " << l << " tensor " << t << " value " << i << " ref " << ref[i];
          equal += std::memcmp(out.data() + (base + i) * es, rb.data(), es) == 0;
          ++total;
        }
      }
    // 16-bit outputs: most values round to the same bits (fp32 shows the summation order).
    if (c.dtype != DType::kFloat32) {
      EXPECT_GT(equal, total * 9 / 10);
    }
  }
}

TEST(PcaSections, MatchScalarReferenceFp16Dim128) {
  OnEveryKernel([] {
    CheckAgainstReference(
        {2, 2, 128, 64, DType::kFloat16, KvKind::kSeparateKV, 0, 11, {}});
  });
}

TEST(PcaSections, MatchScalarReferenceDim64RopeAndDroppedHead) {
  // Head 1 of layer 0's keys and head 0 of layer 1's values drop every coordinate.
  OnEveryKernel([] {
    CheckAgainstReference(
        {2, 3, 64, 80, DType::kFloat16, KvKind::kSeparateKV, 10000, 12, {1, 9}});
  });
}

TEST(PcaSections, MatchScalarReferenceFp32Dim128Rope) {
  OnEveryKernel([] {
    CheckAgainstReference(
        {1, 2, 128, 48, DType::kFloat32, KvKind::kSeparateKV, 1e6f, 13, {}});
  });
}

TEST(PcaSections, MatchScalarReferenceMlaLatent) {
  OnEveryKernel([] {
    CheckAgainstReference(
        {2, 1, 72, 40, DType::kBFloat16, KvKind::kMlaLatent, 0, 14, {}});
  });
}

TEST(PcaSections, MatchScalarReferenceAtTheSequenceStart) {
  // Position 0 with RoPE: the sink, the outlier token 3 and any other token the error rule picks.
  OnEveryKernel([] {
    Case c{1, 2, 64, 256, DType::kFloat16, KvKind::kSeparateKV, 10000, 16, {}};
    c.sequence_start = true;
    CheckAgainstReference(c);
  });
}

TEST(PcaSections, MatchScalarReferenceWithAStepScale) {
  // Finer steps (code 100: x 2^-0.875) and coarser ones (code 200: x 2^2.25, and so more exact
  // tokens), at the sequence start with RoPE and later without.
  OnEveryKernel([] {
    Case fine{1, 2, 64, 96, DType::kFloat16, KvKind::kSeparateKV, 10000, 19, {}};
    fine.sequence_start = true;
    fine.step_code = 100;
    CheckAgainstReference(fine);
    Case coarse{2, 2, 128, 48, DType::kBFloat16, KvKind::kSeparateKV, 0, 20, {}};
    coarse.step_code = 200;
    CheckAgainstReference(coarse);
  });
}

TEST(PcaSections, MatchScalarReferenceOddSizes) {
  // head_dim not a multiple of any vector (scalar column tails), tokens not a multiple of 16,
  // and a whole section (layer 0's values) without coded coordinates.
  OnEveryKernel([] {
    CheckAgainstReference(
        {1, 2, 40, 21, DType::kFloat16, KvKind::kSeparateKV, 500, 15, {2, 3}});
  });
}

// fp16 head vectors of `dim` values that agree within a unit in the last place plus float
// rounding of sums that cancel: 1e-5 of the vector's norm (a misplaced term would be of the
// order of the norm itself).
void ExpectCloseFp16Rows(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                         size_t dim) {
  for (size_t row = 0; row < a.size() / 2; row += dim) {
    double norm2 = 0;
    for (size_t i = row; i < row + dim; ++i)
      norm2 += std::pow(Load(b.data() + 2 * i, DType::kFloat16), 2);
    for (size_t i = row; i < row + dim; ++i) {
      const float x = Load(a.data() + 2 * i, DType::kFloat16);
      const float y = Load(b.data() + 2 * i, DType::kFloat16);
      ASSERT_LE(std::abs(x - y),
                std::max(std::abs(x), std::abs(y)) * 0x1p-10 + 0x1p-24 + 1e-5 * std::sqrt(norm2))
          << "value " << i;
    }
  }
}

// The kernels' sums are fused multiply-adds where the target has FMA: targets that fuse write the
// same blob, and so do those that do not; the same blob decodes to values that agree up to float
// rounding on every target (AVX-512 decodes in token lanes, adding the mean last).
TEST(PcaSections, SameBlobAndOutputOnEveryTarget) {
  const Case c{2, 2, 64, 48, DType::kFloat16, KvKind::kSeparateKV, 10000, 16, {}};
  std::mt19937 rng(16);
  auto cal = std::make_shared<const Calibration>(RandomCalibration(c, rng));
  const std::vector<uint8_t> block = RandomBlock(c, *cal, rng);
  const KvLayout layout = Layout(c.layers, c.heads, c.dim, c.tokens, c.dtype, c.kind);
  CalibrationSet set;
  CodecParams p;
  p.mode = Mode::kPca;
  p.calibration_id = set.Add(cal);
  std::vector<std::vector<uint8_t>> blobs, outs;
  std::vector<bool> fused;
  internal::SetPcaVnniEnabledForTest(false);
  OnEveryTarget([&] {
    fused.push_back(internal::FusesMultiplyAdds());
    Encoder enc;
    Decoder dec;
    enc.set_calibrations(&set);
    dec.set_calibrations(&set);
    std::vector<uint8_t> blob, out(block.size());
    ASSERT_TRUE(enc.Encode(layout, p, block, &blob).ok());
    ASSERT_TRUE(dec.Decode(blob, out).ok());
    blobs.push_back(blob);
    outs.push_back(out);
  });
  internal::SetPcaVnniEnabledForTest(true);
  for (size_t i = 0; i < blobs.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (fused[i] == fused[j]) {
        EXPECT_EQ(blobs[i], blobs[j]) << i << " " << j;
      }
  for (size_t i = 1; i < outs.size(); ++i) {
    if (blobs[i] != blobs[0]) continue;  // a coordinate took another step
    SCOPED_TRACE(::testing::Message() << "target " << i);
    ExpectCloseFp16Rows(outs[i], outs[0], c.dim);
  }
}

// Without AMX, an AVX-512 core decodes every head of dim 64 and 128 in token lanes (their
// values are checked against the scalar reference by the MatchScalarReference tests, on the
// AVX-512 target); where Highway is pinned to another target the float kernels decode.
TEST(PcaSections, Avx512CoresDecodeInTokenLanes) {
  if (!internal::PcaLanesSupported()) GTEST_SKIP() << "this CPU offers no AVX-512";
  if (internal::PcaAmxSupported()) GTEST_SKIP() << "AMX tiles decode on this CPU";
  internal::SetPcaAmxEnabledForTest(false);
  internal::SetPcaVnniEnabledForTest(false);
  for (const uint32_t dim : {64u, 128u}) {
    const Case c{2, 2, dim, 40, DType::kFloat16, KvKind::kSeparateKV, 1e4f, 22, {}};
    std::mt19937 rng(22);
    auto cal = std::make_shared<const Calibration>(RandomCalibration(c, rng));
    const std::vector<uint8_t> block = RandomBlock(c, *cal, rng);
    CalibrationSet set;
    CodecParams p;
    p.mode = Mode::kPca;
    p.calibration_id = set.Add(cal);
    Encoder enc;
    Decoder dec;
    enc.set_calibrations(&set);
    dec.set_calibrations(&set);
    std::vector<uint8_t> blob, lanes(block.size()), floats(block.size());
    ASSERT_TRUE(enc.Encode(Layout(2, 2, dim, 40), p, block, &blob).ok());
    const uint64_t before = internal::PcaLanesHeadsDecoded();
    ASSERT_TRUE(dec.Decode(blob, lanes).ok());
    EXPECT_EQ(internal::PcaLanesHeadsDecoded() - before, 2u * 2 * 2) << "dim " << dim;
    hwy::SetSupportedTargetsForTest(HWY_AVX2);
    ASSERT_TRUE(dec.Decode(blob, floats).ok());
    hwy::SetSupportedTargetsForTest(0);
    EXPECT_EQ(internal::PcaLanesHeadsDecoded() - before, 2u * 2 * 2) << "dim " << dim;
    SCOPED_TRACE(::testing::Message() << "dim " << dim);
    ExpectCloseFp16Rows(lanes, floats, dim);
  }
  internal::SetPcaVnniEnabledForTest(true);
  internal::SetPcaAmxEnabledForTest(true);
}

// A random calibration and block of a Case, with an encoder and a decoder that know it.
struct PcaSetup {
  PcaSetup(const Case& c, uint64_t first_position) {
    std::mt19937 rng(static_cast<uint32_t>(c.seed));
    cal = std::make_shared<const Calibration>(RandomCalibration(c, rng));
    block = RandomBlock(c, *cal, rng);
    p.mode = Mode::kPca;
    p.calibration_id = set.Add(cal);
    p.first_position = first_position;
    enc.set_calibrations(&set);
    dec.set_calibrations(&set);
    layout = Layout(c.layers, c.heads, c.dim, c.tokens, c.dtype, c.kind);
  }
  PcaSetup(const PcaSetup&) = delete;
  PcaSetup& operator=(const PcaSetup&) = delete;
  std::shared_ptr<const Calibration> cal;
  std::vector<uint8_t> block;
  CalibrationSet set;
  CodecParams p;
  Encoder enc;
  Decoder dec;
  KvLayout layout;
};

// The AMX tiles decode a blob as the float kernels do, up to float rounding: with and without
// coordinates beyond 256 steps (the outlier token), keys with RoPE, fp16 and bf16.
TEST(PcaSections, AmxTilesMatchTheFloatKernels) {
  if (!internal::PcaAmxSupported()) GTEST_SKIP() << "this CPU (or kernel) offers no AMX tiles";
  for (const Case& c : {Case{2, 2, 128, 72, DType::kFloat16, KvKind::kSeparateKV, 1e6f, 17, {}},
                        Case{1, 3, 64, 40, DType::kBFloat16, KvKind::kSeparateKV, 1e4f, 18, {},
                             1.0}}) {
    SCOPED_TRACE(::testing::Message() << "D=" << c.dim << " outlier=" << c.outlier);
    PcaSetup s(c, 1000);
    const std::shared_ptr<const Calibration>& cal = s.cal;
    const std::vector<uint8_t>& block = s.block;
    Decoder& dec = s.dec;
    std::vector<uint8_t> blob, tiles(block.size()), floats(block.size());
    ASSERT_TRUE(s.enc.Encode(s.layout, s.p, block, &blob).ok());
    const uint64_t heads_before = internal::PcaAmxHeadsDecoded();
    ASSERT_TRUE(dec.Decode(blob, tiles).ok());
    EXPECT_EQ(internal::PcaAmxHeadsDecoded() - heads_before,
              uint64_t{c.layers} * cal->TensorsPerLayer() * c.heads);
    internal::SetPcaAmxEnabledForTest(false);
    internal::SetPcaVnniEnabledForTest(false);
    ASSERT_TRUE(dec.Decode(blob, floats).ok());
    internal::SetPcaVnniEnabledForTest(true);
    internal::SetPcaAmxEnabledForTest(true);
    // One unit in the last place, plus float rounding of sums that cancel: 1e-4 of the head
    // vector's norm (a misplaced term would be of the order of the norm itself).
    size_t equal = 0;
    const size_t values = block.size() / 2;
    for (size_t row = 0; row < values; row += c.dim) {
      double norm2 = 0;
      for (size_t i = row; i < row + c.dim; ++i)
        norm2 += std::pow(Load(floats.data() + 2 * i, c.dtype), 2);
      for (size_t i = row; i < row + c.dim; ++i) {
        const float a = Load(tiles.data() + 2 * i, c.dtype);
        const float b = Load(floats.data() + 2 * i, c.dtype);
        const double ulp = std::max(std::abs(a), std::abs(b)) *
                           (c.dtype == DType::kFloat16 ? 0x1p-10 : 0x1p-7) + 0x1p-24;
        ASSERT_LE(std::abs(a - b), ulp + 1e-4 * std::sqrt(norm2)) << "value " << i;
        equal += a == b;
      }
    }
    EXPECT_GT(equal, values * 95 / 100);
  }
}

// The encoder's projection on AMX tiles gives the float kernels' symbols but where a coordinate
// lies within float rounding of a rounding boundary: the decoded blocks agree but for those
// coordinates' values, and are as close to the input.
TEST(PcaSections, AmxEncoderMatchesTheFloatKernels) {
  if (!internal::PcaAmxSupported()) GTEST_SKIP() << "this CPU (or kernel) offers no AMX tiles";
  for (const Case& c : {Case{2, 2, 128, 72, DType::kFloat16, KvKind::kSeparateKV, 1e6f, 19, {}},
                        Case{1, 3, 64, 40, DType::kBFloat16, KvKind::kSeparateKV, 1e4f, 20, {},
                             1.0},
                        Case{1, 2, 96, 48, DType::kFloat32, KvKind::kSeparateKV, 0, 21, {}}}) {
    SCOPED_TRACE(::testing::Message() << "D=" << c.dim << " dtype=" << static_cast<int>(c.dtype));
    PcaSetup s(c, 500);
    const std::vector<uint8_t>& block = s.block;
    const KvLayout& layout = s.layout;
    const CodecParams& p = s.p;
    Encoder& enc = s.enc;
    Decoder& dec = s.dec;
    std::vector<uint8_t> tiles_blob, floats_blob, tiles(block.size()), floats(block.size());
    ASSERT_TRUE(enc.Encode(layout, p, block, &tiles_blob).ok());
    internal::SetPcaAmxEncodeEnabledForTest(false);
    ASSERT_TRUE(enc.Encode(layout, p, block, &floats_blob).ok());
    internal::SetPcaAmxEncodeEnabledForTest(true);
    ASSERT_TRUE(dec.Decode(tiles_blob, tiles).ok());
    ASSERT_TRUE(dec.Decode(floats_blob, floats).ok());
    const size_t es = DTypeBytes(c.dtype), values = block.size() / es;
    // Head vectors (a flipped coordinate changes all of one) that decode to the same values.
    size_t equal = 0;
    double err_tiles = 0, err_floats = 0;
    for (size_t row = 0; row < values; row += c.dim) {
      bool same = true;
      for (size_t i = row; i < row + c.dim; ++i) {
        const double x = Load(block.data() + i * es, c.dtype);
        const double a = Load(tiles.data() + i * es, c.dtype);
        const double b = Load(floats.data() + i * es, c.dtype);
        same = same && a == b;
        err_tiles += (a - x) * (a - x);
        err_floats += (b - x) * (b - x);
      }
      equal += same;
    }
    const size_t rows = values / c.dim;
    EXPECT_GT(equal, rows * 98 / 100);
    EXPECT_LT(std::abs(err_tiles - err_floats), 1e-3 * err_floats);
  }
}

// Squared errors over an fp16 block: of `a` and of `b` against `x`, and of `a` against `b`.
struct SquaredErrors {
  double a = 0, b = 0, apart = 0;
};
SquaredErrors Fp16Errors(std::span<const uint8_t> x, const std::vector<uint8_t>& a,
                         const std::vector<uint8_t>& b) {
  SquaredErrors e;
  for (size_t v = 0; v < x.size() / 2; ++v) {
    const double xv = Load(x.data() + 2 * v, DType::kFloat16);
    const double av = Load(a.data() + 2 * v, DType::kFloat16);
    const double bv = Load(b.data() + 2 * v, DType::kFloat16);
    e.a += (av - xv) * (av - xv);
    e.b += (bv - xv) * (bv - xv);
    e.apart += (av - bv) * (av - bv);
  }
  return e;
}

// Synthetic KV (2 layers, 2 heads of 128, 64 tokens per block) whose first four blocks calibrate
// a namespace at 1.5 bits/value: steps coarse against the vectors' spread.
struct CalibratedAtLowRate : test::CalibratedSynthetic {
  explicit CalibratedAtLowRate(size_t blocks) : CalibratedSynthetic(blocks, test::AtBits(1.5)) {}
};

// CpuKernels (what the daemon logs and exports) names the pca kernels that do run: with the
// tiles, VNNI and int8 terms each switched on and off, on every Highway target, the kernel it
// names for the decoder and the encoder is one whose heads a decode and an encode of a
// byte-symbol block counted, and "float" where none of the vector kernels counted any. (For
// amx-int8 the tiles' heads count: int8 terms run only where a head's axes admit them, else
// the bf16 ones; STRATA_CODEC_AMX_INT8=0 turns them off.)
TEST(PcaSections, CpuKernelsNameTheKernelsThatRun) {
  CalibratedAtLowRate c(5);
  const std::span<const uint8_t> block = c.Block(4);
  auto kernel_of = [](const std::string& part) {
    for (const CpuKernel& k : CpuKernels())
      if (k.part == part) return k.kernel;
    return std::string("(none)");
  };
  struct Counts {
    uint64_t lanes = internal::PcaLanesHeadsDecoded(), vnni = internal::PcaVnniHeadsDecoded(),
             avx2 = internal::PcaAvx2HeadsDecoded(), amx = internal::PcaAmxHeadsDecoded(),
             amx_int8 = internal::PcaAmxInt8HeadsDecoded(),
             vnni_projected = internal::PcaVnniHeadsProjected(),
             avx2_projected = internal::PcaAvx2HeadsProjected(),
             amx_projected = internal::PcaAmxHeadsProjectedInBf16();
  };
  auto check = [&] {
    const Counts before;
    std::vector<uint8_t> blob, out(c.bb);
    ASSERT_TRUE(c.enc.Encode(c.layout, c.p, block, &blob).ok());
    ASSERT_TRUE(c.dec.Decode(blob, out).ok());
    const Counts after;
    const bool lanes = after.lanes > before.lanes, vnni = after.vnni > before.vnni,
               avx2 = after.avx2 > before.avx2,
               amx = after.amx > before.amx || after.amx_int8 > before.amx_int8;
    const std::string decode = kernel_of("pca_decode");
    SCOPED_TRACE("pca_decode " + decode);
    const std::map<std::string, bool> decoded = {{"avx512-vnni", vnni},
                                                 {"avx512", lanes && !vnni},
                                                 {"avx2", avx2},
                                                 {"amx-bf16", after.amx > before.amx},
                                                 {"amx-int8", amx},
                                                 {"float", !(lanes || vnni || avx2 || amx)}};
    ASSERT_TRUE(decoded.contains(decode));
    EXPECT_TRUE(decoded.at(decode));
    const std::string encode = kernel_of("pca_encode");
    SCOPED_TRACE("pca_encode " + encode);
    const bool vnni_projected = after.vnni_projected > before.vnni_projected,
               avx2_projected = after.avx2_projected > before.avx2_projected,
               amx_projected = after.amx_projected > before.amx_projected;
    const std::map<std::string, bool> projected = {
        {"avx512-vnni", vnni_projected},
        {"avx2", avx2_projected},
        {"amx-bf16", amx_projected},
        {"float", !(vnni_projected || avx2_projected || amx_projected)}};
    ASSERT_TRUE(projected.contains(encode));
    EXPECT_TRUE(projected.at(encode));
  };
  for (const bool amx : {true, false})
    for (const bool vnni : {true, false})
      for (const bool bytes : {true, false}) {
        SCOPED_TRACE(::testing::Message() << "AMX " << amx << ", VNNI " << vnni << ", int8 "
                                          << bytes);
        internal::SetPcaAmxEnabledForTest(amx);
        internal::SetPcaAmxEncodeEnabledForTest(amx);
        internal::SetPcaVnniEnabledForTest(vnni);
        internal::SetPcaVnniBytesEnabledForTest(bytes);
        internal::SetPcaAmxInt8EnabledForTest(bytes);
        OnEveryTarget(check);
      }
  internal::SetPcaAmxEnabledForTest(true);
  internal::SetPcaAmxEncodeEnabledForTest(true);
  internal::SetPcaVnniEnabledForTest(true);
  internal::SetPcaVnniBytesEnabledForTest(true);
  internal::SetPcaAmxInt8EnabledForTest(true);
}

// At low rates (steps coarse against the vectors' spread) the encoder's tiles take one bf16
// product: blobs as small and errors as large as the float kernels' to within a percent.
TEST(PcaSections, AmxEncoderTakesOneProductAtLowRates) {
  if (!internal::PcaAmxSupported()) GTEST_SKIP() << "this CPU (or kernel) offers no AMX tiles";
  CalibratedAtLowRate c(6);
  const KvLayout& layout = c.layout;
  const CodecParams& p = c.p;
  const size_t bb = c.bb;
  Encoder& enc = c.enc;
  Decoder& dec = c.dec;
  for (size_t i = 4; i < 6; ++i) {
    const std::span<const uint8_t> block = c.Block(i);
    const uint64_t before = internal::PcaAmxHeadsProjectedInBf16();
    std::vector<uint8_t> tiles_blob, floats_blob, tiles(bb), floats(bb);
    ASSERT_TRUE(enc.Encode(layout, p, block, &tiles_blob).ok());
    EXPECT_EQ(internal::PcaAmxHeadsProjectedInBf16() - before, 2u * 2 * 2);  // every head
    internal::SetPcaAmxEncodeEnabledForTest(false);
    ASSERT_TRUE(enc.Encode(layout, p, block, &floats_blob).ok());
    internal::SetPcaAmxEncodeEnabledForTest(true);
    ASSERT_TRUE(dec.Decode(tiles_blob, tiles).ok());
    ASSERT_TRUE(dec.Decode(floats_blob, floats).ok());
    const SquaredErrors e = Fp16Errors(block, tiles, floats);
    EXPECT_NEAR(static_cast<double>(tiles_blob.size()), floats_blob.size(),
                0.01 * floats_blob.size());
    EXPECT_NEAR(e.a, e.b, 0.01 * e.b);
  }
}

// At coarse steps the decoder's tiles take the axes' bf16 hi halves alone: the values may then
// differ from the float kernels' in their last bits, by far less than the codec's own error. A
// block whose step code makes the steps 16x finer is summed with both halves again.
TEST(PcaSections, AmxDecoderTakesOneProductAtCoarseSteps) {
  if (!internal::PcaAmxSupported()) GTEST_SKIP() << "this CPU (or kernel) offers no AMX tiles";
  CalibratedAtLowRate c(5);
  const KvLayout& layout = c.layout;
  CodecParams& p = c.p;
  const size_t bb = c.bb;
  Encoder& enc = c.enc;
  Decoder& dec = c.dec;
  const std::span<const uint8_t> block = c.Block(4);
  const uint64_t heads = 2 * 2 * 2;
  for (const uint8_t code : {uint8_t{0}, uint8_t{1}}) {
    SCOPED_TRACE(::testing::Message() << "step code " << int{code});
    p.pca_step_code = code;
    std::vector<uint8_t> blob, tiles(bb), floats(bb);
    ASSERT_TRUE(enc.Encode(layout, p, block, &blob).ok());
    const uint64_t decoded = internal::PcaAmxHeadsDecoded();
    const uint64_t one_product = internal::PcaAmxHeadsDecodedInBf16();
    internal::SetPcaAmxInt8EnabledForTest(false);  // the int8 tiles would take these heads
    ASSERT_TRUE(dec.Decode(blob, tiles).ok());
    internal::SetPcaAmxInt8EnabledForTest(true);
    EXPECT_EQ(internal::PcaAmxHeadsDecoded() - decoded, heads);
    EXPECT_EQ(internal::PcaAmxHeadsDecodedInBf16() - one_product, code == 0 ? heads : 0);
    internal::SetPcaAmxEnabledForTest(false);
    internal::SetPcaVnniEnabledForTest(false);
    ASSERT_TRUE(dec.Decode(blob, floats).ok());
    internal::SetPcaVnniEnabledForTest(true);
    internal::SetPcaAmxEnabledForTest(true);
    const SquaredErrors e = Fp16Errors(block, tiles, floats);  // b: the codec's own error
    EXPECT_GT(e.b, 0);
    EXPECT_LT(e.apart, 0.01 * e.b);
    EXPECT_NEAR(e.a, e.b, 0.01 * e.b);
  }
}

// With VNNI (and no AMX), byte symbols are summed as integer dot products with int16 axes:
// the heads of byte sections take them, and the decoded block is as far from the input as the
// float kernels' (within 1 % of the codec's error energy) and apart from theirs by < 1 % of
// it, at the calibrated steps and at 16x finer ones.
TEST(PcaSections, VnniDecoderIsAsCloseAsTheFloatKernels) {
  if (!internal::PcaVnniSupported()) GTEST_SKIP() << "this CPU offers no AVX512-VNNI";
  if (internal::PcaAmxSupported()) GTEST_SKIP() << "AMX tiles decode on this CPU";
  internal::SetPcaAmxEnabledForTest(false);
  CalibratedAtLowRate c(5);
  CodecParams& p = c.p;
  const std::span<const uint8_t> block = c.Block(4);
  for (const uint8_t code : {uint8_t{0}, uint8_t{1}}) {
    SCOPED_TRACE(::testing::Message() << "step code " << int{code});
    p.pca_step_code = code;
    std::vector<uint8_t> blob, vnni(c.bb), floats(c.bb);
    ASSERT_TRUE(c.enc.Encode(c.layout, p, block, &blob).ok());
    const uint64_t before = internal::PcaVnniHeadsDecoded();
    const uint64_t bytes_before = internal::PcaVnniBytesHeadsDecoded();
    ASSERT_TRUE(c.dec.Decode(blob, vnni).ok());
    // The sections whose symbols are bytes (one with a coordinate beyond 127 steps has wider).
    EXPECT_GE(internal::PcaVnniHeadsDecoded() - before, 2u * 2);
    // Int8 terms at the calibrated steps; at 16x finer ones (step code 1) the quantisation
    // noise is 256x smaller, the int8 terms' error is not: int16 only.
    if (code == 0 && internal::PcaVnniBytesAvailable())  // STRATA_CODEC_VNNI=16: int16 only
      EXPECT_GT(internal::PcaVnniBytesHeadsDecoded() - bytes_before, 0u);
    else
      EXPECT_EQ(internal::PcaVnniBytesHeadsDecoded() - bytes_before, 0u);
    internal::SetPcaVnniEnabledForTest(false);
    ASSERT_TRUE(c.dec.Decode(blob, floats).ok());
    internal::SetPcaVnniEnabledForTest(true);
    const SquaredErrors e = Fp16Errors(block, vnni, floats);  // b: the codec's own error
    EXPECT_GT(e.b, 0);
    EXPECT_LT(e.apart, 0.01 * e.b);
    EXPECT_NEAR(e.a, e.b, 0.01 * e.b);
  }
  // Random calibrations: head_dim 64 with RoPE and a last group of 8 tokens (VNNI), head_dim 128
  // with an outlier token (every section's symbols wider than bytes: the token lanes decode).
  for (const Case& rc : {Case{1, 3, 64, 40, DType::kFloat16, KvKind::kSeparateKV, 1e4f, 18, {},
                              1.0},
                         Case{2, 2, 128, 72, DType::kFloat16, KvKind::kSeparateKV, 1e6f, 17, {}}}) {
    SCOPED_TRACE(::testing::Message() << "D=" << rc.dim << " T=" << rc.tokens);
    PcaSetup s(rc, 1000);
    std::vector<uint8_t> blob, vnni(s.block.size()), floats(s.block.size());
    ASSERT_TRUE(s.enc.Encode(s.layout, s.p, s.block, &blob).ok());
    const uint64_t before = internal::PcaVnniHeadsDecoded();
    ASSERT_TRUE(s.dec.Decode(blob, vnni).ok());
    if (rc.outlier == 1.0) {
      EXPECT_GT(internal::PcaVnniHeadsDecoded() - before, 0u);
    }
    internal::SetPcaVnniEnabledForTest(false);
    ASSERT_TRUE(s.dec.Decode(blob, floats).ok());
    internal::SetPcaVnniEnabledForTest(true);
    const SquaredErrors e = Fp16Errors(s.block, vnni, floats);
    EXPECT_GT(e.b, 0);
    EXPECT_LT(e.apart, 0.01 * e.b);
    EXPECT_NEAR(e.a, e.b, 0.01 * e.b);
  }
  internal::SetPcaAmxEnabledForTest(true);
}

// Int8 terms add at most kMaxAddedError of the quantisation noise expected from the
// calibration: the decode with them and the one with int16 terms only are that close, on blocks
// the calibration did not see, and the codec's error does not grow beyond it.
TEST(PcaSections, VnniInt8TermsAddAPermilleOfTheNoise) {
  if (!internal::PcaVnniSupported()) GTEST_SKIP() << "this CPU offers no AVX512-VNNI";
  if (internal::PcaAmxSupported()) GTEST_SKIP() << "AMX tiles decode on this CPU";
  if (!internal::PcaVnniBytesAvailable()) GTEST_SKIP() << "STRATA_CODEC_VNNI=16: int16 only";
  CalibratedAtLowRate c(7);
  for (size_t b = 4; b < 7; ++b) {
    SCOPED_TRACE(::testing::Message() << "block " << b);
    std::vector<uint8_t> blob, bytes(c.bb), wide(c.bb);
    ASSERT_TRUE(c.enc.Encode(c.layout, c.p, c.Block(b), &blob).ok());
    const uint64_t before = internal::PcaVnniBytesHeadsDecoded();
    ASSERT_TRUE(c.dec.Decode(blob, bytes).ok());
    EXPECT_GT(internal::PcaVnniBytesHeadsDecoded() - before, 0u);
    internal::SetPcaVnniBytesEnabledForTest(false);
    const uint64_t heads = internal::PcaVnniHeadsDecoded();
    const uint64_t with_bytes = internal::PcaVnniBytesHeadsDecoded();
    ASSERT_TRUE(c.dec.Decode(blob, wide).ok());
    EXPECT_EQ(internal::PcaVnniBytesHeadsDecoded(), with_bytes);  // int16 only
    EXPECT_GT(internal::PcaVnniHeadsDecoded(), heads);
    internal::SetPcaVnniBytesEnabledForTest(true);
    const SquaredErrors e = Fp16Errors(c.Block(b), bytes, wide);
    EXPECT_GT(e.b, 0);
    // Twice the bound: fp16 rounding of the outputs and held-out blocks' own variances.
    EXPECT_LT(e.apart, 2 * internal::kMaxAddedError * e.b);
    EXPECT_LT(e.a, (1 + 2 * internal::kMaxAddedError) * e.b);
  }
}

// The int8 axes: the coordinates whose symbols carry the most energy stay int16, the expected
// added error is within the bound, and none are int8 where every one would break it.
TEST(PcaVnniAxes, Int8TermsOnlyWhereTheyFitTheBound) {
  if (!internal::PcaVnniSupported()) GTEST_SKIP() << "this CPU offers no AVX512-VNNI";
  const size_t dim = 64, n = 60;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> basis(dim * dim), steps(n), variances(n);
  for (float& x : basis) x = normal(rng) / std::sqrt(float{dim});
  std::vector<uint32_t> coords(n);
  for (size_t k = 0; k < n; ++k) {
    coords[k] = static_cast<uint32_t>(k);
    variances[k] = 100.0f / static_cast<float>(k + 1);  // decaying spectrum
    steps[k] = 0.5f;
  }
  internal::PcaVnniAxes wide, mixed;
  internal::BuildPcaVnniAxes(basis.data(), coords.data(), steps.data(), nullptr, n, dim, &wide);
  EXPECT_EQ(wide.pairs, n / 2);
  EXPECT_EQ(wide.quads, 0u);
  internal::BuildPcaVnniAxes(basis.data(), coords.data(), steps.data(), variances.data(), n, dim,
                             &mixed);
  ASSERT_GT(mixed.quads, 0u);
  ASSERT_GT(mixed.pairs, 0u);  // the top of the spectrum stays int16 ...
  EXPECT_EQ(mixed.order[0], 0u);
  EXPECT_EQ(mixed.order[1], 1u);
  EXPECT_GT(mixed.added_error, 0);  // ... and the rest adds within the bound
  EXPECT_TRUE(internal::PcaVnniBytesFit(mixed, steps.data(), variances.data(), n, 1.0f));
  EXPECT_FALSE(internal::PcaVnniBytesFit(mixed, steps.data(), variances.data(), n, 1.0f / 16));
  // Steps so fine that no coordinate fits: no int8 axes at all.
  std::vector<float> fine(n, 1e-4f);
  internal::PcaVnniAxes none;
  internal::BuildPcaVnniAxes(basis.data(), coords.data(), fine.data(), variances.data(), n, dim,
                             &none);
  EXPECT_EQ(none.quads, 0u);
  EXPECT_EQ(none.pairs, n / 2);
}

// What `decode(rows)` writes for `tokens` rows of `dim` values of `type` at an address aligned
// to 64 bytes (where the AVX-512 decoders stream their rows) and at one 2 bytes past it (plain
// stores): {streamed, plain}.
template <typename Decode>
std::pair<std::vector<uint8_t>, std::vector<uint8_t>> StreamedAndPlain(
    size_t tokens, size_t dim, internal::PcaRows::Type type, Decode decode) {
  const size_t bytes = tokens * dim * (type == internal::PcaRows::Type::kFloat32 ? 4 : 2);
  std::vector<uint8_t> mem(bytes + 128);
  uint8_t* aligned = mem.data() + (64 - reinterpret_cast<uintptr_t>(mem.data()) % 64) % 64;
  std::vector<uint8_t> streamed(bytes), plain(bytes);
  for (const size_t offset : {size_t{0}, size_t{2}}) {
    std::memset(aligned, 0xA5, bytes + 2);
    decode(internal::PcaRows{aligned + offset, type, dim});
    std::memcpy(offset == 0 ? streamed.data() : plain.data(), aligned + offset, bytes);
  }
  return {streamed, plain};
}

// The kernel itself against the plain sum, on the shapes the blocks above do not reach: a last
// group of 8 tokens, an odd coordinate count, int8 coordinates not a multiple of 4, slots out of
// order, and axes with no int16 coordinate at all.
TEST(PcaVnniAxes, MixedAxesSumAsThePlainSum) {
  if (!internal::PcaVnniSupported()) GTEST_SKIP() << "this CPU offers no AVX512-VNNI";
  const size_t dim = 64, n = 61, tokens = 40, nslots = 63;
  const int32_t maxq = 20;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<float> basis(dim * dim), steps(n), mean(dim);
  for (float& x : basis) x = normal(rng) / std::sqrt(float{dim});
  for (float& m : mean) m = normal(rng);
  std::vector<uint32_t> coords(n), slot(n);
  for (size_t k = 0; k < n; ++k) {
    coords[k] = static_cast<uint32_t>(k);
    slot[k] = static_cast<uint32_t>((k * 7 + 3) % nslots);  // distinct: 7 and 63 share no factor
    steps[k] = 0.25f + 0.01f * static_cast<float>(k);
  }
  // Symbols as the decoder reads them: 16-token runs per slot, then the last group's 8 per slot.
  std::vector<uint8_t> sym(tokens * nslots);
  std::uniform_int_distribution<int> value(0, 2 * maxq);
  for (uint8_t& v : sym) v = static_cast<uint8_t>(value(rng));
  auto symbol = [&](size_t t, size_t j) -> int32_t {
    const size_t full = tokens / 16, rest = tokens % 16;
    const size_t at = t / 16 < full ? (t / 16 * nslots + j) * 16 + t % 16
                                    : full * 16 * nslots + j * rest + t % 16;
    return int32_t{sym[at]} - maxq;
  };
  std::vector<double> want(tokens * dim);
  double energy = 0;
  for (size_t t = 0; t < tokens; ++t)
    for (size_t c = 0; c < dim; ++c) {
      double x = 0;
      for (size_t k = 0; k < n; ++k)
        x += symbol(t, slot[k]) * double{steps[k]} * basis[k * dim + c];
      want[t * dim + c] = mean[c] + x;
      energy += x * x;
    }
  const internal::PcaSymbols ps{sym.data(), false, nslots, tokens, maxq};
  // A decaying spectrum keeps its top int16; a flat, small one needs no int16 coordinate.
  std::vector<float> decaying(n), flat(n, 1e-3f);
  for (size_t k = 0; k < n; ++k) decaying[k] = 50.0f / static_cast<float>(k + 1);
  for (const std::vector<float>* variances : {&decaying, &flat}) {
    internal::PcaVnniAxes axes;
    internal::BuildPcaVnniAxes(basis.data(), coords.data(), steps.data(), variances->data(), n,
                               dim, &axes);
    ASSERT_GT(axes.quads, 0u);
    if (variances == &flat) {
      EXPECT_EQ(axes.pairs, 0u);
    } else {
      EXPECT_GT(axes.pairs, 0u);
    }
    EXPECT_NE((n - 2 * axes.pairs) % 4, 0u);
    std::vector<float> got(tokens * dim), scratch;
    const uint64_t before = internal::PcaVnniBytesHeadsDecoded();
    internal::PcaReconstructVnni(ps, slot.data(), n, axes, dim, 1.0f, mean.data(), nullptr,
                                 {got.data(), internal::PcaRows::Type::kFloat32, dim}, &scratch);
    EXPECT_EQ(internal::PcaVnniBytesHeadsDecoded() - before, 1u);
    double apart = 0;
    for (size_t i = 0; i < got.size(); ++i) apart += (got[i] - want[i]) * (got[i] - want[i]);
    // Uniform symbols up to 20 steps: int8 terms off by up to 1/254 of a column's largest.
    EXPECT_GT(apart, 0);
    EXPECT_LT(apart, 1e-4 * energy);
    // Rows at aligned addresses are streamed past the caches, others stored plainly: the same
    // values either way, in every type.
    for (const auto type : {internal::PcaRows::Type::kFloat32, internal::PcaRows::Type::kFloat16,
                            internal::PcaRows::Type::kBFloat16}) {
      const auto [streamed, plain] =
          StreamedAndPlain(tokens, dim, type, [&](const internal::PcaRows& rows) {
            internal::PcaReconstructVnni(ps, slot.data(), n, axes, dim, 1.0f, mean.data(),
                                         nullptr, rows, &scratch);
          });
      EXPECT_EQ(streamed, plain) << "type " << static_cast<int>(type);
      if (type == internal::PcaRows::Type::kFloat32) {
        EXPECT_EQ(std::memcmp(streamed.data(), got.data(), streamed.size()), 0);
      }
    }
  }
}

// The float decoder in token lanes streams its rows past the caches where they are aligned
// (each group transposed into token rows first) and stores them plainly elsewhere: the same
// bytes either way, in every type, with and without RoPE, with a last group of 8 tokens.
TEST(PcaLanes, StreamedRowsMatchPlainRows) {
  if (!internal::PcaLanesSupported()) GTEST_SKIP() << "this CPU offers no AVX-512";
  const size_t dim = 64, n = 40, tokens = 40, tp = 48;
  std::mt19937 rng(13);
  std::normal_distribution<float> normal;
  std::vector<float> basis(dim * dim), mean(dim), yt(n * tp, 0.0f);
  for (float& x : basis) x = normal(rng) / 8;
  for (float& x : mean) x = normal(rng);
  for (size_t k = 0; k < n; ++k)
    for (size_t t = 0; t < tokens; ++t) yt[k * tp + t] = normal(rng);
  std::vector<uint32_t> coords(n);
  for (size_t k = 0; k < n; ++k) coords[k] = static_cast<uint32_t>(k);
  std::vector<float> axes, scratch, cos(tokens * dim / 2), sin(tokens * dim / 2);
  internal::BuildPcaLanesAxes(basis.data(), coords.data(), n, dim, &axes);
  for (size_t i = 0; i < cos.size(); ++i) {
    cos[i] = std::cos(0.01f * static_cast<float>(i));
    sin[i] = std::sin(0.01f * static_cast<float>(i));
  }
  const internal::PcaRope rope{cos.data(), sin.data()};
  for (const internal::PcaRope* r : {static_cast<const internal::PcaRope*>(nullptr), &rope}) {
    for (const auto type : {internal::PcaRows::Type::kFloat32, internal::PcaRows::Type::kFloat16,
                            internal::PcaRows::Type::kBFloat16}) {
      const auto [streamed, plain] =
          StreamedAndPlain(tokens, dim, type, [&](const internal::PcaRows& rows) {
            internal::PcaReconstructLanes(yt.data(), tp, tokens, n, axes, dim, mean.data(), r,
                                          rows, &scratch);
          });
      EXPECT_EQ(streamed, plain) << "type " << static_cast<int>(type) << (r ? " rope" : "");
    }
  }
}

// The plan's decoder axes are built by the first decode of each section, whichever thread it
// runs on: decoders on several threads at once, from a calibration no one has decoded with yet,
// all write the same values (TSan runs this).
TEST(PcaSections, DecodersOnManyThreadsShareOnePlan) {
  CalibratedAtLowRate c(5);
  std::vector<uint8_t> blob;
  ASSERT_TRUE(c.enc.Encode(c.layout, c.p, c.Block(4), &blob).ok());
  std::vector<std::vector<uint8_t>> outs(4, std::vector<uint8_t>(c.bb));
  std::vector<absl::Status> status(outs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < outs.size(); ++i)
    threads.emplace_back([&, i] {
      Decoder dec;
      dec.set_calibrations(&c.set);
      status[i] = dec.Decode(blob, outs[i]);
    });
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < outs.size(); ++i) {
    EXPECT_TRUE(status[i].ok()) << status[i];
    EXPECT_EQ(outs[i], outs[0]) << i;
  }
}

}  // namespace
}  // namespace strata::codec
