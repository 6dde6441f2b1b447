#include "codec/calibration.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codec/codec.h"
#include "codec/cross_layer.h"
#include "codec/internal/byte_io.h"
#include "codec/internal/cross_layer_amx.h"
#include "codec/internal/sections.h"
#include "common/crc32c.h"
#include "common/status_macros.h"

namespace strata::codec {

namespace {

constexpr size_t kFixedBytes = 40;

size_t PerHeadFloats(uint32_t d) { return size_t{d} * d + 3 * size_t{d}; }

}  // namespace

std::string CalibrationIdString(uint64_t id) { return absl::StrFormat("%016x", id); }

uint64_t CalibrationIdOf(std::span<const uint8_t> serialized) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint8_t b : serialized) {
    h ^= b;
    h *= 0x100000001b3ull;
  }
  return h == 0 ? 1 : h;
}

std::string_view CalibrationModeOf(std::span<const uint8_t> serialized) {
  if (serialized.size() < 4) return "";
  uint32_t magic;
  std::memcpy(&magic, serialized.data(), 4);
  return magic == kCalibrationMagic ? "pca" : magic == kCrossLayerMagic ? "xl" : "";
}

Calibration Calibration::OfCrossLayer(std::shared_ptr<const CrossLayerCalibration> xl,
                                      uint64_t id) {
  Calibration c;
  c.id_ = id != 0 ? id : xl->Id();
  c.num_layers = xl->num_layers;
  c.num_kv_heads = xl->num_kv_heads;
  c.head_dim = xl->head_dim;
  c.kind = KvKind::kSeparateKV;
  c.version = xl->version;
  c.sample_bits = xl->sample_bits;
  c.rope_theta = xl->rope_theta;
  c.cross_layer = std::move(xl);
  return c;
}

absl::Status Calibration::Matches(const KvLayout& layout) const {
  if (cross_layer) {
    if (absl::Status s = cross_layer->Matches(layout); !s.ok())
      return absl::InvalidArgumentError(absl::StrCat("codec: calibration ",
                                                     CalibrationIdString(Id()), ": ", s.message()));
    return absl::OkStatus();
  }
  if (layout.num_layers != num_layers || layout.num_kv_heads != num_kv_heads ||
      layout.head_dim != head_dim || layout.kind != kind)
    return absl::InvalidArgumentError(absl::StrCat(
        "codec: calibration ", CalibrationIdString(Id()), " is for ", num_layers, " layers x ",
        num_kv_heads, " heads x ", head_dim, " dims, the block has ", layout.num_layers, " x ",
        layout.num_kv_heads, " x ", layout.head_dim));
  return absl::OkStatus();
}

absl::Status Calibration::Validate() const {
  if (cross_layer) {
    const CrossLayerCalibration& x = *cross_layer;
    if (num_layers != x.num_layers || num_kv_heads != x.num_kv_heads || head_dim != x.head_dim ||
        kind != KvKind::kSeparateKV || !heads.empty())
      return absl::InvalidArgumentError("calibration: fields disagree with the cross-layer one");
    return absl::OkStatus();
  }
  if (num_layers == 0 || num_kv_heads == 0 || head_dim == 0 || num_layers > 65535 ||
      num_kv_heads > 65535 || head_dim > 4096)
    return absl::InvalidArgumentError("calibration: bad geometry");
  if (kind != KvKind::kSeparateKV && kind != KvKind::kMlaLatent)
    return absl::InvalidArgumentError("calibration: unknown kv kind");
  const size_t d = head_dim;
  if (heads.size() != size_t{num_layers} * TensorsPerLayer() * num_kv_heads)
    return absl::InvalidArgumentError("calibration: head count disagrees with the geometry");
  for (const HeadTransform& h : heads) {
    if (h.mean.size() != d || h.basis.size() != d * d || h.variance.size() != d ||
        h.step.size() != d)
      return absl::InvalidArgumentError("calibration: transform of the wrong size");
    for (const auto* v : {&h.mean, &h.basis, &h.variance, &h.step})
      for (float x : *v)
        if (!std::isfinite(x)) return absl::InvalidArgumentError("calibration: non-finite value");
    for (size_t i = 0; i < d; ++i)
      if (h.step[i] < 0 || h.variance[i] < 0 || (h.step[i] > 0 && h.step[i] < 1e-20f))
        return absl::InvalidArgumentError("calibration: negative or degenerate step or variance");
  }
  return absl::OkStatus();
}

