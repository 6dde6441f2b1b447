// The calibrated transform's kernels (codec/pca.cc). Highway dynamic dispatch: this file is
// compiled once per SIMD target, like kernels.cc.
// clang-format off: foreach_target.h must follow the HWY_TARGET_INCLUDE definition.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "codec/pca_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <cmath>
#include <vector>

#include "codec/internal/kernels.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata::codec::internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Token-lane kernels: lanes are tokens, so each lane adds its terms in the scalar loop's order.
void PcaCenterTImpl(float* xt, size_t tp, size_t dim, const float* mean, double* norm2,
                    double* err2) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const size_t N = hn::Lanes(dd);
  for (size_t t = 0; t < tp; t += 2 * N) {
    auto n0 = hn::LoadU(dd, norm2 + t), n1 = hn::LoadU(dd, norm2 + t + N);
    auto e0 = hn::LoadU(dd, err2 + t), e1 = hn::LoadU(dd, err2 + t + N);
    for (size_t d = 0; d < dim; ++d) {
      float* row = xt + d * tp + t;
      const auto m = hn::Set(df, mean[d]);
      const auto x0 = hn::LoadU(df, row), x1 = hn::LoadU(df, row + N);
      const auto xd0 = hn::PromoteTo(dd, x0), xd1 = hn::PromoteTo(dd, x1);
      n0 = hn::Add(n0, hn::Mul(xd0, xd0));
      n1 = hn::Add(n1, hn::Mul(xd1, xd1));
      const auto c0 = hn::Sub(x0, m), c1 = hn::Sub(x1, m);
      const auto cd0 = hn::PromoteTo(dd, c0), cd1 = hn::PromoteTo(dd, c1);
      e0 = hn::Add(e0, hn::Mul(cd0, cd0));
      e1 = hn::Add(e1, hn::Mul(cd1, cd1));
      hn::StoreU(c0, df, row);
      hn::StoreU(c1, df, row + N);
    }
    hn::StoreU(n0, dd, norm2 + t);
    hn::StoreU(n1, dd, norm2 + t + N);
    hn::StoreU(e0, dd, err2 + t);
    hn::StoreU(e1, dd, err2 + t + N);
  }
}

