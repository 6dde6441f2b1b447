// The cross-layer coder's bf16 products (codec/internal/cross_layer_amx.h): the AMX tiles' kernel,
// the choice among the kernels and the operands they share.
#include "codec/internal/cross_layer_amx.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "codec/cross_layer.h"
#include "codec/half.h"
#include "codec/internal/pca_amx.h"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define STRATA_XL_AMX 1
#define STRATA_XL_AMX_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#endif

namespace strata::codec::internal {

namespace {

std::atomic<uint64_t> g_products{0};
std::atomic<XlKernel> g_cap{XlKernel::kAmx};

// STRATA_CODEC_XL_KERNEL: "float", "fma", "bf16" or "amx", the best kernel
// allowed (A/B runs; an encoder and its decoders on one machine must agree, as they do by
// default). Anything else allows every kernel.
XlKernel EnvCap() {
  static const XlKernel cap = [] {
    const char* env = std::getenv("STRATA_CODEC_XL_KERNEL");
    const std::string_view v(env == nullptr ? "" : env);
    if (v == "float") return XlKernel::kFloat;
    if (v == "fma") return XlKernel::kFma;
    if (v == "bf16") return XlKernel::kAvx512Bf16;
    return XlKernel::kAmx;
  }();
  return cap;
}

// The best kernel under `cap` that this CPU runs (AMX only where the process has the tiles).
XlKernel BestKernel(XlKernel cap, bool amx) {
  if (cap >= XlKernel::kAmx && amx) return XlKernel::kAmx;
  if (cap >= XlKernel::kAvx512Bf16 && XlBf16ProductsSupported()) return XlKernel::kAvx512Bf16;
  if (cap >= XlKernel::kFma && XlFmaProductsSupported()) return XlKernel::kFma;
  return XlKernel::kFloat;
}

// The products one at a time, as the FMA kernels sum them (the same bits): for a product asked
// of a kernel that is not there (a test's cap changed under a caller).
void ScalarProduct(const uint16_t* a, size_t lda, const XlPairs& b, size_t tokens,
                   bool accumulate, float* c, size_t ldc) {
  for (size_t t = 0; t < tokens; ++t)
    for (size_t j = 0; j < b.cols_pad; ++j) {
      float sum = accumulate ? c[t * ldc + j] : 0.0f;
      for (size_t i = 0; i < b.rows_pad; ++i)
        sum = std::fma(BF16ToFloat(a[t * lda + i]),
                       BF16ToFloat(b.words[(i / 2 * b.cols_pad + j) * 2 + i % 2]), sum);
      c[t * ldc + j] = sum;
    }
}

}  // namespace

void BuildCrossLayerTiles(CrossLayerCalibration* cal) {
  const size_t w = cal->Width(), L = cal->num_layers;
  cal->tiles.reset();
  // Not where no kernel may run them: the operands are ~0.6x the calibration's own size.
  if (BestKernel(EnvCap(), PcaAmxSupported()) == XlKernel::kFloat || w % 32 != 0) return;
  for (const CrossLayerTransform& tr : cal->layers)
    for (float st : tr.step)
      if (!(st >= 0x1p-3f)) return;
  auto tiles = std::make_shared<CrossLayerTiles>();
  tiles->predictor.resize(L);
  tiles->axes_t.resize(L);
  tiles->scaled_axes.resize(L);
  std::vector<float> at;
  for (uint32_t l = 0; l < L; ++l) {
    const CrossLayerTransform& tr = cal->layers[l];
    const size_t n = tr.step.size();
    if (l > 0) BuildXlPairs(tr.predictor.data(), w, w, nullptr, &tiles->predictor[l]);
    at.resize(w * n);
    for (size_t c = 0; c < w; ++c)
      for (size_t k = 0; k < n; ++k) at[c * n + k] = tr.axes[k * w + c];
    BuildXlPairs(at.data(), w, n, nullptr, &tiles->axes_t[l]);
    BuildXlPairs(tr.axes.data(), n, w, tr.step.data(), &tiles->scaled_axes[l]);
  }
  cal->tiles = std::move(tiles);
}

void BuildXlPairs(const float* m, size_t rows, size_t cols, const float* row_scale, XlPairs* out) {
  out->rows_pad = (rows + 31) / 32 * 32;
  out->cols_pad = (cols + 31) / 32 * 32;
  out->words.assign(out->rows_pad * out->cols_pad, 0);
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) {
      const float v = m[i * cols + j] * (row_scale ? row_scale[i] : 1.0f);
      out->words[(i / 2 * out->cols_pad + j) * 2 + i % 2] = FloatToBF16(v);
    }
}