std::vector<uint8_t> Calibration::Serialize() const {
  if (cross_layer) return cross_layer->Serialize();
  std::vector<uint8_t> out;
  internal::ByteWriter w(&out);
  w.U32(kCalibrationMagic);
  w.U16(kCalibrationFormat);
  w.U16(0);
  w.U32(version);
  w.U32(num_layers);
  w.U32(num_kv_heads);
  w.U32(head_dim);
  w.U8(static_cast<uint8_t>(kind));
  w.U8(rope_theta > 0 ? 1 : 0);
  w.U16(0);
  w.Raw(&target_bits, 4);
  w.Raw(&sample_bits, 4);
  w.Raw(&rope_theta, 4);
  for (const HeadTransform& h : heads) {
    w.Raw(h.mean.data(), h.mean.size() * 4);
    w.Raw(h.basis.data(), h.basis.size() * 4);
    w.Raw(h.variance.data(), h.variance.size() * 4);
    w.Raw(h.step.data(), h.step.size() * 4);
  }
  w.U32(Crc32c(out.data(), out.size()));
  return out;
}

absl::StatusOr<Calibration> Calibration::Parse(std::span<const uint8_t> bytes) {
  auto bad = [](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("calibration: ", why));
  };
  if (CalibrationModeOf(bytes) == "xl") {
    STRATA_ASSIGN_OR_RETURN(CrossLayerCalibration xl, CrossLayerCalibration::Parse(bytes));
    return OfCrossLayer(std::make_shared<const CrossLayerCalibration>(std::move(xl)),
                        CalibrationIdOf(bytes));
  }
  if (bytes.size() < kFixedBytes + 4) return bad("truncated");
  const size_t body = bytes.size() - 4;
  uint32_t crc;
  std::memcpy(&crc, bytes.data() + body, 4);
  if (crc != Crc32c(bytes.data(), body)) return bad("CRC32C mismatch");
  internal::ByteReader r(bytes.data(), body, "calibration");
  uint32_t magic;
  uint16_t format, reserved16;
  uint8_t kind, keys;
  Calibration c;
  STRATA_RETURN_IF_ERROR(r.Read(&magic));
  STRATA_RETURN_IF_ERROR(r.Read(&format));
  STRATA_RETURN_IF_ERROR(r.Read(&reserved16));
  if (magic != kCalibrationMagic) return bad("bad magic");
  if (format != kCalibrationFormat)
    return bad(absl::StrCat("format version ", format, " (this build reads ", kCalibrationFormat,
                            ")"));
  if (reserved16 != 0) return bad("reserved field not zero");
  STRATA_RETURN_IF_ERROR(r.Read(&c.version));
  STRATA_RETURN_IF_ERROR(r.Read(&c.num_layers));
  STRATA_RETURN_IF_ERROR(r.Read(&c.num_kv_heads));
  STRATA_RETURN_IF_ERROR(r.Read(&c.head_dim));
  STRATA_RETURN_IF_ERROR(r.Read(&kind));
  STRATA_RETURN_IF_ERROR(r.Read(&keys));
  STRATA_RETURN_IF_ERROR(r.Read(&reserved16));
  STRATA_RETURN_IF_ERROR(r.Read(&c.target_bits));
  STRATA_RETURN_IF_ERROR(r.Read(&c.sample_bits));
  STRATA_RETURN_IF_ERROR(r.Read(&c.rope_theta));
  if (keys > 1) return bad(absl::StrCat("unknown key handling ", keys));
  if ((keys == 1) != (c.rope_theta > 0) || !std::isfinite(c.rope_theta))
    return bad("key handling disagrees with the RoPE theta");
  if (reserved16 != 0) return bad("reserved field not zero");
  if (kind < 1 || kind > 2) return bad("unknown kv kind");
  c.kind = static_cast<KvKind>(kind);
  if (c.num_layers == 0 || c.num_kv_heads == 0 || c.head_dim == 0 || c.num_layers > 65535 ||
      c.num_kv_heads > 65535 || c.head_dim > 4096)
    return bad("bad geometry");
  const size_t n = size_t{c.num_layers} * c.TensorsPerLayer() * c.num_kv_heads;
  const size_t d = c.head_dim;
  if (r.remaining() != n * PerHeadFloats(c.head_dim) * 4)
    return bad("size disagrees with the geometry");
  c.heads.resize(n);
  for (HeadTransform& h : c.heads) {
    for (auto* v : {&h.mean, &h.basis, &h.variance, &h.step}) {
      v->resize(v == &h.basis ? d * d : d);
      const uint8_t* p;
      STRATA_RETURN_IF_ERROR(r.Take(v->size() * 4, &p));
      std::memcpy(v->data(), p, v->size() * 4);
    }
  }
  if (absl::Status s = c.Validate(); !s.ok()) return bad(s.message());
  c.id_ = CalibrationIdOf(bytes);
  return c;
}

