// The CUDA kernels' math on the host: runs the plans of codec/cuda/kernel_math.h with an
// executor that walks the kernels' grids (blocks, threads, per-thread indices, barrier-separated
// Hadamard stages) exactly as kernels.cu launches them, and compares every byte with the CPU
// codec. Built with g++ and run in CI on every machine (no GPU or CUDA toolkit needed).
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "codec/codec.h"
#include "codec/cuda/kernel_math.h"
#include "codec/half.h"
#include "codec/internal/kernels.h"
#include "codec/synthetic_kv.h"
#include "gtest/gtest.h"
#include "tests/codec/cuda_reference.h"

namespace strata::codec {
namespace {

namespace m = cuda::math;
using cuda_test::CpuBlock;
using cuda_test::EncodeOnCpu;
using test::Layout;

// The encoder plan's scratch and output arrays for `a` (its T, C and axis set), attached to it;
// a16 filled with `a16_fill` so bytes the plan must write are told from ones it left.
struct EncoderOutputs {
  EncoderOutputs(m::QuantArgs& a, uint8_t a16_fill)
      : f(size_t{a.T} * a.C),
        mu(a.C),
        w(a.C),
        mu16(a.C),
        steps16(a.steps()),
        syms(size_t{a.T} * a.C),
        a16(a.C, a16_fill) {
    a.f = f.data();
    a.mu = mu.data();
    a.a = w.data();
    a.nonfinite = &nonfinite;
    a.mu16 = mu16.data();
    a.a16 = a16.data();
    a.steps16 = steps16.data();
    a.syms = syms.data();
  }
  std::vector<float> f, mu, w;
  std::vector<uint16_t> mu16, steps16, syms;
  std::vector<uint8_t> a16;
  uint32_t nonfinite = 0;
};

// The device executor's grid walk on the host. `reverse` visits blocks and threads backwards:
// threads of one kernel run in no particular order on a GPU, so a plan must give the same bytes
// either way (a step that read what another thread of the same step writes would not).
struct HostExec {
  bool reverse = false;
  int kernels = 0;

  template <class Op>
  void ForEach(uint64_t count, const Op& op) {
    if (count == 0) return;
    ++kernels;
    const uint64_t blocks = (count + m::kThreads - 1) / m::kThreads;
    for (uint64_t bi = 0; bi < blocks; ++bi) {
      const uint64_t b = reverse ? blocks - 1 - bi : bi;
      for (uint32_t ti = 0; ti < m::kThreads; ++ti) {
        const uint32_t t = reverse ? m::kThreads - 1 - ti : ti;
        const uint64_t i = b * m::kThreads + t;  // blockIdx.x * blockDim.x + threadIdx.x
        if (i < count) op(i);
      }
    }
  }

  // HadamardKernel: block r owns row r in "shared memory"; each phase runs every thread, then
  // the barrier.
  void Hadamard(float* x, uint64_t rows, uint32_t n, float scale) {
    ++kernels;
    const uint32_t threads = m::HadamardThreads(n);
    std::vector<float> shared(n);
    auto each_thread = [&](auto&& fn) {
      for (uint32_t ti = 0; ti < threads; ++ti) fn(reverse ? threads - 1 - ti : ti);
    };
    for (uint64_t ri = 0; ri < rows; ++ri) {
      float* row = x + (reverse ? rows - 1 - ri : ri) * n;
      each_thread([&](uint32_t tid) {
        for (uint32_t j = tid; j < n; j += threads) shared[j] = row[j];
      });
      for (uint32_t h = 1; h < n; h <<= 1)
        each_thread([&](uint32_t tid) { m::HadamardStage(shared.data(), n, h, tid, threads); });
      each_thread([&](uint32_t tid) {
        for (uint32_t j = tid; j < n; j += threads) row[j] = m::Mul(shared[j], scale);
      });
    }
  }
};

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(CudaMath, HalfAndBF16ConversionsMatchTheCpu) {
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(Bits(m::HalfBitsToFloat(static_cast<uint16_t>(h))),
              Bits(HalfToFloat(static_cast<uint16_t>(h))))
        << h;
    ASSERT_EQ(Bits(m::BF16BitsToFloat(static_cast<uint16_t>(h))),
              Bits(BF16ToFloat(static_cast<uint16_t>(h))));
  }
  // Every float near each fp16 rounding boundary, and a stride through all patterns.
  std::vector<uint32_t> pats;
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const uint32_t f = Bits(HalfToFloat(static_cast<uint16_t>(h)));
    const uint32_t mid = f + (h >= 0x400 ? 0x1000u : 0u);  // halfway to the next normal fp16
    for (int d = -2; d <= 2; ++d) {
      pats.push_back(f + d);
      pats.push_back(mid + d);
    }
  }
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 65521)
    pats.push_back(static_cast<uint32_t>(u));
  for (uint32_t u : {0x477FEFFFu, 0x477FF000u, 0x477FF001u, 0x33000000u, 0x33000001u, 0x32FFFFFFu,
                     0x387FE000u, 0x387FF000u, 0x387FFFFFu, 0x38800000u, 0x7F800000u, 0x7FC00000u,
                     0x7F800001u, 0x00000001u, 0x807FFFFFu})
    pats.push_back(u);
  for (uint32_t u : pats) {
    for (uint32_t s : {0u, 0x80000000u}) {
      const float f = FromBits(u ^ s);
      ASSERT_EQ(m::FloatToHalfBits(f), FloatToHalf(f)) << std::hex << (u ^ s);
      ASSERT_EQ(m::FloatToBF16Bits(f), FloatToBF16(f)) << std::hex << (u ^ s);
    }
  }
  // And the SIMD row conversions the CPU codec writes its output with (finite values).
  std::vector<float> fin;
  for (uint32_t u : pats)
    if ((u & 0x7F800000u) != 0x7F800000u) fin.push_back(FromBits(u));
  std::vector<uint16_t> h16(fin.size()), b16(fin.size());
  internal::FloatToHalfRow(fin.data(), h16.data(), fin.size());
  internal::FloatToBF16Row(fin.data(), b16.data(), fin.size());
  for (size_t i = 0; i < fin.size(); ++i) {
    ASSERT_EQ(m::FloatToHalfBits(fin[i]), h16[i]) << fin[i];
    ASSERT_EQ(m::FloatToBF16Bits(fin[i]), b16[i]) << fin[i];
  }
}

