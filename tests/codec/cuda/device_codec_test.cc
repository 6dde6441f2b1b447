// The CUDA kernels on a GPU, against the CPU codec byte for byte. Every test that needs a
// device skips (GTEST_SKIP) when cudaGetDeviceCount fails or finds none, so ctest reports them
// as skipped on machines without a GPU; the argument checks run everywhere.
#include "codec/cuda/device_codec.h"
#include "codec/cuda/device_decoder.h"
#include "codec/cuda/device_encoder.h"

#include <cstring>
#include <random>
#include <vector>

#include "codec/codec.h"
#include "codec/half.h"
#include "codec/internal/kernels.h"
#include "codec/synthetic_kv.h"
#include "gtest/gtest.h"
#include "tests/codec/cuda_reference.h"

namespace strata::codec {
namespace {

using cuda::DeviceBuffer;
using cuda_test::CpuBlock;
using cuda_test::EncodeOnCpu;
using test::Layout;

class CudaDevice : public testing::Test {
 protected:
  void SetUp() override {
    const absl::Status s = cuda::DeviceAvailable();
    if (!s.ok()) GTEST_SKIP() << "CUDA kernel test skipped, no GPU here: " << s.message();
  }
};

DeviceBuffer Upload(const void* host, size_t bytes) {
  auto b = DeviceBuffer::Allocate(bytes);
  EXPECT_TRUE(b.ok()) << b.status();
  if (!b.ok()) return DeviceBuffer();
  const absl::Status s = b->Upload(host, bytes);
  EXPECT_TRUE(s.ok()) << s;
  return std::move(*b);
}
template <typename T>
DeviceBuffer Upload(const std::vector<T>& v) {
  return Upload(v.data(), v.size() * sizeof(T));
}
DeviceBuffer Alloc(size_t bytes) {
  auto b = DeviceBuffer::Allocate(bytes);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : DeviceBuffer();
}
template <typename T>
std::vector<T> Download(const DeviceBuffer& b, size_t count) {
  std::vector<T> v(count);
  const absl::Status s = b.Download(v.data(), count * sizeof(T));
  EXPECT_TRUE(s.ok()) << s;
  return v;
}

TEST_F(CudaDevice, GroupwiseMatchesTheCpu) {
  struct Case {
    DType dt;
    uint32_t heads, dim, tokens;
    uint16_t group;
  };
  const Case cases[] = {{DType::kFloat16, 8, 128, 256, 64},
                        {DType::kFloat16, 3, 48, 7, 100},
                        {DType::kBFloat16, 2, 32, 9, 32},
                        {DType::kFloat32, 1, 64, 5, 7}};
  for (const Case& c : cases) {
    const KvLayout l = Layout(2, c.heads, c.dim, c.tokens, c.dt);
    const std::vector<uint8_t> block = GenerateSyntheticKv(l, 1);
    DeviceBuffer d_block = Upload(block);
    for (uint8_t bits = 2; bits <= 8; ++bits) {
      CodecParams p;
      p.mode = Mode::kGroupwise;
      p.key_bits = p.value_bits = bits;
      p.group_size = c.group;
      const CpuBlock cpu = EncodeOnCpu(l, p, block);
      for (const auto& s : cpu.sections) {
        const size_t n = s.bytes / DTypeBytes(c.dt);
        ASSERT_EQ(cuda::GroupwisePayloadBytes(n, bits, c.group), s.payload.size());
        DeviceBuffer d_payload = Alloc(s.payload.size());
        ASSERT_TRUE(cuda::GroupwiseEncode(d_block.as<uint8_t>() + s.block_offset, c.dt, n, bits,
                                          c.group, d_payload.as<uint8_t>())
                        .ok());
        EXPECT_EQ(Download<uint8_t>(d_payload, s.payload.size()), s.payload)
            << "bits " << int(bits) << " group " << c.group;
        DeviceBuffer d_cpu_payload = Upload(s.payload);
        DeviceBuffer d_out = Alloc(s.bytes);
        ASSERT_TRUE(cuda::GroupwiseDecode(d_cpu_payload.as<uint8_t>(), s.payload.size(), c.dt, n,
                                          bits, c.group, d_out.data())
                        .ok());
        const auto out = Download<uint8_t>(d_out, s.bytes);
        EXPECT_EQ(std::memcmp(out.data(), cpu.decoded.data() + s.block_offset, s.bytes), 0)
            << "bits " << int(bits) << " group " << c.group;
      }
    }
  }
}

TEST_F(CudaDevice, HadamardMatchesTheCpu) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (uint32_t n = 1; n <= 8192; n *= 2) {
    const size_t rows = 8192 * 4 / n + 1;
    std::vector<float> x(rows * n);
    for (float& v : x) v = nd(rng);
    std::vector<float> cpu = x;
    internal::HadamardRowsSimd(cpu.data(), rows, n);
    DeviceBuffer d = Upload(x);
    ASSERT_TRUE(cuda::HadamardRows(d.as<float>(), rows, n).ok());
    const auto fwd = Download<float>(d, x.size());
    EXPECT_EQ(std::memcmp(fwd.data(), cpu.data(), x.size() * 4), 0) << "n " << n;
    ASSERT_TRUE(cuda::InverseHadamardRows(d.as<float>(), rows, n).ok());
    internal::HadamardRowsSimd(cpu.data(), rows, n);
    const auto back = Download<float>(d, x.size());
    EXPECT_EQ(std::memcmp(back.data(), cpu.data(), x.size() * 4), 0) << "n " << n;
  }
}

struct QuantCase {
  DType dt;
  uint32_t heads, dim, tokens;
  uint16_t group;
  bool had, delta;
  uint8_t kbits, vbits;
};

TEST_F(CudaDevice, QuantMatchesTheCpu) {
  const QuantCase cases[] = {
      {DType::kFloat16, 8, 128, 256, 64, false, true, 4, 4},
      {DType::kFloat16, 8, 128, 256, 64, true, true, 3, 4},
      {DType::kFloat16, 8, 128, 256, 64, false, false, 2, 2},
      {DType::kFloat16, 8, 128, 16, 64, false, true, 8, 8},
      {DType::kFloat16, 2, 128, 33, 48, true, true, 4, 3},
      {DType::kBFloat16, 4, 64, 64, 64, true, true, 4, 4},
      {DType::kFloat32, 1, 64, 9, 20, false, true, 5, 6},
      {DType::kFloat16, 3, 16, 1, 16, true, true, 4, 4},
  };
  cuda::QuantKernels qk;
  for (const QuantCase& c : cases) {
    const KvLayout l = Layout(2, c.heads, c.dim, c.tokens, c.dt);
    const std::vector<uint8_t> block = GenerateSyntheticKv(l, 1);
    CodecParams p;
    p.mode = Mode::kQuant;
    p.key_bits = c.kbits;
    p.value_bits = c.vbits;
    p.group_size = c.group;
    p.hadamard = c.had;
    p.token_delta = c.delta;
    const CpuBlock cpu = EncodeOnCpu(l, p, block);
    DeviceBuffer d_block = Upload(block);
    for (const auto& s : cpu.sections) {
      SCOPED_TRACE(testing::Message()
                   << (s.is_key ? "K" : "V") << " layer " << s.layer << " bits " << int(s.bits)
                   << " T " << c.tokens << " dim " << c.dim << (c.had ? " had" : ""));
      cuda::QuantSection qs;
      qs.tokens = c.tokens;
      qs.heads = c.heads;
      qs.head_dim = c.dim;
      qs.dtype = c.dt;
      qs.is_key = s.is_key;
      qs.bits = s.bits;
      qs.group = c.group;
      qs.hadamard = c.had;
      qs.token_delta = c.delta;
      const size_t C = qs.channels(), n = qs.values();
      ASSERT_EQ(qs.steps(), s.steps16.size());
      DeviceBuffer mu16 = Alloc(C * 2), a16 = Alloc(C), steps16 = Alloc(qs.steps() * 2),
                   syms = Alloc(n * 2);
      cuda::QuantArrays arr{mu16.as<uint16_t>(), a16.as<uint8_t>(), steps16.as<uint16_t>(),
                            syms.as<uint16_t>()};
      ASSERT_TRUE(qk.Encode(d_block.as<uint8_t>() + s.block_offset, qs, arr).ok());
      EXPECT_EQ(Download<uint16_t>(mu16, C), s.mu16);
      if (c.delta) {
        EXPECT_EQ(Download<uint8_t>(a16, C), s.a16);
      }
      EXPECT_EQ(Download<uint16_t>(steps16, qs.steps()), s.steps16);
      EXPECT_EQ(Download<uint16_t>(syms, n), s.syms);
      // Decode from the CPU's arrays.
      DeviceBuffer c_mu = Upload(s.mu16), c_steps = Upload(s.steps16), c_syms = Upload(s.syms);
      DeviceBuffer c_a = c.delta ? Upload(s.a16) : DeviceBuffer();
      DeviceBuffer d_out = Alloc(s.bytes);
      cuda::QuantArrays in{c_mu.as<uint16_t>(), c_a.as<uint8_t>(), c_steps.as<uint16_t>(),
                           c_syms.as<uint16_t>()};
      ASSERT_TRUE(qk.Decode(in, qs, d_out.data()).ok());
      const auto out = Download<uint8_t>(d_out, s.bytes);
      EXPECT_EQ(std::memcmp(out.data(), cpu.decoded.data() + s.block_offset, s.bytes), 0);
    }
  }
}

TEST_F(CudaDevice, QuantWithKeyOutliersMatchesTheCpu) {
  cuda::QuantKernels qk;
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    for (bool had : {false, true}) {
      const uint32_t heads = 8, dim = 128, T = 64;
      const KvLayout l = Layout(2, heads, dim, T, dt);
      const std::vector<uint8_t> block = GenerateSyntheticKv(l, 1);
      CodecParams p;
      p.mode = Mode::kQuant;
      p.key_bits = 3;
      p.value_bits = 3;
      p.hadamard = had;
      p.key_outliers = true;
      const CpuBlock cpu = EncodeOnCpu(l, p, block);
      DeviceBuffer d_block = Upload(block);
      for (const auto& s : cpu.sections) {
        if (!s.is_key) continue;
        SCOPED_TRACE(testing::Message() << "layer " << s.layer << (had ? " had" : ""));
        cuda::QuantSection qs;
        qs.tokens = T;
        qs.heads = heads;
        qs.head_dim = dim;
        qs.dtype = dt;
        qs.is_key = true;
        qs.bits = s.bits;
        qs.hadamard = had;
        qs.key_outliers = true;
        const size_t C = qs.channels(), n = qs.values(), slots = heads * qs.outliers_per_head();
        const size_t eb = DTypeBytes(dt);
        DeviceBuffer mu16 = Alloc(C * 2), a16 = Alloc(C), steps16 = Alloc(C * 2),
                     syms = Alloc(n * 2), count = Alloc(heads * 2), idx = Alloc(slots * 2),
                     vals = Alloc(T * slots * eb);
        cuda::QuantArrays arr{mu16.as<uint16_t>(), a16.as<uint8_t>(), steps16.as<uint16_t>(),
                              syms.as<uint16_t>(), count.as<uint16_t>(), idx.as<uint16_t>(),
                              vals.as<uint8_t>()};
        ASSERT_TRUE(qk.Encode(d_block.as<uint8_t>() + s.block_offset, qs, arr).ok());
        EXPECT_EQ(Download<uint16_t>(syms, n), s.syms);
        EXPECT_EQ(Download<uint16_t>(steps16, C), s.steps16);
        const auto counts = Download<uint16_t>(count, heads);
        const auto picks = Download<uint16_t>(idx, slots);
        const auto kept = Download<uint8_t>(vals, T * slots * eb);
        std::vector<uint16_t> flat;
        std::vector<uint8_t> flat_vals;
        for (uint32_t h = 0; h < heads; ++h)
          for (uint32_t i = 0; i < counts[h]; ++i)
            flat.push_back(picks[h * qs.outliers_per_head() + i]);
        for (uint32_t t = 0; t < T; ++t)
          for (uint32_t h = 0; h < heads; ++h)
            for (uint32_t i = 0; i < counts[h]; ++i) {
              const uint8_t* v = kept.data() + ((size_t{t} * heads + h) * qs.outliers_per_head()
                                                + i) * eb;
              flat_vals.insert(flat_vals.end(), v, v + eb);
            }
        EXPECT_EQ(flat, s.outlier_idx);
        EXPECT_EQ(flat_vals, s.outlier_vals);
        // Decode from the CPU's payload fields.
        DeviceBuffer c_mu = Upload(s.mu16), c_steps = Upload(s.steps16), c_syms = Upload(s.syms),
                     c_a = Upload(s.a16), c_idx = Upload(s.outlier_idx),
                     c_vals = Upload(s.outlier_vals);
        DeviceBuffer d_out = Alloc(s.bytes);
        cuda::QuantArrays in{c_mu.as<uint16_t>(), c_a.as<uint8_t>(), c_steps.as<uint16_t>(),
                             c_syms.as<uint16_t>(), nullptr, c_idx.as<uint16_t>(),
                             c_vals.as<uint8_t>(), static_cast<uint32_t>(s.outlier_idx.size())};
        ASSERT_TRUE(qk.Decode(in, qs, d_out.data()).ok());
        const auto out = Download<uint8_t>(d_out, s.bytes);
        EXPECT_EQ(std::memcmp(out.data(), cpu.decoded.data() + s.block_offset, s.bytes), 0);
      }
    }
  }
}

