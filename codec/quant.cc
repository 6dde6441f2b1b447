// Lossy `quant` sections: the format and the encoder (the decoder is in quant_decode.cc).
//
// Payload:
//   u8 bits, u8 axis (0: a step per channel, keys; 1: a step per token and channel group,
//   values), u8 flags (kFlagTokenDelta, kFlagHadamard, kFlagKeyOutliers), u8 rANS contexts,
//   u16 group
//   if kFlagKeyOutliers: u16 W, u16 channel[W] (ascending), then the W channels' input values
//                 [T][W] in the input dtype, kept exactly; they are zeroed before quantising
//   fp16 mu[C]                 per-channel centre (mean over the block's tokens)
//   u8 a[C]                    if token delta: predictor weight a/16 in [0, 1]
//   fp16 step[C]               axis 0
//   fp16 step[T * ceil(C/G)]   axis 1
//   coder 1, 2, 4: rANS(symbols, alphabet 4 << bits)
//   coder 6 (shared, <= 6 bits): the rANS tables only; the symbols are in the blob's stream
//                 section (rans::SharedEncoder), coded after the previous section's
//   coder 5 (split): u8 r (1..7, < bits), u8 rANS coder of the high part (1, 2, 4, or 6: its
//                 tables here, its symbols in the blob's shared stream), u16 base,
//                 rANS(hi = (sym >> r) - base as bytes, alphabet min(256, (4 << bits >> r) -
//                 base)), then the low r bits of every symbol, bit-packed (low_bits.h) to the end
//                 of the payload, in value order; with kFlagKeyOutliers and no Hadamard the outlier
//                 channels' low bits are left out (those channels are zero when quantised, their
//                 symbols are 2^(bits+1) whose low bits are 0, and their output is the kept
//                 input anyway). sym = (hi + base) << r | lo.
//   The encoder picks the largest r whose coded size (entropy of hi + r raw bits per value)
//   stays within kSplitMaxLoss of the symbols' own entropy and whose high part spans <= 256
//   values; the high part of 8-bit symbols then spans <= 64 values on typical data, which the
//   rANS coder's in-register table paths handle, and the tables shrink with the alphabet.
//
// Reconstruction (kernels.h QuantRow/DequantRow), for token t and channel c:
//   xh[t][c] = mu[c] + a[c] * (xh[t-1][c] - mu[c]) + (sym - 2^(bits+1)) * step,  xh[-1] = mu.
// The step is the plain intN step, range / (2^bits - 1), over the channel (keys) or the token's
// channel group (values), so the error matches per-channel/per-token intN with the same bits;
// the prediction only shrinks the symbols the entropy coder sees.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/half.h"
#include "codec/internal/byte_io.h"
#include "codec/internal/kernels.h"
#include "codec/internal/low_bits.h"
#include "codec/internal/sections.h"
#include "common/status_macros.h"