TEST(CudaMath, HadamardMatchesTheCpuBitForBit) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (uint32_t n = 1; n <= 8192; n *= 2) {
    const size_t rows = n >= 1024 ? 2 : 5;
    std::vector<float> x(rows * n);
    for (float& v : x) v = nd(rng);
    std::vector<float> cpu = x;
    internal::HadamardRowsSimd(cpu.data(), rows, n);
    for (bool rev : {false, true}) {
      std::vector<float> host = x;
      HostExec ex{rev};
      ex.Hadamard(host.data(), rows, n, m::HadamardScale(n));
      ASSERT_EQ(std::memcmp(host.data(), cpu.data(), x.size() * 4), 0) << "n=" << n;
      // Inverse (the same transform) brings the input back, to rounding.
      ex.Hadamard(host.data(), rows, n, m::HadamardScale(n));
      for (size_t i = 0; i < x.size(); ++i)
        ASSERT_NEAR(host[i], x[i], 1e-4f * (1 + std::abs(x[i])));
    }
  }
}

// Signed zeros, constant groups, subnormals and huge values in a block of `dt`.
void SprinkleEdgeValues(std::vector<uint8_t>* block, DType dt, size_t group) {
  const size_t eb = DTypeBytes(dt), n = block->size() / eb;
  auto put = [&](size_t i, float v) {
    if (i >= n) return;
    if (dt == DType::kFloat32) {
      std::memcpy(block->data() + i * 4, &v, 4);
    } else {
      const uint16_t h = dt == DType::kFloat16 ? FloatToHalf(v) : FloatToBF16(v);
      std::memcpy(block->data() + i * 2, &h, 2);
    }
  };
  for (size_t i = 0; i < group; ++i) put(i, (i % 3) ? -0.0f : 0.0f);  // zeros, mixed signs
  for (size_t i = group; i < 2 * group; ++i) put(i, 1.5f);            // constant
  for (size_t i = 2 * group; i < 3 * group; ++i)
    put(i, (i % 2 ? 1 : -1) * 3e-7f);  // fp16 subnormals
  put(3 * group, 60000.0f);
  put(3 * group + 1, -60000.0f);
  put(4 * group + 1, -0.0f);
}

