// codec_eval: rate, distortion and speed of every codec mode on one data set, against plain
// group-wise intN, zstd and memcpy measured in the same run (one core, this process).
//
//   codec_eval [--layers 8 --heads 8 --head-dim 128 --tokens-per-block 256 --blocks 4]
//              [--data kv.npy] [--modes raw,lossless,int4-g64,quant:k3v4,...] [--json] [--smoke]
//              [--write-decoded DIR] [--quality quality.tsv]
//
// Data: the synthetic generator (codec/synthetic_kv.h) or a .npy array of shape
// (layers, 2, tokens, kv_heads, head_dim), float16 or float32; tokens are cut into blocks.
// Queries for the attention-logit error: per (layer, kv head), 8 vectors with independent
// N(0, rms_c^2) channels, rms_c the RMS of that key channel over the data set, so queries are
// large where keys are (real Q/K projections share their massive channels).
//
// The logit error is only a proxy. Downstream quality (what a model's next-token distribution
// does when it attends to the decoded KV) comes from bench/codec/real_kv/model_quality.sh:
// --write-decoded hands each mode's reconstruction to the model, --quality prints what the
// model made of it beside the rate.
#include <zstd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/codec/npy.h"
#include "bench/codec/safetensors.h"
#include "codec/codec.h"
#include "codec/cross_layer.h"
#include "codec/half.h"
#include "codec/internal/kernels.h"
#include "codec/internal/sections.h"
#include "codec/rans.h"
#include "codec/synthetic_kv.h"
#include "common/status_macros.h"

namespace strata::codec_bench {
namespace {

using Clock = std::chrono::steady_clock;
using codec::CodecParams;
using codec::Mode;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// --cpu-time: speeds from the thread's CPU time instead of wall time (a loaded machine
// preempts the run; CPU time leaves out the time the thread waited, not the cache it lost).
bool g_cpu_time = false;
bool g_pca_budget_search = false;  // --pca-budget-search
double TimerSeconds() {
  if (!g_cpu_time) return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Dataset {
  KvLayout layout;  // per block
  uint32_t blocks = 0;
  std::vector<uint8_t> bytes;  // blocks * BlockBytes
  std::vector<float> f;        // the same values as floats
  std::vector<float> queries;  // [layer][head][q][dim]
  uint32_t nq = 8;
  std::string source;
  uint64_t source_tokens = 0;  // tokens in the file, whole blocks or not
};

size_t BlockBytes(const Dataset& d) { return d.layout.BlockBytes(); }
size_t Values(const Dataset& d) { return d.bytes.size() / DTypeBytes(d.layout.dtype); }

void ToFloats(const uint8_t* p, DType dt, float* out, size_t n) {
  codec::internal::ToFloat(p, dt, out, n);
}

void MakeQueries(Dataset* d, uint64_t seed) {
  const KvLayout& l = d->layout;
  const size_t T = l.tokens_per_block, H = l.num_kv_heads, D = l.head_dim;
  const size_t tensors = l.TensorsPerLayer();
  std::vector<double> ms(size_t{l.num_layers} * H * D, 0.0);
  for (uint32_t b = 0; b < d->blocks; ++b)
    for (uint32_t layer = 0; layer < l.num_layers; ++layer) {
      const float* k =
          d->f.data() + (size_t{b} * l.num_layers * tensors + layer * tensors) * T * H * D;
      for (size_t t = 0; t < T; ++t)
        for (size_t h = 0; h < H; ++h)
          for (size_t c = 0; c < D; ++c) {
            const double v = k[(t * H + h) * D + c];
            ms[(layer * H + h) * D + c] += v * v;
          }
    }
  const double cnt = static_cast<double>(T) * d->blocks;
  d->queries.resize(size_t{l.num_layers} * H * d->nq * D);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 12345;
  auto uniform = [&] {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (static_cast<double>((z ^ (z >> 31)) >> 11) + 0.5) * 0x1.0p-53;
  };
  for (size_t lh = 0; lh < size_t{l.num_layers} * H; ++lh)
    for (uint32_t j = 0; j < d->nq; ++j)
      for (size_t c = 0; c < D; ++c) {
        const double g = std::sqrt(-2 * std::log(uniform())) * std::cos(2 * M_PI * uniform());
        d->queries[(lh * d->nq + j) * D + c] =
            static_cast<float>(g * std::sqrt(ms[lh * D + c] / cnt));
      }
}

bool IsSafetensors(const std::string& path_spec) {
  return path_spec.find(".safetensors") != std::string::npos;
}

// A .npy file, or PATH.safetensors[:TENSOR] (the named tensor, or the file's only one).
absl::StatusOr<NpyArray> ReadTensor(const std::string& path_spec) {
  const size_t st = path_spec.find(".safetensors");
  if (st == std::string::npos) return ReadNpy(path_spec);
  if (st + 12 < path_spec.size() && path_spec[st + 12] == ':')
    return ReadSafetensors(path_spec.substr(0, st + 12), path_spec.substr(st + 13));
  return ReadSafetensors(path_spec, "");
}

// Real queries for the logit error: PATH.safetensors[:TENSOR] or .npy of shape (layers, tokens,
// q_heads, head_dim), q_heads a multiple of kv_heads (grouped-query attention: q head i reads kv
// head i / (q_heads / kv_heads)), with the keys' position encoding applied. Per (layer, kv head)
// `per_head` queries: the group's q heads at positions spread evenly over the tokens.
absl::Status LoadQueries(Dataset* d, const std::string& path_spec, uint32_t per_head) {
  auto a = ReadTensor(path_spec);
  if (!a.ok()) return a.status();
  const KvLayout& l = d->layout;
  if (a->shape.size() != 4 || a->shape[0] != l.num_layers || a->shape[3] != l.head_dim ||
      a->shape[2] == 0 || a->shape[2] % l.num_kv_heads != 0 || a->shape[1] == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--queries: expected shape (", l.num_layers,
                                                   ", tokens, a multiple of ", l.num_kv_heads, ", ",
                                                   l.head_dim, ")"));
  }
  const uint64_t T = a->shape[1], QH = a->shape[2], D = l.head_dim, H = l.num_kv_heads;
  const uint64_t group = QH / H;
  const size_t eb = a->descr == "<f2" ? 2 : 4;
  d->nq = per_head;
  d->queries.assign(size_t{l.num_layers} * H * per_head * D, 0.0f);
  for (uint64_t layer = 0; layer < l.num_layers; ++layer)
    for (uint64_t h = 0; h < H; ++h)
      for (uint32_t j = 0; j < per_head; ++j) {
        const uint64_t qh = h * group + j % group;
        const uint64_t t = (uint64_t{j / group} * T) / ((per_head + group - 1) / group) +
                           T / (2 * ((per_head + group - 1) / group));
        const uint8_t* src = a->data.data() + ((layer * T + std::min(t, T - 1)) * QH + qh) * D * eb;
        float* dst = d->queries.data() + ((layer * H + h) * per_head + j) * D;
        if (eb == 2) {
          codec::internal::ToFloat(src, DType::kFloat16, dst, D);
        } else {
          std::memcpy(dst, src, D * 4);
        }
      }
  return absl::OkStatus();
}

// A .npy file, or a safetensors file as PATH.safetensors[:TENSOR] (one tensor, or the named
// one), shape (layers, 2, tokens, kv_heads, head_dim).
absl::StatusOr<Dataset> LoadNpyDataset(const std::string& path_spec, uint32_t tokens_per_block) {
  auto a = ReadTensor(path_spec);
  if (!a.ok()) return a.status();
  if (a->shape.size() != 5 || a->shape[1] != 2)
    return absl::InvalidArgumentError(
        "--data: expected shape (layers, 2, tokens, kv_heads, head_dim)");
  Dataset d;
  const uint64_t L = a->shape[0], T = a->shape[2], H = a->shape[3], D = a->shape[4];
  const uint32_t TB = static_cast<uint32_t>(std::min<uint64_t>(tokens_per_block, T));
  d.layout.num_layers = static_cast<uint32_t>(L);
  d.layout.num_kv_heads = static_cast<uint32_t>(H);
  d.layout.head_dim = static_cast<uint32_t>(D);
  d.layout.tokens_per_block = TB;
  d.layout.dtype = DType::kFloat16;
  if (auto s = d.layout.Validate(); !s.ok()) return s;
  d.blocks = static_cast<uint32_t>(T / TB);
  const size_t eb = a->descr == "<f2" ? 2 : 4;
  const size_t row = H * D;
  d.bytes.resize(size_t{d.blocks} * d.layout.BlockBytes());
  std::vector<float> tmp(row);
  for (uint32_t b = 0; b < d.blocks; ++b)
    for (uint64_t layer = 0; layer < L; ++layer)
      for (uint64_t kv = 0; kv < 2; ++kv)
        for (uint32_t t = 0; t < TB; ++t) {
          const uint64_t src_t = uint64_t{b} * TB + t;
          const uint8_t* src = a->data.data() + (((layer * 2 + kv) * T + src_t) * row) * eb;
          uint8_t* dst =
              d.bytes.data() + b * d.layout.BlockBytes() + (((layer * 2 + kv) * TB + t) * row) * 2;
          if (eb == 2) {
            std::memcpy(dst, src, row * 2);
          } else {
            std::memcpy(tmp.data(), src, row * 4);
            codec::internal::FloatToHalfRow(tmp.data(), reinterpret_cast<uint16_t*>(dst), row);
          }
        }
  d.source = absl::StrCat(IsSafetensors(path_spec) ? "safetensors " : "npy ", path_spec);
  d.source_tokens = T;
  return d;
}

// Blocks of fp16 bytes back to one (layers, 2, tokens, kv_heads, head_dim) tensor.
NpyArray ToTensorLayout(const KvLayout& l, uint32_t blocks, const std::vector<uint8_t>& bytes) {
  NpyArray a;
  a.descr = "<f2";
  const uint64_t tpb = l.tokens_per_block, T = tpb * blocks,
                 row = uint64_t{l.num_kv_heads} * l.head_dim;
  a.shape = {l.num_layers, 2, T, l.num_kv_heads, l.head_dim};
  a.data.resize(bytes.size());
  for (uint32_t b = 0; b < blocks; ++b)
    for (uint64_t layer = 0; layer < l.num_layers; ++layer)
      for (uint64_t kv = 0; kv < 2; ++kv)
        std::memcpy(a.data.data() + ((layer * 2 + kv) * T + uint64_t{b} * tpb) * row * 2,
                    bytes.data() + b * l.BlockBytes() + ((layer * 2 + kv) * tpb) * row * 2,
                    tpb * row * 2);
  return a;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A mode spec as a file name: "quant:k3v4:ol" -> "quant_k3v4_ol".
std::string FileStem(const std::string& spec) {
  std::string out = spec;
  for (char& c : out)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') c = '_';
  return out;
}

// What a model made of one mode's decoded KV (model_quality.py eval writes these as TSV:
// mode, tokens, kl_mean, kl_p90, kl_max, top1, dnll, near_lossless). The row named "fp32-kv"
// is the floor: the model on the prefix's fp32 KV against the same fp16 reference.
struct ModelQuality {
  double kl_mean = 0, kl_p90 = 0, kl_max = 0, top1 = 0, dnll = 0;
  uint64_t tokens = 0;
  std::string near_lossless;
};

absl::StatusOr<std::map<std::string, ModelQuality>> ReadQuality(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return absl::NotFoundError(absl::StrCat("--quality: cannot open ", path));
  std::map<std::string, ModelQuality> out;
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    ++line_no;
    if (line.front() == '#' || absl::StartsWith(line, "mode\t")) continue;
    std::vector<std::string> c = absl::StrSplit(line, '\t');
    ModelQuality q;
    if (c.size() != 8 || !absl::SimpleAtoi(c[1], &q.tokens) || !absl::SimpleAtod(c[2], &q.kl_mean) ||
        !absl::SimpleAtod(c[3], &q.kl_p90) || !absl::SimpleAtod(c[4], &q.kl_max) ||
        !absl::SimpleAtod(c[5], &q.top1) || !absl::SimpleAtod(c[6], &q.dnll)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--quality: ", path, " line ", line_no,
                       ": expected mode, tokens, kl_mean, kl_p90, kl_max, top1, dnll, "
                       "near_lossless (tab-separated)"));
    }
    q.near_lossless = c[7];
    out[c[0]] = q;
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("--quality: ", path, " has no rows"));
  return out;
}