// Four coordinates by four token vectors per step of d: 4 loads and 4 broadcasts per 16
// multiply-adds. Token chunks outside, so that a chunk's [d][t] columns stay in L1 while every
// coordinate is projected on them: packed, since xt's rows lie tp floats apart, which for whole
// blocks (tp 256: 1 KiB) maps them to a quarter of L1's sets.
void PcaProjectTImpl(const float* xt, size_t tp, size_t dim, const float* basis,
                     const uint32_t* coords, size_t n, float* y) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  thread_local std::vector<float> packed;
  packed.resize(dim * 4 * N);
  size_t t = 0;
  for (; t + 4 * N <= tp; t += 4 * N) {
    for (size_t i = 0; i < dim; ++i)
      for (size_t j = 0; j < 4; ++j)
        hn::StoreU(hn::LoadU(d, xt + i * tp + t + j * N), d, packed.data() + (i * 4 + j) * N);
    size_t k = 0;
    for (; k + 4 <= n; k += 4) {
      const float* b0 = basis + size_t{coords[k]} * dim;
      const float* b1 = basis + size_t{coords[k + 1]} * dim;
      const float* b2 = basis + size_t{coords[k + 2]} * dim;
      const float* b3 = basis + size_t{coords[k + 3]} * dim;
      auto s00 = hn::Zero(d), s01 = s00, s02 = s00, s03 = s00;
      auto s10 = s00, s11 = s00, s12 = s00, s13 = s00;
      auto s20 = s00, s21 = s00, s22 = s00, s23 = s00;
      auto s30 = s00, s31 = s00, s32 = s00, s33 = s00;
      for (size_t i = 0; i < dim; ++i) {
        const float* x = packed.data() + i * 4 * N;
        const auto x0 = hn::LoadU(d, x), x1 = hn::LoadU(d, x + N);
        const auto x2 = hn::LoadU(d, x + 2 * N), x3 = hn::LoadU(d, x + 3 * N);
        auto c = hn::Set(d, b0[i]);
        s00 = hn::MulAdd(x0, c, s00);
        s01 = hn::MulAdd(x1, c, s01);
        s02 = hn::MulAdd(x2, c, s02);
        s03 = hn::MulAdd(x3, c, s03);
        c = hn::Set(d, b1[i]);
        s10 = hn::MulAdd(x0, c, s10);
        s11 = hn::MulAdd(x1, c, s11);
        s12 = hn::MulAdd(x2, c, s12);
        s13 = hn::MulAdd(x3, c, s13);
        c = hn::Set(d, b2[i]);
        s20 = hn::MulAdd(x0, c, s20);
        s21 = hn::MulAdd(x1, c, s21);
        s22 = hn::MulAdd(x2, c, s22);
        s23 = hn::MulAdd(x3, c, s23);
        c = hn::Set(d, b3[i]);
        s30 = hn::MulAdd(x0, c, s30);
        s31 = hn::MulAdd(x1, c, s31);
        s32 = hn::MulAdd(x2, c, s32);
        s33 = hn::MulAdd(x3, c, s33);
      }
      float* o = y + k * tp + t;
      hn::StoreU(s00, d, o);
      hn::StoreU(s01, d, o + N);
      hn::StoreU(s02, d, o + 2 * N);
      hn::StoreU(s03, d, o + 3 * N);
      o += tp;
      hn::StoreU(s10, d, o);
      hn::StoreU(s11, d, o + N);
      hn::StoreU(s12, d, o + 2 * N);
      hn::StoreU(s13, d, o + 3 * N);
      o += tp;
      hn::StoreU(s20, d, o);
      hn::StoreU(s21, d, o + N);
      hn::StoreU(s22, d, o + 2 * N);
      hn::StoreU(s23, d, o + 3 * N);
      o += tp;
      hn::StoreU(s30, d, o);
      hn::StoreU(s31, d, o + N);
      hn::StoreU(s32, d, o + 2 * N);
      hn::StoreU(s33, d, o + 3 * N);
    }
    for (; k < n; ++k) {  // one coordinate, still four independent sums
      const float* b0 = basis + size_t{coords[k]} * dim;
      auto s0 = hn::Zero(d), s1 = s0, s2 = s0, s3 = s0;
      for (size_t i = 0; i < dim; ++i) {
        const float* x = packed.data() + i * 4 * N;
        const auto c = hn::Set(d, b0[i]);
        s0 = hn::MulAdd(hn::LoadU(d, x), c, s0);
        s1 = hn::MulAdd(hn::LoadU(d, x + N), c, s1);
        s2 = hn::MulAdd(hn::LoadU(d, x + 2 * N), c, s2);
        s3 = hn::MulAdd(hn::LoadU(d, x + 3 * N), c, s3);
      }
      float* o = y + k * tp + t;
      hn::StoreU(s0, d, o);
      hn::StoreU(s1, d, o + N);
      hn::StoreU(s2, d, o + 2 * N);
      hn::StoreU(s3, d, o + 3 * N);
    }
  }
  for (; t < tp; t += N) {  // token vectors left over (tp is a multiple of 16, not of 4N)
    size_t k = 0;
    for (; k + 4 <= n; k += 4) {
      const float* b0 = basis + size_t{coords[k]} * dim;
      const float* b1 = basis + size_t{coords[k + 1]} * dim;
      const float* b2 = basis + size_t{coords[k + 2]} * dim;
      const float* b3 = basis + size_t{coords[k + 3]} * dim;
      auto s0 = hn::Zero(d), s1 = s0, s2 = s0, s3 = s0;
      for (size_t i = 0; i < dim; ++i) {
        const auto x = hn::LoadU(d, xt + i * tp + t);
        s0 = hn::MulAdd(x, hn::Set(d, b0[i]), s0);
        s1 = hn::MulAdd(x, hn::Set(d, b1[i]), s1);
        s2 = hn::MulAdd(x, hn::Set(d, b2[i]), s2);
        s3 = hn::MulAdd(x, hn::Set(d, b3[i]), s3);
      }
      hn::StoreU(s0, d, y + k * tp + t);
      hn::StoreU(s1, d, y + (k + 1) * tp + t);
      hn::StoreU(s2, d, y + (k + 2) * tp + t);
      hn::StoreU(s3, d, y + (k + 3) * tp + t);
    }
    for (; k < n; ++k) {
      const float* b0 = basis + size_t{coords[k]} * dim;
      auto s0 = hn::Zero(d);
      for (size_t i = 0; i < dim; ++i)
        s0 = hn::MulAdd(hn::LoadU(d, xt + i * tp + t), hn::Set(d, b0[i]), s0);
      hn::StoreU(s0, d, y + k * tp + t);
    }
  }
}