TEST(CudaMath, GroupwiseMatchesTheCpuByteForByte) {
  struct Case {
    DType dt;
    uint32_t heads, dim, tokens;
    uint16_t group;
  };
  const Case cases[] = {
      {DType::kFloat16, 2, 64, 16, 64}, {DType::kFloat16, 3, 48, 7, 100},
      {DType::kBFloat16, 2, 32, 9, 32}, {DType::kFloat32, 1, 64, 5, 7},
      {DType::kFloat16, 1, 16, 3, 1},   {DType::kFloat16, 4, 128, 16, 128},
  };
  int sections = 0;
  for (const Case& c : cases) {
    const KvLayout l = Layout(2, c.heads, c.dim, c.tokens, c.dt);
    std::vector<uint8_t> block = GenerateSyntheticKv(l, 1);
    SprinkleEdgeValues(&block, c.dt, c.group);
    for (uint8_t bits = 2; bits <= 8; ++bits) {
      CodecParams p;
      p.mode = Mode::kGroupwise;
      p.key_bits = p.value_bits = bits;
      p.group_size = c.group;
      const CpuBlock cpu = EncodeOnCpu(l, p, block);
      ASSERT_FALSE(cpu.sections.empty());
      for (const auto& s : cpu.sections) {
        m::GroupwiseArgs a;
        a.dtype = static_cast<uint8_t>(c.dt);
        a.n = s.bytes / DTypeBytes(c.dt);
        a.bits = bits;
        a.group = c.group;
        ASSERT_EQ(m::GroupwisePayloadBytes(a.n, bits, c.group), s.payload.size());
        for (bool rev : {false, true}) {
          std::vector<uint8_t> payload(s.payload.size(), 0xA5);
          a.in = block.data() + s.block_offset;
          a.payload = payload.data();
          HostExec ex{rev};
          m::GroupwiseEncodePlan(ex, a);
          ASSERT_EQ(payload, s.payload) << "bits " << int(bits) << " group " << c.group;
          std::vector<uint8_t> out(s.bytes, 0xA5);
          a.cpayload = s.payload.data();
          a.out = out.data();
          m::GroupwiseDecodePlan(ex, a);
          ASSERT_EQ(std::memcmp(out.data(), cpu.decoded.data() + s.block_offset, s.bytes), 0)
              << "bits " << int(bits) << " group " << c.group;
        }
        ++sections;
      }
    }
  }
  EXPECT_EQ(sections, 6 * 7 * 4);
}

struct QuantCase {
  DType dt;
  uint32_t heads, dim, tokens;
  uint16_t group;
  bool had, delta;
  bool far_values = false;  // fp16 only: two value tokens far from every channel's mean
  bool outliers = false;    // keys keep their outlier channels (`:ol`)
};

void CheckQuantOnHost(const QuantCase& c, uint8_t kbits, uint8_t vbits) {
  const KvLayout l = Layout(2, c.heads, c.dim, c.tokens, c.dt);
  SyntheticKvParams sp;
  sp.seed = 3 + c.tokens;
  std::vector<uint8_t> block = GenerateSyntheticKv(l, 1, sp);
  if (c.far_values) {
    // Narrow within the group, far from the means: the CPU widens these tokens' value steps
    // (codec/quant.cc WidenValueSteps), and so must the kernels.
    const size_t T = c.tokens, C = size_t{c.heads} * c.dim;
    for (uint32_t layer = 0; layer < 2; ++layer) {
      const size_t v = (size_t{layer} * 2 + 1) * T * C;
      for (size_t t : {size_t{1}, T - 1})
        for (size_t ch = 0; ch < C; ++ch) {
          const uint16_t h = FloatToHalf((t == 1 ? -30.0f : 40.0f) + 0.001f * float(ch % 7));
          std::memcpy(block.data() + 2 * (v + t * C + ch), &h, 2);
        }
    }
  }
  CodecParams p;
  p.mode = Mode::kQuant;
  p.key_bits = kbits;
  p.value_bits = vbits;
  p.group_size = c.group;
  p.hadamard = c.had;
  p.token_delta = c.delta;
  p.key_outliers = c.outliers;
  const CpuBlock cpu = EncodeOnCpu(l, p, block);
  ASSERT_EQ(cpu.sections.size(), 4u);
  const uint32_t C = c.heads * c.dim, T = c.tokens;
  for (const auto& s : cpu.sections) {
    SCOPED_TRACE(testing::Message() << (s.is_key ? "K" : "V") << " layer " << s.layer << " bits "
                                    << int(s.bits) << " T " << T << " C " << C << " g " << c.group
                                    << (c.had ? " had" : "") << (c.delta ? "" : " nodelta")
                                    << (c.outliers ? " ol" : ""));
    m::QuantArgs a;
    a.T = T;
    a.C = C;
    a.heads = c.heads;
    a.head_dim = c.dim;
    a.bits = s.bits;
    a.group = s.is_key ? C : std::min<uint32_t>(c.group, C);
    a.key_axis = s.is_key;
    a.token_delta = c.delta;
    a.hadamard = c.had;
    a.hadamard_scale = c.had ? m::HadamardScale(c.dim) : 1.0f;
    a.dtype = static_cast<uint8_t>(c.dt);
    EncoderOutputs o(a, 0xEE);
    const size_t eb = DTypeBytes(c.dt);
    a.outliers = c.outliers && s.is_key;
    a.per_head = std::max<uint32_t>(1, c.dim / 16);
    std::vector<float> ms(C), head_scratch(C);
    std::vector<uint16_t> out_count(c.heads, 0xEEEE), out_idx(size_t{c.heads} * a.per_head);
    std::vector<uint8_t> out_vals(size_t{T} * c.heads * a.per_head * eb);
    a.ms = ms.data();
    a.head_scratch = head_scratch.data();
    a.out_count = out_count.data();
    a.out_idx = out_idx.data();
    a.out_vals = out_vals.data();
    const uint32_t& nonfinite = o.nonfinite;
    const auto &mu16 = o.mu16, &steps16 = o.steps16, &syms = o.syms;
    const auto& a16 = o.a16;
    for (bool rev : {false, true}) {
      a.in = block.data() + s.block_offset;
      HostExec ex{rev};
      m::QuantEncodePlan(ex, a);
      ASSERT_EQ(nonfinite, 0u);
      ASSERT_EQ(mu16, s.mu16);
      if (c.delta) {
        ASSERT_EQ(a16, s.a16);
      }
      ASSERT_EQ(steps16, s.steps16);
      ASSERT_EQ(syms, s.syms);
      if (a.outliers) {  // the per-head picks, laid out as the payload lays them out
        std::vector<uint16_t> idx(out_idx.size());
        std::vector<uint8_t> vals(out_vals.size());
        const uint32_t nout = m::GatherOutliers(a, out_count.data(), out_idx.data(),
                                                out_vals.data(), idx.data(), vals.data());
        idx.resize(nout);
        vals.resize(size_t{T} * nout * eb);
        ASSERT_FALSE(s.outlier_idx.empty()) << "the data has outlier channels";
        ASSERT_EQ(idx, s.outlier_idx);
        ASSERT_EQ(vals, s.outlier_vals);
      }
      // Decoder: from the CPU's arrays (here equal to ours) to the CPU decoder's bytes.
      std::vector<uint8_t> out(s.bytes, 0xA5);
      std::vector<float> rec(size_t{T} * C);
      m::QuantArgs d = a;
      d.f = rec.data();
      d.out = out.data();
      d.mu16 = const_cast<uint16_t*>(s.mu16.data());
      d.a16 = c.delta ? const_cast<uint8_t*>(s.a16.data()) : nullptr;
      d.steps16 = const_cast<uint16_t*>(s.steps16.data());
      d.syms = const_cast<uint16_t*>(s.syms.data());
      d.nout = static_cast<uint32_t>(s.outlier_idx.size());
      d.out_idx = const_cast<uint16_t*>(s.outlier_idx.data());
      d.out_vals = const_cast<uint8_t*>(s.outlier_vals.data());
      m::QuantDecodePlan(ex, d);
      ASSERT_EQ(std::memcmp(out.data(), cpu.decoded.data() + s.block_offset, s.bytes), 0);
    }
  }
}