struct Row {
  std::string mode;
  bool baseline = false;
  bool lossy = false;
  double bits = 0, ratio = 0, rel_mse = 0, rel_mse_k = 0, rel_mse_v = 0, max_abs = 0, logit = 0,
         enc_gbps = 0, dec_gbps = 0, entropy = 0;
  double coder_over_entropy = 0;  // coded stream bits / empirical entropy (tables excluded)
  double tables_bits = 0;         // table bits per value
  bool bit_exact = false;
  std::vector<uint16_t> symbols;
  int bits_param = 0;
  double trials_per_block = 0;  // pca and xl bit budgets: whole encodes per block (timed runs)
};

struct Quality {
  double rel_mse = 0, rel_mse_k = 0, rel_mse_v = 0, max_abs = 0, logit = 0;
  bool exact = false;
};

// A row's size, error and speed columns from its coded bytes, its decode's quality and its best
// encode and decode seconds over `values` values.
void FillRow(double coded_bytes, double values, const Quality& q, double encode_s,
             double decode_s, Row* row) {
  row->bits = 8.0 * coded_bytes / values;
  row->ratio = 16.0 / row->bits;
  row->rel_mse = q.rel_mse;
  row->rel_mse_k = q.rel_mse_k;
  row->rel_mse_v = q.rel_mse_v;
  row->max_abs = q.max_abs;
  row->logit = q.logit;
  row->bit_exact = q.exact;
  row->enc_gbps = values * 2 / encode_s / 1e9;
  row->dec_gbps = values * 2 / decode_s / 1e9;
}

Quality Measure(const Dataset& d, const std::vector<uint8_t>& decoded) {
  const KvLayout& l = d.layout;
  const size_t T = l.tokens_per_block, H = l.num_kv_heads, D = l.head_dim;
  const size_t tensors = l.TensorsPerLayer();
  const size_t tv = T * H * D;
  Quality q;
  q.exact = decoded == d.bytes;
  std::vector<float> y(tv), diff(tv);
  double e[2] = {0, 0}, s[2] = {0, 0}, logit_err = 0, logit_ref = 0;
  for (uint32_t b = 0; b < d.blocks; ++b)
    for (uint32_t layer = 0; layer < l.num_layers; ++layer)
      for (size_t t = 0; t < tensors; ++t) {
        const size_t off = (size_t{b} * l.num_layers * tensors + layer * tensors + t) * tv;
        ToFloats(decoded.data() + off * DTypeBytes(l.dtype), l.dtype, y.data(), tv);
        const float* x = d.f.data() + off;
        for (size_t i = 0; i < tv; ++i) {
          const double dd = static_cast<double>(x[i]) - y[i];
          diff[i] = static_cast<float>(dd);
          e[t] += dd * dd;
          s[t] += static_cast<double>(x[i]) * x[i];
          if (std::isfinite(dd))
            q.max_abs = std::max(q.max_abs, std::fabs(dd));
          else
            q.max_abs = INFINITY;
        }
        if (t != 0) continue;
        for (size_t h = 0; h < H; ++h) {
          const float* qs = d.queries.data() + ((size_t{layer} * H + h) * d.nq) * D;
          for (uint32_t j = 0; j < d.nq; ++j)
            for (size_t tok = 0; tok < T; ++tok) {
              const float* kv = x + (tok * H + h) * D;
              const float* dv = diff.data() + (tok * H + h) * D;
              float ref = 0, err = 0;
              for (size_t c = 0; c < D; ++c) {
                ref += qs[j * D + c] * kv[c];
                err += qs[j * D + c] * dv[c];
              }
              logit_ref += std::fabs(ref);
              logit_err += std::fabs(err);
            }
        }
      }
  q.rel_mse = (e[0] + e[1]) / (s[0] + s[1]);
  q.rel_mse_k = e[0] / s[0];
  q.rel_mse_v = tensors == 2 ? e[1] / s[1] : 0;
  q.logit = logit_err / logit_ref;
  return q;
}

