// Highway dynamic dispatch: this file is compiled once per SIMD target.
// clang-format off: foreach_target.h must follow the HWY_TARGET_INCLUDE definition.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "codec/kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <cmath>
#include <vector>

#include "codec/half.h"
#include "codec/internal/kernels.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata::codec::internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Stores fp16(v) as FloatToHalf rounds (to nearest even). Highway 1.0.3's f32->f16 DemoteTo does
// that where the CPU converts (F16C: AVX2 and up); its emulation on the SSE4 and scalar targets
// truncates (half of all values 1 ulp off; found in session 4), so those targets convert lane by
// lane.
// Values past fp16's largest finite one, infinities included, saturate to it, as FloatToHalf's
// do; NaNs pass (Min and Max return their second operand where one is NaN, on x86).
template <class D, class V>
HWY_INLINE void StoreHalf(D d, V v, uint16_t* out) {
#if HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3 || HWY_TARGET == HWY_EMU128 || \
    HWY_TARGET == HWY_SCALAR
  HWY_ALIGN float tmp[HWY_MAX_BYTES / sizeof(float)];
  hn::Store(v, d, tmp);
  for (size_t i = 0; i < hn::Lanes(d); ++i) out[i] = FloatToHalf(tmp[i]);
#else
  const hn::Rebind<hwy::float16_t, D> dh;
  v = hn::Max(hn::Set(d, -65504.0f), hn::Min(hn::Set(d, 65504.0f), v));
  hn::StoreU(hn::DemoteTo(dh, v), dh, reinterpret_cast<hwy::float16_t*>(out));
#endif
}

void HalfToFloatRowImpl(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
#if !(HWY_TARGET == HWY_SSE4 || HWY_TARGET == HWY_SSSE3 || HWY_TARGET == HWY_EMU128 || \
      HWY_TARGET == HWY_SCALAR)
  // Without F16C, Highway 1.0.3's emulated promotion reads fp16 infinity and NaN as 65536 and
  // up; those targets take the scalar loop below.
  const hn::ScalableTag<float> d;
  const hn::Rebind<hwy::float16_t, decltype(d)> dh;
  const size_t N = hn::Lanes(d);
  for (; i + N <= n; i += N)
    hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(in + i))), d,
               out + i);
#endif
  for (; i < n; ++i) out[i] = HalfToFloat(in[i]);
}

void FloatToHalfRowImpl(const float* in, uint16_t* out, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) StoreHalf(d, hn::LoadU(d, in + i), out + i);
  for (; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

void BF16ToFloatRowImpl(const uint16_t* in, float* out, size_t n) {
  const hn::ScalableTag<uint32_t> du;
  const hn::Rebind<uint16_t, decltype(du)> du16;
  const hn::RebindToFloat<decltype(du)> df;
  const size_t N = hn::Lanes(du);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    auto v = hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(du16, in + i)));
    hn::StoreU(hn::BitCast(df, v), df, out + i);
  }
  for (; i < n; ++i) out[i] = BF16ToFloat(in[i]);
}

void FloatToBF16RowImpl(const float* in, uint16_t* out, size_t n) {
  // Round to nearest even; NaN handling in the scalar helper (rare, and only on the tail).
  const hn::ScalableTag<uint32_t> du;
  const hn::Rebind<uint16_t, decltype(du)> du16;
  const hn::RebindToFloat<decltype(du)> df;
  const size_t N = hn::Lanes(du);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    auto f = hn::LoadU(df, in + i);
    if (!hn::AllFalse(df, hn::IsNaN(f))) break;  // finish this row with the scalar path
    auto x = hn::BitCast(du, f);
    auto odd = hn::And(hn::ShiftRight<16>(x), hn::Set(du, 1));
    x = hn::Add(x, hn::Add(hn::Set(du, 0x7FFF), odd));
    hn::StoreU(
        hn::DemoteTo(du16, hn::BitCast(hn::RebindToSigned<decltype(du)>(), hn::ShiftRight<16>(x))),
        du16, out + i);
  }
  for (; i < n; ++i) out[i] = FloatToBF16(in[i]);
}