// A whole blob decoded into device memory: the CPU Decoder's bytes, every mode and coder.
TEST_F(CudaDevice, DeviceDecoderMatchesTheCpuDecoder) {
  cuda::DeviceDecoder dd;
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    const KvLayout l = Layout(4, 8, 128, 64, dt);
    const std::vector<uint8_t> block = GenerateSyntheticKv(l, 1);
    for (const char* spec : {"quant:k4v4", "quant:k3v3:ol", "quant:k2v3:had:ol", "quant:k8v7",
                             "quant:k4v4:nodelta", "int4-g64", "lossless", "raw"}) {
      SCOPED_TRACE(spec);
      auto p = ParseCodecSpec(spec);
      ASSERT_TRUE(p.ok()) << p.status();
      auto blob = Encode(l, *p, block);
      ASSERT_TRUE(blob.ok()) << blob.status();
      std::vector<uint8_t> want(block.size());
      ASSERT_TRUE(Decode(*blob, want).ok());
      DeviceBuffer d_out = Alloc(block.size());
      ASSERT_TRUE(dd.Decode(*blob, d_out.data(), block.size()).ok());
      EXPECT_EQ(Download<uint8_t>(d_out, block.size()), want);
    }
  }
  // A damaged blob is the Decoder's error.
  const KvLayout l = Layout(2, 2, 64, 16, DType::kFloat16);
  auto blob = Encode(l, *ParseCodecSpec("quant:k4v4"), GenerateSyntheticKv(l, 1));
  ASSERT_TRUE(blob.ok());
  (*blob)[blob->size() / 2] ^= 0x40;
  DeviceBuffer d_out = Alloc(l.BlockBytes());
  EXPECT_FALSE(dd.Decode(*blob, d_out.data(), l.BlockBytes()).ok());
}