double WordEntropyBits(const Dataset& d) {
  std::vector<uint64_t> h(65536, 0);
  const uint16_t* w = reinterpret_cast<const uint16_t*>(d.bytes.data());
  const size_t n = d.bytes.size() / 2;
  for (size_t i = 0; i < n; ++i) ++h[w[i]];
  double bits = 0;
  for (uint64_t c : h)
    if (c) bits += c * std::log2(static_cast<double>(n) / c);
  return bits / n;
}

template <typename F>
double BestSeconds(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = TimerSeconds();
    f();
    best = std::min(best, TimerSeconds() - t0);
  }
  return best;
}

// A bit budget's trial encodes per block over `reps` timed passes of `blocks` blocks (the
// encoder counted `before` until them).
double TrialsPerBlock(const codec::Encoder& enc, uint64_t before, uint32_t blocks, int reps) {
  return static_cast<double>(enc.budget_trial_encodes() - before) /
         (static_cast<double>(blocks) * std::max(reps, 1));
}

// pca modes: the calibrations made in this run, and where `pca:bR` specs calibrate from (blocks
// other than the evaluated ones, so the figures are held out).
struct PcaContext {
  codec::CalibrationSet set;
  const Dataset* samples = nullptr;
  double key_weight = 1.0;
  double rope_theta = 0;  // > 0: calibrations undo RoPE on the keys (blocks at b * tokens)
  std::vector<float> metric;  // CalibrateOptions::metric, or empty
  std::vector<double> importance;  // CalibrateOptions::importance, or empty
  double importance_floor_bits = codec::CalibrateOptions{}.importance_floor_bits;
  double min_coordinate_bits = codec::CalibrateOptions{}.min_coordinate_bits;
};

// A float16 or float32 tensor's elements as floats.
std::vector<float> Floats(const NpyArray& a) {
  const size_t n = a.data.size() / (a.descr == "<f2" ? 2 : 4);
  std::vector<float> f(n);
  if (a.descr == "<f2") {
    codec::internal::ToFloat(a.data.data(), DType::kFloat16, f.data(), n);
  } else {
    std::memcpy(f.data(), a.data.data(), n * 4);
  }
  return f;
}

// --pca-importance: PATH.safetensors[:TENSOR] or .npy of shape (layers, 2) or (layers, 2,
// kv_heads), model_quality.py sensitivity's output.
absl::StatusOr<std::vector<double>> LoadImportance(const std::string& path_spec,
                                                   const KvLayout& l) {
  auto a = ReadTensor(path_spec);
  if (!a.ok()) return a.status();
  const bool per_head = a->shape.size() == 3;
  if (a->shape.size() < 2 || a->shape.size() > 3 || a->shape[0] != l.num_layers ||
      a->shape[1] != 2 || (per_head && a->shape[2] != l.num_kv_heads))
    return absl::InvalidArgumentError(absl::StrCat("--pca-importance: expected shape (",
                                                   l.num_layers, ", 2[, ", l.num_kv_heads, "])"));
  const std::vector<float> f = Floats(*a);
  return std::vector<double>(f.begin(), f.end());
}

// --pca-metric: PATH.safetensors[:TENSOR] or .npy of shape (layers, 2, kv_heads, head_dim,
// head_dim), model_quality.py's distortion_metric.
absl::StatusOr<std::vector<float>> LoadMetric(const std::string& path_spec, const KvLayout& l) {
  auto a = ReadTensor(path_spec);
  if (!a.ok()) return a.status();
  const std::vector<uint64_t> want = {l.num_layers, 2, l.num_kv_heads, l.head_dim, l.head_dim};
  if (a->shape != want)
    return absl::InvalidArgumentError(absl::StrCat("--pca-metric: expected shape (", l.num_layers,
                                                   ", 2, ", l.num_kv_heads, ", ", l.head_dim, ", ",
                                                   l.head_dim, ")"));
  return Floats(*a);
}

// Resolves `pca:bR` to a calibration made from ctx->samples at R bits per value.
absl::Status ResolveCalibration(const Dataset& d, PcaContext* ctx, CodecParams* p) {
  if (p->mode != Mode::kPca || p->calibration_id != 0) return absl::OkStatus();
  if (!ctx->samples)
    return absl::InvalidArgumentError("pca modes need --calibrate-from (held-out sample KV)");
  const Dataset& c = *ctx->samples;
  if (c.layout.num_layers != d.layout.num_layers || c.layout.num_kv_heads != d.layout.num_kv_heads ||
      c.layout.head_dim != d.layout.head_dim || c.layout.tokens_per_block != d.layout.tokens_per_block)
    return absl::InvalidArgumentError("--calibrate-from: geometry differs from the data's");
  std::vector<std::span<const uint8_t>> blocks;
  for (uint32_t b = 0; b < c.blocks; ++b)
    blocks.emplace_back(c.bytes.data() + b * BlockBytes(c), BlockBytes(c));
  codec::CalibrateOptions o;
  o.bits_per_value = p->PcaCalibrationBits();
  o.key_weight = ctx->key_weight;
  o.rope_theta = ctx->rope_theta;
  o.metric = ctx->metric;
  o.importance = ctx->importance;
  o.importance_floor_bits = ctx->importance_floor_bits;
  o.min_coordinate_bits = ctx->min_coordinate_bits;
  const auto t0 = Clock::now();
  auto cal = codec::Calibrate(c.layout, blocks, o);
  if (!cal.ok()) return cal.status();
  std::fprintf(stderr, "codec_eval: calibrated pca:b%g from %u blocks in %.1f s: id %s, %.3f bits/value on the samples\n",
               o.bits_per_value, c.blocks, Seconds(t0, Clock::now()),
               codec::CalibrationIdString(cal->Id()).c_str(), cal->sample_bits);
  p->calibration_id = ctx->set.Add(std::make_shared<const codec::Calibration>(*std::move(cal)));
  return absl::OkStatus();
}