uint64_t Calibration::Id() const {
  if (id_ == 0) {
    const std::vector<uint8_t> b = Serialize();
    id_ = CalibrationIdOf(b);
  }
  return id_;
}

void SymmetricEigen(std::vector<double> a, size_t n, std::vector<double>* values,
                    std::vector<double>* vectors) {
  std::vector<double> v(n * n, 0.0);
  for (size_t i = 0; i < n; ++i) v[i * n + i] = 1.0;
  for (int sweep = 0; sweep < 60; ++sweep) {
    double off = 0, diag = 0;
    for (size_t i = 0; i < n; ++i) {
      diag += a[i * n + i] * a[i * n + i];
      for (size_t j = i + 1; j < n; ++j) off += a[i * n + j] * a[i * n + j];
    }
    if (off <= 1e-22 * diag || off == 0) break;  // off-diagonal below ~1e-11 relative
    for (size_t p = 0; p < n; ++p) {
      for (size_t q = p + 1; q < n; ++q) {
        const double apq = a[p * n + q];
        if (std::abs(apq) < 1e-300) continue;
        // The rotation that zeroes a[p][q] (Golub & Van Loan's symmetric Schur step), with the
        // smaller root of t^2 + 2 theta t - 1 = 0 for stability.
        const double theta = (a[q * n + q] - a[p * n + p]) / (2 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (size_t k = 0; k < n; ++k) {  // columns p, q
          const double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - s * akq;
          a[k * n + q] = s * akp + c * akq;
        }
        for (size_t k = 0; k < n; ++k) {  // rows p, q
          const double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - s * aqk;
          a[q * n + k] = s * apk + c * aqk;
        }
        for (size_t k = 0; k < n; ++k) {  // eigenvectors are the rows of v
          const double vpk = v[p * n + k], vqk = v[q * n + k];
          v[p * n + k] = c * vpk - s * vqk;
          v[q * n + k] = s * vpk + c * vqk;
        }
      }
    }
  }
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return a[x * n + x] > a[y * n + y]; });
  values->resize(n);
  vectors->resize(n * n);
  for (size_t i = 0; i < n; ++i) {
    (*values)[i] = a[order[i] * n + order[i]];
    std::copy(v.begin() + order[i] * n, v.begin() + (order[i] + 1) * n,
              vectors->begin() + i * n);
  }
}

