// Calibrated transform coding: the calibration artefact, its lifecycle and the pca mode.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "codec/blob.h"
#include "codec/calibration.h"
#include "codec/codec.h"
#include "codec/half.h"
#include "codec/synthetic_kv.h"
#include "common/crc32c.h"
#include "gtest/gtest.h"
#include "tests/codec/fp16_error.h"
#include "tests/codec/test_layout.h"

namespace strata::codec {
namespace {

using test::Layout;
using test::RelMse;

// Blocks 0..n-1 of one synthetic sequence (each layout.BlockBytes()).
struct Blocks {
  KvLayout layout;
  std::vector<uint8_t> bytes;
  Blocks(const KvLayout& l, uint32_t n, uint64_t seed) : layout(l) {
    SyntheticKvParams p;
    p.seed = seed;
    bytes = GenerateSyntheticKv(l, n, p);
  }
  std::span<const uint8_t> operator[](size_t i) const {
    return std::span<const uint8_t>(bytes).subspan(i * layout.BlockBytes(), layout.BlockBytes());
  }
};

std::shared_ptr<const Calibration> CalibrateOn(const Blocks& b, size_t first, size_t n,
                                               double bits, uint32_t version = 1) {
  std::vector<std::span<const uint8_t>> s;
  for (size_t i = first; i < first + n; ++i) s.push_back(b[i]);
  CalibrateOptions o;
  o.bits_per_value = bits;
  o.version = version;
  auto c = Calibrate(b.layout, s, o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::make_shared<const Calibration>(*std::move(c)) : nullptr;
}

// A pca encoder and decoder sharing one calibration set that holds `cal`.
struct PcaCodec {
  CalibrationSet set;
  CodecParams p;
  Encoder enc;
  Decoder dec;
  explicit PcaCodec(std::shared_ptr<const Calibration> cal) {
    p.mode = Mode::kPca;
    p.calibration_id = set.Add(std::move(cal));
    enc.set_calibrations(&set);
    dec.set_calibrations(&set);
  }
};

const KvLayout kLayout = Layout(2, 2, 32, 64);

TEST(Calibration, JacobiEigenDecomposes) {
  const size_t n = 12;
  std::mt19937 rng(7);
  std::normal_distribution<double> g;
  std::vector<double> a(n * n);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j <= i; ++j) a[i * n + j] = a[j * n + i] = g(rng);
  std::vector<double> vals, vecs;
  SymmetricEigen(a, n, &vals, &vecs);
  for (size_t i = 0; i + 1 < n; ++i) EXPECT_GE(vals[i], vals[i + 1]);
  for (size_t i = 0; i < n; ++i) {
    for (size_t r = 0; r < n; ++r) {  // A v_i = lambda_i v_i
      double av = 0;
      for (size_t k = 0; k < n; ++k) av += a[r * n + k] * vecs[i * n + k];
      EXPECT_NEAR(av, vals[i] * vecs[i * n + r], 1e-9);
    }
    for (size_t j = 0; j < n; ++j) {  // orthonormal
      double dot = 0;
      for (size_t k = 0; k < n; ++k) dot += vecs[i * n + k] * vecs[j * n + k];
      EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-9);
    }
  }
}

// The Householder solver agrees with Jacobi's: the same eigenvalues, eigenvectors up to sign,
// on a random matrix, a covariance of rank n / 2 (a cluster of zero eigenvalues), a diagonal
// one and sizes 1 and 2.
TEST(Calibration, HouseholderEigenDecomposesAsJacobiDoes) {
  std::mt19937 rng(11);
  std::normal_distribution<double> g;
  for (size_t n : {size_t{1}, size_t{2}, size_t{17}, size_t{64}}) {
    for (int kind = 0; kind < 3; ++kind) {
      std::vector<double> a(n * n, 0.0);
      if (kind == 0) {
        for (size_t i = 0; i < n; ++i)
          for (size_t j = 0; j <= i; ++j) a[i * n + j] = a[j * n + i] = g(rng);
      } else if (kind == 1) {  // X^T X of n / 2 + 1 samples
        std::vector<double> x((n / 2 + 1) * n);
        for (double& v : x) v = g(rng);
        for (size_t r = 0; r < n / 2 + 1; ++r)
          for (size_t i = 0; i < n; ++i)
            for (size_t j = 0; j < n; ++j) a[i * n + j] += x[r * n + i] * x[r * n + j];
      } else {
        for (size_t i = 0; i < n; ++i) a[i * n + i] = g(rng);
      }
      std::vector<double> jv, jvec, hv, hvec;
      SymmetricEigen(a, n, &jv, &jvec);
      SymmetricEigenHouseholder(a, n, &hv, &hvec);
      ASSERT_EQ(hv.size(), n);
      double scale = 0;
      for (double v : jv) scale = std::max(scale, std::abs(v));
      for (size_t i = 0; i < n; ++i) {
        EXPECT_NEAR(hv[i], jv[i], 1e-10 * std::max(scale, 1.0)) << n << " " << kind << " " << i;
        for (size_t r = 0; r < n; ++r) {  // A v_i = lambda_i v_i
          double av = 0;
          for (size_t k = 0; k < n; ++k) av += a[r * n + k] * hvec[i * n + k];
          EXPECT_NEAR(av, hv[i] * hvec[i * n + r], 1e-9 * std::max(scale, 1.0));
        }
        for (size_t j = 0; j < n; ++j) {  // orthonormal
          double dot = 0;
          for (size_t k = 0; k < n; ++k) dot += hvec[i * n + k] * hvec[j * n + k];
          EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-9);
        }
      }
    }
  }
}