TEST(CudaMath, QuantMatchesTheCpuByteForByte) {
  const QuantCase cases[] = {
      {DType::kFloat16, 2, 64, 16, 64, false, true},
      {DType::kFloat16, 2, 64, 16, 64, true, true},
      {DType::kFloat16, 2, 64, 16, 64, false, false},
      {DType::kFloat16, 2, 128, 33, 48, true, true},  // groups straddle heads, odd tokens
      {DType::kBFloat16, 2, 32, 16, 64, true, true},
      {DType::kFloat32, 1, 64, 9, 20, false, true},
      {DType::kFloat16, 3, 16, 1, 16, true, true},  // one token: no prediction
      {DType::kFloat16, 1, 8, 2, 3, false, true},
      {DType::kFloat16, 2, 64, 16, 32, false, true, true},  // value steps widened
      {DType::kFloat16, 2, 64, 16, 32, true, false, true},
  };
  for (const QuantCase& c : cases) {
    for (uint8_t b : {2, 3, 4, 8}) {
      CheckQuantOnHost(c, b, b);
      if (testing::Test::HasFatalFailure()) return;
    }
  }
  CheckQuantOnHost(cases[1], 5, 6);
  CheckQuantOnHost(cases[3], 7, 3);
}

TEST(CudaMath, QuantWithKeyOutliersMatchesTheCpuByteForByte) {
  const QuantCase cases[] = {
      {DType::kFloat16, 2, 64, 16, 64, false, true, false, true},
      {DType::kFloat16, 2, 64, 16, 64, true, true, false, true},
      {DType::kFloat16, 4, 128, 33, 48, false, false, false, true},
      {DType::kBFloat16, 2, 32, 16, 64, true, true, false, true},
      {DType::kFloat32, 1, 64, 9, 20, false, true, false, true},
  };
  for (const QuantCase& c : cases) {
    for (uint8_t b : {2, 3, 4}) {
      CheckQuantOnHost(c, b, b);
      if (testing::Test::HasFatalFailure()) return;
    }
  }
}