void SymmetricEigenHouseholder(std::vector<double> a, size_t n, std::vector<double>* values,
                               std::vector<double>* vectors) {
  std::vector<double> original = a;
  // qt: the accumulated transform, transposed (row i of qt is column i of Q, A = Q T Q^T), so
  // that every update below runs along rows.
  std::vector<double> qt(n * n, 0.0), v(n), p(n);
  for (size_t i = 0; i < n; ++i) qt[i * n + i] = 1.0;
  // Householder reflections H = I - 2 v v^T (|v| = 1) zero column k below its subdiagonal:
  // A <- H A H on the trailing block, as A - 2 v w^T - 2 w v^T with w = A v - (v^T A v) v.
  for (size_t k = 0; k + 2 < n; ++k) {
    const size_t m = n - k - 1;  // the trailing block: indices k + 1 ..
    double norm2 = 0;
    for (size_t i = 0; i < m; ++i) norm2 += a[(k + 1 + i) * n + k] * a[(k + 1 + i) * n + k];
    if (norm2 == 0) continue;
    const double x0 = a[(k + 1) * n + k];
    const double alpha = x0 > 0 ? -std::sqrt(norm2) : std::sqrt(norm2);
    for (size_t i = 0; i < m; ++i) v[i] = a[(k + 1 + i) * n + k];
    v[0] -= alpha;
    double vn = 0;
    for (size_t i = 0; i < m; ++i) vn += v[i] * v[i];
    vn = std::sqrt(vn);
    if (vn == 0) continue;
    for (size_t i = 0; i < m; ++i) v[i] /= vn;
    double vav = 0;
    for (size_t i = 0; i < m; ++i) {
      const double* row = &a[(k + 1 + i) * n + k + 1];
      double s = 0;
      for (size_t j = 0; j < m; ++j) s += row[j] * v[j];
      p[i] = s;
      vav += v[i] * s;
    }
    for (size_t i = 0; i < m; ++i) p[i] -= vav * v[i];
    for (size_t i = 0; i < m; ++i) {
      double* row = &a[(k + 1 + i) * n + k + 1];
      const double vi = 2 * v[i], pi = 2 * p[i];
      for (size_t j = 0; j < m; ++j) row[j] -= vi * p[j] + pi * v[j];
    }
    for (size_t i = 0; i < m; ++i) a[(k + 1 + i) * n + k] = a[k * n + k + 1 + i] = 0;
    a[(k + 1) * n + k] = a[k * n + k + 1] = alpha;
    // Q <- Q H: rows k + 1 .. of qt less 2 v (v^T those rows).
    std::vector<double> t(n, 0.0);
    for (size_t i = 0; i < m; ++i) {
      const double* row = &qt[(k + 1 + i) * n];
      for (size_t j = 0; j < n; ++j) t[j] += v[i] * row[j];
    }
    for (size_t i = 0; i < m; ++i) {
      double* row = &qt[(k + 1 + i) * n];
      const double vi = 2 * v[i];
      for (size_t j = 0; j < n; ++j) row[j] -= vi * t[j];
    }
  }
  std::vector<double> d(n), e(n, 0.0);
  for (size_t i = 0; i < n; ++i) d[i] = a[i * n + i];
  for (size_t i = 0; i + 1 < n; ++i) e[i] = a[(i + 1) * n + i];
  // Implicit symmetric QR steps with Wilkinson's shift on the bottom unreduced block, each a
  // chain of Givens rotations chasing the bulge down (Golub & Van Loan, section 8.3).
  const double eps = 1e-15;
  double scale = 0;  // the matrix's size, for an absolute floor under near-zero eigenvalues
  for (size_t i = 0; i < n; ++i) scale = std::max(scale, std::abs(d[i]) + std::abs(e[i]));
  auto negligible = [&](size_t i) {
    return std::abs(e[i]) <= eps * (std::abs(d[i]) + std::abs(d[i + 1])) ||
           std::abs(e[i]) <= 1e-300 + eps * 1e-3 * scale;
  };
  size_t hi = n == 0 ? 0 : n - 1, steps = 0;
  while (hi > 0 && steps < 50 * n) {
    if (negligible(hi - 1)) {
      e[hi - 1] = 0;
      --hi;
      continue;
    }
    size_t lo = hi - 1;
    while (lo > 0 && !negligible(lo - 1)) --lo;
    if (lo > 0) e[lo - 1] = 0;
    const double delta = (d[hi - 1] - d[hi]) / 2, b = e[hi - 1];
    const double mu = d[hi] - b * b / (delta + (delta >= 0 ? 1.0 : -1.0) * std::hypot(delta, b));
    double x = d[lo] - mu, z = e[lo];
    for (size_t k = lo; k < hi; ++k) {
      const double r = std::hypot(x, z);
      const double c = r == 0 ? 1.0 : x / r, s = r == 0 ? 0.0 : z / r;
      if (k > lo) e[k - 1] = r;
      const double dk = d[k], dk1 = d[k + 1], ek = e[k];
      d[k] = c * c * dk + 2 * c * s * ek + s * s * dk1;
      d[k + 1] = s * s * dk - 2 * c * s * ek + c * c * dk1;
      e[k] = c * s * (dk1 - dk) + (c * c - s * s) * ek;
      if (k + 1 < hi) {
        x = e[k];
        z = s * e[k + 1];
        e[k + 1] *= c;
      }
      double* qk = &qt[k * n];
      double* qk1 = &qt[(k + 1) * n];
      for (size_t j = 0; j < n; ++j) {
        const double u = qk[j], w = qk1[j];
        qk[j] = c * u + s * w;
        qk1[j] = c * w - s * u;
      }
    }
    ++steps;
  }
  if (hi > 0) {  // not converged (never seen): Jacobi sweeps, slower but sure
    SymmetricEigen(std::move(original), n, values, vectors);
    return;
  }
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return d[x] > d[y]; });
  values->resize(n);
  vectors->resize(n * n);
  for (size_t i = 0; i < n; ++i) {
    (*values)[i] = d[order[i]];
    std::copy(qt.begin() + order[i] * n, qt.begin() + (order[i] + 1) * n,
              vectors->begin() + i * n);
  }
}