// `decoded`, when given, receives the reconstruction (the data set's block bytes).
absl::StatusOr<Row> RunCodec(const Dataset& d, const std::string& spec, int reps,
                             std::vector<uint8_t>* decoded = nullptr, PcaContext* pca = nullptr) {
  auto params = codec::ParseCodecSpec(spec);
  if (!params.ok()) return params.status();
  if (params->mode == Mode::kPca) {
    if (!pca) return absl::InvalidArgumentError("pca modes need a calibration context");
    if (auto s = ResolveCalibration(d, pca, &*params); !s.ok()) return s;
  }
  const size_t bb = BlockBytes(d);
  codec::Encoder enc;
  enc.set_pca_one_pass(!g_pca_budget_search);
  codec::Decoder dec;
  if (pca) {
    enc.set_calibrations(&pca->set);
    dec.set_calibrations(&pca->set);
  }
  std::vector<std::vector<uint8_t>> blobs(d.blocks);
  codec::EncodeStats stats;
  Row row;
  stats.symbol_sink = params->mode == Mode::kQuant ? &row.symbols : nullptr;
  for (uint32_t b = 0; b < d.blocks; ++b) {
    params->first_position = uint64_t{b} * d.layout.tokens_per_block;
    auto s = enc.Encode(d.layout, *params, {d.bytes.data() + b * bb, bb}, &blobs[b], &stats);
    if (!s.ok()) return s;
  }
  const uint64_t trials_before = enc.budget_trial_encodes();
  const double te = BestSeconds(reps, [&] {
    for (uint32_t b = 0; b < d.blocks; ++b) {
      params->first_position = uint64_t{b} * d.layout.tokens_per_block;
      (void)enc.Encode(d.layout, *params, {d.bytes.data() + b * bb, bb}, &blobs[b]);
    }
  });
  row.trials_per_block = TrialsPerBlock(enc, trials_before, d.blocks, reps);
  // Timed into a buffer aligned as an arena's or a tensor's are (a vector's is 16 bytes off).
  std::vector<uint8_t> out_mem(d.bytes.size() + 64);
  uint8_t* out_p = out_mem.data() + (64 - reinterpret_cast<uintptr_t>(out_mem.data()) % 64) % 64;
  absl::Status st;
  const double td = BestSeconds(reps, [&] {
    for (uint32_t b = 0; b < d.blocks && st.ok(); ++b)
      st = dec.Decode(blobs[b], {out_p + b * bb, bb});
  });
  if (!st.ok()) return st;
  std::vector<uint8_t> out(out_p, out_p + d.bytes.size());
  const double values = static_cast<double>(Values(d));
  const Quality q = Measure(d, out);
  row.mode = spec;
  row.baseline = params->mode == Mode::kGroupwise;
  row.lossy = params->mode == Mode::kGroupwise || params->mode == Mode::kQuant ||
              params->mode == Mode::kPca;
  FillRow(static_cast<double>(stats.blob_bytes), values, q, te, td, &row);
  row.bits_param = params->key_bits;
  if (params->mode == Mode::kRaw) {
    row.entropy = WordEntropyBits(d);
  } else {
    row.entropy = stats.coder.entropy_bits / values;
    if (stats.coder.entropy_bits > 0)
      row.coder_over_entropy =
          static_cast<double>(stats.coder.stream_bits) / stats.coder.entropy_bits;
    row.tables_bits = static_cast<double>(stats.coder.table_bits) / values;
  }
  if (decoded) *decoded = std::move(out);
  return row;
}

// `xl:sSTEP[:rC]`: codec mode xl (codec/cross_layer.h), calibrated from the --calibrate-from
// blocks with the pca modes' RoPE and per (layer, tensor) importances, each block within C bits
// per value with :rC (xl:rC alone calibrates at step 0.5, as a namespace would); blobs as the
// store keeps them.
absl::StatusOr<Row> RunCrossLayer(const Dataset& d, const std::string& spec, int reps,
                                  std::vector<uint8_t>* decoded, const PcaContext& pca) {
  codec::CrossLayerOptions o;
  auto parsed = codec::ParseCodecSpec(spec);
  if (!parsed.ok() || parsed->mode != codec::Mode::kCrossLayer || parsed->calibration_id != 0)
    return absl::InvalidArgumentError(
        "cross-layer modes are xl:sSTEP[:rC] or xl:rC (e.g. xl:s0.7, xl:s0.5:r1.4)");
  o.step = parsed->xl_step > 0 ? parsed->xl_step : 0.5;
  if (!pca.samples)
    return absl::InvalidArgumentError("xl modes need --calibrate-from (held-out sample KV)");
  const Dataset& c = *pca.samples;
  if (!(c.layout == d.layout))
    return absl::InvalidArgumentError("--calibrate-from: geometry differs from the data's");
  std::vector<std::span<const uint8_t>> samples;
  for (uint32_t b = 0; b < c.blocks; ++b)
    samples.emplace_back(c.bytes.data() + b * BlockBytes(c), BlockBytes(c));
  o.rope_theta = pca.rope_theta;
  if (!pca.importance.empty() && pca.importance.size() != size_t{d.layout.num_layers} * 2)
    return absl::InvalidArgumentError("xl modes take importances per (layer, tensor) only");
  o.importance = pca.importance;
  const auto t0 = Clock::now();
  auto cal = codec::CalibrateCrossLayer(c.layout, samples, o);
  if (!cal.ok()) return cal.status();
  size_t coded = 0;
  for (uint32_t l = 0; l < cal->num_layers; ++l) coded += cal->Coded(l);
  std::fprintf(stderr, "codec_eval: calibrated %s from %u blocks in %.1f s: %.1f of %zu "
               "coordinates coded per layer, %.1f MB serialized\n", spec.c_str(), c.blocks,
               Seconds(t0, Clock::now()), static_cast<double>(coded) / cal->num_layers,
               cal->Width(), static_cast<double>(cal->Serialize().size()) / 1e6);
  codec::CalibrationSet set;
  codec::CodecParams params = *parsed;
  params.calibration_id = set.Add(std::make_shared<const codec::Calibration>(
      codec::Calibration::OfCrossLayer(
          std::make_shared<const codec::CrossLayerCalibration>(*std::move(cal)))));
  codec::Encoder encoder;
  encoder.set_calibrations(&set);
  codec::Decoder decoder;
  decoder.set_calibrations(&set);
  const size_t bb = BlockBytes(d);
  std::vector<std::vector<uint8_t>> payloads(d.blocks);
  auto encode = [&]() -> absl::Status {
    for (uint32_t b = 0; b < d.blocks; ++b) {
      params.first_position = uint64_t{b} * d.layout.tokens_per_block;
      STRATA_RETURN_IF_ERROR(
          encoder.Encode(d.layout, params, {d.bytes.data() + b * bb, bb}, &payloads[b]));
    }
    return absl::OkStatus();
  };
  if (auto s = encode(); !s.ok()) return s;
  const uint64_t trials_before = encoder.budget_trial_encodes();
  const double te = BestSeconds(reps, [&] { (void)encode(); });
  const double trials = TrialsPerBlock(encoder, trials_before, d.blocks, reps);
  std::vector<uint8_t> out(d.bytes.size());
  absl::Status st;
  const double td = BestSeconds(reps, [&] {
    for (uint32_t b = 0; b < d.blocks && st.ok(); ++b)
      st = decoder.Decode(payloads[b], {out.data() + b * bb, bb});
  });
  if (!st.ok()) return st;
  double bytes = 0;
  for (const auto& p : payloads) bytes += static_cast<double>(p.size());
  const double values = static_cast<double>(Values(d));
  const Quality q = Measure(d, out);
  Row row;
  row.mode = spec;
  row.lossy = true;
  FillRow(bytes, values, q, te, td, &row);
  row.trials_per_block = trials;
  if (decoded) *decoded = std::move(out);
  return row;
}

Row RunZstd(const Dataset& d, int level, int reps) {
  const size_t bb = BlockBytes(d);
  std::vector<std::vector<uint8_t>> blobs(d.blocks, std::vector<uint8_t>(ZSTD_compressBound(bb)));
  std::vector<size_t> sizes(d.blocks);
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_DCtx* dctx = ZSTD_createDCtx();
  auto enc = [&] {
    for (uint32_t b = 0; b < d.blocks; ++b)
      sizes[b] = ZSTD_compressCCtx(cctx, blobs[b].data(), blobs[b].size(), d.bytes.data() + b * bb,
                                   bb, level);
  };
  enc();
  const double te = BestSeconds(reps, enc);
  std::vector<uint8_t> out(d.bytes.size());
  const double td = BestSeconds(reps, [&] {
    for (uint32_t b = 0; b < d.blocks; ++b)
      ZSTD_decompressDCtx(dctx, out.data() + b * bb, bb, blobs[b].data(), sizes[b]);
  });
  ZSTD_freeCCtx(cctx);
  ZSTD_freeDCtx(dctx);
  Row row;
  row.mode = absl::StrCat("zstd-", level);
  row.baseline = true;
  double total = 0;
  for (size_t s : sizes) total += static_cast<double>(s);
  const double values = static_cast<double>(Values(d));
  FillRow(total, values, Measure(d, out), te, td, &row);
  row.entropy = WordEntropyBits(d);
  return row;
}

double MemcpyGbps(const Dataset& d, int reps) {
  std::vector<uint8_t> dst(d.bytes.size());
  std::memset(dst.data(), 1, dst.size());
  const double t = BestSeconds(std::max(reps, 3), [&] {
    std::memcpy(dst.data(), d.bytes.data(), d.bytes.size());
    asm volatile("" : : "r"(dst.data()) : "memory");
  });
  return static_cast<double>(d.bytes.size()) / t / 1e9;
}

