#include "codec/rans.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "codec/internal/rans_tables.h"
#include "gtest/gtest.h"

namespace strata::codec::rans {
namespace {

template <typename Sym>
std::vector<Sym> Skewed(size_t n, uint32_t alphabet, double spread, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> g(alphabet / 2.0, spread);
  std::vector<Sym> s(n);
  for (auto& v : s) {
    double x = std::round(g(rng));
    v = static_cast<Sym>(std::clamp<double>(x, 0, alphabet - 1));
  }
  return s;
}

template <typename Sym>
void RoundTrip(const std::vector<Sym>& syms, uint32_t alphabet, uint32_t ctx,
               CoderStats* stats_out = nullptr) {
  Scratch scratch;
  std::vector<uint8_t> buf;
  CoderStats stats;
  Encode(syms.data(), syms.size(), alphabet, ctx, &scratch, &buf, &stats);
  EXPECT_EQ(stats.symbols, syms.size());
  EXPECT_NEAR(stats.entropy_bits, EmpiricalEntropyBits(syms.data(), syms.size(), alphabet, ctx),
              1e-6 * (1 + stats.entropy_bits));
  internal::ByteReader r(buf, "test");
  std::vector<Sym> back(syms.size());
  Scratch dscratch;
  ASSERT_TRUE(Decode(r, back.size(), alphabet, ctx, &dscratch, back.data()).ok());
  EXPECT_EQ(r.remaining(), 0u);
  EXPECT_EQ(back, syms);
  if (stats_out) *stats_out = stats;
}

TEST(Rans, RoundTripsManyShapes) {
  for (size_t n : {0, 1, 15, 16, 17, 255, 1000, 65536 + 5}) {
    for (uint32_t ctx : {1u, 3u, 8u}) {
      RoundTrip(Skewed<uint8_t>(n, 256, 20.0, static_cast<uint32_t>(n + ctx)), 256, ctx);
      RoundTrip(Skewed<uint16_t>(n, 1024, 3.0, static_cast<uint32_t>(n * 3 + ctx)), 1024, ctx);
    }
  }
}

TEST(Rans, SingleSymbolAndUniform) {
  RoundTrip(std::vector<uint8_t>(5000, 42), 256, 4);
  std::vector<uint8_t> u(100000);
  std::mt19937 rng(1);
  for (auto& v : u) v = static_cast<uint8_t>(rng());
  RoundTrip(u, 256, 1);
  // Every symbol of a 4096 alphabet, once: forces the frequency floor of 1.
  std::vector<uint16_t> all(4096);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>((i * 37) % 4096);
  RoundTrip(all, 4096, 1);
}

TEST(Rans, WithinTwoPercentOfEmpiricalEntropy) {
  for (double spread : {0.7, 1.5, 4.0, 12.0}) {
    auto syms = Skewed<uint16_t>(1 << 18, 64, spread, 11);
    CoderStats st;
    RoundTrip(syms, 64, 8, &st);
    ASSERT_GT(st.entropy_bits, 0);
    EXPECT_LE(static_cast<double>(st.stream_bits), st.entropy_bits * 1.02) << spread;
  }
}

TEST(Rans, CorruptStreamsFailCleanly) {
  auto syms = Skewed<uint8_t>(4000, 256, 10.0, 5);
  Scratch scratch;
  std::vector<uint8_t> buf;
  Encode(syms.data(), syms.size(), 256, 2, &scratch, &buf, nullptr);
  // On whichever decoder this CPU runs, and on the AVX2 one where it can run.
  for (const bool avx2 : {false, true}) {
    if (avx2 && !Avx2DecodeAvailable()) continue;
    ForceAvx2ForTesting(avx2);
    std::vector<uint8_t> out(syms.size());
    int failures = 0;
    for (size_t cut = 0; cut < buf.size(); cut += 7) {
      internal::ByteReader r(buf.data(), cut, "t");
      failures += !Decode(r, out.size(), 256, 2, &scratch, out.data()).ok();
    }
    EXPECT_EQ(failures, static_cast<int>((buf.size() + 6) / 7));  // every truncation fails
    std::mt19937 rng(9);
    int detected = 0;
    for (int i = 0; i < 300; ++i) {
      std::vector<uint8_t> bad = buf;
      bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
      internal::ByteReader r(bad, "t");
      detected += !Decode(r, out.size(), 256, 2, &scratch, out.data()).ok();
    }
    // Most single-byte corruptions are caught by the table checks and the final-state check.
    EXPECT_GT(detected, 200);
    ForceAvx2ForTesting(false);
  }
}

// The vector and scalar paths must write the same stream bit for bit, and each must decode the
// other's output (where neither vector loop can run, both runs are scalar); the AVX2 loops
// likewise wherever they can run.
template <typename Sym>
void SimdMatchesScalar(const std::vector<Sym>& syms, uint32_t alphabet, uint32_t ctx) {
  for (int lanes : {32, 64, 128}) {
    Scratch scratch;
    std::vector<uint8_t> simd, scalar;
    Encode(syms.data(), syms.size(), alphabet, ctx, &scratch, &simd, nullptr, lanes);
    ForceScalarForTesting(true);
    Encode(syms.data(), syms.size(), alphabet, ctx, &scratch, &scalar, nullptr, lanes);
    std::vector<Sym> back(syms.size()), back2(syms.size());
    internal::ByteReader r1(simd, "t");
    const bool scalar_dec_ok =
        Decode(r1, back.size(), alphabet, ctx, &scratch, back.data(), lanes).ok();
    ForceScalarForTesting(false);
    ASSERT_EQ(simd, scalar) << "n=" << syms.size() << " alphabet=" << alphabet << " ctx=" << ctx
                            << " lanes=" << lanes;
    if (Avx2DecodeAvailable()) {  // the AVX2 encoder's stream too, where AVX-512 runs by default
      std::vector<uint8_t> avx2;
      ForceAvx2ForTesting(true);
      Encode(syms.data(), syms.size(), alphabet, ctx, &scratch, &avx2, nullptr, lanes);
      ForceAvx2ForTesting(false);
      ASSERT_EQ(avx2, scalar) << "AVX2, n=" << syms.size() << " alphabet=" << alphabet;
    }
    EXPECT_TRUE(scalar_dec_ok);
    EXPECT_EQ(back, syms);
    internal::ByteReader r2(simd, "t");
    ASSERT_TRUE(Decode(r2, back2.size(), alphabet, ctx, &scratch, back2.data(), lanes).ok());
    EXPECT_EQ(back2, syms);
    EXPECT_EQ(r2.remaining(), 0u);
    if (Avx2DecodeAvailable()) {  // the AVX2 loop too, where AVX-512 would take its place
      ForceAvx2ForTesting(true);
      std::vector<Sym> back3(syms.size());
      internal::ByteReader r4(simd, "t");
      const bool ok = Decode(r4, back3.size(), alphabet, ctx, &scratch, back3.data(), lanes).ok();
      ForceAvx2ForTesting(false);
      EXPECT_TRUE(ok);
      EXPECT_EQ(back3, syms);
      EXPECT_EQ(r4.remaining(), 0u);
    }
    // A stream read with the other lane count must fail cleanly, not crash.
    internal::ByteReader r3(simd, "t");
    (void)Decode(r3, back2.size(), alphabet, ctx, &scratch, back2.data(), lanes == 32 ? 64 : 32);
  }
}

// The byte histogram (compares around the centre where a context's symbols lie there, one at
// a time elsewhere) against a plain count: contexts from narrow to wide, alphabets from 1 to
// 256 (the window clipped at either end), partial runs and run counts that leave a context's
// last vector short, the scalar path and the AVX2 one (mode 0, 1, 2).
TEST(Rans, ByteHistogramCountsEverySymbol) {
  std::mt19937 rng(17);
  for (const int mode : {0, 1, 2})
    for (const uint32_t alphabet : {1u, 2u, 3u, 7u, 9u, 201u, 255u, 256u})
      for (const uint32_t num_ctx : {1u, 3u, 16u})
        for (const size_t n : {size_t{0}, size_t{15}, size_t{16 * 5 + 7}, size_t{16 * 97},
                               size_t{16 * 131 + 9}}) {
          SCOPED_TRACE(::testing::Message() << "alphabet " << alphabet << " contexts " << num_ctx
                                            << " n " << n << " mode " << mode);
          std::vector<uint8_t> syms(n);
          for (size_t i = 0; i < n; ++i) {
            // Context c's spread grows with c: some all inside the window, some mostly outside.
            const uint32_t c = static_cast<uint32_t>((i / kCtxRun) % num_ctx);
            std::normal_distribution<double> g(alphabet / 2, 0.3 + 6.0 * c);
            syms[i] = static_cast<uint8_t>(std::clamp<double>(std::round(g(rng)), 0, alphabet - 1));
          }
          if (n > 40 && alphabet > 1) syms[n / 2] = static_cast<uint8_t>(alphabet - 1);
          std::vector<uint32_t> want(size_t{alphabet} * num_ctx, 0), got(want.size(), 1);
          for (size_t i = 0; i < n; ++i) ++want[((i / kCtxRun) % num_ctx) * alphabet + syms[i]];
          for (uint32_t& v : want) ++v;  // Histogram adds to what is there
          ForceScalarForTesting(mode == 1);
          ForceAvx2ForTesting(mode == 2);
          Histogram(syms.data(), n, alphabet, num_ctx, got.data());
          ForceAvx2ForTesting(false);
          ForceScalarForTesting(false);
          ASSERT_EQ(got, want);
        }
}

TEST(Rans, VectorEncoderMatchesScalar) {
  for (size_t n : {16, 17, 32, 33, 48, 1000, 4096, 65536 + 7}) {
    for (uint32_t ctx : {1u, 2u, 3u, 4u, 8u}) {
      SimdMatchesScalar(Skewed<uint8_t>(n, 256, 20.0, static_cast<uint32_t>(n + ctx)), 256, ctx);
      SimdMatchesScalar(Skewed<uint8_t>(n, 256, 0.3, static_cast<uint32_t>(n + 7 * ctx)), 256, ctx);
      // Spans of 17-32 and 33-64 symbols (the decoders' in-register tables and their gathers).
      SimdMatchesScalar(Skewed<uint8_t>(n, 256, 3.5, static_cast<uint32_t>(n + 9 * ctx)), 256, ctx);
      SimdMatchesScalar(Skewed<uint8_t>(n, 256, 7.0, static_cast<uint32_t>(n + 11 * ctx)), 256,
                        ctx);
      SimdMatchesScalar(Skewed<uint16_t>(n, 64, 2.0, static_cast<uint32_t>(n * 5 + ctx)), 64, ctx);
      SimdMatchesScalar(Skewed<uint16_t>(n, 4096, 600.0, static_cast<uint32_t>(n * 3 + ctx)), 4096,
                        ctx);
    }
  }
  SimdMatchesScalar(std::vector<uint8_t>(5000, 42), 256, 4);  // freq = 2^p: never emits
  std::vector<uint16_t> all(4096 * 3);  // every symbol of a 4096 alphabet: freq 1 at p = 15
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>((i * 37) % 4096);
  SimdMatchesScalar(all, 4096, 1);
  std::vector<uint8_t> u(100000);
  std::mt19937 rng(1);
  for (auto& v : u) v = static_cast<uint8_t>(rng());
  SimdMatchesScalar(u, 256, 1);
}

// The vector encoder's quotient estimate (float(x) times QuotientReciprocal(freq), truncated)
// is x / freq or one less, never more, at every frequency a table can hold and for x at the
// edges of each quotient (just below, at and above multiples of freq) up to freq * 2^21, the
// largest state a symbol is encoded from, and at random states in between.
TEST(Rans, QuotientEstimateIsExactOrOneLess) {
  std::mt19937 rng(7);
  for (uint32_t f = 1; f <= 1u << 15; ++f) {
    const float r = QuotientReciprocal(f);
    const uint64_t top = uint64_t{f} << 21;
    auto check = [&](uint64_t x) {
      if (x >= top || x > 0xFFFFFFFFu) return;
      const uint32_t q = static_cast<uint32_t>(x / f);
      const uint32_t est =
          static_cast<uint32_t>(static_cast<float>(static_cast<uint32_t>(x)) * r);
      ASSERT_TRUE(est == q || est + 1 == q) << "freq " << f << " x " << x << " est " << est;
    };
    for (const uint64_t m : {uint64_t{1}, uint64_t{2} << 20, (uint64_t{1} << 21) - 1,
                             uint64_t{rng() % (1u << 21)}})
      for (const int64_t d : {-1, 0, 1}) check(m * f + d);
    check(top - 1);
    for (int i = 0; i < 4; ++i) check(rng() % top);
  }
}

}  // namespace
}  // namespace strata::codec::rans