// Rounding ties and near-ties of the quantiser, element by element against the CPU's row kernel
// (SIMD lanes and scalar tail): x sits at p + (k + 1/2) step, and a few ulps either side.
TEST(CudaMath, QuantElementMatchesTheCpuOnTies) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  const size_t n = 37;
  for (int bits : {2, 4, 8}) {
    const int32_t off = 1 << (bits + 1), max_sym = (4 << bits) - 1;
    for (int iter = 0; iter < 2000; ++iter) {
      std::vector<float> x(n), mu(n), w(n), st(n), inv(n), xh(n);
      for (size_t c = 0; c < n; ++c) {
        mu[c] = HalfToFloat(FloatToHalf(u(rng)));
        w[c] = static_cast<float>(rng() % 17) / 16.0f;
        xh[c] = u(rng);
        st[c] = HalfToFloat(FloatToHalf(std::abs(u(rng)) / 8 + 1e-3f));
        inv[c] = 1.0f / st[c];
        const float p = mu[c] + w[c] * (xh[c] - mu[c]);
        const int k = static_cast<int>(rng() % (2 * off)) - off;
        x[c] = p + (static_cast<float>(k) + 0.5f) * st[c];
        uint32_t b = Bits(x[c]);
        b += static_cast<int32_t>(rng() % 5) - 2;
        x[c] = FromBits(b);
      }
      std::vector<float> xh_cpu = xh;
      std::vector<uint16_t> sym_cpu(n), sym(n);
      internal::QuantRow(x.data(), mu.data(), w.data(), st.data(), inv.data(), xh_cpu.data(),
                         sym_cpu.data(), n, off, max_sym);
      for (size_t c = 0; c < n; ++c) {
        const float r = m::QuantElement(x[c], mu[c], w[c], xh[c], st[c], m::Div(1.0f, st[c]),
                                        static_cast<float>(-off), static_cast<float>(max_sym - off),
                                        off, &sym[c]);
        ASSERT_EQ(sym[c], sym_cpu[c]) << "bits " << bits << " c " << c;
        ASSERT_EQ(Bits(r), Bits(xh_cpu[c]));
      }
    }
  }
}

TEST(CudaMath, QuantFlagsNonFiniteInput) {
  const uint32_t T = 4, C = 8;
  std::vector<uint16_t> in(T * C, FloatToHalf(1.0f));
  in[13] = 0x7C00;  // +inf
  m::QuantArgs a;
  a.T = T;
  a.C = C;
  a.heads = 1;
  a.head_dim = C;
  a.group = C;
  EncoderOutputs o(a, 0);
  a.in = in.data();
  const uint32_t& nonfinite = o.nonfinite;
  HostExec ex;
  m::QuantEncodePlan(ex, a);
  EXPECT_EQ(nonfinite, 1u);
}

}  // namespace
}  // namespace strata::codec

namespace strata::codec {
namespace {

// The kernels' arguments for a section the codec hands over or asks for.
m::QuantArgs QuantArgsOf(const SectionHandoff& h) {
  m::QuantArgs a;
  a.T = h.tokens;
  a.C = h.heads * h.head_dim;
  a.heads = h.heads;
  a.head_dim = h.head_dim;
  a.bits = h.bits;
  a.key_axis = h.is_key;
  a.group = h.is_key ? a.C : h.group;
  a.token_delta = h.token_delta;
  a.hadamard = h.hadamard;
  a.hadamard_scale = h.hadamard ? m::HadamardScale(h.head_dim) : 1.0f;
  a.dtype = static_cast<uint8_t>(h.dtype);
  return a;
}

// A device decoder's route on the host: the Decoder hands quant and groupwise sections over
// with their entropy coding undone (DecodeOptions::device_sections), the kernel plans rebuild
// them from those arrays alone, and the block is the CPU Decoder's, byte for byte, for every
// coder the encoder picks (narrow, wide, split, shared stream), with and without outliers.
void CheckHandoffDecode(const KvLayout& l, const CodecParams& p) {
  SCOPED_TRACE(testing::Message() << ModeName(p.mode) << " k" << int(p.key_bits) << "v"
                                  << int(p.value_bits) << (p.hadamard ? " had" : "")
                                  << (p.key_outliers ? " ol" : "") << " dtype "
                                  << int(l.dtype));
  SyntheticKvParams sp;
  sp.seed = 11;
  const std::vector<uint8_t> block = GenerateSyntheticKv(l, 1, sp);
  auto blob = Encode(l, p, block);
  ASSERT_TRUE(blob.ok()) << blob.status();
  std::vector<uint8_t> want(block.size());
  ASSERT_TRUE(Decode(*blob, want).ok());

  std::vector<uint8_t> got(block.size(), 0xA5);
  size_t handed = 0;
  DecodeOptions opts;
  opts.device_sections = [&](const SectionHandoff& h) -> absl::Status {
    ++handed;
    uint8_t* dst = got.data() + h.out_offset;
    HostExec ex;
    if (h.kind == SectionHandoff::Kind::kGroupwise) {
      m::GroupwiseArgs a;
      a.dtype = static_cast<uint8_t>(h.dtype);
      a.n = uint64_t{h.tokens} * h.heads * h.head_dim;
      a.bits = h.bits;
      a.group = h.group;
      a.cpayload = h.payload.data();
      a.out = dst;
      m::GroupwiseDecodePlan(ex, a);
      return absl::OkStatus();
    }
    m::QuantArgs a = QuantArgsOf(h);
    std::vector<float> rec(size_t{a.T} * a.C);
    a.f = rec.data();
    a.out = dst;
    a.mu16 = const_cast<uint16_t*>(h.mu16.data());
    a.a16 = const_cast<uint8_t*>(h.a16.data());
    a.steps16 = const_cast<uint16_t*>(h.steps16.data());
    a.syms = const_cast<uint16_t*>(h.syms.data());
    a.nout = static_cast<uint32_t>(h.outlier_idx.size());
    a.out_idx = const_cast<uint16_t*>(h.outlier_idx.data());
    a.out_vals = const_cast<uint8_t*>(h.outlier_vals.data());
    m::QuantDecodePlan(ex, a);
    return absl::OkStatus();
  };
  Decoder dec;
  ASSERT_TRUE(dec.Decode(*blob, got, opts).ok());
  EXPECT_EQ(handed, size_t{l.num_layers} * l.TensorsPerLayer());
  EXPECT_EQ(got, want);
}

TEST(CudaMath, SectionsHandedToADeviceDecoderRebuildTheCpuBlock) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    const KvLayout l = Layout(2, 2, 64, 32, dt);
    for (auto [kb, vb] : {std::pair<int, int>{2, 2}, {3, 4}, {4, 4}, {6, 6}, {7, 8}}) {
      for (bool had : {false, true}) {
        for (bool ol : {false, true}) {
          auto params = ParseCodecSpec(std::string("quant:k") + std::to_string(kb) + "v" +
                                       std::to_string(vb) + (had ? ":had" : "") +
                                       (ol ? ":ol" : ""));
          ASSERT_TRUE(params.ok()) << params.status();
          CheckHandoffDecode(l, *params);
          if (testing::Test::HasFatalFailure()) return;
        }
      }
    }
    for (const char* spec : {"int4-g64", "int2-g32", "int8-g128"}) {
      auto params = ParseCodecSpec(spec);
      ASSERT_TRUE(params.ok()) << params.status();
      CheckHandoffDecode(l, *params);
    }
  }
}

