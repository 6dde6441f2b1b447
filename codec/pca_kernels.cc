// The calibrated transform's kernels (codec/pca.cc). Highway dynamic dispatch: this file is
// compiled once per SIMD target, like kernels.cc.
// clang-format off: foreach_target.h must follow the HWY_TARGET_INCLUDE definition.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "codec/pca_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <cmath>

#include "codec/internal/kernels.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata::codec::internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Four rows share each load of b; every output is init + the products added in k order, so the
// vector lanes and the scalar tail give the same bits.
void MatMulRowsImpl(const float* a, size_t a_stride, size_t rows, size_t inner, const float* b,
                    size_t cols, const float* init, float* out, size_t out_stride) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  size_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float* a0 = a + r * a_stride;
    const float* a1 = a0 + a_stride;
    const float* a2 = a1 + a_stride;
    const float* a3 = a2 + a_stride;
    float* o0 = out + r * out_stride;
    size_t c = 0;
    for (; c + N <= cols; c += N) {
      auto s0 = init ? hn::LoadU(d, init + c) : hn::Zero(d);
      auto s1 = s0, s2 = s0, s3 = s0;
      for (size_t k = 0; k < inner; ++k) {
        const auto bv = hn::LoadU(d, b + k * cols + c);
        s0 = hn::Add(s0, hn::Mul(hn::Set(d, a0[k]), bv));
        s1 = hn::Add(s1, hn::Mul(hn::Set(d, a1[k]), bv));
        s2 = hn::Add(s2, hn::Mul(hn::Set(d, a2[k]), bv));
        s3 = hn::Add(s3, hn::Mul(hn::Set(d, a3[k]), bv));
      }
      hn::StoreU(s0, d, o0 + c);
      hn::StoreU(s1, d, o0 + out_stride + c);
      hn::StoreU(s2, d, o0 + 2 * out_stride + c);
      hn::StoreU(s3, d, o0 + 3 * out_stride + c);
    }
    for (; c < cols; ++c)
      for (size_t i = 0; i < 4; ++i) {
        float s = init ? init[c] : 0.0f;
        for (size_t k = 0; k < inner; ++k) s += a0[i * a_stride + k] * b[k * cols + c];
        o0[i * out_stride + c] = s;
      }
  }
  for (; r < rows; ++r) {
    const float* ar = a + r * a_stride;
    float* o = out + r * out_stride;
    size_t c = 0;
    for (; c + N <= cols; c += N) {
      auto s0 = init ? hn::LoadU(d, init + c) : hn::Zero(d);
      for (size_t k = 0; k < inner; ++k)
        s0 = hn::Add(s0, hn::Mul(hn::Set(d, ar[k]), hn::LoadU(d, b + k * cols + c)));
      hn::StoreU(s0, d, o + c);
    }
    for (; c < cols; ++c) {
      float s = init ? init[c] : 0.0f;
      for (size_t k = 0; k < inner; ++k) s += ar[k] * b[k * cols + c];
      o[c] = s;
    }
  }
}

void RoundToStepsImpl(const float* y, const float* inv_step, const float* step, size_t n,
                      float limit, float* q, float* gain) {
  const hn::ScalableTag<float> d;
  const size_t N = hn::Lanes(d);
  const auto lo = hn::Set(d, -limit), hi = hn::Set(d, limit);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto yv = hn::LoadU(d, y + i);
    const auto qv = hn::Min(hi, hn::Max(lo, hn::Round(hn::Mul(yv, hn::LoadU(d, inv_step + i)))));
    const auto e = hn::Sub(yv, hn::Mul(qv, hn::LoadU(d, step + i)));
    hn::StoreU(qv, d, q + i);
    hn::StoreU(hn::Sub(hn::Mul(e, e), hn::Mul(yv, yv)), d, gain + i);
  }
  for (; i < n; ++i) {
    const float qv = std::min(limit, std::max(-limit, std::nearbyint(y[i] * inv_step[i])));
    const float e = y[i] - qv * step[i];
    q[i] = qv;
    gain[i] = e * e - y[i] * y[i];
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace strata::codec::internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata::codec::internal {

HWY_EXPORT(MatMulRowsImpl);
HWY_EXPORT(RoundToStepsImpl);

void MatMulRows(const float* a, size_t a_stride, size_t rows, size_t inner, const float* b,
                size_t cols, const float* init, float* out, size_t out_stride) {
  HWY_DYNAMIC_DISPATCH(MatMulRowsImpl)(a, a_stride, rows, inner, b, cols, init, out, out_stride);
}
void RoundToSteps(const float* y, const float* inv_step, const float* step, size_t n, float limit,
                  float* q, float* gain) {
  HWY_DYNAMIC_DISPATCH(RoundToStepsImpl)(y, inv_step, step, n, limit, q, gain);
}

}  // namespace strata::codec::internal
#endif  // HWY_ONCE