std::vector<double> AllocateBits(std::span<const double> wvar, double budget, double quantum,
                                 double max_bits) {
  return AllocateBitsFrom(wvar, std::vector<double>(wvar.size(), 0.0), budget, quantum, max_bits);
}

std::vector<double> AllocateBitsFrom(std::span<const double> wvar, std::vector<double> bits,
                                     double budget, double quantum, double max_bits) {
  const double shrink = std::exp2(-2 * quantum);
  // Gain of the next quantum for coordinate i: D_i(b) - D_i(b + q) = D_i(b) (1 - 2^-2q).
  std::priority_queue<std::pair<double, size_t>> gains;
  for (size_t i = 0; i < wvar.size(); ++i) {
    budget -= bits[i];
    if (wvar[i] > 0 && bits[i] + quantum <= max_bits + 1e-9)
      gains.push({wvar[i] * std::exp2(-2 * bits[i]) * (1 - shrink), i});
  }
  const auto steps = static_cast<int64_t>(std::floor(budget / quantum + 1e-9));
  for (int64_t k = 0; k < steps && !gains.empty(); ++k) {
    auto [g, i] = gains.top();
    gains.pop();
    bits[i] += quantum;
    if (bits[i] + quantum <= max_bits + 1e-9) gains.push({g * shrink, i});
  }
  return bits;
}

namespace {

// u^T M u for a d x d row-major M, clamped at 0 (M is meant to be positive semi-definite).
double QuadraticForm(const float* m, const float* u, size_t d) {
  double acc = 0;
  for (size_t j = 0; j < d; ++j) {
    double row = 0;
    for (size_t k = 0; k < d; ++k) row += double{m[j * d + k]} * u[k];
    acc += u[j] * row;
  }
  return std::max(acc, 0.0);
}

}  // namespace