namespace strata::codec::internal {
namespace {

constexpr float kMinStep = 6.103515625e-05f;  // 2^-14, the smallest normal fp16
constexpr float kMaxStep = 65504.0f;

uint16_t StepToHalf(float range, int levels) {
  float st = range / static_cast<float>(levels);
  if (!(st >= kMinStep)) st = kMinStep;  // also catches NaN
  if (st > kMaxStep) st = kMaxStep;
  return FloatToHalf(st);
}

// A value step comes from the token's range over its channel group, but the symbol codes the
// residual against the prediction mu + a * (xh[t-1] - mu), which can lie outside that range
// (a token whose group sits far from the channels' means: real KV has such tokens). The
// alphabet holds residuals of +-(offset - 1) steps; where a residual would be clipped, the
// group's step grows just enough (rounded up in fp16) that none is. The decoder reads the
// steps as before: only the encoder's choice changes.
void WidenValueSteps(const float* x, const float* mu, const float* a, const float* xh, size_t C,
                     size_t group, int32_t offset, float* worst, uint16_t* steps16) {
  const float room = static_cast<float>(offset) - 1.0f;
  MaxResidualGroups(x, mu, a, xh, C, group, worst);
  for (size_t g = 0, c0 = 0; c0 < C; ++g, c0 += group) {
    // Residual / step must round to at most `room`: keep half a step of margin.
    const float need = worst[g] / (room - 0.5f);
    if (!(need > HalfToFloat(steps16[g]))) continue;
    uint16_t h = FloatToHalf(std::min(need, kMaxStep));
    while (HalfToFloat(h) < need && HalfToFloat(h) < kMaxStep) ++h;
    steps16[g] = h;
  }
}

int g_split_r = 0;  // tests: forced r

// Order-0 entropy in bits of per-context histograms (num_ctx * alphabet), and the used range.
// `sample`: the histograms are of a sample; add the Miller-Madow correction ((used - 1) / 2 nats
// per context), without which a sample's entropy of a wide alphabet reads low (by ~0.3% for
// 8-bit symbols sampled 1 in 7).
// log2(k) from a table for the small counts of a (sampled) histogram: the split coder's choice
// of r takes a few thousand of them per section (~4% of encoding with std::log2).
double Log2Count(uint32_t k) {
  static const std::vector<double> table = [] {
    std::vector<double> t(4096);
    for (size_t i = 1; i < t.size(); ++i) t[i] = std::log2(static_cast<double>(i));
    return t;
  }();
  return k < table.size() ? table[k] : std::log2(static_cast<double>(k));
}

// Only symbols first..last are counted (the caller knows the rest are zero).
double HistEntropy(const uint32_t* h, uint32_t alphabet, uint32_t num_ctx, uint32_t* lo,
                   uint32_t* hi, bool sample = false, uint32_t first = 0,
                   uint32_t last = UINT32_MAX) {
  double bits = 0;
  uint32_t lo_seen = alphabet, hi_seen = 0;  // locals: *lo may alias h for the compiler
  last = std::min(last, alphabet - 1);
  for (uint32_t c = 0; c < num_ctx; ++c) {
    const uint32_t* hc = h + size_t{c} * alphabet;
    uint64_t total = 0;
    for (uint32_t s = first; s <= last; ++s) total += hc[s];
    if (total == 0) continue;
    // sum h log2(total / h) = total log2(total) - sum h log2(h); four partial sums in a fixed
    // order, so the adds need not wait on each other.
    double part[4] = {0, 0, 0, 0};
    uint32_t used = 0;
    for (uint32_t s = first; s <= last; ++s) {
      const uint32_t k = hc[s];
      if (!k) continue;
      part[used & 3] += k * Log2Count(k);
      ++used;
      lo_seen = std::min(lo_seen, s);
      hi_seen = std::max(hi_seen, s);
    }
    bits += static_cast<double>(total) * std::log2(static_cast<double>(total)) -
            ((part[0] + part[1]) + (part[2] + part[3]));
    if (sample) bits += (used - 1) / (2.0 * std::log(2.0));
  }
  *lo = lo_seen;
  *hi = hi_seen;
  return bits;
}

// Histogram (num_ctx * alphabet, rANS contexts) of a deterministic sample of the symbols: every
// `stride`-th block of num_ctx runs of kCtxRun symbols, stride odd so that, when a token row is
// a power-of-two number of blocks, the sampled blocks walk through every channel. Returns the
// number of symbols sampled.
// Every symbol is within [mn, mx] (the section's smallest and largest).
size_t SampleHistogram(const uint16_t* syms, size_t n, uint32_t alphabet, uint32_t num_ctx,
                       size_t stride, uint32_t* counts, uint16_t mn, uint16_t mx) {
  const size_t block = size_t{num_ctx} * rans::kCtxRun;
  // Four sub-histograms (symbol i & 3), so a run of equal symbols does not wait on one
  // counter's store-to-load latency, each only as wide as the symbols' range (clearing and
  // summing whole 8-bit alphabets cost about as much as counting a small section's sample).
  const size_t span = size_t{mx} - mn + 1;
  const size_t table = size_t{num_ctx} * span;
  std::vector<uint32_t> sub(4 * table, 0);
  uint32_t* const base = sub.data() - mn;  // base[k] for symbols k in [mn, mx]
  size_t sampled = 0;
  for (size_t at = 0; at < n; at += stride * block) {
    const size_t len = std::min(block, n - at);
    const uint16_t* y = syms + at;
    size_t i = 0;
    for (; i + 4 <= len; i += 4) {
      uint32_t* h = base + (i / rans::kCtxRun) * span;  // 4 | kCtxRun: one context
      ++h[y[i]];
      ++h[table + y[i + 1]];
      ++h[2 * table + y[i + 2]];
      ++h[3 * table + y[i + 3]];
    }
    for (; i < len; ++i) ++base[(i / rans::kCtxRun) * span + y[i]];
    sampled += len;
  }
  for (size_t c = 0; c < num_ctx; ++c)
    for (size_t k = 0; k < span; ++k) {
      const size_t j = c * span + k;
      counts[c * alphabet + mn + k] +=
          sub[j] + sub[table + j] + sub[2 * table + j] + sub[3 * table + j];
    }
  return sampled;
}

// The rANS tables' counts, in sc->counts. Sections of kSampledTablesFrom symbols or more build
// them from a 1-in-3 sample (the histogram pass was ~18% of quant encoding), every symbol between
// the section's smallest and largest given at least a count of one in every context, so none
// that occurs is left without a code. The tables' precision costs < 0.1% there (measured: code/H
// unchanged to 0.01 points on the generator's 262k-symbol sections).
//
// (Before the shared stream, this also chose the section's number of rANS states: its own 128
// final states weighed 2-5% of a 49k-symbol section, and the 32 states chosen instead cost the
// decoder 15-20%.)
void TableCounts(SectionScratch* sc, size_t n, uint32_t alphabet, uint32_t ctx) {
  constexpr size_t kSampledTablesFrom = 16384;
  sc->counts.assign(size_t{alphabet} * ctx, 0);
  if (n >= kSampledTablesFrom) {
    const uint16_t* y = sc->syms.data();
    uint16_t mn, mx;
    MinMaxU16(y, n, &mn, &mx);
    SampleHistogram(y, n, alphabet, ctx, 3, sc->counts.data(), mn, mx);
    for (uint32_t c = 0; c < ctx; ++c)
      for (uint32_t s = mn; s <= mx; ++s) {
        uint32_t& k = sc->counts[size_t{c} * alphabet + s];
        if (k == 0) k = 1;
      }
  } else {
    rans::Histogram(sc->syms.data(), n, alphabet, ctx, sc->counts.data());
  }
}

// The split coder's r: the largest r < bits (<= 7) whose high part spans <= 256 values over all
// symbols (min mn, max mx) and whose estimated cost, from the sample histogram `counts` of
// `sampled` symbols, H(hi) + r * sampled * lo_frac, is within kSplitMaxLoss of H(sym); 0 when
// none is. lo_frac: the share of symbols that keep their low bits.
int ChooseSplit(const uint32_t* counts, size_t sampled, uint32_t alphabet, uint32_t num_ctx,
                uint8_t bits, double lo_frac, uint16_t mn, uint16_t mx) {
  const int forced = g_split_r;
  uint32_t lo, hi;
  const double full_bits = HistEntropy(counts, alphabet, num_ctx, &lo, &hi, true, mn, mx);
  std::vector<uint32_t> hc;
  // Relative cost of r over the whole symbols' entropy.
  auto cost = [&](int r) {
    const uint32_t ha = alphabet >> r;
    hc.assign(size_t{ha} * num_ctx, 0);
    for (uint32_t c = 0; c < num_ctx; ++c) {
      const uint32_t* h = counts + size_t{c} * alphabet;
      uint32_t* o = hc.data() + size_t{c} * ha;
      // No symbol outside [mn, mx]; one sum per bucket of 2^r symbols, kept in a register.
      for (uint32_t b = mn >> r; b <= static_cast<uint32_t>(mx >> r); ++b) {
        const uint32_t s0 = std::max<uint32_t>(mn, b << r);
        const uint32_t s1 = std::min<uint32_t>(mx, ((b + 1) << r) - 1);
        uint32_t sum = 0;
        for (uint32_t sy = s0; sy <= s1; ++sy) sum += h[sy];
        o[b] = sum;
      }
    }
    const double hbits = HistEntropy(hc.data(), ha, num_ctx, &lo, &hi, true, mn >> r, mx >> r);
    return (hbits + r * static_cast<double>(sampled) * lo_frac) / full_bits - 1.0;
  };
  auto span = [&](int r) { return (mx >> r) - (mn >> r) + 1; };
  for (int r = std::min(7, bits - 1); r >= 1; --r) {
    if (forced && r != forced) continue;
    if (span(r) > 256) continue;
    if (forced) return r;
    if (full_bits <= 0 || cost(r) > kSplitMaxLoss) continue;
    // The rANS coder's fast paths want the high part within 64 values: one more low bit is
    // worth up to twice the loss.
    if (span(r) > 64 && r + 1 <= std::min(7, bits - 1) && span(r + 1) <= 64 &&
        cost(r + 1) <= 2 * kSplitMaxLoss)
      return r + 1;
    return r;
  }
  return 0;
}

// ---- EncodeQuant's steps ----------------------------------------------------------------------

// What the encoder's steps share about one section.
struct QuantGeometry {
  size_t T, C, n;
  int levels;         // a step is a range over this many levels: 2^bits - 1
  int32_t offset;     // the symbol of a zero residual: 2^(bits+1)
  uint32_t alphabet;  // 4 << bits
  uint8_t axis;       // 0: a step per channel (keys); 1: per token and channel group (values)
  size_t group, ngroups;
};

QuantGeometry GeometryOf(const TensorShape& s, uint8_t bits, const CodecParams& p) {
  QuantGeometry q;
  q.T = s.tokens;
  q.C = s.channels();
  q.n = s.values();
  q.levels = (1 << bits) - 1;
  q.offset = 1 << (bits + 1);
  q.alphabet = 4u << bits;
  q.axis = s.is_key ? 0 : 1;
  q.group = q.axis == 0 ? q.C : std::min<size_t>(p.group_size, q.C);
  q.ngroups = (q.C + q.group - 1) / q.group;
  return q;
}

// Dense-and-sparse keys: picks the outlier channels (per head, up to head_dim / 16 whose mean
// square is over 16 times the head's median; ascending), whose input the section keeps exactly,
// and zeroes them in f. Returns false when one of their values is not finite (the finiteness
// pass that follows sees only the zeros).
bool TakeKeyOutliers(const TensorShape& s, const QuantGeometry& q, float* f,
                     std::vector<uint16_t>* outliers) {
  const size_t T = q.T, C = q.C;
  const size_t D = s.head_dim, per_head = std::max<size_t>(1, D / 16);
  std::vector<float> ms(C, 0.0f);
  for (size_t t = 0; t < T; ++t) SumSquaresRow(f + t * C, ms.data(), C);
  std::vector<std::pair<float, uint16_t>> cand;
  for (size_t h = 0; h < s.heads; ++h) {
    std::vector<float> sorted(ms.begin() + h * D, ms.begin() + (h + 1) * D);
    std::nth_element(sorted.begin(), sorted.begin() + D / 2, sorted.end());
    const float median = sorted[D / 2];
    cand.clear();
    for (size_t c = h * D; c < (h + 1) * D; ++c)
      if (ms[c] > 16.0f * median && ms[c] > 0) cand.push_back({ms[c], static_cast<uint16_t>(c)});
    std::sort(cand.begin(), cand.end(), [](auto& a, auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    for (size_t i = 0; i < cand.size() && i < per_head; ++i) outliers->push_back(cand[i].second);
  }
  std::sort(outliers->begin(), outliers->end());
  bool finite = true;
  for (size_t t = 0; t < T; ++t)
    for (uint16_t c : *outliers) {
      finite &= std::isfinite(f[t * C + c]);
      f[t * C + c] = 0.0f;
    }
  return finite;
}

// One pass over the rows: finiteness, per-channel sums (centre), and the step ranges
// (per-channel min/max for keys, per token and channel group for values). Then the centres, as
// written (mu16) and as the decoder will read them (sc->mu), and the keys' steps.
absl::Status CentresAndSteps(const float* f, const QuantGeometry& q, bool outliers_finite,
                             SectionScratch* sc, std::vector<uint16_t>* mu16) {
  const size_t T = q.T, C = q.C, ngroups = q.ngroups;
  sc->mu.assign(C, 0.0f);
  const bool key_axis = q.axis == 0;
  if (key_axis) {
    sc->mn.assign(f, f + C);
    sc->mx.assign(f, f + C);
  } else {
    sc->mn.resize(ngroups);
    sc->steps16.resize(T * ngroups);
  }
  bool finite = AccumRows(f, T, C, sc->mu.data(), key_axis ? sc->mn.data() : nullptr,
                          key_axis ? sc->mx.data() : nullptr);
  if (!key_axis) {
    for (size_t t = 0; t < T; ++t) {
      GroupRangesRow(f + t * C, C, q.group, sc->mn.data());
      for (size_t g = 0; g < ngroups; ++g)
        sc->steps16[t * ngroups + g] = StepToHalf(sc->mn[g], q.levels);
    }
  }
  if (!finite || !outliers_finite)
    return absl::InvalidArgumentError("codec: quant mode needs finite values (use lossless)");
  mu16->resize(C);
  for (size_t c = 0; c < C; ++c) {
    (*mu16)[c] = FloatToHalf(sc->mu[c] / static_cast<float>(T));
    sc->mu[c] = HalfToFloat((*mu16)[c]);
  }
  if (key_axis) {
    sc->steps16.resize(C);
    for (size_t c = 0; c < C; ++c) sc->steps16[c] = StepToHalf(sc->mx[c] - sc->mn[c], q.levels);
  }
  return absl::OkStatus();
}

// Predictor weights (sc->a, and as written, a16): a = rho * var / (var + D), the closed-loop
// optimum for an AR(1) channel whose prediction sees quantisation noise of variance
// D = step^2 / 12. All zero without token delta.
void PredictorWeights(const float* f, const QuantGeometry& q, bool token_delta, SectionScratch* sc,
                      std::vector<uint8_t>* a16) {
  const size_t T = q.T, C = q.C, ngroups = q.ngroups, group = q.group;
  sc->a.assign(C, 0.0f);
  a16->assign(C, 0);
  if (!token_delta || T <= 1) return;
  std::vector<float> num(C, 0.0f), den(C, 0.0f), d2(C, 0.0f);
  ArStatsRows(f, T, C, sc->mu.data(), num.data(), den.data());
  if (q.axis == 0) {
    for (size_t c = 0; c < C; ++c) {
      const float st = HalfToFloat(sc->steps16[c]);
      d2[c] = st * st;
    }
  } else {
    // Per group (every channel of a group gets the same sum, added in the same order).
    std::vector<float> d2g(ngroups, 0.0f);
    for (size_t t = 0; t < T; ++t)
      for (size_t g = 0; g < ngroups; ++g) {
        const float st = HalfToFloat(sc->steps16[t * ngroups + g]);
        d2g[g] += st * st / static_cast<float>(T);
      }
    for (size_t g = 0; g < ngroups; ++g)
      for (size_t c = g * group, c1 = std::min(C, c + group); c < c1; ++c) d2[c] = d2g[g];
  }
  for (size_t c = 0; c < C; ++c) {
    if (den[c] <= 0) continue;
    const float rho = num[c] / den[c];
    const float var = den[c] / static_cast<float>(T - 1);
    const float a = rho * var / (var + d2[c] / 12.0f);
    const int qa = static_cast<int>(std::lround(std::clamp(a, 0.0f, 1.0f) * 16.0f));
    (*a16)[c] = static_cast<uint8_t>(qa);
    sc->a[c] = static_cast<float>(qa) / 16.0f;
  }
}

// Quantises row by row into sc->syms; sc->xh carries the reconstruction the decoder will have.
// Values' steps are widened first where a residual would not fit (WidenValueSteps).
void QuantiseRows(const float* f, const QuantGeometry& q, SectionScratch* sc) {
  const size_t T = q.T, C = q.C, ngroups = q.ngroups, group = q.group;
  sc->syms.resize(q.n);
  sc->xh.assign(sc->mu.begin(), sc->mu.end());
  sc->step.resize(C);
  sc->inv_step.resize(C);
  if (q.axis == 0) {
    for (size_t c = 0; c < C; ++c) {
      sc->step[c] = HalfToFloat(sc->steps16[c]);
      sc->inv_step[c] = 1.0f / sc->step[c];
    }
  }
  std::vector<float> worst(q.axis == 1 ? ngroups : 0);
  // The next section's input, fetched from memory while this one computes: its first pass
  // (the conversion to floats) otherwise waits on DRAM.
  const uint8_t* pf = sc->prefetch;
  const size_t pf_per_row = T ? (sc->prefetch_bytes + 64 * T - 1) / (64 * T) : 0;
  const uint8_t* const pf_end = pf ? pf + sc->prefetch_bytes : nullptr;
  for (size_t t = 0; t < T; ++t) {
    for (size_t k = 0; k < pf_per_row && pf < pf_end; ++k, pf += 64) __builtin_prefetch(pf, 0, 2);
    size_t step_group = 0;
    if (q.axis == 1) {
      step_group = group;
      WidenValueSteps(f + t * C, sc->mu.data(), sc->a.data(), sc->xh.data(), C, group, q.offset,
                      worst.data(), sc->steps16.data() + t * ngroups);
      for (size_t g = 0; g < ngroups; ++g) {
        sc->step[g] = HalfToFloat(sc->steps16[t * ngroups + g]);
        sc->inv_step[g] = 1.0f / sc->step[g];
      }
    }
    QuantRowGrouped(f + t * C, sc->mu.data(), sc->a.data(), sc->step.data(), sc->inv_step.data(),
                    step_group, sc->xh.data(), sc->syms.data() + t * C, C, q.offset,
                    static_cast<int32_t>(q.alphabet - 1));
  }
}

// Everything in front of the symbols (see the layout at the top of this file).
// The outlier channels' values come from `in` (gathered) or, when `in` is null, from
// `outlier_vals` ([T][W], gathered already).
void WriteQuantHeader(const uint8_t* in, const uint8_t* outlier_vals, const TensorShape& s,
                      const QuantGeometry& q, uint8_t bits, const CodecParams& p,
                      bool use_outliers, const std::vector<uint16_t>& outliers,
                      const std::vector<uint16_t>& mu16, const std::vector<uint8_t>& a16,
                      const std::vector<uint16_t>& steps16, std::vector<uint8_t>* out) {
  const size_t T = q.T, C = q.C;
  ByteWriter w(out);
  w.U8(bits);
  w.U8(q.axis);
  w.U8(static_cast<uint8_t>((p.token_delta ? kFlagTokenDelta : 0) |
                            (p.hadamard ? kFlagHadamard : 0) |
                            (use_outliers ? kFlagKeyOutliers : 0)));
  w.U8(static_cast<uint8_t>(NumChannelContexts(s)));
  w.U16(static_cast<uint16_t>(q.group == C && q.axis == 0 ? 0 : q.group));
  if (use_outliers) {
    const size_t eb = DTypeBytes(s.dtype);
    w.U16(static_cast<uint16_t>(outliers.size()));
    w.Raw(outliers.data(), outliers.size() * 2);
    const size_t at = w.Skip(T * outliers.size() * eb);
    uint8_t* dst = out->data() + at;
    if (!in) {
      std::memcpy(dst, outlier_vals, T * outliers.size() * eb);
    } else if (eb == 2) {  // a memcpy of a runtime size per value was ~1% of an `ol` key section
      for (size_t t = 0; t < T; ++t)
        for (uint16_t c : outliers) {
          std::memcpy(dst, in + (t * C + c) * 2, 2);
          dst += 2;
        }
    } else {
      for (size_t t = 0; t < T; ++t)
        for (uint16_t c : outliers) {
          std::memcpy(dst, in + (t * C + c) * eb, eb);
          dst += eb;
        }
    }
  }
  w.Raw(mu16.data(), C * 2);
  if (p.token_delta) w.Raw(a16.data(), C);
  w.Raw(steps16.data(), steps16.size() * 2);
}

// The split coder's symbols once r (>= 1) is chosen: r, the high part's coder and base, the high
// part's tables (counts from the sample in sc->counts, of symbols within [mn, mx]) and, shared or
// not, its stream, then the low bits. `dropped`: the outlier channels, whose low bits are left
// out (lo_values are kept).
void WriteSplitSymbols(const QuantGeometry& q, uint32_t ctx, int r, uint16_t mn, uint16_t mx,
                       const std::vector<uint16_t>* dropped, size_t lo_values, SectionScratch* sc,
                       std::vector<uint8_t>* out, rans::CoderStats* stats,
                       rans::SharedEncoder* shared) {
  const size_t T = q.T, C = q.C, n = q.n;
  const uint32_t alphabet = q.alphabet;
  ByteWriter w(out);
  // The high part joins the blob's shared stream (where the caller gives one).
  const uint8_t hcoder = shared                  ? kCoderShared
                         : n >= kMinValuesFor128 ? kCoderRans128
                                                 : kCoderRans64;
  const uint16_t base = static_cast<uint16_t>(mn >> r);
  const uint32_t ahi = std::min<uint32_t>(256, (alphabet >> r) - base);
  w.U8(static_cast<uint8_t>(r));
  w.U8(hcoder);
  w.U16(base);
  sc->hi.resize(n);
  sc->lo.resize(n);
  SplitSymbols(sc->syms.data(), n, r, base, sc->hi.data(), sc->lo.data());
  if (dropped) {  // drop the outlier channels' low bits (in place; a move per run cost ~10%)
    std::vector<uint64_t> keep((C + 63) / 64, 0);
    for (size_t c = 0; c < C; ++c) keep[c / 64] |= uint64_t{1} << (c % 64);
    for (uint16_t c : *dropped) keep[c / 64] &= ~(uint64_t{1} << (c % 64));
    CompactLowBits(sc->lo.data(), T, C, keep.data());
  }
  // The high part's tables come from the sample too (no pass over all symbols): its counts
  // plus one for every value between the section's smallest and largest high part, so
  // every symbol that occurs has a frequency. Costs ~0.1% of the stream against exact
  // counts (a sample of 1 in 7 blocks); tested by the code/H column of codec_eval.
  std::vector<uint32_t>& hcounts = sc->hcounts;
  hcounts.assign(size_t{ahi} * ctx, 0);
  const uint32_t top = static_cast<uint32_t>(mx >> r) - base;  // < ahi
  for (uint32_t c = 0; c < ctx; ++c) {
    const uint32_t* h = sc->counts.data() + size_t{c} * alphabet;
    uint32_t* o = hcounts.data() + size_t{c} * ahi;
    for (uint32_t v = 0; v <= top; ++v) o[v] = 1;
    for (uint32_t v = static_cast<uint32_t>(mn); v <= mx; ++v) o[(v >> r) - base] += h[v];
  }
  rans::CoderStats hs;  // only when asked: stats make rANS count the symbols again
  rans::Encode(sc->hi.data(), n, ahi, ctx, &sc->rans, out, stats ? &hs : nullptr, RansLanes(hcoder),
               hcounts.data(), shared);
  const size_t lo_bytes = LowBitsBytes(lo_values, r);
  const size_t at = w.Skip(lo_bytes + 8);
  PackLowBits(sc->lo.data(), lo_values, r, out->data() + at);
  out->resize(at + lo_bytes);
  if (stats) {  // measured against the whole symbols' entropy (exact, not the sample's)
    sc->counts.assign(size_t{alphabet} * ctx, 0);
    rans::Histogram(sc->syms.data(), n, alphabet, ctx, sc->counts.data());
    uint32_t l0, h0;
    stats->entropy_bits += HistEntropy(sc->counts.data(), alphabet, ctx, &l0, &h0);
    stats->stream_bits += hs.stream_bits + 8 * lo_bytes;
    stats->table_bits += hs.table_bits + 32;  // + r, coder, base
    stats->symbols += n;
  }
}

// The split coder (kCoderSplit): r from a sample's histogram (1 in 3 to 1 in 7 blocks of
// sections of 16k symbols or more; the full histogram of a 49k-symbol section was ~15% of its
// encoding). Where no r pays, the symbols are written whole, with kCoderWritten (*coder).
// `dropped`: the outlier channels, which keep no low bits (they are zero when quantised, and
// replaced by their kept values).
void EncodeSplit(const QuantGeometry& q, uint8_t bits, uint32_t ctx,
                 const std::vector<uint16_t>* dropped, SectionScratch* sc,
                 std::vector<uint8_t>* out, rans::CoderStats* stats, uint8_t* coder,
                 rans::SharedEncoder* shared) {
  const size_t n = q.n;
  const uint32_t alphabet = q.alphabet;
  const size_t stride = n < 16384 ? 1 : std::min<size_t>(7, std::max<size_t>(3, n / 32768)) | 1;
  sc->counts.assign(size_t{alphabet} * ctx, 0);
  uint16_t mn = 0, mx = 0;
  if (n) MinMaxU16(sc->syms.data(), n, &mn, &mx);
  const size_t sampled =
      n ? SampleHistogram(sc->syms.data(), n, alphabet, ctx, stride, sc->counts.data(), mn, mx) : 0;
  const size_t lo_values = n - (dropped ? q.T * dropped->size() : 0);
  const int r = n == 0
                    ? 0
                    : ChooseSplit(sc->counts.data(), sampled, alphabet, ctx, bits,
                                  static_cast<double>(lo_values) / static_cast<double>(n), mn, mx);
  if (r == 0) {
    *coder = kCoderWritten;
    rans::Encode(sc->syms.data(), n, alphabet, ctx, &sc->rans, out, stats, RansLanes(*coder));
    return;
  }
  WriteSplitSymbols(q, ctx, r, mn, mx, dropped, lo_values, sc, out, stats, shared);
}

}  // namespace

void SetSplitLowBitsForTesting(int r) { g_split_r = r; }

namespace {

// Everything after the quantiser: the header and the symbols' coding (sc->syms, sc->steps16).
absl::Status CodeQuant(const uint8_t* in, const uint8_t* outlier_vals, const TensorShape& s,
                       const QuantGeometry& q, uint8_t bits, const CodecParams& p,
                       const std::vector<uint16_t>& outliers, const std::vector<uint16_t>& mu16,
                       const std::vector<uint8_t>& a16, SectionScratch* sc,
                       std::vector<uint8_t>* out, rans::CoderStats* stats,
                       std::vector<uint16_t>* symbol_sink, uint8_t* coder,
                       rans::SharedEncoder* shared) {
  const size_t n = q.n;
  const bool use_outliers = p.key_outliers && q.axis == 0;
  WriteQuantHeader(in, outlier_vals, s, q, bits, p, use_outliers, outliers, mu16, a16,
                   sc->steps16, out);
  const uint32_t ctx = NumChannelContexts(s);
  if (*coder == kCoderShared) {
    if (!shared) return absl::InternalError("quant section: shared coder without a stream");
    TableCounts(sc, n, q.alphabet, ctx);
    rans::Encode(sc->syms.data(), n, q.alphabet, ctx, &sc->rans, out, stats, 128, sc->counts.data(),
                 shared);
  } else if (*coder != kCoderSplit) {
    TableCounts(sc, n, q.alphabet, ctx);
    rans::Encode(sc->syms.data(), n, q.alphabet, ctx, &sc->rans, out, stats, RansLanes(*coder),
                 sc->counts.data());
  } else {
    const bool drop = use_outliers && !p.hadamard && !outliers.empty();
    EncodeSplit(q, bits, ctx, drop ? &outliers : nullptr, sc, out, stats, coder, shared);
  }
  if (symbol_sink) symbol_sink->insert(symbol_sink->end(), sc->syms.begin(), sc->syms.end());
  return absl::OkStatus();
}

bool FiniteHalf(uint16_t h) { return (h & 0x7C00) != 0x7C00; }

// A device encoder's arrays against the section they claim to be, as the decoder checks a
// payload: a blob made of them must decode.
absl::Status CheckQuantArrays(const SectionArrays& a, const TensorShape& s, const QuantGeometry& q,
                              const CodecParams& p) {
  auto bad = [](std::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("quant section from a device: ", std::string(what)));
  };
  if (a.mu16.size() != q.C) return bad("centres disagree with the channels");
  if (!std::all_of(a.mu16.begin(), a.mu16.end(), FiniteHalf)) return bad("a centre not finite");
  if (p.token_delta &&
      (a.a16.size() != q.C || !std::all_of(a.a16.begin(), a.a16.end(), [](uint8_t w) {
         return w <= 16;
       })))
    return bad("predictor weights disagree with the channels or exceed 1");
  if (a.steps16.size() != (q.axis == 0 ? q.C : q.T * q.ngroups))
    return bad("steps disagree with the section");
  for (uint16_t st : a.steps16)  // what StepToHalf writes: a positive normal fp16
    if ((st & 0x8000) || st < 0x0400 || st >= 0x7C00) return bad("a step out of range");
  if (a.syms.size() != q.n) return bad("symbols disagree with the values");
  uint16_t mn = 0, mx = 0;
  if (q.n) MinMaxU16(a.syms.data(), q.n, &mn, &mx);
  if (q.n && mx >= q.alphabet) return bad("a symbol beyond the alphabet");
  const bool use_outliers = p.key_outliers && q.axis == 0;
  if (!use_outliers) {
    if (!a.outlier_idx.empty() || !a.outlier_vals.empty()) return bad("outliers it did not ask");
    return absl::OkStatus();
  }
  const size_t per_head = std::max<size_t>(1, s.head_dim / 16);
  std::vector<size_t> per(s.heads, 0);
  for (size_t i = 0; i < a.outlier_idx.size(); ++i) {
    const uint16_t c = a.outlier_idx[i];
    if (c >= q.C || (i > 0 && c <= a.outlier_idx[i - 1]))
      return bad("outlier channels not ascending within the section");
    if (++per[c / s.head_dim] > per_head) return bad("too many outlier channels in a head");
  }
  if (a.outlier_vals.size() != q.T * a.outlier_idx.size() * DTypeBytes(s.dtype))
    return bad("outlier values disagree with their channels");
  return absl::OkStatus();
}

}  // namespace

namespace {

// The quantiser's half of EncodeQuant: symbols and steps in the scratch (sc->syms,
// sc->steps16), the rest into the arguments.
absl::Status Quantise(const uint8_t* in, const TensorShape& s, const QuantGeometry& q,
                      const CodecParams& p, SectionScratch* sc, std::vector<uint16_t>* outliers,
                      std::vector<uint16_t>* mu16, std::vector<uint8_t>* a16) {
  sc->f.resize(q.n);
  ToFloat(in, s.dtype, sc->f.data(), q.n);
  const bool use_outliers = p.key_outliers && q.axis == 0;
  const bool outliers_finite = !use_outliers || TakeKeyOutliers(s, q, sc->f.data(), outliers);
  if (p.hadamard) HadamardRows(sc->f.data(), q.T * s.heads, s.head_dim);
  const float* f = sc->f.data();
  STRATA_RETURN_IF_ERROR(CentresAndSteps(f, q, outliers_finite, sc, mu16));
  PredictorWeights(f, q, p.token_delta, sc, a16);
  QuantiseRows(f, q, sc);
  return absl::OkStatus();
}

}  // namespace

absl::Status EncodeQuant(const uint8_t* in, const TensorShape& s, uint8_t bits,
                         const CodecParams& p, SectionScratch* sc, std::vector<uint8_t>* out,
                         rans::CoderStats* stats, std::vector<uint16_t>* symbol_sink,
                         uint8_t* coder, rans::SharedEncoder* shared) {
  const QuantGeometry q = GeometryOf(s, bits, p);
  std::vector<uint16_t> outliers, mu16;
  std::vector<uint8_t> a16;
  STRATA_RETURN_IF_ERROR(Quantise(in, s, q, p, sc, &outliers, &mu16, &a16));
  return CodeQuant(in, nullptr, s, q, bits, p, outliers, mu16, a16, sc, out, stats, symbol_sink,
                   coder, shared);
}

absl::Status QuantiseToArrays(const uint8_t* in, const TensorShape& s, uint8_t bits,
                              const CodecParams& p, SectionScratch* sc, SectionArrays* out) {
  const QuantGeometry q = GeometryOf(s, bits, p);
  out->outlier_idx.clear();
  STRATA_RETURN_IF_ERROR(Quantise(in, s, q, p, sc, &out->outlier_idx, &out->mu16, &out->a16));
  if (!p.token_delta) out->a16.clear();
  out->syms.assign(sc->syms.begin(), sc->syms.begin() + static_cast<ptrdiff_t>(q.n));
  out->steps16 = sc->steps16;
  const size_t eb = DTypeBytes(s.dtype);
  out->outlier_vals.resize(q.T * out->outlier_idx.size() * eb);
  uint8_t* dst = out->outlier_vals.data();
  for (size_t t = 0; t < q.T; ++t)
    for (uint16_t c : out->outlier_idx) {
      std::memcpy(dst, in + (t * q.C + c) * eb, eb);
      dst += eb;
    }
  out->payload.clear();
  return absl::OkStatus();
}

absl::Status EncodeQuantArrays(SectionArrays& arrays, const TensorShape& s, uint8_t bits,
                               const CodecParams& p, SectionScratch* sc,
                               std::vector<uint8_t>* out, rans::CoderStats* stats,
                               std::vector<uint16_t>* symbol_sink, uint8_t* coder,
                               rans::SharedEncoder* shared) {
  const QuantGeometry q = GeometryOf(s, bits, p);
  STRATA_RETURN_IF_ERROR(CheckQuantArrays(arrays, s, q, p));
  sc->syms.swap(arrays.syms);  // the coders read them from the scratch; no copy
  sc->steps16.swap(arrays.steps16);
  return CodeQuant(nullptr, arrays.outlier_vals.data(), s, q, bits, p, arrays.outlier_idx,
                   arrays.mu16, arrays.a16, sc, out, stats, symbol_sink, coder, shared);
}

}  // namespace strata::codec::internal