// A device encoder's route on the host: the kernel plans quantise each quant and groupwise
// section where the block lies (here, host memory) and the Encoder entropy-codes and frames what
// they hand it (Encoder::EncodeFromSections). The blob is the CPU Encoder's, byte for byte.
absl::Status QuantiseOnHost(const std::vector<uint8_t>& block, const SectionHandoff& h,
                            SectionArrays* out) {
  const uint8_t* in = block.data() + h.out_offset;
  const uint64_t values = uint64_t{h.tokens} * h.heads * h.head_dim;
  HostExec ex;
  if (h.kind == SectionHandoff::Kind::kGroupwise) {
    m::GroupwiseArgs a;
    a.dtype = static_cast<uint8_t>(h.dtype);
    a.n = values;
    a.bits = h.bits;
    a.group = h.group;
    out->payload.resize(m::GroupwisePayloadBytes(values, h.bits, h.group));
    a.in = in;
    a.payload = out->payload.data();
    m::GroupwiseEncodePlan(ex, a);
    return absl::OkStatus();
  }
  m::QuantArgs a = QuantArgsOf(h);
  EncoderOutputs o(a, 0);
  a.outliers = h.key_outliers;
  a.per_head = std::max<uint32_t>(1, h.head_dim / 16);
  const size_t eb = DTypeBytes(h.dtype), slots = size_t{h.heads} * a.per_head;
  std::vector<float> ms(a.C), head_scratch(a.C);
  std::vector<uint16_t> count(h.heads), idx(slots);
  std::vector<uint8_t> vals(h.tokens * slots * eb);
  a.ms = ms.data();
  a.head_scratch = head_scratch.data();
  a.out_count = count.data();
  a.out_idx = idx.data();
  a.out_vals = vals.data();
  a.in = in;
  m::QuantEncodePlan(ex, a);
  if (o.nonfinite) return absl::InvalidArgumentError("non-finite input");
  out->mu16 = o.mu16;
  if (h.token_delta) out->a16 = o.a16;
  out->steps16 = o.steps16;
  out->syms = o.syms;
  if (a.outliers) {
    out->outlier_idx.resize(slots);
    out->outlier_vals.resize(h.tokens * slots * eb);
    const uint32_t nout = m::GatherOutliers(a, count.data(), idx.data(), vals.data(),
                                            out->outlier_idx.data(), out->outlier_vals.data());
    out->outlier_idx.resize(nout);
    out->outlier_vals.resize(size_t{h.tokens} * nout * eb);
  }
  return absl::OkStatus();
}