absl::StatusOr<Calibration> Calibrate(const KvLayout& layout,
                                      std::span<const std::span<const uint8_t>> blocks,
                                      const CalibrateOptions& opts) {
  STRATA_RETURN_IF_ERROR(layout.Validate());
  if (layout.dtype == DType::kFloat8E4M3)
    return absl::InvalidArgumentError("calibrate: fp8 blocks are not supported");
  if (blocks.empty()) return absl::InvalidArgumentError("calibrate: no sample blocks");
  if (!(opts.bits_per_value > 0 && opts.bits_per_value <= 8))
    return absl::InvalidArgumentError("calibrate: target bits per value must be in (0, 8]");
  for (const auto& b : blocks)
    if (b.size() != layout.BlockBytes())
      return absl::InvalidArgumentError("calibrate: a sample block has the wrong size");
  const size_t metric_size = size_t{layout.num_layers} * layout.TensorsPerLayer() *
                             layout.num_kv_heads * layout.head_dim * layout.head_dim;
  if (!opts.metric.empty() && opts.metric.size() != metric_size)
    return absl::InvalidArgumentError(absl::StrCat(
        "calibrate: the metric has ", opts.metric.size(), " values; ", metric_size, " needed"));
  for (float v : opts.metric)
    if (!std::isfinite(v)) return absl::InvalidArgumentError("calibrate: non-finite metric value");
  // Importances per (layer, tensor) apply to each of its heads alike.
  const size_t slices = size_t{layout.num_layers} * layout.TensorsPerLayer();
  const size_t head_count = slices * layout.num_kv_heads;
  if (!opts.importance.empty() && opts.importance.size() != slices &&
      opts.importance.size() != head_count)
    return absl::InvalidArgumentError(absl::StrCat(
        "calibrate: ", opts.importance.size(), " importances; one per (layer, tensor): ", slices,
        ", or per (layer, tensor, kv head): ", head_count));
  const size_t heads_per_importance = opts.importance.size() == slices ? layout.num_kv_heads : 1;
  for (double v : opts.importance)
    if (!(v >= 0 && std::isfinite(v)))
      return absl::InvalidArgumentError("calibrate: importances must be finite and >= 0");
  if (!(opts.min_coordinate_bits >= 0 && opts.min_coordinate_bits <= 8))
    return absl::InvalidArgumentError("calibrate: min_coordinate_bits must be in [0, 8]");
  if (!opts.importance.empty() &&
      std::none_of(opts.importance.begin(), opts.importance.end(), [](double v) { return v > 0; }))
    return absl::InvalidArgumentError("calibrate: every importance is zero: nothing to code");
  Calibration cal;
  cal.num_layers = layout.num_layers;
  cal.num_kv_heads = layout.num_kv_heads;
  cal.head_dim = layout.head_dim;
  cal.kind = layout.kind;
  cal.version = opts.version;
  cal.target_bits = static_cast<float>(opts.bits_per_value);
  cal.rope_theta = static_cast<float>(opts.rope_theta);
  if (!(opts.rope_theta >= 0) || (opts.rope_theta > 0 && (layout.kind != KvKind::kSeparateKV ||
                                                         layout.head_dim % 2 != 0)))
    return absl::InvalidArgumentError("calibrate: RoPE needs separate K/V of even head_dim");
  if (!opts.first_positions.empty() && opts.first_positions.size() != blocks.size())
    return absl::InvalidArgumentError("calibrate: one first position per sample block");
  auto position = [&](size_t i) {
    return opts.first_positions.empty() ? i * layout.tokens_per_block : opts.first_positions[i];
  };
  const uint32_t tensors = layout.TensorsPerLayer();
  const size_t d = layout.head_dim, heads = layout.num_kv_heads, T = layout.tokens_per_block;
  const size_t tensor_values = T * heads * d;
  const size_t tensor_bytes = tensor_values * DTypeBytes(layout.dtype);
  cal.heads.resize(size_t{layout.num_layers} * tensors * heads);
  std::vector<float> f(tensor_values);
  std::vector<double> sum(heads * d), cov(heads * d * d);
  for (uint32_t l = 0; l < layout.num_layers; ++l) {
    for (uint32_t t = 0; t < tensors; ++t) {
      std::fill(sum.begin(), sum.end(), 0.0);
      std::fill(cov.begin(), cov.end(), 0.0);
      for (size_t bi = 0; bi < blocks.size(); ++bi) {
        internal::ToFloat(blocks[bi].data() + (size_t{l} * tensors + t) * tensor_bytes,
                          layout.dtype, f.data(), tensor_values);
        if (t == 0 && cal.rope_theta > 0)
          internal::RotateRope(f.data(), T, heads, d, position(bi), cal.rope_theta, true);
        for (size_t tok = 0; tok < T; ++tok)
          for (size_t h = 0; h < heads; ++h) {
            const float* x = f.data() + (tok * heads + h) * d;
            double* s = sum.data() + h * d;
            double* c = cov.data() + h * d * d;
            for (size_t i = 0; i < d; ++i) {
              if (!std::isfinite(x[i]))
                return absl::InvalidArgumentError("calibrate: non-finite sample value");
              s[i] += x[i];
              for (size_t j = 0; j <= i; ++j) c[i * d + j] += double{x[i]} * x[j];
            }
          }
      }
      const double n = static_cast<double>(blocks.size() * T);
      for (size_t h = 0; h < heads; ++h) {
        HeadTransform& ht = cal.heads[(size_t{l} * tensors + t) * heads + h];
        const double* s = sum.data() + h * d;
        std::vector<double> c(d * d);
        for (size_t i = 0; i < d; ++i)
          for (size_t j = 0; j <= i; ++j)
            c[i * d + j] = c[j * d + i] =
                cov[h * d * d + i * d + j] / n - (s[i] / n) * (s[j] / n);
        std::vector<double> vals, vecs;
        SymmetricEigen(std::move(c), d, &vals, &vecs);
        ht.mean.resize(d);
        ht.basis.resize(d * d);
        ht.variance.resize(d);
        ht.step.assign(d, 0.0f);
        for (size_t i = 0; i < d; ++i) {
          ht.mean[i] = static_cast<float>(s[i] / n);
          ht.variance[i] = static_cast<float>(std::max(vals[i], 0.0));
        }
        // Entries below 1e-30 (Jacobi leaves such crumbs where the covariance is block
        // structured) become zero: as float they can be subnormal, and a subnormal operand
        // costs the multiplies in the codec's transforms a microcode assist each.
        for (size_t i = 0; i < d * d; ++i)
          ht.basis[i] = std::abs(vecs[i]) < 1e-30 ? 0.0f : static_cast<float>(vecs[i]);
      }
    }
  }
  // Search the model budget whose allocation meets the target on the samples, measured by
  // actually encoding them (the Gaussian model's rates are wrong at a bit or less per value,
  // and the coder's tables and contexts cost something on top of the entropy).
  // Distortion is counted relative to each head's variance: plain MSE would spend the bits on the
  // layers and tensors of large magnitude (SmolLM2's keys, its late layers) and starve the rest
  // (its early layers' values decoded with 75% relative error at 1.5 bits/value), while the model
  // needs every layer.
  // Under a metric M, coordinate c's error costs u_c^T M u_c per unit (u_c its basis axis).
  std::vector<double> wvar, plain_wvar;  // with and without the importances
  std::vector<double> cost(d);
  for (size_t i = 0; i < cal.heads.size(); ++i) {
    const bool key = layout.kind == KvKind::kSeparateKV && (i / heads) % tensors == 0;
    const HeadTransform& ht = cal.heads[i];
    for (size_t c = 0; c < d; ++c)
      cost[c] = opts.metric.empty() ? 1.0
                                    : QuadraticForm(opts.metric.data() + i * d * d,
                                                    ht.basis.data() + c * d, d);
    double energy = 0;
    for (size_t c = 0; c < d; ++c) energy += ht.variance[c] * cost[c];
    const double w = (key ? opts.key_weight : 1.0) / std::max(energy, 1e-30);
    const double importance =
        opts.importance.empty() ? 1.0 : opts.importance[i / heads_per_importance];
    for (size_t c = 0; c < d; ++c) {
      plain_wvar.push_back(ht.variance[c] * cost[c] * w);
      wvar.push_back(plain_wvar.back() * importance);
    }
  }
  // With importances, the bits the plain allocation would give each coordinate, less
  // importance_floor_bits, are its floor: the probe that measured the importances is linear,
  // and a slice starved far below it costs the model more than it says.
  if (opts.importance.empty() || opts.importance_floor_bits < 0) plain_wvar.clear();
  auto apply = [&](double budget) {
    std::vector<double> floor(wvar.size(), 0.0);
    if (!plain_wvar.empty()) {
      floor = AllocateBits(plain_wvar, budget);
      for (double& b : floor) b = std::max(0.0, b - opts.importance_floor_bits);
    }
    std::vector<double> bits = AllocateBitsFrom(wvar, floor, budget);
    for (size_t k = 0; k < bits.size(); ++k)
      if (bits[k] > 0 && bits[k] < opts.min_coordinate_bits - 1e-9)
        bits[k] = floor[k] > 0 ? opts.min_coordinate_bits : 0.0;
    size_t k = 0;
    for (HeadTransform& ht : cal.heads)
      for (size_t i = 0; i < d; ++i, ++k) {
        // Uniform quantiser of a Gaussian at high rate: D = step^2 / 12 = var 2^(-2b).
        const double st = std::sqrt(12.0 * ht.variance[i]) * std::exp2(-bits[k]);
        ht.step[i] = bits[k] > 0 && st > 1e-20 ? static_cast<float>(st) : 0.0f;
      }
  };
  auto measure = [&](double budget) -> absl::StatusOr<double> {
    apply(budget);
    Calibration trial = cal;  // a fresh id per trial
    CalibrationSet set;
    CodecParams p;
    p.mode = Mode::kPca;
    p.calibration_id = set.Add(std::make_shared<const Calibration>(std::move(trial)));
    Encoder enc;
    enc.set_calibrations(&set);
    std::vector<uint8_t> blob;
    uint64_t bytes = 0;
    for (size_t bi = 0; bi < blocks.size(); ++bi) {
      p.first_position = position(bi);
      STRATA_RETURN_IF_ERROR(enc.Encode(layout, p, blocks[bi], &blob));
      bytes += blob.size();
    }
    const double values = static_cast<double>(blocks.size()) * layout.BlockBytes() /
                          DTypeBytes(layout.dtype);
    return 8.0 * bytes / values;
  };
  const double total = static_cast<double>(wvar.size());
  double lo = 0, hi = 8 * total, best = 0;
  double best_bits = 0;
  for (int it = 0; it < 24; ++it) {
    const double mid = 0.5 * (lo + hi);
    STRATA_ASSIGN_OR_RETURN(double bits, measure(mid));
    if (bits <= opts.bits_per_value) {
      lo = mid;
      best = mid;
      best_bits = bits;
    } else {
      hi = mid;
    }
    if (hi - lo < 0.25) break;
  }
  apply(best);
  cal.sample_bits = static_cast<float>(best_bits);
  STRATA_RETURN_IF_ERROR(cal.Validate());
  return cal;
}