void QuantRowImpl(const float* x, const float* mu, const float* a, const float* step,
                  const float* inv_step, size_t step_group, float* xh, uint16_t* sym, size_t n,
                  int32_t offset, int32_t max_sym) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const hn::Rebind<uint16_t, decltype(d)> du16;
  const size_t N = hn::Lanes(d);
  const auto qlo = hn::Set(d, static_cast<float>(-offset));
  const auto qhi = hn::Set(d, static_cast<float>(max_sym - offset));
  const auto off = hn::Set(di, offset);
  const bool odd_group = step_group != 0 && step_group % N != 0;
  HWY_ALIGN float stv[hn::MaxLanes(d)];
  HWY_ALIGN float isv[hn::MaxLanes(d)];
  size_t i = 0;
  for (; i + N <= n; i += N) {
    hn::Vec<decltype(d)> st, is;
    if (odd_group) {
      for (size_t k = 0; k < N; ++k) {
        stv[k] = step[(i + k) / step_group];
        isv[k] = inv_step[(i + k) / step_group];
      }
      st = hn::Load(d, stv);
      is = hn::Load(d, isv);
    } else if (step_group) {
      st = hn::Set(d, step[i / step_group]);
      is = hn::Set(d, inv_step[i / step_group]);
    } else {
      st = hn::LoadU(d, step + i);
      is = hn::LoadU(d, inv_step + i);
    }
    const auto m = hn::LoadU(d, mu + i);
    const auto p = hn::Add(m, hn::Mul(hn::LoadU(d, a + i), hn::Sub(hn::LoadU(d, xh + i), m)));
    auto q = hn::Round(hn::Mul(hn::Sub(hn::LoadU(d, x + i), p), is));
    q = hn::Min(hn::Max(q, qlo), qhi);
    hn::StoreU(hn::Add(p, hn::Mul(q, st)), d, xh + i);
    hn::StoreU(hn::DemoteTo(du16, hn::Add(hn::ConvertTo(di, q), off)), du16, sym + i);
  }
  for (; i < n; ++i) {
    const size_t k = step_group ? i / step_group : i;
    const float p = mu[i] + a[i] * (xh[i] - mu[i]);
    float q = std::nearbyint((x[i] - p) * inv_step[k]);
    q = std::min(std::max(q, static_cast<float>(-offset)), static_cast<float>(max_sym - offset));
    xh[i] = p + q * step[k];
    sym[i] = static_cast<uint16_t>(static_cast<int32_t>(q) + offset);
  }
}

// Walsh-Hadamard of one n-vector held in NV registers (n = NV * Lanes, NV a compile-time
// constant, so the vectors are never spilled). In-vector stages (h < Lanes): the partner lane y
// comes from a lane permute and the new value is y + u * sgn with sgn = -1 on the high lane of
// each pair, +1 on the low lane, as one MulAdd: u * (+-1) is exact, so the single rounding gives
// round(y + u) (low lane: the scalar loop's a + b, commuted) or round(y - u) (high lane: a - b),
// the same bits as the scalar butterflies, with or without a native FMA. Then the stages
// between vectors; the caller multiplies by `sc` (1/sqrt(n)) and stores. The permute indices,
// signs and scale are set up once per call, not per vector.
// In-vector stage st (h = 1 << st) of the Hadamard: lane i's partner is i ^ h, and its sign is
// -1 on the high lane of each pair (i & h). Prefixes serve every vector length up to 16 lanes.
alignas(64) constexpr int32_t kHadamardPartner[4][16] = {
    {1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14},
    {2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13},
    {4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11},
    {8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}};
alignas(64) constexpr float kHadamardSign[4][16] = {
    {1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1},
    {1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1},
    {1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1},
    {1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1}};

template <class D>
struct HadamardKit {
  using V = hn::Vec<D>;
  using VI = hn::Vec<hn::RebindToSigned<D>>;
  using VX = decltype(hn::IndicesFromVec(D(), VI()));
  static constexpr size_t kN = hn::MaxLanes(D());       // exact on the fixed-width x86 targets
  static constexpr size_t kStages = hwy::CeilLog2(kN);  // in-vector stages h = 1, .., kN / 2
  V sgn[kStages + 1];
  VX idx[kStages + 1];
  V sc;

  HWY_INLINE HadamardKit(D d, size_t n) {
    static_assert(kN <= 16, "partner/sign tables cover 16 lanes");
    const hn::RebindToSigned<D> di;
    for (size_t st = 0; st < kStages; ++st) {
      idx[st] = hn::IndicesFromVec(d, hn::Load(di, kHadamardPartner[st]));
      sgn[st] = hn::Load(d, kHadamardSign[st]);
    }
    sc = hn::Set(d, 1.0f / std::sqrt(static_cast<float>(n)));
  }

  template <size_t NV>
  HWY_INLINE void Transform(V* u) const {
    constexpr size_t kVecStages = hwy::CeilLog2(NV);
    HWY_UNROLL(16)
    for (size_t st = 0; st < kStages; ++st) {
      HWY_UNROLL(16)
      for (size_t k = 0; k < NV; ++k)
        u[k] = hn::MulAdd(u[k], sgn[st], hn::TableLookupLanes(u[k], idx[st]));
    }
    HWY_UNROLL(16)
    for (size_t sv = 0; sv < kVecStages; ++sv) {  // h = kN << sv: pairs of vectors
      const size_t hvec = size_t{1} << sv;
      HWY_UNROLL(16)
      for (size_t p = 0; p < NV / 2; ++p) {
        const size_t j = (p / hvec) * 2 * hvec + p % hvec;
        const V a = u[j], b = u[j + hvec];
        u[j] = hn::Add(a, b);
        u[j + hvec] = hn::Sub(a, b);
      }
    }
  }
};

// Hadamard of rows of n = NV * Lanes floats in registers; floats to x or fp16 to out16.
template <size_t NV, class D>
HWY_INLINE void HadamardRegs(D d, const float* in, float* x, uint16_t* out16, size_t rows,
                             size_t n) {
  using Kit = HadamardKit<D>;
  constexpr size_t kN = Kit::kN;
  const Kit kit(d, n);
  for (size_t r = 0; r < rows; ++r) {
    const float* src = in + r * n;
    typename Kit::V u[NV];
    HWY_UNROLL(16)
    for (size_t k = 0; k < NV; ++k) u[k] = hn::LoadU(d, src + k * kN);
    kit.template Transform<NV>(u);
    if (out16) {
      HWY_UNROLL(16)
      for (size_t k = 0; k < NV; ++k) StoreHalf(d, hn::Mul(u[k], kit.sc), out16 + r * n + k * kN);
    } else {
      HWY_UNROLL(16)
      for (size_t k = 0; k < NV; ++k) hn::StoreU(hn::Mul(u[k], kit.sc), d, x + r * n + k * kN);
    }
  }
}