void PcaQuantizeTImpl(const float* y, size_t tp, float inv_step, float step, float limit,
                      int32_t* q, float* gain, int32_t* max_abs) {
  const hn::CappedTag<float, 16> df;  // tp is a multiple of 16, not of a wider vector's lanes
  const hn::RebindToSigned<decltype(df)> di;
  const size_t N = hn::Lanes(df);
  const auto lo = hn::Set(df, -limit), hi = hn::Set(df, limit);
  const auto inv = hn::Set(df, inv_step), st = hn::Set(df, step);
  for (size_t t = 0; t < tp; t += N) {
    const auto yv = hn::LoadU(df, y + t);
    const auto qv = hn::Min(hi, hn::Max(lo, hn::Round(hn::Mul(yv, inv))));
    const auto e = hn::Sub(yv, hn::Mul(qv, st));
    const auto g = hn::Sub(hn::Mul(e, e), hn::Mul(yv, yv));
    hn::StoreU(hn::Add(hn::LoadU(df, gain + t), g), df, gain + t);
    const auto qi = hn::ConvertTo(di, qv);
    hn::StoreU(qi, di, q + t);
    hn::StoreU(hn::Max(hn::LoadU(di, max_abs + t), hn::Abs(qi)), di, max_abs + t);
  }
}