// The greedy allocation reaches the exhaustive DP's minimum of sum w var 2^(-2b).
TEST(Calibration, AllocationIsTheDpOptimum) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(-6, 3);
  for (int trial = 0; trial < 20; ++trial) {
    const size_t n = 6;
    const double quantum = 0.5, max_bits = 3;
    const int levels = static_cast<int>(max_bits / quantum);
    std::vector<double> var(n);
    for (double& v : var) v = std::exp(u(rng));
    const int budget = 1 + trial % 14;  // in quanta
    // dp[k] = least distortion of the coordinates so far with k quanta.
    std::vector<double> dp(budget + 1, 0.0);
    for (size_t i = 0; i < n; ++i) {
      std::vector<double> next(budget + 1, 1e300);
      for (int k = 0; k <= budget; ++k)
        for (int b = 0; b <= levels && b <= k; ++b)
          next[k] = std::min(next[k], dp[k - b] + var[i] * std::exp2(-2 * b * quantum));
      dp = next;
    }
    const std::vector<double> bits = AllocateBits(var, budget * quantum, quantum, max_bits);
    double d = 0, used = 0;
    for (size_t i = 0; i < n; ++i) {
      d += var[i] * std::exp2(-2 * bits[i]);
      used += bits[i];
      EXPECT_LE(bits[i], max_bits);
    }
    EXPECT_LE(used, budget * quantum + 1e-9);
    EXPECT_NEAR(d, dp[budget], 1e-9 * dp[budget]) << "trial " << trial;
  }
}

TEST(Calibration, SerializeParseKeepsIdAndRejectsCorruption) {
  Blocks b(kLayout, 3, 1);
  auto cal = CalibrateOn(b, 0, 2, 2.0);
  ASSERT_TRUE(cal);
  const std::vector<uint8_t> bytes = cal->Serialize();
  auto back = Calibration::Parse(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->Id(), cal->Id());
  EXPECT_EQ(back->Serialize(), bytes);
  EXPECT_NE(cal->Id(), 0u);
  for (size_t at : {size_t{0}, size_t{5}, size_t{13}, size_t{100}, bytes.size() - 1}) {
    std::vector<uint8_t> bad = bytes;
    bad[at] ^= 0x10;
    auto p = Calibration::Parse(bad);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss) << at;
  }
  for (size_t len : {size_t{0}, size_t{43}, bytes.size() - 5}) {
    auto p = Calibration::Parse(std::span<const uint8_t>(bytes).first(len));
    EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss) << len;
  }
  // A well-formed file of an unknown format version is refused by name.
  std::vector<uint8_t> v2 = bytes;
  v2[4] = 2;
  const uint32_t crc = Crc32c(v2.data(), v2.size() - 4);
  std::memcpy(v2.data() + v2.size() - 4, &crc, 4);
  auto p = Calibration::Parse(v2);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(p.status().message().find("format version 2"), std::string::npos) << p.status();
}

TEST(Calibration, HeldOutRoundTripMeetsRateAndBeatsInt2) {
  Blocks b(kLayout, 6, 11);
  auto cal = CalibrateOn(b, 0, 4, 2.0);
  ASSERT_TRUE(cal);
  EXPECT_LE(cal->sample_bits, 2.0f);
  EXPECT_GE(cal->sample_bits, 1.6f);
  PcaCodec codec(cal);
  auto& [set, p, enc, dec] = codec;
  for (size_t i = 4; i < 6; ++i) {  // held out
    std::vector<uint8_t> blob, out(kLayout.BlockBytes());
    ASSERT_TRUE(enc.Encode(kLayout, p, b[i], &blob).ok());
    ASSERT_TRUE(dec.Decode(blob, out).ok());
    const double bits = 8.0 * blob.size() / (kLayout.BlockBytes() / 2);
    EXPECT_LT(bits, 2.4) << "block " << i;
    EXPECT_GT(bits, 1.4) << "block " << i;
    auto gw = Encode(kLayout, *ParseCodecSpec("int2-g64"), b[i]);
    std::vector<uint8_t> gw_out(out.size());
    ASSERT_TRUE(Decode(*gw, gw_out).ok());
    EXPECT_LT(RelMse(b[i], out), RelMse(b[i], gw_out)) << "block " << i;
    EXPECT_LT(blob.size(), gw->size());
    // Deterministic, and the blob names its calibration.
    std::vector<uint8_t> again;
    ASSERT_TRUE(enc.Encode(kLayout, p, b[i], &again).ok());
    EXPECT_EQ(again, blob);
    auto info = InspectBlob(blob);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->params.mode, Mode::kPca);
    EXPECT_EQ(info->params.calibration_id, cal->Id());
  }
}

TEST(Calibration, HigherTargetMeansBiggerBlobsAndLessError) {
  Blocks b(kLayout, 4, 5);
  double last_mse = 1e9;
  size_t last_size = 0;
  for (double bits : {0.75, 1.5, 3.0}) {
    auto cal = CalibrateOn(b, 0, 3, bits);
    ASSERT_TRUE(cal);
    PcaCodec codec(cal);
    auto& [set, p, enc, dec] = codec;
    std::vector<uint8_t> blob, out(kLayout.BlockBytes());
    ASSERT_TRUE(enc.Encode(kLayout, p, b[3], &blob).ok());
    ASSERT_TRUE(dec.Decode(blob, out).ok());
    EXPECT_GT(blob.size(), last_size) << bits;
    const double mse = RelMse(b[3], out);
    EXPECT_LT(mse, last_mse) << bits;
    last_size = blob.size();
    last_mse = mse;
  }
}

// Squared error of channels [lo, hi) of every head vector (kSeparateKV fp16 blocks).
double ChannelError(std::span<const uint8_t> a, std::span<const uint8_t> b, uint32_t d,
                    uint32_t lo, uint32_t hi) {
  double e = 0;
  for (size_t i = 0; i + 1 < a.size(); i += 2) {
    const size_t c = (i / 2) % d;
    if (c < lo || c >= hi) continue;
    uint16_t x, y;
    std::memcpy(&x, a.data() + i, 2);
    std::memcpy(&y, b.data() + i, 2);
    e += (double{HalfToFloat(x)} - HalfToFloat(y)) * (double{HalfToFloat(x)} - HalfToFloat(y));
  }
  return e;
}