// One vector of the decoder row at channel i: mu + a * (xh - mu) + (sym - offset) * step (the
// caller stores it to xh). Split symbols (lo set): sym = (hi << r) + lo, hi the 8-bit `sym`
// argument; `offset` then already holds the split's base (offset - (base << r)), so
// q = sym - offset as before.
template <typename Sym, class D>
HWY_INLINE hn::Vec<D> DequantVec(D d, const Sym* sym, const float* mu, const float* a,
                                 const float* step, size_t step_group, bool odd_group, float* xh,
                                 size_t i, hn::Vec<hn::RebindToSigned<D>> off, const uint8_t* lo,
                                 int r) {
  const hn::RebindToSigned<D> di;
  const hn::Rebind<Sym, D> ds;
  const size_t N = hn::Lanes(d);
  const auto m = hn::LoadU(d, mu + i);
  const auto p = hn::Add(m, hn::Mul(hn::LoadU(d, a + i), hn::Sub(hn::LoadU(d, xh + i), m)));
  hn::Vec<D> st;
  if (odd_group) {  // groups straddle vectors: gather the steps lane by lane
    HWY_ALIGN float stv[hn::MaxLanes(d)];
    for (size_t k = 0; k < N; ++k) stv[k] = step[(i + k) / step_group];
    st = hn::Load(d, stv);
  } else {
    st = step_group ? hn::Set(d, step[i / step_group]) : hn::LoadU(d, step + i);
  }
  auto si =
      hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<decltype(di)>(), hn::LoadU(ds, sym + i)));
  if constexpr (sizeof(Sym) == 1) {
    if (lo) {
      const hn::Rebind<uint8_t, D> d8;
      si = hn::Add(hn::ShiftLeftSame(si, r),
                   hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<decltype(di)>(),
                                                 hn::LoadU(d8, lo + i))));
    }
  }
  const auto q = hn::ConvertTo(d, hn::Sub(si, off));
  return hn::Add(p, hn::Mul(q, st));
}

// The decoder row pass of a :had section (fp16 output): per head vector of n = NV * Lanes
// channels, dequantise into registers (xh stored as before), rotate there and store
// fp16(Hadamard * 1/sqrt(n)) to out16: one pass, no float row to store and reload.
template <size_t NV, typename Sym, class D>
HWY_INLINE void DequantHadamardRegs(D d, const Sym* sym, const float* mu, const float* a,
                                    const float* step, size_t step_group, bool odd_group, float* xh,
                                    uint16_t* out16, size_t n, int32_t offset, const uint8_t* lo,
                                    int r, size_t had_dim) {
  using Kit = HadamardKit<D>;
  constexpr size_t kN = Kit::kN;
  const Kit kit(d, had_dim);
  const auto off = hn::Set(hn::RebindToSigned<D>(), offset);
  for (size_t h0 = 0; h0 < n; h0 += had_dim) {
    typename Kit::V u[NV];
    HWY_UNROLL(16)
    for (size_t k = 0; k < NV; ++k)
      u[k] = DequantVec(d, sym, mu, a, step, step_group, odd_group, xh, h0 + k * kN, off, lo, r);
    // Store the head's xh only after all its loads: a store followed by a load 4 KiB apart
    // (mu, a and xh are separate 4 KiB rows at C = 1024) stalls the load (4K aliasing).
    HWY_UNROLL(16)
    for (size_t k = 0; k < NV; ++k) hn::StoreU(u[k], d, xh + h0 + k * kN);
    kit.template Transform<NV>(u);
    HWY_UNROLL(16)
    for (size_t k = 0; k < NV; ++k) StoreHalf(d, hn::Mul(u[k], kit.sc), out16 + h0 + k * kN);
  }
}

void HadamardCore(const float* in, float* x, uint16_t* out16, size_t rows, size_t n);