XlKernel XlKernelInUse() {
  return BestKernel(std::min(EnvCap(), g_cap.load(std::memory_order_relaxed)), PcaAmxAvailable());
}
void SetXlKernelCapForTest(XlKernel cap) { g_cap.store(cap); }
bool XlProductsAvailable() { return XlKernelInUse() != XlKernel::kFloat; }
uint64_t XlTileProducts() { return g_products.load(std::memory_order_relaxed); }

#ifdef STRATA_XL_AMX
namespace {

// Tiles 0-3: sums for two groups of 16 tokens x two blocks of 16 columns; 4, 5: the groups'
// rows of a (32 of its columns); 6, 7: the two column blocks of b (16 pair rows).
STRATA_XL_AMX_TARGET void Product(const uint16_t* a, size_t lda, const XlPairs& b, size_t tokens,
                                  bool accumulate, float* c, size_t ldc) {
  AmxTileConfig cfg;
  for (int i = 0; i < 8; ++i) {
    cfg.rows[i] = 16;
    cfg.colsb[i] = 64;
  }
  _tile_loadconfig(&cfg);
  const size_t astride = lda * sizeof(uint16_t), cstride = ldc * sizeof(float);
  const size_t bstride = b.cols_pad * 2 * sizeof(uint16_t);
  for (size_t t = 0; t < tokens; t += 32)
    for (size_t j = 0; j < b.cols_pad; j += 32) {
      float* c0 = c + t * ldc + j;
      float* c1 = c0 + 16 * ldc;
      if (accumulate) {
        _tile_loadd(0, c0, cstride);
        _tile_loadd(1, c1, cstride);
        _tile_loadd(2, c0 + 16, cstride);
        _tile_loadd(3, c1 + 16, cstride);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (size_t k = 0; k < b.rows_pad; k += 32) {
        _tile_loadd(4, a + t * lda + k, astride);
        _tile_loadd(5, a + (t + 16) * lda + k, astride);
        const uint16_t* bk = b.words.data() + (k / 2 * b.cols_pad + j) * 2;
        _tile_loadd(6, bk, bstride);
        _tile_loadd(7, bk + 32, bstride);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 5, 6);
        _tile_dpbf16ps(2, 4, 7);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, c0, cstride);
      _tile_stored(1, c1, cstride);
      _tile_stored(2, c0 + 16, cstride);
      _tile_stored(3, c1 + 16, cstride);
    }
  _tile_release();
}

}  // namespace
#endif

void XlProduct(const uint16_t* a, size_t lda, const XlPairs& b, size_t tokens, bool accumulate,
               float* c, size_t ldc) {
  switch (XlKernelInUse()) {
    case XlKernel::kAmx:
#ifdef STRATA_XL_AMX
      Product(a, lda, b, tokens, accumulate, c, ldc);
#else
      ScalarProduct(a, lda, b, tokens, accumulate, c, ldc);
#endif
      break;
    case XlKernel::kAvx512Bf16:
      XlProductBf16(a, lda, b, tokens, accumulate, c, ldc);
      break;
    case XlKernel::kFma:
      XlProductFma(a, lda, b, tokens, accumulate, c, ldc);
      break;
    case XlKernel::kFloat:  // callers ask XlProductsAvailable first
      ScalarProduct(a, lda, b, tokens, accumulate, c, ldc);
      break;
  }
  g_products.fetch_add(1, std::memory_order_relaxed);
}

void XlToBf16(const float* src, size_t n, size_t n_pad, uint16_t* dst) {
  XlToBf16Vector(src, n, n_pad, dst);
}

}  // namespace strata::codec::internal