TEST(Calibration, MetricSteersTheBitsToWhatItWeighs) {
  Blocks b(kLayout, 5, 23);
  std::vector<std::span<const uint8_t>> samples = {b[0], b[1], b[2], b[3]};
  const uint32_t d = kLayout.head_dim;
  const size_t heads = size_t{kLayout.num_layers} * 2 * kLayout.num_kv_heads;
  // A metric weighing channels [0, d/2) 100 times the rest, and its mirror.
  auto metric = [&](bool low) {
    std::vector<float> m(heads * d * d, 0.0f);
    for (size_t h = 0; h < heads; ++h)
      for (uint32_t c = 0; c < d; ++c) m[(h * d + c) * d + c] = ((c < d / 2) == low) ? 100 : 1;
    return m;
  };
  CalibrateOptions o;
  o.bits_per_value = 1.5;
  auto plain = Calibrate(kLayout, samples, o);
  o.metric.assign(heads * d * d, 0.0f);
  for (size_t h = 0; h < heads; ++h)
    for (uint32_t c = 0; c < d; ++c) o.metric[(h * d + c) * d + c] = 1;
  auto identity = Calibrate(kLayout, samples, o);
  ASSERT_TRUE(plain.ok() && identity.ok());
  EXPECT_EQ(identity->Id(), plain->Id()) << "the identity metric is plain squared error";
  double low_err[2], high_err[2];
  for (int low = 0; low < 2; ++low) {
    o.metric = metric(low == 1);
    auto cal = Calibrate(kLayout, samples, o);
    ASSERT_TRUE(cal.ok()) << cal.status();
    EXPECT_LE(cal->sample_bits, 1.5f);
    PcaCodec codec(std::make_shared<const Calibration>(*std::move(cal)));
    std::vector<uint8_t> blob, out(kLayout.BlockBytes());
    ASSERT_TRUE(codec.enc.Encode(kLayout, codec.p, b[4], &blob).ok());  // held out
    ASSERT_TRUE(codec.dec.Decode(blob, out).ok());
    low_err[low] = ChannelError(b[4], out, d, 0, d / 2);
    high_err[low] = ChannelError(b[4], out, d, d / 2, d);
  }
  EXPECT_LT(low_err[1], 0.7 * low_err[0]);
  EXPECT_LT(high_err[0], 0.7 * high_err[1]);
  o.metric.resize(7);
  EXPECT_EQ(Calibrate(kLayout, samples, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.metric = metric(true);
  o.metric[3] = std::nanf("");
  EXPECT_EQ(Calibrate(kLayout, samples, o).status().code(), absl::StatusCode::kInvalidArgument);
}

// Bits per coordinate of one head, from its step (step = sqrt(12 var) 2^-bits; 0: dropped).
double HeadBits(const HeadTransform& h) {
  double bits = 0;
  for (size_t c = 0; c < h.step.size(); ++c)
    if (h.step[c] > 0) bits += std::log2(std::sqrt(12.0 * h.variance[c]) / h.step[c]);
  return bits;
}

// Each head's coordinates by their bits (as HeadBits reads them; dropped ones not counted).
std::vector<double> CoordinateBits(const Calibration& cal) {
  std::vector<double> bits;
  for (const HeadTransform& h : cal.heads)
    for (size_t c = 0; c < h.step.size(); ++c)
      if (h.step[c] > 0) bits.push_back(std::log2(std::sqrt(12.0 * h.variance[c]) / h.step[c]));
  return bits;
}

TEST(Calibration, CoordinatesGetTheMinimumBitsOrNone) {
  Blocks b(kLayout, 5, 31);
  std::vector<std::span<const uint8_t>> samples = {b[0], b[1], b[2], b[3]};
  CalibrateOptions o;
  o.bits_per_value = 1.5;
  EXPECT_EQ(o.min_coordinate_bits, 0) << "off by default";
  auto all = Calibrate(kLayout, samples, o);
  o.min_coordinate_bits = 0.75;
  auto thresholded = Calibrate(kLayout, samples, o);
  ASSERT_TRUE(thresholded.ok() && all.ok());
  const std::vector<double> kept = CoordinateBits(*thresholded), every = CoordinateBits(*all);
  for (double bits : kept) EXPECT_GE(bits, 0.75 - 1e-6);
  // Without the minimum the model hands out quarter and half bits on this data, and the same
  // target then codes more coordinates.
  EXPECT_GT(std::count_if(every.begin(), every.end(), [](double v) { return v < 0.75 - 1e-6; }),
            0);
  EXPECT_LT(kept.size(), every.size());
  EXPECT_LE(thresholded->sample_bits, 1.5f);
  EXPECT_GT(thresholded->sample_bits, 1.4f) << "the dropped coordinates' bits are spent elsewhere";
  // Both decode a held-out block; the thresholded one with fewer coordinates.
  for (const auto& cal : {*thresholded, *all}) {
    PcaCodec codec(std::make_shared<const Calibration>(cal));
    std::vector<uint8_t> blob, out(kLayout.BlockBytes());
    ASSERT_TRUE(codec.enc.Encode(kLayout, codec.p, b[4], &blob).ok());
    ASSERT_TRUE(codec.dec.Decode(blob, out).ok());
    EXPECT_LT(RelMse(b[4], out), 0.5);
  }
  // With importances, a coordinate their floor keeps is coded at the minimum, not dropped: head
  // 0, which matters not at all, gets exactly its floor (the plain allocation, in quarter bits,
  // less 2.1: 0.15, 0.4, 0.65, 0.9, ... bits), and only raising a floor below 0.75 gives 0.75.
  o.importance.assign(size_t{kLayout.num_layers} * 2 * kLayout.num_kv_heads, 1.0);
  o.importance[0] = 0;
  o.importance_floor_bits = 2.1;
  auto floored = Calibrate(kLayout, samples, o);
  ASSERT_TRUE(floored.ok()) << floored.status();
  for (double bits : CoordinateBits(*floored)) EXPECT_GE(bits, 0.75 - 1e-6);
  const HeadTransform& h0 = floored->heads[0];
  int raised = 0;
  for (size_t c = 0; c < h0.step.size(); ++c)
    if (h0.step[c] > 0 &&
        std::abs(std::log2(std::sqrt(12.0 * h0.variance[c]) / h0.step[c]) - 0.75) < 1e-6)
      ++raised;
  EXPECT_GT(raised, 0);
  o.importance.clear();
  for (double bad : {-0.25, 8.5, std::nan("")}) {
    o.min_coordinate_bits = bad;
    EXPECT_EQ(Calibrate(kLayout, samples, o).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(Calibration, ImportanceMovesBitsWithinTheFloor) {
  Blocks b(kLayout, 4, 29);
  std::vector<std::span<const uint8_t>> samples = {b[0], b[1], b[2], b[3]};
  const size_t heads = size_t{kLayout.num_layers} * 2 * kLayout.num_kv_heads;
  CalibrateOptions o;
  o.bits_per_value = 2;
  auto plain = Calibrate(kLayout, samples, o);
  ASSERT_TRUE(plain.ok()) << plain.status();
  // Head 0 barely matters to the model, head 1 matters a lot.
  o.importance.assign(heads, 1.0);
  o.importance[0] = 1e-3;
  o.importance[1] = 30;
  o.importance_floor_bits = -1;
  auto free = Calibrate(kLayout, samples, o);
  o.importance_floor_bits = 0.5;
  auto floored = Calibrate(kLayout, samples, o);
  ASSERT_TRUE(free.ok() && floored.ok());
  const double d = kLayout.head_dim;
  const double p0 = HeadBits(plain->heads[0]), p1 = HeadBits(plain->heads[1]);
  EXPECT_LT(HeadBits(free->heads[0]), 0.25 * p0) << "unimportant head starved without a floor";
  EXPECT_GT(HeadBits(free->heads[1]), p1 + d);
  EXPECT_GT(HeadBits(floored->heads[0]), p0 - 0.5 * d - 0.1 * d) << "the floor holds";
  EXPECT_LT(HeadBits(floored->heads[0]), p0);
  EXPECT_GT(HeadBits(floored->heads[1]), p1);
  EXPECT_LE(floored->sample_bits, 2.0f);
  o.importance.resize(3);
  EXPECT_EQ(Calibrate(kLayout, samples, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.importance.assign(heads, -1.0);
  EXPECT_EQ(Calibrate(kLayout, samples, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.importance.assign(heads, 0.0);
  EXPECT_EQ(Calibrate(kLayout, samples, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.importance[2] = 1;  // only one head matters: the rest keep their floor
  auto one = Calibrate(kLayout, samples, o);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_GT(HeadBits(one->heads[0]), p0 - 0.6 * d);
  // One importance per (layer, tensor) is that importance for each of its heads.
  const size_t slices = heads / kLayout.num_kv_heads;
  o.importance.clear();
  std::vector<double> per_head;
  for (size_t s = 0; s < slices; ++s) {
    o.importance.push_back(1.0 + s);
    per_head.insert(per_head.end(), kLayout.num_kv_heads, 1.0 + s);
  }
  auto by_slice = Calibrate(kLayout, samples, o);
  o.importance = per_head;
  auto by_head = Calibrate(kLayout, samples, o);
  ASSERT_TRUE(by_slice.ok() && by_head.ok());
  EXPECT_EQ(by_slice->Id(), by_head->Id());
}

TEST(Calibration, UnknownCalibrationIsRefused) {
  Blocks b(kLayout, 3, 2);
  auto v1 = CalibrateOn(b, 0, 2, 1.5);
  auto other = CalibrateOn(b, 1, 2, 1.5);
  ASSERT_TRUE(v1 && other);
  PcaCodec codec(v1);
  auto& [set, p, enc, unused_dec] = codec;
  std::vector<uint8_t> blob, out(kLayout.BlockBytes());
  ASSERT_TRUE(enc.Encode(kLayout, p, b[2], &blob).ok());
  Decoder none;  // no set at all
  absl::Status s = none.Decode(blob, out);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find(CalibrationIdString(v1->Id())), std::string::npos) << s;
  CalibrationSet others;
  others.Add(other);
  Decoder wrong;
  wrong.set_calibrations(&others);
  EXPECT_EQ(wrong.Decode(blob, out).code(), absl::StatusCode::kNotFound);
  // The encoder refuses ids it lacks, and specs that only name a rate.
  CodecParams q = p;
  q.calibration_id = other->Id();
  EXPECT_EQ(enc.Encode(kLayout, q, b[2], &blob).code(), absl::StatusCode::kNotFound);
  auto rate_only = ParseCodecSpec("pca:b1.5");
  ASSERT_TRUE(rate_only.ok());
  EXPECT_EQ(enc.Encode(kLayout, *rate_only, b[2], &blob).code(),
            absl::StatusCode::kInvalidArgument);
  // A calibration of another geometry is refused, not misapplied.
  const KvLayout l2 = Layout(2, 1, 32, 64);  // tokens_per_block may differ; heads may not
  Blocks c(l2, 1, 3);
  EXPECT_EQ(enc.Encode(l2, p, c[0], &blob).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Calibration, OldBlobsDecodeAfterRecalibration) {
  Blocks b(kLayout, 5, 9);
  auto v1 = CalibrateOn(b, 0, 2, 1.5, 1);
  auto v2 = CalibrateOn(b, 2, 2, 1.5, 2);
  ASSERT_TRUE(v1 && v2);
  ASSERT_NE(v1->Id(), v2->Id());
  PcaCodec codec(v1);
  auto& [set, p1, enc, dec] = codec;
  CodecParams p2 = p1;
  std::vector<uint8_t> blob1, out1(kLayout.BlockBytes()), again(kLayout.BlockBytes());
  ASSERT_TRUE(enc.Encode(kLayout, p1, b[4], &blob1).ok());
  ASSERT_TRUE(dec.Decode(blob1, out1).ok());
  // The namespace moves to v2, its artefact arriving serialized (as replication will bring it).
  auto v2_copy = Calibration::Parse(v2->Serialize());
  ASSERT_TRUE(v2_copy.ok());
  p2.calibration_id = set.Add(std::make_shared<const Calibration>(*std::move(v2_copy)));
  EXPECT_EQ(p2.calibration_id, v2->Id());
  std::vector<uint8_t> blob2, out2(kLayout.BlockBytes());
  ASSERT_TRUE(enc.Encode(kLayout, p2, b[4], &blob2).ok());
  EXPECT_NE(blob1, blob2);
  ASSERT_TRUE(dec.Decode(blob2, out2).ok());
  ASSERT_TRUE(dec.Decode(blob1, again).ok());
  EXPECT_EQ(again, out1);
  EXPECT_EQ(set.Ids().size(), 2u);
}

// A set with a budget drops the least recently found or added calibration that nobody holds;
// its blobs are then refused as unknown (NotFound, so a client or daemon asks for it again),
// never decoded with another.
TEST(Calibration, ABoundedSetDropsTheLeastRecentlyUsedOneNobodyHolds) {
  Blocks b(kLayout, 7, 9);
  std::shared_ptr<const Calibration> v[3];
  for (uint32_t i = 0; i < 3; ++i) v[i] = CalibrateOn(b, 2 * i, 2, 1.5, i + 1);
  ASSERT_TRUE(v[0] && v[1] && v[2]);
  const uint64_t each = v[0]->MemoryBytes();
  EXPECT_GE(each, v[0]->Serialize().size());
  CalibrationSet set(2 * each + each / 2);
  Encoder enc;
  Decoder dec;
  enc.set_calibrations(&set);
  dec.set_calibrations(&set);
  std::vector<uint8_t> blob[3];
  for (uint32_t i = 0; i < 3; ++i) {
    CodecParams p;
    p.mode = Mode::kPca;
    p.calibration_id = v[i]->Id();
    set.Add(std::make_shared<const Calibration>(*v[i]));  // copies: the set's own references
    ASSERT_TRUE(enc.Encode(kLayout, p, b[6], &blob[i]).ok());
    if (i == 1) {
      ASSERT_NE(set.Find(v[0]->Id()), nullptr);  // v0 is now more recent than v1
    }
  }
  EXPECT_EQ(set.evictions(), 1u);
  EXPECT_EQ(set.Find(v[1]->Id()), nullptr);
  EXPECT_LE(set.bytes(), set.max_bytes());
  std::vector<uint8_t> out(kLayout.BlockBytes());
  EXPECT_TRUE(absl::IsNotFound(dec.Decode(blob[1], out)));
  EXPECT_TRUE(dec.Decode(blob[0], out).ok());
  EXPECT_TRUE(dec.Decode(blob[2], out).ok());

  // One held elsewhere stays; the set goes over its budget rather than drop it.
  std::shared_ptr<const Calibration> held = set.Find(v[0]->Id());
  set.Find(v[2]->Id());
  set.Add(std::make_shared<const Calibration>(*v[1]));
  EXPECT_NE(set.Find(v[0]->Id()), nullptr);
  EXPECT_NE(set.Find(v[1]->Id()), nullptr);
  EXPECT_EQ(set.Find(v[2]->Id()), nullptr);
  EXPECT_EQ(set.evictions(), 2u);
  held.reset();
  set.Add(std::make_shared<const Calibration>(*v[2]));  // now v0, the oldest, goes
  EXPECT_EQ(set.Find(v[0]->Id()), nullptr);
  EXPECT_EQ(set.Ids().size(), 2u);
  EXPECT_LE(set.bytes(), set.max_bytes());

  // Two threads that parsed the same id: the second's copy is not the one held, so Insert hands
  // back the held one, whose pin keeps it in the set.
  const uint64_t before = set.bytes();
  std::shared_ptr<const Calibration> pin = set.Insert(std::make_shared<const Calibration>(*v[2]));
  EXPECT_EQ(pin, set.Find(v[2]->Id()));
  EXPECT_EQ(set.bytes(), before);
  set.Add(std::make_shared<const Calibration>(*v[0]));
  set.Add(std::make_shared<const Calibration>(*v[1]));
  EXPECT_EQ(set.Find(v[2]->Id()), pin);
}

// A token unlike the calibration samples is stored exactly: here, as with an attention sink's
// KV, a token of tiny norm in data whose mean is far from zero.
TEST(Calibration, OutlierTokenIsStoredExactly) {
  const size_t row = size_t{kLayout.num_kv_heads} * kLayout.head_dim;  // values per token
  const size_t tensor_values = row * kLayout.tokens_per_block, n = kLayout.BlockBytes() / 2;
  std::mt19937 rng(5);
  std::normal_distribution<float> g;
  auto make = [&](bool sink) {
    std::vector<uint8_t> block(kLayout.BlockBytes());
    for (size_t i = 0; i < n; ++i) {
      const size_t tok = (i % tensor_values) / row, ch = i % row;
      float x = 1.0f + 0.1f * static_cast<float>(ch % 5) + 0.3f * g(rng);
      if (sink && tok == 5) x = 0.001f * static_cast<float>(ch % 3);
      const uint16_t h = FloatToHalf(x);
      std::memcpy(block.data() + 2 * i, &h, 2);
    }
    return block;
  };
  std::vector<std::vector<uint8_t>> samples = {make(false), make(false)};
  std::vector<std::span<const uint8_t>> spans(samples.begin(), samples.end());
  CalibrateOptions o;
  o.bits_per_value = 1.0;
  auto cal = Calibrate(kLayout, spans, o);
  ASSERT_TRUE(cal.ok()) << cal.status();
  PcaCodec codec(std::make_shared<const Calibration>(*std::move(cal)));
  auto& [set, p, enc, dec] = codec;
  const std::vector<uint8_t> block = make(true);
  std::vector<uint8_t> blob, out(block.size());
  p.first_position = kLayout.tokens_per_block;  // not the sequence's first block
  ASSERT_TRUE(enc.Encode(kLayout, p, block, &blob).ok());
  ASSERT_TRUE(dec.Decode(blob, out).ok());
  for (size_t t = 0; t < 4; ++t)
    EXPECT_EQ(std::memcmp(out.data() + 2 * (t * tensor_values + 5 * row),
                          block.data() + 2 * (t * tensor_values + 5 * row), 2 * row),
              0)
        << "tensor " << t;
  EXPECT_NE(std::memcmp(out.data(), block.data(), 2 * row), 0);  // token 0 is coded, lossy
}

// The first block of a sequence keeps its first token (the attention sink) exact in every
// section, though nothing about its values stands out; a later block codes its first token.
TEST(Calibration, SequenceFirstTokenIsStoredExactly) {
  Blocks b(kLayout, 6, 17);
  auto cal = CalibrateOn(b, 0, 4, 1.0);
  ASSERT_TRUE(cal);
  PcaCodec codec(cal);
  auto& [set, p, enc, dec] = codec;
  const size_t row_bytes = 2 * size_t{kLayout.num_kv_heads} * kLayout.head_dim;
  const size_t sections = kLayout.BlockBytes() / (row_bytes * kLayout.tokens_per_block);
  const std::span<const uint8_t> block = b[5];
  std::vector<uint8_t> start_blob, later_blob, out(block.size());
  p.first_position = 0;
  ASSERT_TRUE(enc.Encode(kLayout, p, block, &start_blob).ok());
  ASSERT_TRUE(dec.Decode(start_blob, out).ok());
  for (size_t sec = 0; sec < sections; ++sec) {
    const size_t first_row = sec * kLayout.tokens_per_block * row_bytes;
    EXPECT_EQ(std::memcmp(out.data() + first_row, block.data() + first_row, row_bytes), 0)
        << "section " << sec;
    EXPECT_NE(std::memcmp(out.data() + first_row + row_bytes, block.data() + first_row + row_bytes,
                          row_bytes),
              0)
        << "section " << sec << ": token 1 is coded, lossy";
  }
  p.first_position = kLayout.tokens_per_block;
  ASSERT_TRUE(enc.Encode(kLayout, p, block, &later_blob).ok());
  ASSERT_TRUE(dec.Decode(later_blob, out).ok());
  EXPECT_NE(std::memcmp(out.data(), block.data(), row_bytes), 0);
  // The sink costs its raw rows and little else.
  EXPECT_LE(start_blob.size(), later_blob.size() + sections * (row_bytes + 16));
}

// A section may hold the sink plus max(1, T/128) tokens the error rule picked; a blob whose
// section claims more is refused before any of them is read.
TEST(Calibration, TooManyExactTokensAreRefused) {
  Blocks b(kLayout, 5, 19);
  auto cal = CalibrateOn(b, 0, 4, 1.0);
  ASSERT_TRUE(cal);
  PcaCodec codec(cal);
  auto& [set, p, enc, dec] = codec;
  std::vector<uint8_t> blob, out(kLayout.BlockBytes());
  p.first_position = 0;
  ASSERT_TRUE(enc.Encode(kLayout, p, b[4], &blob).ok());
  ASSERT_TRUE(dec.Decode(blob, out).ok());
  // The first section's payload (table entry at 64: u64 offset at +8): u16 maxq, u16 coded
  // coordinates, u16 exact tokens.
  uint64_t payload = 0;
  std::memcpy(&payload, blob.data() + 64 + 8, 8);
  uint16_t exact = 0;
  std::memcpy(&exact, blob.data() + payload + 4, 2);
  EXPECT_GE(exact, 1u) << "the sink";
  const uint16_t too_many = std::max<uint16_t>(1, kLayout.tokens_per_block / 128) + 2;
  std::memcpy(blob.data() + payload + 4, &too_many, 2);
  const uint32_t crc = Crc32c(blob.data(), blob.size() - 4);
  std::memcpy(blob.data() + blob.size() - 4, &crc, 4);
  const absl::Status refused = dec.Decode(blob, out);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
  EXPECT_NE(refused.message().find("too many exact tokens"), std::string::npos) << refused;
}

// Keys calibrated with RoPE undone: the blob carries its block's position, and the decoder
// re-applies RoPE at it. The synthetic keys are RoPE-rotated (theta 10000, rotate-half pairs).
TEST(Calibration, RopeUndoneKeysRoundTripAtTheirPosition) {
  Blocks b(kLayout, 6, 13);
  std::vector<std::span<const uint8_t>> samples = {b[0], b[1], b[2], b[3]};
  CalibrateOptions o;
  o.bits_per_value = 2.0;
  o.rope_theta = 10000;
  auto rope = Calibrate(kLayout, samples, o);
  ASSERT_TRUE(rope.ok()) << rope.status();
  EXPECT_FLOAT_EQ(rope->rope_theta, 10000.0f);
  auto parsed = Calibration::Parse(rope->Serialize());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FLOAT_EQ(parsed->rope_theta, 10000.0f);
  PcaCodec codec(std::make_shared<const Calibration>(*std::move(rope)));
  auto& [set, p, enc, dec] = codec;
  p.first_position = 5 * kLayout.tokens_per_block;
  std::vector<uint8_t> blob, out(kLayout.BlockBytes()), shifted(kLayout.BlockBytes());
  ASSERT_TRUE(enc.Encode(kLayout, p, b[5], &blob).ok());
  auto info = InspectBlob(blob);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->params.first_position, p.first_position);
  ASSERT_TRUE(dec.Decode(blob, out).ok());
  const double good = RelMse(b[5], out);
  EXPECT_LT(good, 0.1);
  // The same payload read at another position decodes to wrongly rotated keys.
  const uint32_t other = 7;
  std::memcpy(blob.data() + 36, &other, 4);
  const uint32_t crc = Crc32c(blob.data(), blob.size() - 4);
  std::memcpy(blob.data() + blob.size() - 4, &crc, 4);
  ASSERT_TRUE(dec.Decode(blob, shifted).ok());
  EXPECT_GT(RelMse(b[5], shifted), 2 * good);
}

TEST(Calibration, SpecStrings) {
  struct Good {
    const char* spec;
    uint64_t id;
    float target, rate;
  };
  for (const Good& g : {Good{"pca:b1.5", 0, 1.5f, 0},
                        Good{"pca:00000000deadbeef", 0xdeadbeef, 0, 0},
                        Good{"pca:b1.5:r1.6", 0, 1.5f, 1.6f},
                        Good{"pca:00000000deadbeef:r2", 0xdeadbeef, 0, 2},
                        Good{"pca:r0.75", 0, 0, 0.75f}}) {
    auto p = ParseCodecSpec(g.spec);
    ASSERT_TRUE(p.ok()) << g.spec << ": " << p.status();
    EXPECT_EQ(p->mode, Mode::kPca) << g.spec;
    EXPECT_EQ(p->calibration_id, g.id) << g.spec;
    EXPECT_FLOAT_EQ(p->pca_target_bits, g.target) << g.spec;
    EXPECT_FLOAT_EQ(p->rate_bits, g.rate) << g.spec;
    EXPECT_EQ(CodecSpecString(*p), g.spec);
  }
  for (const char* bad : {"pca", "pca:b0", "pca:b9", "pca:0000000000000000", "pca:beef",
                          "pca:b1:b2", "pca:xyz", "pca:b1.5:r0", "pca:b1.5:r17", "pca:b1.5:e0.1",
                          "pca:b1.5:r1:r2", "pca:r0", "pca:r1.5:b1", "pca:b1.5:"})
    EXPECT_FALSE(ParseCodecSpec(bad).ok()) << bad;
}

// The step codes of a pca blob's sections (SectionEntry::bits).
std::vector<uint8_t> StepCodes(std::span<const uint8_t> blob) {
  std::vector<uint8_t> codes;
  auto v = ParseBlob(blob);
  EXPECT_TRUE(v.ok()) << v.status();
  if (!v.ok()) return codes;
  for (const SectionEntry& e : v->sections)
    if (e.type != SectionType::kStream) codes.push_back(e.bits);
  return codes;
}

// A bit budget's search (`pca:...:rR`; an encoder's first block of a budget, and every block
// with the one-pass coding off) holds on every block, is nearly spent (the finest common step
// scale that fits), and a larger one buys less error; every section carries the block's code.
TEST(Calibration, BitBudgetHoldsOnEveryBlockAndIsSpent) {
  Blocks b(kLayout, 8, 21);
  auto cal = CalibrateOn(b, 0, 4, 1.5);
  ASSERT_TRUE(cal);
  PcaCodec codec(cal);
  auto& [set, p, enc, dec] = codec;
  enc.set_pca_one_pass(false);
  const double values = kLayout.BlockBytes() / 2.0;
  std::vector<double> last_mse(8, 1e9);
  for (float budget : {0.8f, 1.2f, 1.7f, 2.4f}) {
    for (size_t i = 4; i < 8; ++i) {  // the encoder's search starts where its last one ended
      SCOPED_TRACE(::testing::Message() << "block " << i << " budget " << budget);
      CodecParams q = p;
      q.rate_bits = budget;
      std::vector<uint8_t> blob, out(kLayout.BlockBytes());
      ASSERT_TRUE(enc.Encode(kLayout, q, b[i], &blob).ok());
      ASSERT_TRUE(dec.Decode(blob, out).ok());
      const double bits = 8.0 * blob.size() / values;
      EXPECT_LE(bits, budget);
      const std::vector<uint8_t> codes = StepCodes(blob);
      ASSERT_FALSE(codes.empty());
      for (uint8_t c : codes) EXPECT_EQ(c, codes[0]);
      EXPECT_NE(codes[0], 0);
      // Spent: one code finer does not fit; and the same blob from an encoder that has not
      // seen the previous blocks (the search starts elsewhere).
      ASSERT_GT(codes[0], 1);
      CodecParams finer = p;
      finer.pca_step_code = static_cast<uint8_t>(codes[0] - 1);
      std::vector<uint8_t> more, fresh_blob;
      ASSERT_TRUE(enc.Encode(kLayout, finer, b[i], &more).ok());
      EXPECT_GT(8.0 * more.size() / values, budget) << "code " << int{codes[0]};
      Encoder fresh;
      fresh.set_calibrations(&set);
      ASSERT_TRUE(fresh.Encode(kLayout, q, b[i], &fresh_blob).ok());
      EXPECT_EQ(fresh_blob, blob);
      const double mse = RelMse(b[i], out);
      EXPECT_LT(mse, last_mse[i]);
      last_mse[i] = mse;
    }
  }
}

// Once an encoder has seen a few blocks of a namespace, its bit budget's search (the one-pass
// coding off) tries one code for most blocks (the size model, corrected by each block's trial),
// and what it keeps is still the finest code that fits.
TEST(Calibration, BitBudgetSearchTriesOneCodeForMostBlocks) {
  const KvLayout layout = Layout(4, 2, 64, 256);
  Blocks b(layout, 20, 31);
  auto cal = CalibrateOn(b, 0, 4, 2.0);
  ASSERT_TRUE(cal);
  PcaCodec codec(cal);
  auto& [set, p, enc, dec] = codec;
  enc.set_pca_one_pass(false);
  const double values = layout.BlockBytes() / 2.0;
  for (float budget : {1.3f, 1.8f}) {
    uint64_t late_trials = 0, late_blocks = 0;
    for (size_t i = 4; i < 20; ++i) {
      SCOPED_TRACE(::testing::Message() << "block " << i << " budget " << budget);
      CodecParams q = p;
      q.rate_bits = budget;
      q.first_position = uint64_t{i} * layout.tokens_per_block;
      std::vector<uint8_t> blob, more, out(layout.BlockBytes());
      const uint64_t trials_before = enc.budget_trial_encodes();
      ASSERT_TRUE(enc.Encode(layout, q, b[i], &blob).ok());
      const uint64_t trials = enc.budget_trial_encodes() - trials_before;
      ASSERT_GE(trials, 1u);  // counted, so the bound below means something
      EXPECT_LE(8.0 * blob.size() / values, budget);
      ASSERT_TRUE(dec.Decode(blob, out).ok());
      const uint8_t code = StepCodes(blob)[0];
      ASSERT_GT(code, 1);
      CodecParams finer = q;
      finer.rate_bits = 0;
      finer.pca_step_code = static_cast<uint8_t>(code - 1);
      ASSERT_TRUE(enc.Encode(layout, finer, b[i], &more).ok());
      EXPECT_GT(8.0 * more.size() / values, budget) << "code " << int{code};
      if (i >= 12) {
        late_trials += trials;
        ++late_blocks;
      }
    }
    EXPECT_LE(late_trials, late_blocks * 3 / 2) << late_trials << " trials for " << late_blocks
                                                << " blocks at " << budget << " bits/value";
  }
}

// Blocks of fewer tokens than a vector of 16, down to one (the sequence's first token alone,
// kept exact): each blob decodes, within the budget or (where its tables and headers alone
// exceed it) at the coarsest code.
TEST(Calibration, BitBudgetHoldsOnBlocksOfFewTokens) {
  for (uint32_t tokens : {1u, 8u, 24u}) {
    SCOPED_TRACE(::testing::Message() << tokens << " tokens");
    const KvLayout layout = Layout(2, 2, 32, tokens);
    Blocks b(layout, 8, 43);
    auto cal = CalibrateOn(b, 0, 4, 2.0);
    ASSERT_TRUE(cal);
    PcaCodec codec(cal);
    auto& [set, p, enc, dec] = codec;
    const double values = layout.BlockBytes() / 2.0;
    for (size_t i : {size_t{0}, size_t{4}, size_t{5}, size_t{6}}) {
      CodecParams q = p;
      q.rate_bits = 3.0f;
      q.first_position = uint64_t{i} * tokens;
      std::vector<uint8_t> blob, out(layout.BlockBytes());
      ASSERT_TRUE(enc.Encode(layout, q, b[i], &blob).ok()) << "block " << i;
      EXPECT_TRUE(dec.Decode(blob, out).ok()) << "block " << i;
      if (8.0 * blob.size() / values > 3.0) {
        // Past the budget at the coarsest code, or raw where that blob would be larger than
        // the block (one token: the tables outweigh its 512 bytes).
        auto v = ParseBlob(blob);
        ASSERT_TRUE(v.ok()) << v.status();
        if (v->header.mode == static_cast<uint8_t>(Mode::kRaw)) {
          EXPECT_TRUE(std::equal(out.begin(), out.end(), b[i].begin())) << "block " << i;
        } else {
          EXPECT_EQ(StepCodes(blob)[0], 255) << "block " << i;
        }
      }
    }
  }
}

// Budgets at the coarsest codes: where only the coarsest codes fit, or none does, the encoder
// still hands back this block's blob (never what the caller's vector held before), within the
// budget where any code fits, at code 255 where none does.
TEST(Calibration, BitBudgetsAtTheCoarsestCodesReturnTheBlocksBlob) {
  Blocks b(kLayout, 6, 41);
  auto cal = CalibrateOn(b, 0, 4, 1.5);
  ASSERT_TRUE(cal);
  PcaCodec codec(cal);
  auto& [set, p, enc, dec] = codec;
  const double values = kLayout.BlockBytes() / 2.0;
  for (size_t i = 4; i < 6; ++i) {
    // The coarsest code whose blob is larger than code 255's (coarser ones round every
    // coordinate to zero alike).
    std::vector<uint8_t> at255, larger;
    CodecParams fixed = p;
    fixed.pca_step_code = 255;
    ASSERT_TRUE(enc.Encode(kLayout, fixed, b[i], &at255).ok());
    int below = 254;
    for (; below > 128; --below) {
      fixed.pca_step_code = static_cast<uint8_t>(below);
      ASSERT_TRUE(enc.Encode(kLayout, fixed, b[i], &larger).ok());
      if (larger.size() > at255.size()) break;
    }
    ASSERT_GT(larger.size(), at255.size());
    const double between = 8.0 * (larger.size() + at255.size()) / 2.0 / values;
    const double under = 8.0 * (at255.size() - 1) / values;
    for (double budget : {between, under, 8.0 * at255.size() * 1.01 / values,
                          8.0 * at255.size() * 1.03 / values, 8.0 * at255.size() * 1.06 / values}) {
      SCOPED_TRACE(::testing::Message() << "block " << i << " budget " << budget);
      CodecParams q = p;
      q.rate_bits = static_cast<float>(budget);
      std::vector<uint8_t> blob = {0xde, 0xad}, out(kLayout.BlockBytes());
      ASSERT_TRUE(enc.Encode(kLayout, q, b[i], &blob).ok());
      ASSERT_TRUE(dec.Decode(blob, out).ok());
      const uint8_t code = StepCodes(blob)[0];
      if (budget == under) {
        EXPECT_EQ(code, 255);
        EXPECT_EQ(blob, at255);
      } else {
        EXPECT_LE(8.0 * blob.size() / values, budget);
        if (budget == between) {
          EXPECT_GT(code, below);
        }
      }
    }
  }
}

// Code 128 is the calibrated steps: it decodes to what a blob without a code (0) decodes to.
// A budget below what the coarsest steps reach stores the block at the coarsest, not refused.
TEST(Calibration, StepScaleCodes) {
  Blocks b(kLayout, 5, 22);
  auto cal = CalibrateOn(b, 0, 4, 1.5);
  ASSERT_TRUE(cal);
  PcaCodec codec(cal);
  auto& [set, p, enc, dec] = codec;
  std::vector<uint8_t> plain, scaled, a(kLayout.BlockBytes()), c(kLayout.BlockBytes());
  CodecParams one = p;
  one.pca_step_code = 128;
  ASSERT_TRUE(enc.Encode(kLayout, p, b[4], &plain).ok());
  ASSERT_TRUE(enc.Encode(kLayout, one, b[4], &scaled).ok());
  EXPECT_EQ(plain.size(), scaled.size());
  EXPECT_NE(plain, scaled);  // the sections' codes
  ASSERT_TRUE(dec.Decode(plain, a).ok());
  ASSERT_TRUE(dec.Decode(scaled, c).ok());
  EXPECT_EQ(a, c);
  CodecParams tiny = p;
  tiny.rate_bits = 0.01f;
  ASSERT_TRUE(enc.Encode(kLayout, tiny, b[4], &scaled).ok());
  EXPECT_EQ(StepCodes(scaled)[0], 255);
  EXPECT_GT(8.0 * scaled.size() / (kLayout.BlockBytes() / 2.0), 0.01);
  EXPECT_LT(scaled.size(), plain.size());
  ASSERT_TRUE(dec.Decode(scaled, c).ok());
  // Step codes are pca's alone; pca takes no error target.
  CodecParams quant = *ParseCodecSpec("quant:k4v4");
  quant.pca_step_code = 100;
  EXPECT_EQ(enc.Encode(kLayout, quant, b[4], &scaled).code(), absl::StatusCode::kInvalidArgument);
  CodecParams target = p;
  target.error_target = 0.1f;
  EXPECT_EQ(enc.Encode(kLayout, target, b[4], &scaled).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Calibration, BlobHeaderIdOnlyInPcaBlobs) {
  Blocks b(kLayout, 1, 4);
  auto raw = Encode(kLayout, CodecParams{}, b[0]);
  ASSERT_TRUE(raw.ok());
  std::vector<uint8_t> bad = *raw;
  bad[56] = 1;
  const uint32_t crc = Crc32c(bad.data(), bad.size() - 4);
  std::memcpy(bad.data() + bad.size() - 4, &crc, 4);
  EXPECT_EQ(InspectBlob(bad).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace strata::codec