void CheckSectionsEncode(const KvLayout& l, const CodecParams& p) {
  SCOPED_TRACE(testing::Message() << CodecSpecString(p) << " dtype " << int(l.dtype));
  SyntheticKvParams sp;
  sp.seed = 17;
  const std::vector<uint8_t> block = GenerateSyntheticKv(l, 1, sp);
  auto want = Encode(l, p, block);
  ASSERT_TRUE(want.ok()) << want.status();
  size_t asked = 0;
  const SectionSource source = [&](const SectionHandoff& h, SectionArrays* out) {
    ++asked;
    EXPECT_TRUE(out->syms.empty() && out->payload.empty());
    return QuantiseOnHost(block, h, out);
  };
  Encoder enc;
  std::vector<uint8_t> got;
  for (int round = 0; round < 2; ++round) {  // the second reuses the encoder's scratch
    ASSERT_TRUE(enc.EncodeFromSections(l, p, source, &got).ok());
    EXPECT_EQ(got, *want);
  }
  // Once per section per encode; rate control encodes a block several times.
  if (p.rate_bits == 0) {
    EXPECT_EQ(asked, 2 * size_t{l.num_layers} * l.TensorsPerLayer());
  }
}

TEST(CudaMath, SectionsQuantisedOnADeviceEncodeToTheCpuBlob) {
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    const KvLayout l = Layout(2, 2, 64, 32, dt);
    for (const char* spec :
         {"quant:k2v2", "quant:k3v4:had", "quant:k4v4:ol", "quant:k4v4:had:ol", "quant:k6v6",
          "quant:k7v8:g32", "quant:k8v8:nodelta:ol", "quant:k4v4:nodelta", "int4-g64",
          "int2-g32", "int8-g128"}) {
      auto params = ParseCodecSpec(spec);
      ASSERT_TRUE(params.ok()) << params.status();
      CheckSectionsEncode(l, *params);
      if (testing::Test::HasFatalFailure()) return;
    }
  }
  // Rate control: the same search over the same sizes, so the same per-layer bits.
  for (const char* spec : {"quant:k4v4:ol:r2.6", "quant:k6v6:had:r3.1"}) {
    auto params = ParseCodecSpec(spec);
    ASSERT_TRUE(params.ok()) << params.status();
    CheckSectionsEncode(Layout(4, 2, 64, 32, DType::kFloat16), *params);
  }
  // Per-layer bits and a large section (the 128-lane and split coders).
  auto params = ParseCodecSpec("quant:k3v4:had:ol");
  ASSERT_TRUE(params.ok());
  params->layer_key_bits = {2, 8};
  params->layer_value_bits = {5, 3};
  CheckSectionsEncode(Layout(2, 8, 128, 64, DType::kFloat16), *params);
}

// Groupwise input that is not finite: the device plan marks the group with a NaN scale and zero
// (its codes zero), the Encoder refuses the section as the CPU encoder refuses the block, and
// the other groups keep the CPU's bytes.
TEST(CudaMath, GroupwiseRefusesValuesThatAreNotFiniteAsTheCpuDoes) {
  const KvLayout l = Layout(1, 2, 64, 8, DType::kFloat16);
  const std::vector<uint8_t> clean = GenerateSyntheticKv(l, 1);
  const auto params = ParseCodecSpec("int4-g64");
  ASSERT_TRUE(params.ok());
  const uint64_t values = uint64_t{l.tokens_per_block} * l.ValuesPerTokenPerTensor();
  for (uint16_t bad : {uint16_t{0x7E00}, uint16_t{0x7C00}, uint16_t{0xFC00}}) {
    for (uint64_t at : {uint64_t{0}, uint64_t{70}, values - 1}) {
      SCOPED_TRACE(testing::Message() << bad << " at " << at);
      std::vector<uint8_t> block = clean;
      std::memcpy(block.data() + 2 * at, &bad, 2);  // in the first section, layer 0's keys
      auto cpu = Encode(l, *params, block);
      EXPECT_EQ(cpu.status().code(), absl::StatusCode::kInvalidArgument);
      Encoder enc;
      std::vector<uint8_t> blob;
      const absl::Status st = enc.EncodeFromSections(
          l, *params,
          [&](const SectionHandoff& h, SectionArrays* out) {
            return QuantiseOnHost(block, h, out);
          },
          &blob);
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
      EXPECT_NE(st.message().find("finite"), std::string_view::npos) << st;

      m::GroupwiseArgs a, c;
      a.n = c.n = values;
      a.bits = c.bits = 4;
      a.group = c.group = 64;
      std::vector<uint8_t> got(m::GroupwisePayloadBytes(values, 4, 64)), want(got.size());
      a.in = block.data();
      a.payload = got.data();
      c.in = clean.data();
      c.payload = want.data();
      HostExec ex;
      m::GroupwiseEncodePlan(ex, a);
      m::GroupwiseEncodePlan(ex, c);
      const uint64_t ng = a.groups(), g = at / 64;
      EXPECT_EQ(m::Load16(got.data() + 3 + 2 * g), m::kGroupwiseNotFinite);
      EXPECT_EQ(m::Load16(got.data() + 3 + 2 * (ng + g)), m::kGroupwiseNotFinite);
      for (uint64_t i = g * 64; i < std::min(values, g * 64 + 64); ++i)
        EXPECT_EQ(m::GroupwiseCode(a, got.data(), i), 0u) << i;
      for (uint64_t i = 0; i < values; ++i) {
        if (i / 64 == g) continue;
        ASSERT_EQ(m::GroupwiseCode(a, got.data(), i), m::GroupwiseCode(c, want.data(), i)) << i;
      }
    }
  }
}