// Fused decoder row: xh = mu + a * (xh - mu) + (sym - offset) * step, and, when out16 is set,
// out16 = fp16(xh) in the same pass, or with had_dim != 0, out16 = fp16 of the orthonormal
// Hadamard of each had_dim-vector of the new xh (what HadamardRowsToHalf(xh) would write).
template <typename Sym>
HWY_INLINE void DequantRowT(const Sym* sym, const float* mu, const float* a, const float* step,
                            size_t step_group, float* xh, uint16_t* out16, size_t n, int32_t offset,
                            const uint8_t* lo = nullptr, int r = 0, size_t had_dim = 0) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const size_t N = hn::Lanes(d);
  const auto off = hn::Set(di, offset);
  const bool odd_group = step_group != 0 && step_group % N != 0;
  if (!out16) had_dim = 0;
  if (had_dim) {
    const size_t nv =
        N == hn::MaxLanes(d) && had_dim % N == 0 && n % had_dim == 0 ? had_dim / N : 0;
    switch (nv) {
#define STRATA_DEQUANT_HAD(NV)                                                               \
  case NV:                                                                                   \
    return DequantHadamardRegs<NV>(d, sym, mu, a, step, step_group, odd_group, xh, out16, n, \
                                   offset, lo, r, had_dim);
      STRATA_DEQUANT_HAD(1)
      STRATA_DEQUANT_HAD(2)
      STRATA_DEQUANT_HAD(4)
      STRATA_DEQUANT_HAD(8)
#undef STRATA_DEQUANT_HAD
      default: break;
    }
  }
  uint16_t* conv16 = had_dim ? nullptr : out16;  // other geometries: rotate after the pass
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto v = DequantVec(d, sym, mu, a, step, step_group, odd_group, xh, i, off, lo, r);
    hn::StoreU(v, d, xh + i);
    if (conv16) StoreHalf(d, v, conv16 + i);
  }
  for (; i < n; ++i) {
    const float p = mu[i] + a[i] * (xh[i] - mu[i]);
    const int32_t sv = lo ? (static_cast<int32_t>(sym[i]) << r) + lo[i] : sym[i];
    const float q = static_cast<float>(sv - offset);
    xh[i] = p + q * (step_group ? step[i / step_group] : step[i]);
    if (conv16) conv16[i] = FloatToHalf(xh[i]);
  }
  if (had_dim) {
    thread_local std::vector<float> scratch;
    if (scratch.size() < had_dim) scratch.resize(had_dim);
    HadamardCore(xh, scratch.data(), out16, n / had_dim, had_dim);
  }
}

void DequantRow8Impl(const uint8_t* sym, const float* mu, const float* a, const float* step,
                     size_t step_group, float* xh, uint16_t* out16, size_t n, int32_t offset,
                     size_t had_dim) {
  DequantRowT(sym, mu, a, step, step_group, xh, out16, n, offset, nullptr, 0, had_dim);
}
void DequantRowSplitImpl(const uint8_t* hi, const uint8_t* lo, int r, const float* mu,
                         const float* a, const float* step, size_t step_group, float* xh,
                         uint16_t* out16, size_t n, int32_t offset, size_t had_dim) {
  DequantRowT(hi, mu, a, step, step_group, xh, out16, n, offset, lo, r, had_dim);
}
void DequantRow16Impl(const uint16_t* sym, const float* mu, const float* a, const float* step,
                      size_t step_group, float* xh, uint16_t* out16, size_t n, int32_t offset,
                      size_t had_dim) {
  DequantRowT(sym, mu, a, step, step_group, xh, out16, n, offset, nullptr, 0, had_dim);
}

constexpr size_t kWriteAhead = 2048;

// DequantRowsF16: the row loop inside one dispatched call (a small model's 192-channel rows
// spent ~5% of decoding in per-row dispatch and set-up).
void DequantRowsImpl(const uint8_t* sym, const uint8_t* lo, int r, const float* mu, const float* a,
                     float* step, const uint16_t* steps16, size_t step_group, float* xh,
                     uint16_t* out16, size_t rows, size_t n, int32_t offset, size_t had_dim) {
  const size_t ngroups = step_group ? (n + step_group - 1) / step_group : 0;
  for (size_t t = 0; t < rows; ++t) {
    // The output lines kWriteAhead bytes ahead are fetched for writing now, so the stores of
    // later rows do not wait on them (the output is fresh memory: each line is read before it
    // is written).
    {
      const char* row = reinterpret_cast<const char*>(out16 + t * n);
      const char* end = reinterpret_cast<const char*>(out16 + rows * n);
      for (const char* p = row + kWriteAhead; p < row + kWriteAhead + n * 2 && p < end; p += 64)
        __builtin_prefetch(p, 1, 3);
    }
    for (size_t g = 0; g < ngroups; ++g) step[g] = HalfToFloat(steps16[t * ngroups + g]);
    DequantRowT(sym + t * n, mu, a, step, step_group, xh, out16 + t * n, n, offset,
                lo ? lo + t * n : nullptr, r, had_dim);
  }
}