// Same-symbol comparison of entropy coders for one quant row.
struct SymbolRow {
  std::string mode;
  double n = 0, entropy = 0, rans_bits = 0, zstd3_bits = 0, zstd19_bits = 0;
  double rans_enc = 0, rans_dec = 0, zstd3_enc = 0, zstd3_dec = 0;  // Msymbols/s
};

SymbolRow CompareCoders(const Dataset& d, const Row& row, int reps) {
  // Per section (one layer's K or V), as in the blob: rANS with per-section tables against zstd
  // on the same section's symbols.
  SymbolRow r;
  r.mode = row.mode;
  const auto& s = row.symbols;
  r.n = static_cast<double>(s.size());
  const size_t sec = size_t{d.layout.tokens_per_block} * d.layout.ValuesPerTokenPerTensor();
  const uint32_t ctx = d.layout.head_dim % 16 == 0 ? d.layout.head_dim / 16 : 1;
  const size_t nsec = s.size() / sec;
  std::vector<uint32_t> alpha(nsec);
  std::vector<std::vector<uint8_t>> bytes(nsec), rbuf(nsec), zbuf(nsec);
  std::vector<size_t> zsize(nsec);
  for (size_t i = 0; i < nsec; ++i) {
    uint16_t maxs = 0;
    for (size_t j = i * sec; j < (i + 1) * sec; ++j) maxs = std::max(maxs, s[j]);
    alpha[i] = uint32_t{maxs} + 1;
    // zstd sees the symbols as bytes when they fit (int6 and below), else as 16-bit words.
    if (maxs < 256) {
      bytes[i].assign(s.begin() + i * sec, s.begin() + (i + 1) * sec);
    } else {
      bytes[i].resize(sec * 2);
      std::memcpy(bytes[i].data(), s.data() + i * sec, sec * 2);
    }
    zbuf[i].resize(ZSTD_compressBound(bytes[i].size()));
  }
  codec::rans::Scratch scratch;
  codec::rans::CoderStats st;
  for (size_t i = 0; i < nsec; ++i)
    codec::rans::Encode(s.data() + i * sec, sec, alpha[i], ctx, &scratch, &rbuf[i], &st, 64);
  r.entropy = st.entropy_bits / r.n;
  double rbytes = 0;
  for (auto& b : rbuf) rbytes += static_cast<double>(b.size());
  r.rans_bits = 8.0 * rbytes / r.n;
  r.rans_enc = r.n /
               BestSeconds(reps,
                           [&] {
                             for (size_t i = 0; i < nsec; ++i) {
                               rbuf[i].clear();
                               codec::rans::Encode(s.data() + i * sec, sec, alpha[i], ctx, &scratch,
                                                   &rbuf[i], nullptr, 64);
                             }
                           }) /
               1e6;
  std::vector<uint16_t> back(sec);
  r.rans_dec =
      r.n /
      BestSeconds(reps,
                  [&] {
                    for (size_t i = 0; i < nsec; ++i) {
                      codec::internal::ByteReader rd(rbuf[i], "bench");
                      (void)codec::rans::Decode(rd, sec, alpha[i], ctx, &scratch, back.data(), 64);
                    }
                  }) /
      1e6;
  r.zstd3_enc = r.n /
                BestSeconds(reps,
                            [&] {
                              for (size_t i = 0; i < nsec; ++i)
                                zsize[i] = ZSTD_compress(zbuf[i].data(), zbuf[i].size(),
                                                         bytes[i].data(), bytes[i].size(), 3);
                            }) /
                1e6;
  double zb = 0;
  for (size_t z : zsize) zb += static_cast<double>(z);
  r.zstd3_bits = 8.0 * zb / r.n;
  std::vector<uint8_t> zout(sec * 2);
  r.zstd3_dec = r.n /
                BestSeconds(reps,
                            [&] {
                              for (size_t i = 0; i < nsec; ++i)
                                ZSTD_decompress(zout.data(), zout.size(), zbuf[i].data(), zsize[i]);
                            }) /
                1e6;
  double z19 = 0;
  for (size_t i = 0; i < nsec; ++i)
    z19 += static_cast<double>(
        ZSTD_compress(zbuf[i].data(), zbuf[i].size(), bytes[i].data(), bytes[i].size(), 19));
  r.zstd19_bits = 8.0 * z19 / r.n;
  return r;
}

// Logit error of the plain baselines interpolated (log-linear in error) at `bits`.
std::optional<double> BaselineAt(const std::vector<const Row*>& base, double bits, bool* extrap) {
  if (base.size() < 2) return std::nullopt;
  size_t i = 0;
  while (i + 2 < base.size() && bits > base[i + 1]->bits) ++i;
  const Row* a = base[i];
  const Row* b = base[i + 1];
  *extrap = bits < base.front()->bits || bits > base.back()->bits;
  const double la = std::log(a->logit), lb = std::log(b->logit);
  const double t = (bits - a->bits) / (b->bits - a->bits);
  return std::exp(la + t * (lb - la));
}

void PrintModelQuality(const std::vector<Row>& rows,
                       const std::map<std::string, ModelQuality>& quality,
                       const std::string& path, double memcpy_gbps) {
  std::printf(
      "\nQuality as the model sees it (%s): the model's next-token distributions on the "
      "continuation, attending to each mode's decoded prefix KV, against the same run on the "
      "fp16 prefix KV. KL(fp16 || mode) in nats/token; top-1: argmax agreement; dNLL: change of "
      "the continuation's mean negative log-likelihood (nats/token). Speeds from this run "
      "(memcpy %.2f GB/s).\n",
      path.c_str(), memcpy_gbps);
  std::printf("%-22s %8s %7s %6s %10s %10s %10s %8s %10s %6s %10s %7s %7s\n", "mode", "bits/val",
              "x fp16", "tokens", "KL mean", "KL p90", "KL max", "top-1 %", "dNLL", "near-0",
              "logit_err", "enc", "dec");
  auto print_quality = [](const ModelQuality& q) {
    std::printf("%6llu %10.3g %10.3g %10.3g %8.2f %+10.4f %6s ",
                static_cast<unsigned long long>(q.tokens), q.kl_mean, q.kl_p90, q.kl_max,
                100 * q.top1, q.dnll, q.near_lossless.c_str());
  };
  if (auto it = quality.find("fp32-kv"); it != quality.end()) {
    std::printf("%-22s %8s %7s ", "fp32 KV (floor)", "32", "0.50");
    print_quality(it->second);
    std::printf("%10s %7s %7s\n", "-", "-", "-");
  }
  for (const Row& r : rows) {
    std::printf("%-22s %8.3f %7.2f ", r.mode.c_str(), r.bits, r.ratio);
    auto it = quality.find(r.mode);
    if (it == quality.end())
      std::printf("%6s %10s %10s %10s %8s %10s %6s ", "-", "-", "-", "-", "-", "-", "-");
    else
      print_quality(it->second);
    std::printf("%10.3g %7.2f %7.2f\n", r.logit, r.enc_gbps, r.dec_gbps);
  }
  std::printf(
      "near-0 (near-lossless): mean KL <= 0.01 nats and top-1 >= 98%% over >= 256 continuation "
      "tokens (docs/codec.md); '-' where the model did not see the mode.\n");
}

}  // namespace
}  // namespace strata::codec_bench