// Whatever a device encoder hands back is checked before it is framed: a blob made of it
// decodes, or the encode fails with the reason.
TEST(CudaMath, SectionsFromADeviceThatDoNotFitAreRefused) {
  const KvLayout l = Layout(1, 2, 64, 16, DType::kFloat16);
  const std::vector<uint8_t> block = GenerateSyntheticKv(l, 1);
  struct Damage {
    const char* spec;
    const char* why;
    std::function<void(SectionArrays*)> apply;
  };
  const Damage damages[] = {
      {"quant:k4v4", "centres", [](SectionArrays* a) { a->mu16.pop_back(); }},
      {"quant:k4v4", "centre not finite", [](SectionArrays* a) { a->mu16[3] = 0x7C00; }},
      {"quant:k4v4", "predictor", [](SectionArrays* a) { a->a16[0] = 17; }},
      {"quant:k4v4", "steps disagree", [](SectionArrays* a) { a->steps16.push_back(0x3C00); }},
      {"quant:k4v4", "step out of range", [](SectionArrays* a) { a->steps16[0] = 0; }},
      {"quant:k4v4", "symbols disagree", [](SectionArrays* a) { a->syms.resize(5); }},
      {"quant:k4v4", "beyond the alphabet", [](SectionArrays* a) { a->syms[7] = 4 << 4; }},
      {"quant:k4v4", "did not ask", [](SectionArrays* a) { a->outlier_idx = {1}; }},
      {"quant:k4v4:ol", "not ascending",
       [](SectionArrays* a) {
         a->outlier_idx = {5, 5};
         a->outlier_vals.assign(16 * 2 * 2, 0);
       }},
      {"quant:k4v4:ol", "too many outlier channels",
       [](SectionArrays* a) {
         a->outlier_idx = {1, 2, 3, 4, 5};
         a->outlier_vals.assign(16 * 5 * 2, 0);
       }},
      {"quant:k4v4:ol", "outlier values",
       [](SectionArrays* a) {
         a->outlier_idx = {1};
         a->outlier_vals.assign(3, 0);
       }},
      {"int4-g64", "payload disagrees", [](SectionArrays* a) { a->payload.pop_back(); }},
      {"int4-g64", "payload disagrees", [](SectionArrays* a) { a->payload[0] = 3; }},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(testing::Message() << d.spec << ": " << d.why);
    auto params = ParseCodecSpec(d.spec);
    ASSERT_TRUE(params.ok());
    Encoder enc;
    std::vector<uint8_t> blob;
    const absl::Status st = enc.EncodeFromSections(
        l, *params,
        [&](const SectionHandoff& h, SectionArrays* out) {
          absl::Status s = QuantiseOnHost(block, h, out);
          if (h.is_key) d.apply(out);
          return s;
        },
        &blob);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(d.why), std::string_view::npos) << st;
  }
  // A source's own error ends the encode with it; modes the device does not quantise refuse.
  auto quant = ParseCodecSpec("quant:k4v4");
  Encoder enc;
  std::vector<uint8_t> blob;
  EXPECT_EQ(enc.EncodeFromSections(l, *quant,
                                   [](const SectionHandoff&, SectionArrays*) {
                                     return absl::UnavailableError("device lost");
                                   },
                                   &blob)
                .code(),
            absl::StatusCode::kUnavailable);
  for (const char* spec : {"raw", "lossless"}) {
    auto p = ParseCodecSpec(spec);
    const absl::Status st = enc.EncodeFromSections(
        l, *p, [&](const SectionHandoff& h, SectionArrays* out) {
          return QuantiseOnHost(block, h, out);
        }, &blob);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << spec;
  }
  // And the encoder still encodes on its own afterwards.
  auto again = Encode(l, *quant, block);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(enc.EncodeFromSections(l, *quant,
                                     [&](const SectionHandoff& h, SectionArrays* out) {
                                       return QuantiseOnHost(block, h, out);
                                     },
                                     &blob)
                  .ok());
  EXPECT_EQ(blob, *again);
}

}  // namespace
}  // namespace strata::codec