// Orthonormal fast Walsh-Hadamard transform of each n-vector, in place. The butterflies and
// their order (h = 1, 2, 4, ...; a + b low, a - b high; then one multiply by 1/sqrt(n)) are
// those of the scalar loop, so every target gives the same bits. Stages with h < lanes run
// inside a vector (a lane permute), the others between vectors.
// Hadamard of each n-vector of `in`; writes the floats to x (may equal in) or, when out16 is set,
// only their fp16 conversion to out16 (x is then scratch of n floats).
void HadamardCore(const float* in, float* x, uint16_t* out16, size_t rows, size_t n) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const size_t N = hn::Lanes(d);
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
  if (n < N || n % N != 0) {
    for (size_t r = 0; r < rows; ++r) {
      float* v = out16 ? x : x + r * n;
      if (v != in + r * n) std::copy(in + r * n, in + (r + 1) * n, v);
      for (size_t h = 1; h < n; h <<= 1)
        for (size_t i = 0; i < n; i += 2 * h)
          for (size_t j = i; j < i + h; ++j) {
            const float a = v[j], b = v[j + h];
            v[j] = a + b;
            v[j + h] = a - b;
          }
      for (size_t i = 0; i < n; ++i) v[i] *= scale;
      if (out16)
        for (size_t i = 0; i < n; ++i) out16[r * n + i] = FloatToHalf(v[i]);
    }
    return;
  }
  switch (N == hn::MaxLanes(d) ? n / N : 0) {  // whole row in registers: see HadamardRegs
    case 1: return HadamardRegs<1>(d, in, x, out16, rows, n);
    case 2: return HadamardRegs<2>(d, in, x, out16, rows, n);
    case 4: return HadamardRegs<4>(d, in, x, out16, rows, n);
    case 8: return HadamardRegs<8>(d, in, x, out16, rows, n);
    default: break;
  }
  const auto iota = hn::Iota(di, 0);
  const auto sc = hn::Set(d, scale);
  for (size_t r = 0; r < rows; ++r) {
    float* v = out16 ? x : x + r * n;
    const float* src = in + r * n;
    for (size_t i = 0; i < n; i += N) {
      auto u = hn::LoadU(d, src + i);
      for (size_t h = 1; h < N; h <<= 1) {
        const auto hv = hn::Set(di, static_cast<int32_t>(h));
        const auto idx = hn::IndicesFromVec(d, hn::Xor(iota, hv));
        const auto y = hn::TableLookupLanes(u, idx);  // partner lane
        const auto hi = hn::RebindMask(d, hn::Ne(hn::And(iota, hv), hn::Zero(di)));
        u = hn::IfThenElse(hi, hn::Sub(y, u), hn::Add(u, y));
      }
      hn::StoreU(u, d, v + i);
    }
    for (size_t h = N; h < n; h <<= 1)
      for (size_t i = 0; i < n; i += 2 * h)
        for (size_t j = i; j < i + h; j += N) {
          const auto a = hn::LoadU(d, v + j), b = hn::LoadU(d, v + j + h);
          hn::StoreU(hn::Add(a, b), d, v + j);
          hn::StoreU(hn::Sub(a, b), d, v + j + h);
        }
    if (out16) {
      for (size_t i = 0; i < n; i += N)
        StoreHalf(d, hn::Mul(hn::LoadU(d, v + i), sc), out16 + r * n + i);
    } else {
      for (size_t i = 0; i < n; i += N) hn::StoreU(hn::Mul(hn::LoadU(d, v + i), sc), d, v + i);
    }
  }
}

void HadamardRowsImpl(float* x, size_t rows, size_t n) { HadamardCore(x, x, nullptr, rows, n); }
void HadamardRowsToHalfImpl(const float* in, float* tmp, uint16_t* out16, size_t rows, size_t n) {
  HadamardCore(in, tmp, out16, rows, n);
}

void SplitBytesImpl(const uint16_t* w, uint8_t* lo, uint8_t* hi, size_t n) {
  const hn::ScalableTag<uint16_t> d;
  const hn::RebindToSigned<decltype(d)> di;
  const hn::Rebind<uint8_t, decltype(d)> d8;
  const size_t N = hn::Lanes(d);
  const auto ff = hn::Set(d, 0xFF);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(d, w + i);
    hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di, hn::And(v, ff))), d8, lo + i);
    hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di, hn::ShiftRight<8>(v))), d8, hi + i);
  }
  for (; i < n; ++i) {
    lo[i] = static_cast<uint8_t>(w[i]);
    hi[i] = static_cast<uint8_t>(w[i] >> 8);
  }
}

void SplitSymbolsImpl(const uint16_t* sym, size_t n, int r, uint16_t base, uint8_t* hi,
                      uint8_t* lo) {
  const hn::ScalableTag<uint16_t> d;
  const hn::RebindToSigned<decltype(d)> di;
  const hn::Rebind<uint8_t, decltype(d)> d8;
  const size_t N = hn::Lanes(d);
  const auto mask = hn::Set(d, static_cast<uint16_t>((1u << r) - 1));
  const auto bv = hn::Set(d, base);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(d, sym + i);
    hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di, hn::And(v, mask))), d8, lo + i);
    hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di, hn::Sub(hn::ShiftRightSame(v, r), bv))), d8,
               hi + i);
  }
  for (; i < n; ++i) {
    lo[i] = static_cast<uint8_t>(sym[i] & ((1u << r) - 1));
    hi[i] = static_cast<uint8_t>((sym[i] >> r) - base);
  }
}

void MinMaxU16Impl(const uint16_t* x, size_t n, uint16_t* mn, uint16_t* mx) {
  const hn::ScalableTag<uint16_t> d;
  const size_t N = hn::Lanes(d);
  auto vmn = hn::Set(d, 0xFFFF), vmx = hn::Zero(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(d, x + i);
    vmn = hn::Min(vmn, v);
    vmx = hn::Max(vmx, v);
  }
  uint16_t a = hn::GetLane(hn::MinOfLanes(d, vmn)), b = hn::GetLane(hn::MaxOfLanes(d, vmx));
  for (; i < n; ++i) {
    a = std::min(a, x[i]);
    b = std::max(b, x[i]);
  }
  *mn = a;
  *mx = b;
}

void MergeBytesImpl(const uint8_t* lo, const uint8_t* hi, uint16_t* w, size_t n) {
  const hn::ScalableTag<uint16_t> d;
  const hn::Rebind<uint8_t, decltype(d)> d8;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto l = hn::PromoteTo(d, hn::LoadU(d8, lo + i));
    const auto h = hn::PromoteTo(d, hn::LoadU(d8, hi + i));
    hn::StoreU(hn::Or(l, hn::ShiftLeft<8>(h)), d, w + i);
  }
  for (; i < n; ++i) w[i] = static_cast<uint16_t>(lo[i] | (hi[i] << 8));
}