uint64_t Calibration::MemoryBytes() const {
  uint64_t floats = 0;
  for (const HeadTransform& h : heads)
    floats += h.mean.size() + 3 * h.basis.size() + h.variance.size() + h.step.size();
  uint64_t bytes = sizeof(Calibration) + floats * sizeof(float);
  if (cross_layer) {
    const CrossLayerCalibration& xl = *cross_layer;
    floats = xl.scale.size();
    for (const CrossLayerTransform& l : xl.layers)
      floats += l.mean.size() + l.predictor.size() + l.axes.size() + l.step.size();
    bytes += sizeof(CrossLayerCalibration) + floats * sizeof(float);
    if (xl.tiles)
      for (const auto* ops : {&xl.tiles->predictor, &xl.tiles->axes_t, &xl.tiles->scaled_axes})
        for (const internal::XlPairs& p : *ops) bytes += p.words.size() * sizeof(uint16_t);
  }
  return bytes;
}

uint64_t CalibrationSet::Add(std::shared_ptr<const Calibration> c) {
  return Insert(std::move(c))->Id();
}

std::shared_ptr<const Calibration> CalibrationSet::Insert(std::shared_ptr<const Calibration> c) {
  const uint64_t id = c->Id();
  const uint64_t size = c->MemoryBytes();
  std::vector<std::shared_ptr<const Calibration>> dropped;  // freed after the lock
  std::lock_guard<std::mutex> g(mu_);
  auto [it, added] = map_.try_emplace(id);
  it->second.last_used = ++tick_;
  if (added) {
    it->second.cal = std::move(c);
    it->second.bytes = size;
    bytes_ += size;
  }
  std::shared_ptr<const Calibration> held = it->second.cal;
  if (added) EvictLocked(id, &dropped);
  return held;
}