// Four tokens by four column vectors per coordinate: the basis row's loads are shared by the
// four tokens.
void PcaReconstructImpl(const float* yt, size_t tp, size_t rows, size_t n, const float* basis,
                        const uint32_t* coords, size_t dim, const float* mean, float* out,
                        size_t out_stride) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  size_t c = 0;
  for (; c + 4 * N <= dim; c += 4 * N) {
    const auto m0 = hn::LoadU(d, mean + c), m1 = hn::LoadU(d, mean + c + N);
    const auto m2 = hn::LoadU(d, mean + c + 2 * N), m3 = hn::LoadU(d, mean + c + 3 * N);
    size_t t = 0;
    for (; t + 4 <= rows; t += 4) {
      auto s00 = m0, s01 = m1, s02 = m2, s03 = m3;
      auto s10 = m0, s11 = m1, s12 = m2, s13 = m3;
      auto s20 = m0, s21 = m1, s22 = m2, s23 = m3;
      auto s30 = m0, s31 = m1, s32 = m2, s33 = m3;
      for (size_t k = 0; k < n; ++k) {
        const float* b = basis + size_t{coords[k]} * dim + c;
        const auto b0 = hn::LoadU(d, b), b1 = hn::LoadU(d, b + N);
        const auto b2 = hn::LoadU(d, b + 2 * N), b3 = hn::LoadU(d, b + 3 * N);
        const float* a = yt + k * tp + t;
        auto v = hn::Set(d, a[0]);
        s00 = hn::MulAdd(v, b0, s00);
        s01 = hn::MulAdd(v, b1, s01);
        s02 = hn::MulAdd(v, b2, s02);
        s03 = hn::MulAdd(v, b3, s03);
        v = hn::Set(d, a[1]);
        s10 = hn::MulAdd(v, b0, s10);
        s11 = hn::MulAdd(v, b1, s11);
        s12 = hn::MulAdd(v, b2, s12);
        s13 = hn::MulAdd(v, b3, s13);
        v = hn::Set(d, a[2]);
        s20 = hn::MulAdd(v, b0, s20);
        s21 = hn::MulAdd(v, b1, s21);
        s22 = hn::MulAdd(v, b2, s22);
        s23 = hn::MulAdd(v, b3, s23);
        v = hn::Set(d, a[3]);
        s30 = hn::MulAdd(v, b0, s30);
        s31 = hn::MulAdd(v, b1, s31);
        s32 = hn::MulAdd(v, b2, s32);
        s33 = hn::MulAdd(v, b3, s33);
      }
      float* o = out + t * out_stride + c;
      hn::StoreU(s00, d, o);
      hn::StoreU(s01, d, o + N);
      hn::StoreU(s02, d, o + 2 * N);
      hn::StoreU(s03, d, o + 3 * N);
      o += out_stride;
      hn::StoreU(s10, d, o);
      hn::StoreU(s11, d, o + N);
      hn::StoreU(s12, d, o + 2 * N);
      hn::StoreU(s13, d, o + 3 * N);
      o += out_stride;
      hn::StoreU(s20, d, o);
      hn::StoreU(s21, d, o + N);
      hn::StoreU(s22, d, o + 2 * N);
      hn::StoreU(s23, d, o + 3 * N);
      o += out_stride;
      hn::StoreU(s30, d, o);
      hn::StoreU(s31, d, o + N);
      hn::StoreU(s32, d, o + 2 * N);
      hn::StoreU(s33, d, o + 3 * N);
    }
    for (; t < rows; ++t) {
      auto s0 = m0, s1 = m1, s2 = m2, s3 = m3;
      for (size_t k = 0; k < n; ++k) {
        const float* b = basis + size_t{coords[k]} * dim + c;
        const auto v = hn::Set(d, yt[k * tp + t]);
        s0 = hn::MulAdd(v, hn::LoadU(d, b), s0);
        s1 = hn::MulAdd(v, hn::LoadU(d, b + N), s1);
        s2 = hn::MulAdd(v, hn::LoadU(d, b + 2 * N), s2);
        s3 = hn::MulAdd(v, hn::LoadU(d, b + 3 * N), s3);
      }
      float* o = out + t * out_stride + c;
      hn::StoreU(s0, d, o);
      hn::StoreU(s1, d, o + N);
      hn::StoreU(s2, d, o + 2 * N);
      hn::StoreU(s3, d, o + 3 * N);
    }
  }
  for (; c + N <= dim; c += N) {
    const auto m = hn::LoadU(d, mean + c);
    for (size_t t = 0; t < rows; ++t) {
      auto s = m;
      for (size_t k = 0; k < n; ++k)
        s = hn::MulAdd(hn::Set(d, yt[k * tp + t]),
                       hn::LoadU(d, basis + size_t{coords[k]} * dim + c), s);
      hn::StoreU(s, d, out + t * out_stride + c);
    }
  }
  for (; c < dim; ++c)
    for (size_t t = 0; t < rows; ++t) {
      float s = mean[c];
      for (size_t k = 0; k < n; ++k) {
        const float a = yt[k * tp + t], b = basis[size_t{coords[k]} * dim + c];
        s = HWY_NATIVE_FMA ? std::fma(a, b, s) : s + a * b;  // as the vectors add
      }
      out[t * out_stride + c] = s;
    }
}