bool AccumRowImpl(const float* x, float* sum, float* mn, float* mx, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto bad = hn::FirstN(d, 0);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(d, x + i);
    bad = hn::Or(bad, hn::Not(hn::IsFinite(v)));
    hn::StoreU(hn::Add(hn::LoadU(d, sum + i), v), d, sum + i);
    if (mn) {
      hn::StoreU(hn::Min(hn::LoadU(d, mn + i), v), d, mn + i);
      hn::StoreU(hn::Max(hn::LoadU(d, mx + i), v), d, mx + i);
    }
  }
  bool finite = hn::AllFalse(d, bad);
  for (; i < n; ++i) {
    finite &= std::isfinite(x[i]);
    sum[i] += x[i];
    if (mn) {
      mn[i] = std::min(mn[i], x[i]);
      mx[i] = std::max(mx[i], x[i]);
    }
  }
  return finite;
}

void GroupRangesRowImpl(const float* x, size_t n, size_t group, float* range) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  for (size_t c0 = 0, g = 0; c0 < n; c0 += group, ++g) {
    const size_t c1 = std::min(n, c0 + group);
    float lo = x[c0], hi = x[c0];
    size_t c = c0;
    if (c1 - c0 >= N) {
      auto vlo = hn::LoadU(d, x + c0), vhi = vlo;
      for (c = c0 + N; c + N <= c1; c += N) {
        const auto v = hn::LoadU(d, x + c);
        vlo = hn::Min(vlo, v);
        vhi = hn::Max(vhi, v);
      }
      lo = hn::GetLane(hn::MinOfLanes(d, vlo));
      hi = hn::GetLane(hn::MaxOfLanes(d, vhi));
    }
    for (; c < c1; ++c) {
      lo = std::min(lo, x[c]);
      hi = std::max(hi, x[c]);
    }
    range[g] = hi - lo;
  }
}

void MaxResidualGroupsImpl(const float* x, const float* mu, const float* a, const float* xh,
                           size_t n, size_t group, float* worst) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  for (size_t c0 = 0, g = 0; c0 < n; c0 += group, ++g) {
    const size_t c1 = std::min(n, c0 + group);
    float w = 0.0f;
    size_t c = c0;
    if (c1 - c0 >= N) {
      auto vw = hn::Zero(d);
      for (; c + N <= c1; c += N) {
        const auto m = hn::LoadU(d, mu + c);
        const auto p = hn::Add(m, hn::Mul(hn::LoadU(d, a + c), hn::Sub(hn::LoadU(d, xh + c), m)));
        vw = hn::Max(vw, hn::Abs(hn::Sub(hn::LoadU(d, x + c), p)));
      }
      w = hn::GetLane(hn::MaxOfLanes(d, vw));
    }
    for (; c < c1; ++c) {
      const float p = mu[c] + a[c] * (xh[c] - mu[c]);
      w = std::max(w, std::fabs(x[c] - p));
    }
    worst[g] = w;
  }
}

// Column-blocked passes over all T rows of a tensor: for kBlock vectors of channels at a time,
// every row, with the accumulators in registers (the row-by-row kernels loaded and stored them
// once per row, and paid a dispatched call per row). Each channel's values are added in row
// order, as before, so the sums are the same bits.
constexpr size_t kBlock = 4;

void ArStatsRowImpl(const float* prev, const float* cur, const float* mu, float* num, float* den,
                    size_t n);

bool AccumRowsImpl(const float* x, size_t T, size_t C, float* sum, float* mn, float* mx) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  auto bad = hn::FirstN(d, 0);
  size_t c = 0;
  for (; c + kBlock * N <= C; c += kBlock * N) {
    hn::Vec<decltype(d)> s[kBlock], lo[kBlock], hi[kBlock];
    for (size_t k = 0; k < kBlock; ++k) {
      s[k] = hn::LoadU(d, sum + c + k * N);
      lo[k] = hi[k] = hn::Zero(d);
      if (mn) {
        lo[k] = hn::LoadU(d, mn + c + k * N);
        hi[k] = hn::LoadU(d, mx + c + k * N);
      }
    }
    for (size_t t = 0; t < T; ++t) {
      const float* r = x + t * C + c;
      HWY_UNROLL(4)
      for (size_t k = 0; k < kBlock; ++k) {
        const auto v = hn::LoadU(d, r + k * N);
        bad = hn::Or(bad, hn::Not(hn::IsFinite(v)));
        s[k] = hn::Add(s[k], v);
        if (mn) {
          lo[k] = hn::Min(lo[k], v);
          hi[k] = hn::Max(hi[k], v);
        }
      }
    }
    for (size_t k = 0; k < kBlock; ++k) {
      hn::StoreU(s[k], d, sum + c + k * N);
      if (mn) {
        hn::StoreU(lo[k], d, mn + c + k * N);
        hn::StoreU(hi[k], d, mx + c + k * N);
      }
    }
  }
  bool finite = hn::AllFalse(d, bad);
  if (c < C)  // the remaining channels row by row
    for (size_t t = 0; t < T; ++t)
      finite &=
          AccumRowImpl(x + t * C + c, sum + c, mn ? mn + c : nullptr, mn ? mx + c : nullptr, C - c);
  return finite;
}