void CalibrationSet::EvictLocked(uint64_t keep,
                                 std::vector<std::shared_ptr<const Calibration>>* dropped) {
  if (max_bytes_ == 0) return;
  while (bytes_ > max_bytes_) {
    // A handful of entries: a scan for the oldest one nobody else holds. (Held ones stay, and
    // the set over its budget, until an Add finds them released.)
    auto victim = map_.end();
    for (auto it = map_.begin(); it != map_.end(); ++it)
      if (it->first != keep && it->second.cal.use_count() == 1 &&
          (victim == map_.end() || it->second.last_used < victim->second.last_used))
        victim = it;
    if (victim == map_.end()) return;
    bytes_ -= victim->second.bytes;
    ++evictions_;
    dropped->push_back(std::move(victim->second.cal));
    map_.erase(victim);
  }
}

std::shared_ptr<const Calibration> CalibrationSet::Find(uint64_t id) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = map_.find(id);
  if (it == map_.end()) return nullptr;
  it->second.last_used = ++tick_;
  return it->second.cal;
}

std::vector<uint64_t> CalibrationSet::Ids() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<uint64_t> ids;
  for (const auto& [id, e] : map_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

uint64_t CalibrationSet::bytes() const {
  std::lock_guard<std::mutex> g(mu_);
  return bytes_;
}

uint64_t CalibrationSet::evictions() const {
  std::lock_guard<std::mutex> g(mu_);
  return evictions_;
}

}  // namespace strata::codec