// Symbol runs: run r of a slot's symbols sits at r * stride in the stream and holds tokens
// [r * run, (r + 1) * run) (run a multiple of the vector length: 16).
template <typename Sym>
void EmitRunsT(const int32_t* q, size_t runs, size_t run, size_t stride, int32_t offset,
               Sym* out) {
  const hn::ScalableTag<int32_t> di;
  const hn::Rebind<Sym, decltype(di)> ds;
  const size_t N = hn::Lanes(di);
  const auto off = hn::Set(di, offset);
  for (size_t r = 0; r < runs; ++r)
    for (size_t i = 0; i < run; i += N)
      hn::StoreU(hn::DemoteTo(ds, hn::Add(hn::LoadU(di, q + r * run + i), off)), ds,
                 out + r * stride + i);
}
void EmitRuns8Impl(const int32_t* q, size_t runs, size_t run, size_t stride, int32_t offset,
                   uint8_t* out) {
  EmitRunsT(q, runs, run, stride, offset, out);
}
void EmitRuns16Impl(const int32_t* q, size_t runs, size_t run, size_t stride, int32_t offset,
                    uint16_t* out) {
  EmitRunsT(q, runs, run, stride, offset, out);
}

template <typename Sym>
void DequantRunsT(const Sym* sym, size_t runs, size_t run, size_t stride, int32_t offset,
                  float step, float* out) {
  const hn::ScalableTag<int32_t> di;
  const hn::Rebind<Sym, decltype(di)> ds;
  const hn::RebindToFloat<decltype(di)> df;
  const size_t N = hn::Lanes(di);
  const auto off = hn::Set(di, offset);
  const auto st = hn::Set(df, step);
  for (size_t r = 0; r < runs; ++r)
    for (size_t i = 0; i < run; i += N) {
      const auto v = hn::Sub(hn::PromoteTo(di, hn::LoadU(ds, sym + r * stride + i)), off);
      hn::StoreU(hn::Mul(hn::ConvertTo(df, v), st), df, out + r * run + i);
    }
}
void DequantRuns8Impl(const uint8_t* sym, size_t runs, size_t run, size_t stride, int32_t offset,
                      float step, float* out) {
  DequantRunsT(sym, runs, run, stride, offset, step, out);
}
void DequantRuns16Impl(const uint16_t* sym, size_t runs, size_t run, size_t stride,
                       int32_t offset, float step, float* out) {
  DequantRunsT(sym, runs, run, stride, offset, step, out);
}

void RopeRowsImpl(float* x, size_t tokens, size_t heads, size_t dim, const float* cos,
                  const float* sin, bool inverse) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const size_t half = dim / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  const auto sg = hn::Set(d, sign);
  for (size_t tok = 0; tok < tokens; ++tok) {
    const float* c = cos + tok * half;
    const float* s = sin + tok * half;
    for (size_t h = 0; h < heads; ++h) {
      float* v = x + (tok * heads + h) * dim;
      size_t j = 0;
      for (; j + N <= half; j += N) {
        const auto a = hn::LoadU(d, v + j), b = hn::LoadU(d, v + j + half);
        const auto cj = hn::LoadU(d, c + j), sj = hn::Mul(sg, hn::LoadU(d, s + j));
        hn::StoreU(hn::Sub(hn::Mul(a, cj), hn::Mul(b, sj)), d, v + j);
        hn::StoreU(hn::Add(hn::Mul(b, cj), hn::Mul(a, sj)), d, v + j + half);
      }
      for (; j < half; ++j) {
        const float a = v[j], b = v[j + half], sj = sign * s[j];
        v[j] = a * c[j] - b * sj;
        v[j + half] = b * c[j] + a * sj;
      }
    }
  }
}

bool DispatchesToAvx512Impl() { return HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL; }
bool DispatchesToAvx2Impl() { return HWY_TARGET == HWY_AVX2; }
bool FusesMultiplyAddsImpl() { return HWY_NATIVE_FMA != 0; }

bool AllFiniteImpl(const float* x, size_t n) {
  const hn::ScalableTag<uint32_t> du;
  const hn::RebindToFloat<decltype(du)> df;
  const size_t N = hn::Lanes(du);
  const auto exp = hn::Set(du, 0x7F800000u);
  auto any = hn::Zero(du);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto e = hn::And(hn::BitCast(du, hn::LoadU(df, x + i)), exp);
    any = hn::Or(any, hn::VecFromMask(du, hn::Eq(e, exp)));
  }
  bool ok = hn::AllTrue(du, hn::Eq(any, hn::Zero(du)));
  for (; i < n; ++i) ok &= std::isfinite(x[i]);
  return ok;
}

}  // namespace HWY_NAMESPACE
}  // namespace strata::codec::internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::codec::internal {