void ArStatsRowsImpl(const float* x, size_t T, size_t C, const float* mu, float* num, float* den) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  size_t c = 0;
  for (; c + kBlock * N <= C && T > 1; c += kBlock * N) {
    hn::Vec<decltype(d)> m[kBlock], y0[kBlock], nu[kBlock], de[kBlock];
    for (size_t k = 0; k < kBlock; ++k) {
      m[k] = hn::LoadU(d, mu + c + k * N);
      y0[k] = hn::Sub(hn::LoadU(d, x + c + k * N), m[k]);
      nu[k] = hn::LoadU(d, num + c + k * N);
      de[k] = hn::LoadU(d, den + c + k * N);
    }
    for (size_t t = 1; t < T; ++t) {
      const float* r = x + t * C + c;
      HWY_UNROLL(4)
      for (size_t k = 0; k < kBlock; ++k) {
        const auto y1 = hn::Sub(hn::LoadU(d, r + k * N), m[k]);
        nu[k] = hn::Add(nu[k], hn::Mul(y0[k], y1));
        de[k] = hn::Add(de[k], hn::Mul(y0[k], y0[k]));
        y0[k] = y1;
      }
    }
    for (size_t k = 0; k < kBlock; ++k) {
      hn::StoreU(nu[k], d, num + c + k * N);
      hn::StoreU(de[k], d, den + c + k * N);
    }
  }
  if (c < C)
    for (size_t t = 1; t < T; ++t)
      ArStatsRowImpl(x + (t - 1) * C + c, x + t * C + c, mu + c, num + c, den + c, C - c);
}

void ArStatsRowImpl(const float* prev, const float* cur, const float* mu, float* num, float* den,
                    size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto m = hn::LoadU(d, mu + i);
    const auto y0 = hn::Sub(hn::LoadU(d, prev + i), m);
    const auto y1 = hn::Sub(hn::LoadU(d, cur + i), m);
    hn::StoreU(hn::Add(hn::LoadU(d, num + i), hn::Mul(y0, y1)), d, num + i);
    hn::StoreU(hn::Add(hn::LoadU(d, den + i), hn::Mul(y0, y0)), d, den + i);
  }
  for (; i < n; ++i) {
    const float y0 = prev[i] - mu[i], y1 = cur[i] - mu[i];
    num[i] += y0 * y1;
    den[i] += y0 * y0;
  }
}

void SumSquaresRowImpl(const float* x, float* acc, size_t n) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(d, x + i);
    hn::StoreU(hn::Add(hn::LoadU(d, acc + i), hn::Mul(v, v)), d, acc + i);
  }
  for (; i < n; ++i) acc[i] += x[i] * x[i];
}

