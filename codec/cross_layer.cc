// Cross-layer transform coding (codec/cross_layer.h). Two ways to the same products: bf16
// operands (internal/cross_layer_amx.h: AMX tiles, AVX512-BF16, or FMAs on AVX2,
// whichever the CPU has), else plain float loops, every product the reconstruction depends on
// written as a row update (out[c] += a * row[c]) in a fixed order, which compilers vectorise
// without reordering sums (the library is built with -ffp-contract=off). Either way the
// encoder's closed-loop reconstruction is the decoder's bit for bit where both take the same
// kernel; the bf16 kernels differ among themselves by float rounding, and from the float loops
// by bf16's rounding, which does not grow through the layers (docs/codec.md).
#include "codec/cross_layer.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/calibration.h"
#include "codec/half.h"
#include "codec/internal/byte_io.h"
#include "codec/internal/cross_layer_amx.h"
#include "codec/internal/cross_layer_layout.h"
#include "codec/internal/kernels.h"
#include "codec/internal/pca_amx.h"
#include "codec/internal/sections.h"
#include "codec/internal/size_model.h"
#include "codec/rans.h"
#include "common/crc32c.h"
#include "common/status_macros.h"

namespace strata::codec {

using internal::ByteReader;
using internal::ByteWriter;

namespace {

// "SXL1": every layer's symbols in a stream of its own (128 states each, ~3 % of a 1.5
// bits/value payload); "SXL2": one stream for the block, after the last layer (what the encoder
// writes; both decode).
constexpr uint32_t kMagicLayerStreams = 0x314C5853;  // "SXL1" little-endian
constexpr uint32_t kMagic = 0x324C5853;              // "SXL2"
std::atomic<bool> g_layer_streams{false};  // internal::XlWriteLayerStreamsForTesting
constexpr uint32_t kContexts = 16;
constexpr int32_t kMaxQ = 2047;  // alphabet <= 4095 < rans::kMaxAlphabet
constexpr size_t kRun = rans::kCtxRun;

// The loops below are row updates; built for AVX-512 and AVX2 beside the baseline (chosen at
// load time), they compute the same bits on each: no sum is reordered, none contracted. Not
// under ThreadSanitizer: the clones' resolver runs while the loader relocates, before TSan's
// runtime is up, and its instrumented entry crashes every program that links the codec.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define STRATA_XL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define STRATA_XL_CLONES
#endif

// RoPE's cosines and sines for tokens first .. first + T - 1, [t][D / 2].
struct Angles {
  std::vector<float> cos, sin;
};

void MakeAngles(size_t tokens, size_t dim, uint64_t first, double theta, Angles* a) {
  const size_t half = dim / 2;
  a->cos.resize(tokens * half);
  a->sin.resize(tokens * half);
  for (size_t j = 0; j < half; ++j) {
    const double freq = std::pow(theta, -2.0 * static_cast<double>(j) / static_cast<double>(dim));
    for (size_t t = 0; t < tokens; ++t) {
      const double angle = static_cast<double>(first + t) * freq;
      a->cos[t * half + j] = static_cast<float>(std::cos(angle));
      a->sin[t * half + j] = static_cast<float>(std::sin(angle));
    }
  }
}

// Where the geometry comes from: the block's sections are [layer][tensor][token][head][dim].
struct Shape {
  size_t tokens, heads, dim, width, es;
  DType dtype;
  size_t Section(uint32_t layer, uint32_t tensor) const {  // bytes before (layer, tensor)
    return ((size_t{layer} * 2 + tensor) * tokens) * heads * dim * es;
  }
  size_t RowBytes() const { return heads * dim * es; }  // one token of one tensor
};

Shape ShapeOf(const KvLayout& l) {
  const size_t hd = size_t{l.num_kv_heads} * l.head_dim;
  return {l.tokens_per_block, l.num_kv_heads, l.head_dim, 2 * hd, DTypeBytes(l.dtype), l.dtype};
}

// A token's row in the calibration's units from its key and value (floats, H * D each): keys
// rotated back by RoPE where `cos` is given, every head divided by its scale ([tensor][head]).
void ToRow(const Shape& s, const float* k, const float* v, const float* cos, const float* sin,
           const float* scale, float* row) {
  const size_t half = s.dim / 2;
  for (size_t h = 0; h < s.heads; ++h) {
    const float* kh = k + h * s.dim;
    float* out = row + h * s.dim;
    const float ks = scale[h];
    if (cos) {
      for (size_t j = 0; j < half; ++j) {
        const float a = kh[j], b = kh[j + half];
        out[j] = (a * cos[j] + b * sin[j]) / ks;
        out[j + half] = (b * cos[j] - a * sin[j]) / ks;
      }
    } else {
      for (size_t j = 0; j < s.dim; ++j) out[j] = kh[j] / ks;
    }
    const float vs = scale[s.heads + h];
    for (size_t j = 0; j < s.dim; ++j) out[s.heads * s.dim + j] = v[h * s.dim + j] / vs;
  }
}

// The inverse: a row back to the key and value (floats), RoPE redone.
// (Vectorised per ISA: its results only ever leave as the block's values, never feed a
// prediction.)
STRATA_XL_CLONES void FromRow(const Shape& s, const float* __restrict__ row,
                              const float* __restrict__ cos, const float* __restrict__ sin,
                              const float* __restrict__ scale, float* __restrict__ k,
                              float* __restrict__ v) {
  const size_t half = s.dim / 2;
  for (size_t h = 0; h < s.heads; ++h) {
    const float* in = row + h * s.dim;
    float* kh = k + h * s.dim;
    const float ks = scale[h];
    if (cos) {
      for (size_t j = 0; j < half; ++j) {
        const float a = in[j] * ks, b = in[j + half] * ks;
        kh[j] = a * cos[j] - b * sin[j];
        kh[j + half] = b * cos[j] + a * sin[j];
      }
    } else {
      for (size_t j = 0; j < s.dim; ++j) kh[j] = in[j] * ks;
    }
    const float vs = scale[s.heads + h];
    for (size_t j = 0; j < s.dim; ++j) v[h * s.dim + j] = in[s.heads * s.dim + j] * vs;
  }
}

// Scratch for a block's layer: its keys and values as floats and its rows.
struct LayerFloats {
  std::vector<float> k, v;
};

// Layer `layer` of `block` as rows [t][width]. False where a value is not finite.
bool LayerRows(const Shape& s, const uint8_t* block, uint32_t layer, const Angles* angles,
               const float* scale, LayerFloats* f, float* rows) {
  const size_t n = s.tokens * s.heads * s.dim, half = s.dim / 2;
  f->k.resize(n);
  f->v.resize(n);
  internal::ToFloat(block + s.Section(layer, 0), s.dtype, f->k.data(), n);
  internal::ToFloat(block + s.Section(layer, 1), s.dtype, f->v.data(), n);
  if (!internal::AllFinite(f->k.data(), n) || !internal::AllFinite(f->v.data(), n)) return false;
  for (size_t t = 0; t < s.tokens; ++t)
    ToRow(s, f->k.data() + t * s.heads * s.dim, f->v.data() + t * s.heads * s.dim,
          angles ? angles->cos.data() + t * half : nullptr,
          angles ? angles->sin.data() + t * half : nullptr, scale, rows + t * s.width);
  return true;
}

// guess[t] = (below[t] - below_mean) P, as row updates in input order, 16 tokens at a time
// (the predictor's rows stay in cache across them).
STRATA_XL_CLONES void Predict(const float* below, const float* below_mean, const float* p,
                              size_t tokens, size_t width, std::vector<float>* centred,
                              float* guess) {
  std::fill(guess, guess + tokens * width, 0.0f);
  centred->resize(tokens * width);
  for (size_t t = 0; t < tokens; ++t)
    for (size_t i = 0; i < width; ++i)
      (*centred)[t * width + i] = below[t * width + i] - below_mean[i];
  for (size_t t0 = 0; t0 < tokens; t0 += 16) {
    const size_t t1 = std::min(tokens, t0 + 16);
    for (size_t i = 0; i < width; ++i) {
      const float* row = p + i * width;
      for (size_t t = t0; t < t1; ++t) {
        const float a = (*centred)[t * width + i];
        float* out = guess + t * width;
        for (size_t c = 0; c < width; ++c) out[c] += a * row[c];
      }
    }
  }
}

// hat[t] = mean + guess[t] + sum over k of q[t][k] (step[k] step_scale) axis k (k in order,
// zeros skipped: adding a zero product would not change a sum that is not -0).
STRATA_XL_CLONES void Reconstruct(const CrossLayerTransform& tr, const float* guess,
                                  const int32_t* q, size_t tokens, size_t width, float step_scale,
                                  float* hat) {
  const size_t n = tr.step.size();
  for (size_t t = 0; t < tokens; ++t) {
    float* out = hat + t * width;
    for (size_t c = 0; c < width; ++c) out[c] = tr.mean[c] + guess[t * width + c];
    for (size_t k = 0; k < n; ++k) {
      const int32_t qk = q[t * n + k];
      if (qk == 0) continue;
      const float a = static_cast<float>(qk) * (tr.step[k] * step_scale);
      const float* axis = tr.axes.data() + k * width;
      for (size_t c = 0; c < width; ++c) out[c] += a * axis[c];
    }
  }
}

// y[t] = (rows[t] - mean - guess[t]) axes^T, from the axes transposed ([c][k]).
STRATA_XL_CLONES void Project(const float* rows, const float* mean, const float* guess,
                              const float* axes_t, size_t tokens, size_t width, size_t n,
                              float* y) {
  for (size_t t = 0; t < tokens; ++t) {
    float* out = y + t * n;
    std::fill(out, out + n, 0.0f);
    for (size_t c = 0; c < width; ++c) {
      const float r = rows[t * width + c] - mean[c] - guess[t * width + c];
      const float* at = axes_t + c * n;
      for (size_t j = 0; j < n; ++j) out[j] += r * at[j];
    }
  }
}

// residual[r] -= below[r] P (doubles less the float predictor's products).
STRATA_XL_CLONES void SubtractPrediction(const std::vector<double>& below, const float* p,
                                         size_t rows, size_t width, std::vector<double>* residual) {
  for (size_t r = 0; r < rows; ++r) {
    double* out = residual->data() + r * width;
    for (size_t i = 0; i < width; ++i) {
      const double a = below[r * width + i];
      if (a == 0) continue;
      const float* prow = p + i * width;
      for (size_t c = 0; c < width; ++c) out[c] -= a * prow[c];
    }
  }
}

// most[k] = max over rows of |x[r] . vectors[k]| (vectors row-major, k < width).
STRATA_XL_CLONES void LargestCoordinates(const std::vector<double>& x,
                                         const std::vector<double>& vectors, size_t rows,
                                         size_t width, std::vector<double>* most) {
  std::vector<double> vt(width * width), y(width);
  for (size_t k = 0; k < width; ++k)
    for (size_t c = 0; c < width; ++c) vt[c * width + k] = vectors[k * width + c];
  most->assign(width, 0.0);
  for (size_t r = 0; r < rows; ++r) {
    std::fill(y.begin(), y.end(), 0.0);
    for (size_t c = 0; c < width; ++c) {
      const double a = x[r * width + c];
      const double* row = vt.data() + c * width;
      for (size_t k = 0; k < width; ++k) y[k] += a * row[k];
    }
    for (size_t k = 0; k < width; ++k) (*most)[k] = std::max((*most)[k], std::abs(y[k]));
  }
}

// The symbol runs: nslots = coded rounded up to the contexts, slot j = i * kContexts + c holding
// coordinate c * (nslots / kContexts) + i (padding: zero); run (g, j) holds tokens g * 16 ..
// g * 16 + 15, so run r's context r mod kContexts is its coordinate's rank class.
size_t Slots(size_t coded) { return (coded + kContexts - 1) / kContexts * kContexts; }
size_t SlotCoordinate(size_t j, size_t nslots) {
  return (j % kContexts) * (nslots / kContexts) + j / kContexts;
}

double Dot(const double* a, const double* b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// x = A^-1 B for symmetric positive definite A (n x n) and B (n x m), by Cholesky; false if A
// is not positive definite. A is overwritten.
bool SolveSpd(std::vector<double>* a, size_t n, std::vector<double>* b, size_t m) {
  std::vector<double>& l = *a;  // lower triangle: L
  for (size_t j = 0; j < n; ++j) {
    double d = l[j * n + j] - Dot(&l[j * n], &l[j * n], j);
    if (!(d > 0)) return false;
    d = std::sqrt(d);
    l[j * n + j] = d;
    for (size_t i = j + 1; i < n; ++i)
      l[i * n + j] = (l[i * n + j] - Dot(&l[i * n], &l[j * n], j)) / d;
  }
  std::vector<double>& x = *b;
  for (size_t i = 0; i < n; ++i) {  // L y = B
    for (size_t k = 0; k < i; ++k) {
      const double lik = l[i * n + k];
      for (size_t c = 0; c < m; ++c) x[i * m + c] -= lik * x[k * m + c];
    }
    for (size_t c = 0; c < m; ++c) x[i * m + c] /= l[i * n + i];
  }
  for (size_t i = n; i-- > 0;) {  // L^T X = Y
    for (size_t k = i + 1; k < n; ++k) {
      const double lki = l[k * n + i];
      for (size_t c = 0; c < m; ++c) x[i * m + c] -= lki * x[k * m + c];
    }
    for (size_t c = 0; c < m; ++c) x[i * m + c] /= l[i * n + i];
  }
  return true;
}

// c = a^T b for a (rows x n) and b (rows x m), row-major.
STRATA_XL_CLONES void TransposeTimes(const std::vector<double>& a, size_t n,
                                     const std::vector<double>& b, size_t m, size_t rows,
                                     std::vector<double>* c) {
  c->assign(n * m, 0.0);
  for (size_t r = 0; r < rows; ++r)
    for (size_t i = 0; i < n; ++i) {
      const double ai = a[r * n + i];
      if (ai == 0) continue;
      double* out = c->data() + i * m;
      const double* br = b.data() + r * m;
      for (size_t j = 0; j < m; ++j) out[j] += ai * br[j];
    }
}

}  // namespace

absl::StatusOr<CrossLayerCalibration> CalibrateCrossLayer(
    const KvLayout& layout, std::span<const std::span<const uint8_t>> blocks,
    const CrossLayerOptions& opts) {
  STRATA_RETURN_IF_ERROR(layout.Validate());
  if (blocks.empty()) return absl::InvalidArgumentError("cross-layer calibration: no samples");
  if (!(opts.step > 0) || !std::isfinite(opts.step) || !(opts.ridge >= 0) ||
      !std::isfinite(opts.ridge) || !(opts.rope_theta == 0 || opts.rope_theta >= 1) ||
      !std::isfinite(opts.rope_theta) || opts.rope_theta > 3e38)
    return absl::InvalidArgumentError(
        "cross-layer calibration: step must be > 0, ridge >= 0, rope_theta 0 or >= 1, all "
        "finite");
  if (!opts.first_positions.empty() && opts.first_positions.size() != blocks.size())
    return absl::InvalidArgumentError("cross-layer calibration: one first position per block");
  const size_t L = layout.num_layers;
  if (!opts.importance.empty()) {
    if (opts.importance.size() != L * 2)
      return absl::InvalidArgumentError(absl::StrCat(
          "cross-layer calibration: importances come one per (layer, tensor): ", L * 2, ", not ",
          opts.importance.size()));
    for (double w : opts.importance)
      if (!(w > 0) || !std::isfinite(w))
        return absl::InvalidArgumentError("cross-layer calibration: importances must be > 0");
  }
  CrossLayerCalibration cal;
  cal.num_layers = layout.num_layers;
  cal.num_kv_heads = layout.num_kv_heads;
  cal.head_dim = layout.head_dim;
  cal.rope_theta = static_cast<float>(opts.rope_theta);
  cal.step = static_cast<float>(opts.step);
  cal.version = opts.version;
  cal.layers.resize(L);
  cal.scale.assign(L * 2 * layout.num_kv_heads, 1.0f);
  STRATA_RETURN_IF_ERROR(internal::CrossLayerLayoutFits(layout, cal.num_layers, cal.num_kv_heads,
                                                         cal.head_dim, cal.rope_theta));
  const Shape s = ShapeOf(layout);
  for (const auto& b : blocks)
    if (b.size() != layout.BlockBytes())
      return absl::InvalidArgumentError("cross-layer calibration: a sample is not one block");
  const size_t w = s.width, rows_n = blocks.size() * s.tokens;
  std::vector<Angles> angles(blocks.size());
  if (cal.rope_theta > 0)
    for (size_t b = 0; b < blocks.size(); ++b)
      MakeAngles(s.tokens, s.dim,
                 opts.first_positions.empty() ? b * s.tokens : opts.first_positions[b],
                 cal.rope_theta, &angles[b]);

  std::vector<double> below, cur(rows_n * w), centred(rows_n * w), residual;
  std::vector<float> rows(s.tokens * w);
  std::vector<double> gram, cross, values, vectors;
  LayerFloats f;
  const std::vector<float> unit(2 * s.heads, 1.0f);
  for (uint32_t l = 0; l < L; ++l) {
    // The layer's rows as given (keys rotated back), then each head brought to unit rms.
    for (size_t b = 0; b < blocks.size(); ++b) {
      if (!LayerRows(s, blocks[b].data(), l, cal.rope_theta > 0 ? &angles[b] : nullptr, unit.data(),
                     &f, rows.data()))
        return absl::InvalidArgumentError("cross-layer calibration: non-finite sample");
      std::copy(rows.begin(), rows.end(), cur.begin() + b * s.tokens * w);
    }
    std::vector<double> mean(w, 0.0);
    for (size_t r = 0; r < rows_n; ++r)
      for (size_t c = 0; c < w; ++c) mean[c] += cur[r * w + c];
    for (double& m : mean) m /= static_cast<double>(rows_n);
    float* scale = cal.scale.data() + size_t{l} * 2 * s.heads;
    for (size_t g = 0; g < 2 * s.heads; ++g) {  // (tensor, head) = columns g * D ..
      double energy = 0;
      for (size_t r = 0; r < rows_n; ++r)
        for (size_t c = g * s.dim; c < (g + 1) * s.dim; ++c) {
          const double d = cur[r * w + c] - mean[c];
          energy += d * d;
        }
      const double rms = std::sqrt(energy / static_cast<double>(rows_n * s.dim));
      const double weight = opts.importance.empty() ? 1.0 : opts.importance[l * 2 + g / s.heads];
      scale[g] = rms > 0 ? static_cast<float>(rms / std::sqrt(weight)) : 1.0f;
    }
    for (size_t r = 0; r < rows_n; ++r)
      for (size_t c = 0; c < w; ++c) {
        // In float first, as ToRow divides for the encoder and decoder.
        const float v = static_cast<float>(cur[r * w + c]) / scale[c / s.dim];
        cur[r * w + c] = v;
      }
    CrossLayerTransform& tr = cal.layers[l];
    tr.mean.assign(w, 0.0f);
    std::fill(mean.begin(), mean.end(), 0.0);
    for (size_t r = 0; r < rows_n; ++r)
      for (size_t c = 0; c < w; ++c) mean[c] += cur[r * w + c];
    for (size_t c = 0; c < w; ++c) {
      mean[c] /= static_cast<double>(rows_n);
      tr.mean[c] = static_cast<float>(mean[c]);
    }
    for (size_t r = 0; r < rows_n; ++r)
      for (size_t c = 0; c < w; ++c) centred[r * w + c] = cur[r * w + c] - tr.mean[c];
    residual = centred;
    if (l > 0) {
      // Ridge regression of this layer on the one below (both centred): (A^T A + ridge N I) P
      // = A^T B.
      TransposeTimes(below, w, below, w, rows_n, &gram);
      for (size_t i = 0; i < w; ++i) gram[i * w + i] += opts.ridge * static_cast<double>(rows_n);
      TransposeTimes(below, w, centred, w, rows_n, &cross);
      if (!SolveSpd(&gram, w, &cross, w)) {  // only with ridge 0 and degenerate samples
        for (size_t i = 0; i < w; ++i) gram[i * w + i] = 0;
        cross.assign(w * w, 0.0);
      }
      tr.predictor.resize(w * w);
      for (size_t i = 0; i < w * w; ++i) tr.predictor[i] = static_cast<float>(cross[i]);
      SubtractPrediction(below, tr.predictor.data(), rows_n, w, &residual);
    }
    // The residual's principal axes, by decreasing variance.
    TransposeTimes(residual, w, residual, w, rows_n, &gram);
    for (double& g : gram) g /= static_cast<double>(std::max<size_t>(rows_n - 1, 1));
    SymmetricEigenHouseholder(gram, w, &values, &vectors);
    // Coded: the coordinates some sample reaches half a step on.
    std::vector<double> most;
    LargestCoordinates(residual, vectors, rows_n, w, &most);
    tr.axes.clear();
    tr.step.clear();
    for (size_t k = 0; k < w; ++k) {
      if (most[k] < 0.5 * opts.step) continue;
      for (size_t c = 0; c < w; ++c) tr.axes.push_back(static_cast<float>(vectors[k * w + c]));
      tr.step.push_back(static_cast<float>(opts.step));
    }
    below = centred;
  }
  internal::BuildCrossLayerTiles(&cal);
  // The rate the calibration gives, on samples it was made from (as pca's sample_bits).
  std::vector<uint8_t> payload;
  uint64_t bytes = 0, coded_values = 0;
  for (size_t b = 0; b < std::min(opts.rate_samples, blocks.size()); ++b) {
    payload.clear();
    const uint64_t first = opts.first_positions.empty() ? b * s.tokens : opts.first_positions[b];
    STRATA_RETURN_IF_ERROR(EncodeCrossLayer(cal, layout, blocks[b], first, &payload));
    bytes += payload.size();
    coded_values += layout.BlockBytes() / DTypeBytes(layout.dtype);
  }
  if (coded_values > 0) cal.sample_bits = static_cast<float>(8.0 * bytes / coded_values);
  return cal;
}

namespace {

struct Work {
  LayerFloats f;
  std::vector<float> rows, hat, below_hat, guess, centred, axes_t, y, kf, vf, squares;
  std::vector<int32_t> q;
  std::vector<uint16_t> syms, a, qa;  // a, qa: the tiles' bf16 token rows (qa: of q)
  rans::Scratch rans;
  // The encoder's per layer: its header and exact rows, then its symbols (coded last to first
  // into one stream once every layer is quantised: the decoder reads the stream from its end).
  std::vector<std::vector<uint8_t>> head;
  std::vector<std::vector<uint16_t>> layer_syms;
  std::vector<uint16_t> layer_maxq;
  rans::SharedEncoder shared;
};

// Whether a step scale keeps every scaled step where the tiles' bf16 projection is accurate
// enough (BuildTiles asks 2^-3 of the calibrated steps).
bool ScaledStepsFitTiles(const CrossLayerCalibration& cal, float step_scale) {
  if (step_scale >= 1) return true;
  for (const CrossLayerTransform& tr : cal.layers)
    for (float st : tr.step)
      if (!(st * step_scale >= 0x1p-3f)) return false;
  return true;
}

bool UseTiles(const CrossLayerCalibration& cal, size_t tokens, float step_scale) {
  return cal.tiles && internal::XlProductsAvailable() && tokens % 32 == 0 &&
         ScaledStepsFitTiles(cal, step_scale);
}

// On the tiles: guess = (below_hat - the mean below) P, zero for layer 0.
void TileGuess(const CrossLayerCalibration& cal, uint32_t l, size_t tokens, Work* k) {
  const size_t w = cal.Width();
  if (l == 0) {
    std::fill(k->guess.begin(), k->guess.end(), 0.0f);
    return;
  }
  const float* below_mean = cal.layers[l - 1].mean.data();
  k->a.resize(tokens * w);
  k->centred.resize(w);
  for (size_t t = 0; t < tokens; ++t) {
    for (size_t c = 0; c < w; ++c) k->centred[c] = k->below_hat[t * w + c] - below_mean[c];
    internal::XlToBf16(k->centred.data(), w, w, k->a.data() + t * w);
  }
  internal::XlProduct(k->a.data(), w, cal.tiles->predictor[l], tokens, false, k->guess.data(), w);
}

// On the tiles: y = (rows - mean - guess) axes^T, tokens x the padded coded count.
void TileProject(const CrossLayerCalibration& cal, uint32_t l, size_t tokens, Work* k) {
  const size_t w = cal.Width();
  const CrossLayerTransform& tr = cal.layers[l];
  const internal::XlPairs& b = cal.tiles->axes_t[l];
  k->a.resize(tokens * w);
  k->centred.resize(w);
  for (size_t t = 0; t < tokens; ++t) {
    for (size_t c = 0; c < w; ++c)
      k->centred[c] = k->rows[t * w + c] - tr.mean[c] - k->guess[t * w + c];
    internal::XlToBf16(k->centred.data(), w, w, k->a.data() + t * w);
  }
  k->y.resize(tokens * b.cols_pad);
  internal::XlProduct(k->a.data(), w, b, tokens, false, k->y.data(), b.cols_pad);
}

// The reconstruction's operand on the tiles: q as bf16 token rows of the scaled axes' padded
// width (every |q| <= 32 is exact in bf16), from the encoder's q.
void TileHatRows(const CrossLayerCalibration& cal, uint32_t l, size_t tokens, Work* k) {
  const size_t n = cal.layers[l].step.size();
  const size_t rows_pad = cal.tiles->scaled_axes[l].rows_pad;
  k->qa.resize(tokens * rows_pad);
  k->centred.resize(n);
  for (size_t t = 0; t < tokens; ++t) {
    for (size_t j = 0; j < n; ++j) k->centred[j] = static_cast<float>(k->q[t * n + j]);
    internal::XlToBf16(k->centred.data(), n, rows_pad, k->qa.data() + t * rows_pad);
  }
}

// The same rows straight from the decoded symbol runs (word for word what TileHatRows makes of
// the q they hold), checking on the way that padding slots and the exact tokens' rows hold
// zeros; false where one does not. The decoder's q never exists as integers on this path.
bool TileHatRowsFromSymbols(const CrossLayerCalibration& cal, uint32_t l, size_t tokens,
                            uint16_t maxq, const std::vector<uint16_t>& exact, Work* k) {
  const size_t n = cal.layers[l].step.size();
  const size_t rows_pad = cal.tiles->scaled_axes[l].rows_pad, nslots = Slots(n);
  uint16_t bf16_of[2 * 32 + 1];  // TileHatFits: maxq <= 32
  for (int32_t s = 0; s <= 2 * int32_t{maxq}; ++s)
    bf16_of[s] = FloatToBF16(static_cast<float>(s - int32_t{maxq}));
  k->qa.resize(tokens * rows_pad);
  for (size_t t = 0; t < tokens; ++t)  // nslots <= rows_pad; the rest of a row is padding
    std::fill_n(k->qa.data() + t * rows_pad + nslots, rows_pad - nslots, uint16_t{0});
  uint32_t bad = 0;
  for (size_t g = 0; g < tokens / kRun; ++g)
    for (size_t j = 0; j < nslots; ++j) {
      const size_t coord = SlotCoordinate(j, nslots);
      const uint16_t* run = k->syms.data() + (g * nslots + j) * kRun;
      uint16_t* dst = k->qa.data() + g * kRun * rows_pad + coord;
      if (coord >= n)
        for (size_t i = 0; i < kRun; ++i) bad |= run[i] ^ maxq;
      for (size_t i = 0; i < kRun; ++i) dst[i * rows_pad] = bf16_of[run[i]];
    }
  for (uint16_t t : exact)
    for (size_t c = 0; c < n; ++c) bad |= k->qa[t * rows_pad + c];
  return bad == 0;
}

// On the tiles: hat = mean + (guess + q (steps x axes)), the sums continuing the prediction's;
// with a step scale, guess + step_scale (q (steps x axes)), the product's sums scaled in fp32.
// q comes as k->qa (TileHatRows).
void TileHat(const CrossLayerCalibration& cal, uint32_t l, size_t tokens, float step_scale,
             Work* k) {
  const size_t w = cal.Width();
  const CrossLayerTransform& tr = cal.layers[l];
  const size_t n = tr.step.size();
  if (n > 0) {
    const internal::XlPairs& b = cal.tiles->scaled_axes[l];
    if (step_scale == 1) {
      internal::XlProduct(k->qa.data(), b.rows_pad, b, tokens, true, k->guess.data(), w);
    } else {
      k->y.resize(tokens * w);
      internal::XlProduct(k->qa.data(), b.rows_pad, b, tokens, false, k->y.data(), w);
      for (size_t i = 0; i < tokens * w; ++i) k->guess[i] += step_scale * k->y[i];
    }
  }
  for (size_t t = 0; t < tokens; ++t)
    for (size_t c = 0; c < w; ++c) k->hat[t * w + c] = k->guess[t * w + c] + tr.mean[c];
}

// The coded coordinates' q ([t][n]) from the decoded symbol runs, for the float kernels;
// DataLoss for a padding slot or an exact token's coordinate that is not zero.
absl::Status SymbolsToQ(const std::vector<uint16_t>& syms, size_t tokens, size_t n,
                        uint16_t maxq, const std::vector<uint16_t>& exact,
                        std::vector<int32_t>* q) {
  q->assign(tokens * n, 0);
  const size_t nslots = Slots(n);
  for (size_t g = 0; n > 0 && g < tokens / kRun; ++g)
    for (size_t j = 0; j < nslots; ++j) {
      const size_t coord = SlotCoordinate(j, nslots);
      const uint16_t* run = syms.data() + (g * nslots + j) * kRun;
      for (size_t i = 0; i < kRun; ++i) {
        const int32_t v = static_cast<int32_t>(run[i]) - maxq;
        if (coord < n) {
          (*q)[(g * kRun + i) * n + coord] = v;
        } else if (v != 0) {
          return absl::DataLossError("cross-layer payload: a padding symbol is not zero");
        }
      }
    }
  for (uint16_t t : exact)
    for (size_t j = 0; j < n; ++j)
      if ((*q)[t * n + j] != 0)
        return absl::DataLossError("cross-layer payload: an exact token has coordinates");
  return absl::OkStatus();
}

}  // namespace

namespace {

// Layer l of the block the decoder writes: every token's row scaled back (keys rotated again)
// in the block's type, then the exact tokens' rows as given, bit for bit (raw[2 i], raw[2 i + 1]:
// token tokens[i]'s key and value).
void StoreLayer(const Shape& s, uint32_t l, const Angles& angles, const float* scale,
                const std::vector<uint16_t>& tokens, const std::vector<const uint8_t*>& raw,
                Work* k, uint8_t* out) {
  const size_t half = s.dim / 2, hd = s.heads * s.dim;
  k->kf.resize(s.tokens * hd);
  k->vf.resize(s.tokens * hd);
  for (size_t t = 0; t < s.tokens; ++t)
    FromRow(s, k->hat.data() + t * s.width,
            angles.cos.empty() ? nullptr : angles.cos.data() + t * half,
            angles.sin.empty() ? nullptr : angles.sin.data() + t * half, scale,
            k->kf.data() + t * hd, k->vf.data() + t * hd);
  uint8_t* ko = out + s.Section(l, 0);
  uint8_t* vo = out + s.Section(l, 1);
  internal::FromFloat(k->kf.data(), s.dtype, ko, k->kf.size());
  internal::FromFloat(k->vf.data(), s.dtype, vo, k->vf.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::memcpy(ko + tokens[i] * s.RowBytes(), raw[2 * i], s.RowBytes());
    std::memcpy(vo + tokens[i] * s.RowBytes(), raw[2 * i + 1], s.RowBytes());
  }
}

// The reconstruction on the tiles only where its bf16 rounding stays far under a step: each
// term q * (step x axis) is off by up to 2^-9 of itself, so |q| <= 32 keeps every coordinate
// within 1/16 of a step (and q exact); the header's maxq tells the decoder the same. A step
// scale multiplies the sums in fp32 (TileHat), which keeps the bound.
bool TileHatFits(int32_t maxq) { return maxq <= 32; }


}  // namespace

namespace internal {
void XlWriteLayerStreamsForTesting(bool on) { g_layer_streams.store(on); }
}  // namespace internal

absl::Status EncodeCrossLayer(const CrossLayerCalibration& cal, const KvLayout& layout,
                              std::span<const uint8_t> block, uint64_t first_position,
                              std::vector<uint8_t>* out, std::span<uint8_t> reconstruction,
                              float step_scale, std::vector<double>* spreads) {
  STRATA_RETURN_IF_ERROR(cal.Matches(layout));
  if (!(step_scale > 0) || !std::isfinite(step_scale))
    return absl::InvalidArgumentError("cross-layer encode: the step scale must be > 0");
  if (block.size() != layout.BlockBytes() ||
      (!reconstruction.empty() && reconstruction.size() != block.size()))
    return absl::InvalidArgumentError("cross-layer encode: input is not one block");
  const Shape s = ShapeOf(layout);
  const size_t T = s.tokens, w = s.width;
  Angles angles;
  if (cal.rope_theta > 0) MakeAngles(T, s.dim, first_position, cal.rope_theta, &angles);
  Work k;
  k.rows.resize(T * w);
  k.hat.resize(T * w);
  k.below_hat.resize(T * w);
  k.guess.assign(T * w, 0.0f);
  const size_t start = out->size();
  k.head.resize(cal.num_layers);
  k.layer_syms.resize(cal.num_layers);
  k.layer_maxq.resize(cal.num_layers);
  const bool sink = first_position == 0;
  const bool tiles = UseTiles(cal, T, step_scale);
  for (uint32_t l = 0; l < cal.num_layers; ++l) {
    const CrossLayerTransform& tr = cal.layers[l];
    const float* scale = cal.scale.data() + size_t{l} * 2 * s.heads;
    if (!LayerRows(s, block.data(), l, cal.rope_theta > 0 ? &angles : nullptr, scale, &k.f,
                   k.rows.data())) {
      out->resize(start);
      return absl::InvalidArgumentError("cross-layer encode: non-finite input");
    }
    const size_t n = tr.step.size();
    size_t ny = n;  // y's row length
    if (tiles) {
      TileGuess(cal, l, T, &k);
      if (n > 0) {
        TileProject(cal, l, T, &k);
        ny = cal.tiles->axes_t[l].cols_pad;
      }
    } else {
      if (l > 0)
        Predict(k.below_hat.data(), cal.layers[l - 1].mean.data(), tr.predictor.data(), T, w,
                &k.centred, k.guess.data());
      // The residual's coordinates, as row updates over the transposed axes.
      k.axes_t.resize(w * n);
      for (size_t c = 0; c < w; ++c)
        for (size_t j = 0; j < n; ++j) k.axes_t[c * n + j] = tr.axes[j * w + c];
      k.y.resize(T * n);
      Project(k.rows.data(), tr.mean.data(), k.guess.data(), k.axes_t.data(), T, w, n, k.y.data());
    }
    if (spreads && T > (sink ? 1u : 0u))  // the coded tokens (the sink's row is exact)
      internal::AddColumnSpreads(k.y.data() + (sink ? ny : 0), T - (sink ? 1 : 0), ny, n,
                                 tr.step.data(), &k.squares, spreads);
    k.q.resize(T * n);
    int32_t maxq = 0;
    for (size_t t = 0; t < T; ++t) {
      for (size_t j = 0; j < n; ++j) {
        const float v = std::nearbyint(k.y[t * ny + j] / (tr.step[j] * step_scale));
        if (!std::isfinite(v)) {  // a calibration whose products overflow on this block
          out->resize(start);
          return absl::InvalidArgumentError(absl::StrCat("cross-layer encode: layer ", l,
                                                         " has a coordinate that is not finite"));
        }
        const int32_t qi = static_cast<int32_t>(std::clamp(v, -float{kMaxQ}, float{kMaxQ}));
        k.q[t * n + j] = sink && t == 0 ? 0 : qi;
        maxq = std::max(maxq, std::abs(k.q[t * n + j]));
      }
    }
    if (tiles && TileHatFits(maxq)) {
      if (n > 0) TileHatRows(cal, l, T, &k);
      TileHat(cal, l, T, step_scale, &k);
    } else {
      Reconstruct(tr, k.guess.data(), k.q.data(), T, w, step_scale, k.hat.data());
    }
    k.layer_maxq[l] = static_cast<uint16_t>(maxq);
    k.head[l].clear();
    ByteWriter bw(&k.head[l]);
    bw.U16(static_cast<uint16_t>(maxq));
    bw.U16(sink ? 1 : 0);
    const std::vector<uint16_t> exact = sink ? std::vector<uint16_t>{0} : std::vector<uint16_t>{};
    const std::vector<const uint8_t*> raw =
        sink ? std::vector<const uint8_t*>{block.data() + s.Section(l, 0),
                                           block.data() + s.Section(l, 1)}
             : std::vector<const uint8_t*>{};
    if (sink) {
      bw.U16(0);
      bw.Raw(raw[0], s.RowBytes());
      bw.Raw(raw[1], s.RowBytes());
      std::copy(k.rows.begin(), k.rows.begin() + w, k.hat.begin());
    }
    if (!reconstruction.empty())
      StoreLayer(s, l, angles, scale, exact, raw, &k, reconstruction.data());
    if (n > 0) {
      const size_t nslots = Slots(n);
      std::vector<uint16_t>& syms = k.layer_syms[l];
      syms.resize(T * nslots);
      for (size_t g = 0; g < T / kRun; ++g)
        for (size_t j = 0; j < nslots; ++j) {
          const size_t coord = SlotCoordinate(j, nslots);
          uint16_t* run = syms.data() + (g * nslots + j) * kRun;
          for (size_t i = 0; i < kRun; ++i)
            run[i] =
                static_cast<uint16_t>((coord < n ? k.q[(g * kRun + i) * n + coord] : 0) + maxq);
        }
    } else {
      k.layer_syms[l].clear();
    }
    k.below_hat.swap(k.hat);
  }
  // The tables of layer l go with its header; its symbols into the one stream, last layer first
  // (SXL1, for tests: each layer's own stream after its tables).
  const bool one_stream = !g_layer_streams.load(std::memory_order_relaxed);
  std::vector<std::vector<uint8_t>> tables(cal.num_layers);
  k.shared.Reset();
  for (uint32_t l = cal.num_layers; l-- > 0;) {
    const std::vector<uint16_t>& syms = k.layer_syms[l];
    if (syms.empty()) continue;
    rans::Encode<uint16_t>(syms.data(), syms.size(), 2 * uint32_t{k.layer_maxq[l]} + 1, kContexts,
                           &k.rans, &tables[l], nullptr, rans::kMaxLanes, nullptr,
                           one_stream ? &k.shared : nullptr);
  }
  ByteWriter bw(out);
  bw.U32(one_stream ? kMagic : kMagicLayerStreams);
  const size_t stream_at = out->size();
  if (one_stream) bw.U32(0);  // where the stream begins, from the payload's start: set below
  for (uint32_t l = 0; l < cal.num_layers; ++l) {
    out->insert(out->end(), k.head[l].begin(), k.head[l].end());
    out->insert(out->end(), tables[l].begin(), tables[l].end());
  }
  if (one_stream) {
    const uint32_t stream_offset = static_cast<uint32_t>(out->size() - start);
    std::memcpy(out->data() + stream_at, &stream_offset, 4);
    rans::FinishShared(&k.shared, out, nullptr);
  }
  ByteWriter(out).U32(Crc32c(out->data() + start, out->size() - start));
  return absl::OkStatus();
}

absl::Status DecodeCrossLayer(const CrossLayerCalibration& cal, const KvLayout& layout,
                              std::span<const uint8_t> payload, uint64_t first_position,
                              std::span<uint8_t> out, float step_scale, bool verify_crc) {
  STRATA_RETURN_IF_ERROR(cal.Matches(layout));
  if (!(step_scale > 0) || !std::isfinite(step_scale))
    return absl::InvalidArgumentError("cross-layer decode: the step scale must be > 0");
  if (out.size() != layout.BlockBytes())
    return absl::InvalidArgumentError("cross-layer decode: output is not one block");
  if (payload.size() < 8) return absl::DataLossError("cross-layer payload: truncated");
  const size_t body = payload.size() - 4;
  uint32_t crc;
  std::memcpy(&crc, payload.data() + body, 4);
  if (verify_crc && crc != Crc32c(payload.data(), body))
    return absl::DataLossError("cross-layer payload: CRC32C mismatch");
  ByteReader in(payload.data(), body, "cross-layer payload");
  uint32_t magic = 0;
  STRATA_RETURN_IF_ERROR(in.Read(&magic));
  if (magic != kMagic && magic != kMagicLayerStreams)
    return absl::DataLossError("cross-layer payload: bad magic");
  // SXL2: the layers' tables up to the stream, which runs to the CRC.
  rans::SharedDecoder shared_stream;
  rans::SharedDecoder* shared = nullptr;
  if (magic == kMagic) {
    uint32_t stream_offset = 0;
    STRATA_RETURN_IF_ERROR(in.Read(&stream_offset));
    if (stream_offset < 8 || stream_offset > body)
      return absl::DataLossError("cross-layer payload: stream offset out of range");
    STRATA_RETURN_IF_ERROR(rans::StartShared(
        payload.subspan(stream_offset, body - stream_offset), &shared_stream));
    shared = &shared_stream;
    in = ByteReader(payload.data() + 8, stream_offset - 8, "cross-layer payload");
  }
  const Shape s = ShapeOf(layout);
  const size_t T = s.tokens, w = s.width, half = s.dim / 2;
  Angles angles;
  if (cal.rope_theta > 0) MakeAngles(T, s.dim, first_position, cal.rope_theta, &angles);
  Work k;
  k.hat.resize(T * w);
  k.below_hat.resize(T * w);
  k.guess.assign(T * w, 0.0f);
  std::vector<float> kt(s.heads * s.dim), vt(s.heads * s.dim);
  const bool tiles = UseTiles(cal, T, step_scale);
  for (uint32_t l = 0; l < cal.num_layers; ++l) {
    const CrossLayerTransform& tr = cal.layers[l];
    const float* scale = cal.scale.data() + size_t{l} * 2 * s.heads;
    uint16_t maxq = 0, exact = 0;
    STRATA_RETURN_IF_ERROR(in.Read(&maxq));
    STRATA_RETURN_IF_ERROR(in.Read(&exact));
    if (maxq > kMaxQ || exact > T)
      return absl::DataLossError(absl::StrCat("cross-layer payload: layer ", l, " header"));
    std::vector<uint16_t> tokens(exact);
    for (uint16_t& t : tokens) STRATA_RETURN_IF_ERROR(in.Read(&t));
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] >= T || (i > 0 && tokens[i] <= tokens[i - 1]))
        return absl::DataLossError(absl::StrCat("cross-layer payload: layer ", l, " exact tokens"));
    // Copied out of the payload: a row there may sit at any byte, ToFloat reads whole words.
    std::vector<uint8_t> rows_given(2 * size_t{exact} * s.RowBytes());
    std::vector<const uint8_t*> raw(2 * exact);
    for (size_t i = 0; i < 2 * size_t{exact}; ++i) {
      const uint8_t* p;
      STRATA_RETURN_IF_ERROR(in.Take(s.RowBytes(), &p));
      std::memcpy(rows_given.data() + i * s.RowBytes(), p, s.RowBytes());
      raw[i] = rows_given.data() + i * s.RowBytes();
    }
    const size_t n = tr.step.size();
    const bool tile_hat = tiles && TileHatFits(maxq);
    if (n > 0) {
      k.syms.resize(T * Slots(n));
      STRATA_RETURN_IF_ERROR(rans::Decode<uint16_t>(in, k.syms.size(),
                                                    2 * static_cast<uint32_t>(maxq) + 1, kContexts,
                                                    &k.rans, k.syms.data(), rans::kMaxLanes,
                                                    shared));
    }
    if (tile_hat) {
      if (n > 0 && !TileHatRowsFromSymbols(cal, l, T, maxq, tokens, &k))
        return absl::DataLossError(
            absl::StrCat("cross-layer payload: layer ", l,
                         " has a padding symbol or an exact token's coordinate that is not zero"));
    } else {
      STRATA_RETURN_IF_ERROR(SymbolsToQ(k.syms, T, n, maxq, tokens, &k.q));
    }
    if (tiles) {
      TileGuess(cal, l, T, &k);
    } else if (l > 0) {
      Predict(k.below_hat.data(), cal.layers[l - 1].mean.data(), tr.predictor.data(), T, w,
              &k.centred, k.guess.data());
    }
    if (tile_hat) {
      TileHat(cal, l, T, step_scale, &k);
    } else {
      Reconstruct(tr, k.guess.data(), k.q.data(), T, w, step_scale, k.hat.data());
    }
    for (size_t i = 0; i < tokens.size(); ++i) {  // the exact tokens' rows, as the encoder's
      const size_t t = tokens[i];
      internal::ToFloat(raw[2 * i], s.dtype, kt.data(), kt.size());
      internal::ToFloat(raw[2 * i + 1], s.dtype, vt.data(), vt.size());
      if (!internal::AllFinite(kt.data(), kt.size()) || !internal::AllFinite(vt.data(), vt.size()))
        return absl::DataLossError("cross-layer payload: a non-finite exact token");
      ToRow(s, kt.data(), vt.data(), angles.cos.empty() ? nullptr : angles.cos.data() + t * half,
            angles.sin.empty() ? nullptr : angles.sin.data() + t * half, scale,
            k.hat.data() + t * w);
    }
    StoreLayer(s, l, angles, scale, tokens, raw, &k, out.data());
    k.below_hat.swap(k.hat);
  }
  if (in.remaining() != 0) return absl::DataLossError("cross-layer payload: trailing bytes");
  if (shared) return rans::FinishShared(*shared);
  return absl::OkStatus();
}

}  // namespace strata::codec