HWY_EXPORT(PcaCenterTImpl);
HWY_EXPORT(PcaProjectTImpl);
HWY_EXPORT(PcaQuantizeTImpl);
HWY_EXPORT(PcaReconstructImpl);
HWY_EXPORT(RopeRowsImpl);
HWY_EXPORT(EmitRuns8Impl);
HWY_EXPORT(EmitRuns16Impl);
HWY_EXPORT(DequantRuns8Impl);
HWY_EXPORT(DequantRuns16Impl);
HWY_EXPORT(AllFiniteImpl);
HWY_EXPORT(DispatchesToAvx512Impl);
HWY_EXPORT(DispatchesToAvx2Impl);
HWY_EXPORT(FusesMultiplyAddsImpl);

void PcaCenterT(float* xt, size_t tp, size_t dim, const float* mean, double* norm2,
                double* err2) {
  HWY_DYNAMIC_DISPATCH(PcaCenterTImpl)(xt, tp, dim, mean, norm2, err2);
}
void PcaProjectT(const float* xt, size_t tp, size_t dim, const float* basis,
                 const uint32_t* coords, size_t n, float* y) {
  HWY_DYNAMIC_DISPATCH(PcaProjectTImpl)(xt, tp, dim, basis, coords, n, y);
}
void PcaQuantizeT(const float* y, size_t tp, float inv_step, float step, float limit, int32_t* q,
                  float* gain, int32_t* max_abs) {
  HWY_DYNAMIC_DISPATCH(PcaQuantizeTImpl)(y, tp, inv_step, step, limit, q, gain, max_abs);
}
void PcaReconstruct(const float* yt, size_t tp, size_t rows, size_t n, const float* basis,
                    const uint32_t* coords, size_t dim, const float* mean, float* out,
                    size_t out_stride) {
  HWY_DYNAMIC_DISPATCH(PcaReconstructImpl)(yt, tp, rows, n, basis, coords, dim, mean, out,
                                           out_stride);
}
void RopeRows(float* x, size_t tokens, size_t heads, size_t dim, const float* cos,
              const float* sin, bool inverse) {
  HWY_DYNAMIC_DISPATCH(RopeRowsImpl)(x, tokens, heads, dim, cos, sin, inverse);
}
void EmitRuns(const int32_t* q, size_t runs, size_t run, size_t stride, int32_t offset,
              uint8_t* out) {
  HWY_DYNAMIC_DISPATCH(EmitRuns8Impl)(q, runs, run, stride, offset, out);
}
void EmitRuns(const int32_t* q, size_t runs, size_t run, size_t stride, int32_t offset,
              uint16_t* out) {
  HWY_DYNAMIC_DISPATCH(EmitRuns16Impl)(q, runs, run, stride, offset, out);
}
void DequantRuns(const uint8_t* sym, size_t runs, size_t run, size_t stride, int32_t offset,
                 float step, float* out) {
  HWY_DYNAMIC_DISPATCH(DequantRuns8Impl)(sym, runs, run, stride, offset, step, out);
}
void DequantRuns(const uint16_t* sym, size_t runs, size_t run, size_t stride, int32_t offset,
                 float step, float* out) {
  HWY_DYNAMIC_DISPATCH(DequantRuns16Impl)(sym, runs, run, stride, offset, step, out);
}
bool AllFinite(const float* x, size_t n) { return HWY_DYNAMIC_DISPATCH(AllFiniteImpl)(x, n); }
bool DispatchesToAvx512() { return HWY_DYNAMIC_DISPATCH(DispatchesToAvx512Impl)(); }
bool DispatchesToAvx2() { return HWY_DYNAMIC_DISPATCH(DispatchesToAvx2Impl)(); }
bool FusesMultiplyAdds() { return HWY_DYNAMIC_DISPATCH(FusesMultiplyAddsImpl)(); }

}  // namespace strata::codec::internal
#endif  // HWY_ONCE