const char* TargetNameImpl() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace strata::codec::internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::codec::internal {

HWY_EXPORT(HalfToFloatRowImpl);
HWY_EXPORT(FloatToHalfRowImpl);
HWY_EXPORT(BF16ToFloatRowImpl);
HWY_EXPORT(FloatToBF16RowImpl);
HWY_EXPORT(QuantRowImpl);
HWY_EXPORT(DequantRow8Impl);
HWY_EXPORT(DequantRow16Impl);
HWY_EXPORT(DequantRowSplitImpl);
HWY_EXPORT(DequantRowsImpl);
HWY_EXPORT(SplitSymbolsImpl);
HWY_EXPORT(MinMaxU16Impl);
HWY_EXPORT(HadamardRowsImpl);
HWY_EXPORT(HadamardRowsToHalfImpl);
HWY_EXPORT(SplitBytesImpl);
HWY_EXPORT(MergeBytesImpl);
HWY_EXPORT(TargetNameImpl);
HWY_EXPORT(AccumRowImpl);
HWY_EXPORT(GroupRangesRowImpl);
HWY_EXPORT(MaxResidualGroupsImpl);
HWY_EXPORT(ArStatsRowImpl);
HWY_EXPORT(AccumRowsImpl);
HWY_EXPORT(ArStatsRowsImpl);
HWY_EXPORT(SumSquaresRowImpl);

void HalfToFloatRow(const uint16_t* in, float* out, size_t n) {
  HWY_DYNAMIC_DISPATCH(HalfToFloatRowImpl)(in, out, n);
}
void FloatToHalfRow(const float* in, uint16_t* out, size_t n) {
  HWY_DYNAMIC_DISPATCH(FloatToHalfRowImpl)(in, out, n);
}
void BF16ToFloatRow(const uint16_t* in, float* out, size_t n) {
  HWY_DYNAMIC_DISPATCH(BF16ToFloatRowImpl)(in, out, n);
}
void FloatToBF16Row(const float* in, uint16_t* out, size_t n) {
  HWY_DYNAMIC_DISPATCH(FloatToBF16RowImpl)(in, out, n);
}
void QuantRow(const float* x, const float* mu, const float* a, const float* step,
              const float* inv_step, float* xh, uint16_t* sym, size_t n, int32_t offset,
              int32_t max_sym) {
  HWY_DYNAMIC_DISPATCH(QuantRowImpl)(x, mu, a, step, inv_step, 0, xh, sym, n, offset, max_sym);
}
void QuantRowGrouped(const float* x, const float* mu, const float* a, const float* step,
                     const float* inv_step, size_t step_group, float* xh, uint16_t* sym, size_t n,
                     int32_t offset, int32_t max_sym) {
  HWY_DYNAMIC_DISPATCH(QuantRowImpl)
  (x, mu, a, step, inv_step, step_group, xh, sym, n, offset, max_sym);
}
void DequantRow(const uint16_t* sym, const float* mu, const float* a, const float* step, float* xh,
                size_t n, int32_t offset) {
  HWY_DYNAMIC_DISPATCH(DequantRow16Impl)(sym, mu, a, step, 0, xh, nullptr, n, offset, 0);
}
void DequantRowF16(const uint8_t* sym, const float* mu, const float* a, const float* step,
                   size_t step_group, float* xh, uint16_t* out16, size_t n, int32_t offset,
                   size_t had_dim) {
  HWY_DYNAMIC_DISPATCH(DequantRow8Impl)
  (sym, mu, a, step, step_group, xh, out16, n, offset, had_dim);
}
void DequantRowF16(const uint16_t* sym, const float* mu, const float* a, const float* step,
                   size_t step_group, float* xh, uint16_t* out16, size_t n, int32_t offset,
                   size_t had_dim) {
  HWY_DYNAMIC_DISPATCH(DequantRow16Impl)
  (sym, mu, a, step, step_group, xh, out16, n, offset, had_dim);
}
void DequantRowSplitF16(const uint8_t* hi, const uint8_t* lo, int r, const float* mu,
                        const float* a, const float* step, size_t step_group, float* xh,
                        uint16_t* out16, size_t n, int32_t offset, size_t had_dim) {
  HWY_DYNAMIC_DISPATCH(DequantRowSplitImpl)
  (hi, lo, r, mu, a, step, step_group, xh, out16, n, offset, had_dim);
}
void DequantRowsF16(const uint8_t* sym, const uint8_t* lo, int r, const float* mu, const float* a,
                    float* step, const uint16_t* steps16, size_t step_group, float* xh,
                    uint16_t* out16, size_t rows, size_t n, int32_t offset, size_t had_dim) {
  HWY_DYNAMIC_DISPATCH(DequantRowsImpl)
  (sym, lo, r, mu, a, step, steps16, step_group, xh, out16, rows, n, offset, had_dim);
}
void SplitSymbols(const uint16_t* sym, size_t n, int r, uint16_t base, uint8_t* hi, uint8_t* lo) {
  HWY_DYNAMIC_DISPATCH(SplitSymbolsImpl)(sym, n, r, base, hi, lo);
}
void MinMaxU16(const uint16_t* x, size_t n, uint16_t* mn, uint16_t* mx) {
  HWY_DYNAMIC_DISPATCH(MinMaxU16Impl)(x, n, mn, mx);
}
void HadamardRowsToHalf(const float* in, float* tmp, uint16_t* out16, size_t rows, size_t n) {
  HWY_DYNAMIC_DISPATCH(HadamardRowsToHalfImpl)(in, tmp, out16, rows, n);
}
void HadamardRowsSimd(float* x, size_t rows, size_t n) {
  HWY_DYNAMIC_DISPATCH(HadamardRowsImpl)(x, rows, n);
}
void SplitBytes(const uint16_t* w, uint8_t* lo, uint8_t* hi, size_t n) {
  HWY_DYNAMIC_DISPATCH(SplitBytesImpl)(w, lo, hi, n);
}
void MergeBytes(const uint8_t* lo, const uint8_t* hi, uint16_t* w, size_t n) {
  HWY_DYNAMIC_DISPATCH(MergeBytesImpl)(lo, hi, w, n);
}
bool AccumRow(const float* x, float* sum, float* mn, float* mx, size_t n) {
  return HWY_DYNAMIC_DISPATCH(AccumRowImpl)(x, sum, mn, mx, n);
}
void GroupRangesRow(const float* x, size_t n, size_t group, float* range) {
  HWY_DYNAMIC_DISPATCH(GroupRangesRowImpl)(x, n, group, range);
}
void MaxResidualGroups(const float* x, const float* mu, const float* a, const float* xh, size_t n,
                       size_t group, float* worst) {
  HWY_DYNAMIC_DISPATCH(MaxResidualGroupsImpl)(x, mu, a, xh, n, group, worst);
}
void ArStatsRow(const float* prev, const float* cur, const float* mu, float* num, float* den,
                size_t n) {
  HWY_DYNAMIC_DISPATCH(ArStatsRowImpl)(prev, cur, mu, num, den, n);
}
bool AccumRows(const float* x, size_t T, size_t C, float* sum, float* mn, float* mx) {
  return HWY_DYNAMIC_DISPATCH(AccumRowsImpl)(x, T, C, sum, mn, mx);
}
void ArStatsRows(const float* x, size_t T, size_t C, const float* mu, float* num, float* den) {
  HWY_DYNAMIC_DISPATCH(ArStatsRowsImpl)(x, T, C, mu, num, den);
}
void SumSquaresRow(const float* x, float* acc, size_t n) {
  HWY_DYNAMIC_DISPATCH(SumSquaresRowImpl)(x, acc, n);
}
const char* SimdTargetName() { return HWY_DYNAMIC_DISPATCH(TargetNameImpl)(); }

}  // namespace strata::codec::internal
#endif