int main(int argc, char** argv) {
  using namespace strata;
  using namespace strata::codec_bench;
  CLI::App app{"codec_eval: rate, distortion and speed of Strata's KV codec modes"};
  uint32_t layers = 8, heads = 8, head_dim = 128, tpb = 256, blocks = 4;
  std::string data_path, modes_str, write_npy, queries_path, write_queries, dtype_str = "fp16";
  std::string write_decoded, quality_path, calibrate_from, pca_metric, pca_importance;
  double pca_key_weight = 1.0, pca_rope_theta = 0,
         pca_importance_floor = codec::CalibrateOptions{}.importance_floor_bits,
         pca_min_coordinate_bits = codec::CalibrateOptions{}.min_coordinate_bits;
  bool json = false, smoke = false;
  int reps = 3;
  codec::SyntheticKvParams gen;
  app.add_option("--layers", layers, "generator: layers");
  app.add_option("--heads", heads, "generator: kv heads");
  app.add_option("--head-dim", head_dim, "generator: head dim");
  app.add_option("--tokens-per-block", tpb, "tokens per block");
  app.add_option("--blocks", blocks, "generator: blocks (consecutive positions)");
  app.add_option("--dtype", dtype_str, "generator dtype: fp16 or bf16");
  app.add_option("--seed", gen.seed, "generator seed");
  app.add_option("--key-corr", gen.key_token_corr, "generator: AR(1) token correlation of keys");
  app.add_option("--value-corr", gen.value_token_corr,
                 "generator: AR(1) token correlation of values");
  app.add_option("--outlier-scale", gen.outlier_scale, "generator: outlier key channel scale");
  app.add_option("--data", data_path,
                 ".npy file or FILE.safetensors[:TENSOR], shape (layers, 2, tokens, kv_heads, "
                 "head_dim), fp16/bf16/fp32");
  app.add_option("--queries", queries_path,
                 "real queries for the logit error: .npy or FILE.safetensors[:TENSOR], shape "
                 "(layers, tokens, q_heads, head_dim); default: synthetic ones");
  app.add_option("--write-queries", write_queries,
                 "write the synthetic queries as (layers, nq, kv_heads, head_dim) fp32 .npy or "
                 ".safetensors (tensor 'q') and continue");
  app.add_option("--modes", modes_str, "comma-separated codec specs (default: all)");
  app.add_option("--reps", reps, "timing repetitions (best of)");
  app.add_option("--write-npy", write_npy,
                 "write the generated data set as .npy (or, for a .safetensors name, as a "
                 "safetensors tensor 'kv') and continue");
  app.add_option("--write-decoded", write_decoded,
                 "with --data: write each codec mode's decoded KV to DIR/<mode>.safetensors "
                 "(tensor 'kv', the input's shape) and DIR/modes.tsv (mode, file), for "
                 "model_quality.py eval");
  app.add_option("--quality", quality_path,
                 "model_quality.py's quality.tsv: print the model's KL, top-1 and NLL change per "
                 "mode beside bits/value");
  app.add_option("--calibrate-from", calibrate_from,
                 "pca:bR modes calibrate from this KV (same format as --data; other text or "
                 "blocks than --data, for held-out figures)");
  app.add_option("--pca-key-weight", pca_key_weight,
                 "pca calibration: distortion weight of keys against values");
  app.add_option("--pca-metric", pca_metric,
                 "pca calibration: what an error in each head vector costs the model, "
                 "FILE[:TENSOR] of shape (layers, 2, kv_heads, head_dim, head_dim) "
                 "(model_quality.py prefix writes it as 'metric'); default: squared error");
  app.add_option("--pca-importance", pca_importance,
                 "pca calibration: how much the model minds each layer's and tensor's (or "
                 "head's) relative error, FILE[:TENSOR] of shape (layers, 2[, kv_heads]) "
                 "(model_quality.py sensitivity); default: all alike");
  app.add_option("--pca-importance-floor", pca_importance_floor,
                 "pca calibration with --pca-importance: no coordinate gets more than this many "
                 "bits fewer than without importances (< 0: no floor)");
  app.add_option("--pca-min-coordinate-bits", pca_min_coordinate_bits,
                 "pca calibration: a coordinate gets at least this many bits of the allocation's "
                 "model or none (0: the model's allocation as it is)");
  app.add_option("--pca-rope-theta", pca_rope_theta,
                 "pca calibration: undo RoPE (rotate-half, this theta) on the keys; block b "
                 "of --data and of --calibrate-from starts at token b * tokens-per-block");
  app.add_flag("--pca-budget-search", g_pca_budget_search,
               "pca bit budgets: search every block for its common step code (the encoder's "
               "one-pass coding off; an A/B of the two in one binary)");
  app.add_flag("--json", json, "print JSON instead of tables");
  app.add_flag("--cpu-time", g_cpu_time,
               "speeds from the thread's CPU time, not wall time (for a loaded machine)");
  app.add_flag("--smoke", smoke, "tiny sizes, one repetition (a quick self-check)");
  CLI11_PARSE(app, argc, argv);
  if (smoke) {
    layers = 2;
    heads = 2;
    head_dim = 64;
    tpb = 64;
    blocks = 2;
    reps = 1;
  }
  Dataset d;
  if (!data_path.empty()) {
    auto ds = LoadNpyDataset(data_path, tpb);
    if (!ds.ok()) {
      std::fprintf(stderr, "codec_eval: %s\n", std::string(ds.status().message()).c_str());
      return 1;
    }
    d = std::move(*ds);
  } else {
    auto dt = ParseDType(dtype_str);
    if (!dt.ok() || (*dt != DType::kFloat16 && *dt != DType::kBFloat16)) {
      std::fprintf(stderr, "codec_eval: --dtype must be fp16 or bf16\n");
      return 1;
    }
    d.layout.num_layers = layers;
    d.layout.num_kv_heads = heads;
    d.layout.head_dim = head_dim;
    d.layout.tokens_per_block = tpb;
    d.layout.dtype = *dt;
    if (auto s = d.layout.Validate(); !s.ok() || blocks == 0) {
      std::fprintf(stderr, "codec_eval: bad layout\n");
      return 1;
    }
    d.blocks = blocks;
    d.bytes = codec::GenerateSyntheticKv(d.layout, blocks, gen);
    d.source =
        absl::StrFormat("generator seed %d, key corr %.2f, value corr %.2f, outlier scale %.1f",
                        gen.seed, gen.key_token_corr, gen.value_token_corr, gen.outlier_scale);
    if (!write_npy.empty()) {
      if (d.layout.dtype != DType::kFloat16) {
        std::fprintf(stderr, "codec_eval: --write-npy writes fp16 data only\n");
        return 1;
      }
      const NpyArray a = ToTensorLayout(d.layout, d.blocks, d.bytes);
      if (auto s = EndsWith(write_npy, ".safetensors") ? WriteSafetensors(write_npy, "kv", a)
                                                        : WriteNpy(write_npy, a);
          !s.ok()) {
        std::fprintf(stderr, "codec_eval: %s\n", std::string(s.message()).c_str());
        return 1;
      }
    }
  }
  d.f.resize(Values(d));
  ToFloats(d.bytes.data(), d.layout.dtype, d.f.data(), d.f.size());
  if (queries_path.empty()) {
    MakeQueries(&d, 99);
    if (!write_queries.empty()) {
      // Shape (layers, nq, kv_heads, head_dim): nq "positions", one q head per kv head.
      const KvLayout& l = d.layout;
      NpyArray q;
      q.shape = {l.num_layers, d.nq, l.num_kv_heads, l.head_dim};
      q.descr = "<f4";
      q.data.resize(d.queries.size() * 4);
      for (uint32_t layer = 0; layer < l.num_layers; ++layer)
        for (uint32_t j = 0; j < d.nq; ++j)
          for (uint32_t h = 0; h < l.num_kv_heads; ++h)
            std::memcpy(
                q.data.data() +
                    (((size_t{layer} * d.nq + j) * l.num_kv_heads + h) * l.head_dim) * 4,
                d.queries.data() + ((size_t{layer} * l.num_kv_heads + h) * d.nq + j) * l.head_dim,
                l.head_dim * 4);
      if (auto s = EndsWith(write_queries, ".safetensors") ? WriteSafetensors(write_queries, "q", q)
                                                            : WriteNpy(write_queries, q);
          !s.ok()) {
        std::fprintf(stderr, "codec_eval: %s\n", std::string(s.message()).c_str());
        return 1;
      }
    }
  } else if (auto s = LoadQueries(&d, queries_path, 48); !s.ok()) {
    std::fprintf(stderr, "codec_eval: %s\n", std::string(s.message()).c_str());
    return 1;
  } else {
    absl::StrAppend(&d.source, "; real queries from ", queries_path, " (", d.nq,
                    " per layer and kv head)");
  }

  std::vector<std::string> modes;
  if (!modes_str.empty()) {
    modes = absl::StrSplit(modes_str, ',', absl::SkipEmpty());
  } else if (smoke) {
    modes = {"zstd-3",   "raw",        "lossless",       "int4-g64",
             "int2-g64", "quant:k4v4", "quant:k3v4:had", "quant:k3v4:ol"};
  } else {
    modes = {"zstd-3",
             "raw",
             "lossless",
             "int8-g64",
             "int4-g64",
             "int3-g64",
             "int2-g64",
             "quant:k8v8",
             "quant:k4v4",
             "quant:k4v4:had",
             "quant:k4v4:nodelta",
             "quant:k8v8:ol",
             "quant:k4v4:ol",
             "quant:k3v4:ol",
             "quant:k3v3:ol",
             "quant:k2v3:ol",
             "quant:k2v2:ol",
             "quant:k3v4:had:ol",
             "quant:k3v4:nodelta:ol"};
  }
  if (!write_decoded.empty()) {
    // The model reads the decoded prefix in place of the original, so every token must have
    // gone through the codec: a partial last block would leave a hole.
    if (data_path.empty() || d.source_tokens != uint64_t{d.blocks} * d.layout.tokens_per_block ||
        d.blocks == 0) {
      std::fprintf(stderr,
                   "codec_eval: --write-decoded needs --data with a whole number of blocks "
                   "(%llu tokens, %u per block)\n",
                   static_cast<unsigned long long>(d.source_tokens), d.layout.tokens_per_block);
      return 1;
    }
    std::error_code ec;
    std::filesystem::create_directories(write_decoded, ec);
    if (ec) {
      std::fprintf(stderr, "codec_eval: --write-decoded: %s\n", ec.message().c_str());
      return 1;
    }
  }
  std::map<std::string, ModelQuality> quality;
  if (!quality_path.empty()) {
    auto q = ReadQuality(quality_path);
    if (!q.ok()) {
      std::fprintf(stderr, "codec_eval: %s\n", std::string(q.status().message()).c_str());
      return 1;
    }
    quality = std::move(*q);
  }
  Dataset calib;
  PcaContext pca;
  pca.key_weight = pca_key_weight;
  pca.rope_theta = pca_rope_theta;
  pca.importance_floor_bits = pca_importance_floor;
  pca.min_coordinate_bits = pca_min_coordinate_bits;
  if (!calibrate_from.empty()) {
    auto c = LoadNpyDataset(calibrate_from, d.layout.tokens_per_block);
    if (!c.ok()) {
      std::fprintf(stderr, "codec_eval: --calibrate-from: %s\n",
                   std::string(c.status().message()).c_str());
      return 1;
    }
    calib = std::move(*c);
    pca.samples = &calib;
  }
  // The calibration's optional steering inputs: false after printing why one did not load.
  auto load = [&](const std::string& path, auto loader, auto* into) {
    if (path.empty()) return true;
    auto v = loader(path, d.layout);
    if (!v.ok())
      std::fprintf(stderr, "codec_eval: %s\n", std::string(v.status().message()).c_str());
    else
      *into = std::move(*v);
    return v.ok();
  };
  if (!load(pca_metric, LoadMetric, &pca.metric) ||
      !load(pca_importance, LoadImportance, &pca.importance))
    return 1;
  const double memcpy_gbps = MemcpyGbps(d, reps);
  std::vector<Row> rows;
  std::string modes_tsv;
  for (const std::string& m : modes) {
    if (absl::StartsWith(m, "zstd-")) {
      int level = 3;
      if (!absl::SimpleAtoi(m.substr(5), &level)) {
        std::fprintf(stderr, "codec_eval: bad mode %s\n", m.c_str());
        return 1;
      }
      rows.push_back(RunZstd(d, level, reps));
      continue;
    }
    std::vector<uint8_t> decoded;
    auto r = absl::StartsWith(m, "xl:")
                 ? RunCrossLayer(d, m, reps, write_decoded.empty() ? nullptr : &decoded, pca)
                 : RunCodec(d, m, reps, write_decoded.empty() ? nullptr : &decoded, &pca);
    if (!r.ok()) {
      std::fprintf(stderr, "codec_eval: %s: %s\n", m.c_str(),
                   std::string(r.status().message()).c_str());
      return 1;
    }
    // Lossless modes must round-trip exactly; stop loudly if not.
    if ((m == "raw" || m == "lossless") && !r->bit_exact) {
      std::fprintf(stderr, "codec_eval: %s did not round-trip bit-exactly\n", m.c_str());
      return 2;
    }
    if (!write_decoded.empty()) {
      const std::string file = FileStem(m) + ".safetensors";
      if (auto s = WriteSafetensors(write_decoded + "/" + file, "kv",
                                    ToTensorLayout(d.layout, d.blocks, decoded));
          !s.ok()) {
        std::fprintf(stderr, "codec_eval: %s\n", std::string(s.message()).c_str());
        return 1;
      }
      absl::StrAppend(&modes_tsv, m, "\t", file, "\n");
    }
    rows.push_back(std::move(*r));
  }

  if (!write_decoded.empty()) {
    std::FILE* f = std::fopen((write_decoded + "/modes.tsv").c_str(), "w");
    if (!f || std::fputs(modes_tsv.c_str(), f) < 0 || std::fclose(f) != 0) {
      std::fprintf(stderr, "codec_eval: cannot write %s/modes.tsv\n", write_decoded.c_str());
      return 1;
    }
  }

  if (json) {
    std::string out = absl::StrFormat("{\"memcpy_gbps\": %.4f, \"rows\": [", memcpy_gbps);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      absl::StrAppendFormat(
          &out,
          "%s\n  {\"mode\": \"%s\", \"baseline\": %s, \"bits_per_value\": %.5f, "
          "\"ratio_vs_fp16\": %.4f, \"rel_mse\": %.6g, \"max_abs_err\": %.6g, "
          "\"logit_rel_err\": %.6g, \"encode_gbps\": %.4f, \"decode_gbps\": %.4f, "
          "\"entropy_bits\": %.5f}",
          i ? "," : "", r.mode, r.baseline ? "true" : "false", r.bits, r.ratio, r.rel_mse,
          std::isfinite(r.max_abs) ? r.max_abs : 1e308, r.logit, r.enc_gbps, r.dec_gbps, r.entropy);
      if (auto it = quality.find(r.mode); it != quality.end()) {
        const ModelQuality& q = it->second;
        out.pop_back();
        absl::StrAppendFormat(&out,
                              ", \"model_tokens\": %d, \"kl_mean\": %.6g, \"kl_p90\": %.6g, "
                              "\"kl_max\": %.6g, \"top1\": %.6f, \"dnll\": %.6g, "
                              "\"near_lossless\": \"%s\"}",
                              q.tokens, q.kl_mean, q.kl_p90, q.kl_max, q.top1, q.dnll,
                              q.near_lossless);
      }
    }
    out += "\n]";
    if (auto it = quality.find("fp32-kv"); it != quality.end())
      absl::StrAppendFormat(&out, ", \"floor_fp32_kv\": {\"kl_mean\": %.6g, \"kl_p90\": %.6g, "
                                  "\"kl_max\": %.6g, \"top1\": %.6f, \"dnll\": %.6g}",
                            it->second.kl_mean, it->second.kl_p90, it->second.kl_max,
                            it->second.top1, it->second.dnll);
    out += "}\n";
    std::fputs(out.c_str(), stdout);
    return 0;
  }

  std::printf("data: %s; layout %s; %u blocks (%.1f MiB fp16); SIMD %s; rANS decode %s\n",
              d.source.c_str(), d.layout.DebugString().c_str(), d.blocks,
              static_cast<double>(d.bytes.size()) / (1 << 20), codec::internal::SimdTargetName(),
              codec::rans::SimdDecodeAvailable() ? "AVX-512" : "scalar");
  std::printf(
      "memcpy: %.2f GB/s (same buffer, one core). Speeds are GB/s of fp16 input, one core, best of "
      "%d%s.\n\n",
      memcpy_gbps, reps, g_cpu_time ? ", thread CPU time" : "");
  std::printf("%-20s %4s %8s %7s %10s %10s %10s %10s %10s %7s %7s %8s %8s\n", "mode", "base",
              "bits/val", "x fp16", "rel_mse", "mse_K", "mse_V", "max_abs", "logit_err", "enc",
              "dec", "H bits", "code/H");
  for (const Row& r : rows) {
    std::printf("%-20s %4s %8.3f %7.2f %10.3g %10.3g %10.3g %10.3g %10.3g %7.2f %7.2f %8.3f ",
                r.mode.c_str(), r.baseline ? "yes" : "", r.bits, r.ratio, r.rel_mse, r.rel_mse_k,
                r.rel_mse_v, r.max_abs, r.logit, r.enc_gbps, r.dec_gbps, r.entropy);
    if (r.coder_over_entropy > 0)
      std::printf("%8.4f\n", r.coder_over_entropy);
    else
      std::printf("%8s\n", "-");
  }
  std::printf(
      "\nH bits: empirical entropy per value of the symbol streams under the coder's own "
      "model (per-context order-0); code/H: coded stream bits over that entropy (tables "
      "excluded). raw/zstd rows: order-0 entropy of the fp16 words.\n");

  // Rate-distortion against the plain baselines.
  std::vector<const Row*> base;
  for (const Row& r : rows)
    if (r.baseline && r.lossy) base.push_back(&r);
  std::sort(base.begin(), base.end(), [](const Row* a, const Row* b) { return a->bits < b->bits; });
  std::printf(
      "\nRate-distortion (attention-logit error at equal bits; baseline = plain group-wise "
      "intN interpolated log-linearly at the same bits/value):\n");
  std::printf("%-20s %8s %11s %13s %8s %10s %14s\n", "mode", "bits/val", "logit_err",
              "baseline@bits", "better", "rel_mse", "Shannon bits*");
  for (const Row& r : rows) {
    if (!r.lossy) continue;
    bool extrap = false;
    auto b = BaselineAt(base, r.bits, &extrap);
    const double shannon = std::max(0.0, 0.5 * std::log2(1.0 / r.rel_mse));
    std::printf("%-20s %8.3f %11.4g ", r.mode.c_str(), r.bits, r.logit);
    if (b && !r.baseline)
      std::printf("%13.4g %8s ", *b,
                  (r.logit < *b ? (extrap ? "yes(ex)" : "yes") : (extrap ? "no(ex)" : "no")));
    else
      std::printf("%13s %8s ", "-", "-");
    std::printf("%10.4g %14.3f\n", r.rel_mse, shannon);
  }
  std::printf(
      "* rate an ideal coder needs for i.i.d. Gaussian data at the same relative MSE: "
      "R(D) = 1/2 log2(sigma^2/D). Correlated data can go below it.\n");

  // Entropy coders on the same symbol streams.
  std::vector<SymbolRow> srows;
  for (const Row& r : rows)
    if (!r.symbols.empty()) srows.push_back(CompareCoders(d, r, reps));
  if (!srows.empty()) {
    std::printf(
        "\nEntropy coders on the same quantised symbol streams (bits/symbol; Msym/s, one core):\n");
    std::printf("%-20s %8s %9s %9s %9s %9s %9s %9s %9s\n", "mode", "H", "rANS", "zstd-3", "zstd-19",
                "rANS enc", "zstd enc", "rANS dec", "zstd dec");
    for (const SymbolRow& s : srows)
      std::printf("%-20s %8.4f %9.4f %9.4f %9.4f %9.0f %9.0f %9.0f %9.0f\n", s.mode.c_str(),
                  s.entropy, s.rans_bits, s.zstd3_bits, s.zstd19_bits, s.rans_enc, s.zstd3_enc,
                  s.rans_dec, s.zstd3_dec);
    std::printf("(per section, as in the blob; rANS bits include its tables)\n");
  }

  // Acceptance figures computed from the rows above.
  const Row* zstd = nullptr;
  const Row* lossless = nullptr;
  const Row* int4 = nullptr;
  for (const Row& r : rows) {
    if (r.mode == "zstd-3") zstd = &r;
    if (r.mode == "lossless") lossless = &r;
    if (r.mode == "int4-g64") int4 = &r;
  }
  std::printf("\nChecks:\n");
  if (zstd && lossless)
    std::printf(
        "  lossless: ratio %.4f vs zstd-3 %.4f (%s); encode %.2f GB/s = %.1fx zstd-3 (%s 3x)\n",
        lossless->ratio, zstd->ratio, lossless->ratio >= zstd->ratio ? "ok" : "WORSE",
        lossless->enc_gbps, lossless->enc_gbps / zstd->enc_gbps,
        lossless->enc_gbps >= 3 * zstd->enc_gbps ? ">=" : "below");
  if (int4) {
    const Row* best = nullptr;
    for (const Row& r : rows)
      if (r.lossy && !r.baseline && r.logit <= int4->logit && (!best || r.bits < best->bits))
        best = &r;
    if (best)
      std::printf(
          "  lowest-rate quant row with logit_err <= int4-g64 (%.4g): %s at %.3f bits/value "
          "(%.2fx fp16); its rel_mse %.4g vs int4-g64 %.4g (K %.4g vs %.4g, V %.4g vs %.4g)\n",
          int4->logit, best->mode.c_str(), best->bits, best->ratio, best->rel_mse, int4->rel_mse,
          best->rel_mse_k, int4->rel_mse_k, best->rel_mse_v, int4->rel_mse_v);
    const Row* best_both = nullptr;
    for (const Row& r : rows)
      if (r.lossy && !r.baseline && r.logit <= int4->logit && r.rel_mse_v <= int4->rel_mse_v &&
          (!best_both || r.bits < best_both->bits))
        best_both = &r;
    if (best_both)
      std::printf(
          "  lowest-rate quant row also matching int4-g64 value MSE: %s at %.3f bits/value "
          "(%.2fx)\n",
          best_both->mode.c_str(), best_both->bits, best_both->ratio);
  }
  for (const Row& r : rows)
    if (r.mode.rfind("quant", 0) == 0)
      std::printf(
          "  %-20s coder %.2f%% over entropy (tables +%.4f bits/value); enc %.2f GB/s (%s 1), dec "
          "%.2f GB/s (%s 2)\n",
          r.mode.c_str(), 100 * (r.coder_over_entropy - 1), r.tables_bits, r.enc_gbps,
          r.enc_gbps >= 1 ? ">=" : "<", r.dec_gbps, r.dec_gbps >= 2 ? ">=" : "<");
  for (const Row& r : rows)  // the calibrated modes' speed lines, against this run's memcpy
    if (r.mode.rfind("pca", 0) == 0 || r.mode.rfind("xl", 0) == 0)
      std::printf("  %-20s enc %.3fx memcpy (%s 0.1), dec %.3fx memcpy (%s 0.2)%s\n",
                  r.mode.c_str(), r.enc_gbps / memcpy_gbps,
                  r.enc_gbps >= 0.1 * memcpy_gbps ? ">=" : "<", r.dec_gbps / memcpy_gbps,
                  r.dec_gbps >= 0.2 * memcpy_gbps ? ">=" : "<",
                  r.trials_per_block > 0
                      ? absl::StrFormat("; bit budget: %.2f trial encodes per block",
                                        r.trials_per_block)
                            .c_str()
                      : "");
  if (!quality.empty()) PrintModelQuality(rows, quality, quality_path, memcpy_gbps);
  return 0;
}