// Item 4 of the GPU tier: a block that lives in device memory is encoded there, and the blob
// is the CPU Encoder's byte for byte (decoded on the device again, it is the CPU's block).
TEST_F(CudaDevice, DeviceEncoderMatchesTheCpuEncoder) {
  cuda::DeviceEncoder de;
  cuda::DeviceDecoder dd;
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    const KvLayout l = Layout(4, 8, 128, 64, dt);
    const std::vector<uint8_t> block = GenerateSyntheticKv(l, 1);
    DeviceBuffer d_block = Upload(block);
    for (const char* spec : {"quant:k4v4", "quant:k3v3:ol", "quant:k2v3:had:ol", "quant:k8v7",
                             "quant:k4v4:nodelta", "quant:k4v4:g32:had", "int4-g64",
                             "int3-g100", "raw"}) {
      SCOPED_TRACE(testing::Message() << spec << " dtype " << int(dt));
      auto p = ParseCodecSpec(spec);
      ASSERT_TRUE(p.ok()) << p.status();
      auto want = Encode(l, *p, block);
      ASSERT_TRUE(want.ok()) << want.status();
      std::vector<uint8_t> got;
      const absl::Status st = de.Encode(l, *p, d_block.data(), block.size(), &got);
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_EQ(got, *want);
      std::vector<uint8_t> cpu_block(block.size());
      ASSERT_TRUE(Decode(got, cpu_block).ok());
      DeviceBuffer d_out = Alloc(block.size());
      ASSERT_TRUE(dd.Decode(got, d_out.data(), block.size()).ok());
      EXPECT_EQ(Download<uint8_t>(d_out, block.size()), cpu_block);
    }
  }
  // Non-finite input is the CPU's InvalidArgument; host memory and a wrong size are refused.
  const KvLayout l = Layout(1, 1, 64, 8, DType::kFloat16);
  std::vector<uint8_t> block = GenerateSyntheticKv(l, 1);
  const uint16_t inf = 0x7C00;
  std::memcpy(block.data() + 10, &inf, 2);
  DeviceBuffer d_block = Upload(block);
  std::vector<uint8_t> blob;
  const auto quant = *ParseCodecSpec("quant:k4v4");
  EXPECT_EQ(de.Encode(l, quant, d_block.data(), block.size(), &blob).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(de.Encode(l, quant, block.data(), block.size(), &blob).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(de.Encode(l, *ParseCodecSpec("int4-g64"), d_block.data(), block.size(), &blob).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(de.Encode(l, quant, d_block.data(), block.size() - 2, &blob).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaDevice, QuantRejectsNonFiniteInput) {
  cuda::QuantSection qs;
  qs.tokens = 4;
  qs.heads = 1;
  qs.head_dim = 8;
  std::vector<uint16_t> in(32, FloatToHalf(0.5f));
  in[9] = 0x7E00;  // NaN
  DeviceBuffer d_in = Upload(in);
  DeviceBuffer mu16 = Alloc(16), a16 = Alloc(8), steps16 = Alloc(16), syms = Alloc(64);
  cuda::QuantKernels qk;
  const absl::Status s = qk.Encode(
      d_in.data(), qs,
      {mu16.as<uint16_t>(), a16.as<uint8_t>(), steps16.as<uint16_t>(), syms.as<uint16_t>()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

// Host-side argument checks: no device needed.
TEST(CudaDeviceApi, RejectsBadArguments) {
  EXPECT_EQ(cuda::HadamardRows(nullptr, 1, 48).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::HadamardRows(nullptr, 1, 16384).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::GroupwiseEncode(nullptr, DType::kFloat16, 64, 9, 64, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::GroupwiseEncode(nullptr, DType::kFloat8E4M3, 64, 4, 64, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::GroupwiseDecode(nullptr, 10, DType::kFloat16, 64, 4, 64, nullptr).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(cuda::GroupwisePayloadBytes(100, 3, 64), 3u + 2 * 4 + 38);
  cuda::QuantSection qs;
  qs.tokens = 4;
  qs.heads = 1;
  qs.head_dim = 48;
  qs.hadamard = true;
  EXPECT_EQ(qs.Validate().code(), absl::StatusCode::kInvalidArgument);
  qs.hadamard = false;
  EXPECT_TRUE(qs.Validate().ok());
  qs.is_key = false;
  qs.group = 20;
  EXPECT_EQ(qs.steps(), 4u * 3);
  qs.bits = 1;
  EXPECT_EQ(qs.Validate().code(), absl::StatusCode::kInvalidArgument);
  cuda::QuantKernels qk;
  EXPECT_EQ(qk.Encode(nullptr, qs, {}).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::codec
