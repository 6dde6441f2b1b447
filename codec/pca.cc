// Sections of the calibrated transform mode (`pca`): each head vector, minus the calibration's
// mean, is projected on the calibration's basis; the coordinates with a step are quantised
// uniformly (round to nearest) and rANS-coded in the blob's shared stream; dropped coordinates
// decode as zero (the head vector as the mean along them).
//
// Payload: u16 maxq (symbols are q + maxq, alphabet 2 maxq + 1), u16 coded coordinates (of all
// heads: a check against the calibration), u16 exact tokens e, e u16 token indexes (increasing),
// e token rows as given (all heads, the block's dtype), then, when any coordinate is coded, the
// rANS tables of kPcaContexts contexts (symbols in the shared stream).
//
// Symbol order and contexts. Coordinates differ in spread (sqrt(variance) / step) by orders of
// magnitude, so one table for all would waste bits, and a table per coordinate costs more than it
// saves. The coded coordinates of a section are ranked by spread and split into C equal classes
// (C = min(16, count); the count padded to a multiple of C with always-zero coordinates, which
// land in the lowest class); slot j of the ranked, interleaved list holds class j % C. Symbols
// go in runs of 16 tokens of one slot, slot after slot, token group after token group, so that
// the coder's context of run r, r % C, is the class of its coordinate.
//
// Arithmetic. Encoder: y_k = 0 + sum over d of (x_d - mean_d) basis[k][d] in d order (float),
// q_k = round-half-even(y_k / step_k) clamped (step_k: the calibration's times the section's
// step scale), and per token (double) the squared norm and the squared error (sum of
// (x_d - mean_d)^2 in d order, heads in order, then per coded coordinate in ascending order
// (y_k - q_k step_k)^2 - y_k^2, heads in order) that pick the exact tokens. Decoder:
// x_d = mean_d + sum over the head's coded coordinates, in slot order, of (q_k step_k)
// basis[k][d]. The kernels (pca_kernels.cc) compute these sums on every SIMD target, each term
// added by a fused multiply-add where the target has one (half the instructions), with tokens in
// the vector lanes for the encoder ([d][t] and [k][t] arrays, the tokens padded to a multiple of
// 16), the decoder's on 4 tokens x 4 column vectors per basis row loaded (on AVX-512 cores
// without AMX in token lanes, or as VNNI dot products: pca_avx512.cc). Both are dense: at
// 1.5-3 bits/value 82-98 % of the coordinates are coded (Qwen2.5, SmolLM2), so each output
// value costs about head_dim multiply-adds (docs/codec.md, "Pca speed"). Where the CPU has AMX
// tiles the decoder computes the same sums as bf16 matrix products instead (pca_amx.cc), equal
// to these up to float rounding (not bit for bit: the sums' order differs), and so does the
// encoder's projection. Without AMX, cores with AVX512-VNNI project from int16 operands instead
// (pca_encode_avx512.cc: each coordinate off by ~1e-5 of the token's length, where no step is
// finer than 2^-10 of the head's spread). Between targets with and without FMA, and CPUs with
// and without AMX or VNNI, a coordinate that close to a rounding boundary may then take another
// step (the exact tokens may follow) and decoded values differ in their last bits: blobs of the
// same block may differ between machines; each decodes on all.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "codec/calibration.h"
#include "codec/internal/byte_io.h"
#include "codec/internal/kernels.h"
#include "codec/internal/pca_amx.h"
#include "codec/internal/pca_avx2.h"
#include "codec/internal/pca_avx512.h"
#include "codec/internal/pca_dispatch.h"
#include "codec/internal/sections.h"
#include "codec/internal/size_model.h"
#include "common/status_macros.h"

namespace strata::codec {
namespace internal {

namespace {

constexpr uint32_t kPcaContexts = 16;
constexpr int32_t kMaxQ = 2047;  // alphabet <= 4095 < rans::kMaxAlphabet
constexpr size_t kRun = rans::kCtxRun;
// Exact tokens: relative coding error above this multiple of the section's median, at most
// MaxExactTokens (so their cost stays under 16/128 bits per value), plus the first token of a
// sequence.
constexpr double kExactTokenFactor = 8.0;
inline size_t MaxExactTokens(size_t T) { return std::max<size_t>(1, T / 128); }

struct Slot {
  uint32_t head;
  uint32_t coord;  // == head_dim: padding
};

// The section's coded coordinates in symbol order (see the top of the file).
void PlanSlots(const Calibration& cal, uint32_t layer, uint32_t tensor, std::vector<Slot>* slots,
               uint32_t* num_ctx, uint32_t* coded) {
  struct Item {
    float spread;
    uint32_t head, coord;
  };
  std::vector<Item> items;
  for (uint32_t h = 0; h < cal.num_kv_heads; ++h) {
    const HeadTransform& ht = cal.At(layer, tensor, h);
    for (uint32_t c = 0; c < cal.head_dim; ++c)
      if (ht.step[c] > 0) items.push_back({std::sqrt(ht.variance[c]) / ht.step[c], h, c});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.spread > b.spread; });
  *coded = static_cast<uint32_t>(items.size());
  slots->clear();
  if (items.empty()) {
    *num_ctx = 0;
    return;
  }
  const uint32_t C = std::min<uint32_t>(kPcaContexts, *coded);
  const uint32_t per_class = (*coded + C - 1) / C;
  slots->assign(size_t{per_class} * C, Slot{0, cal.head_dim});
  for (uint32_t rank = 0; rank < *coded; ++rank)
    (*slots)[size_t{rank % per_class} * C + rank / per_class] = {items[rank].head,
                                                                 items[rank].coord};
  *num_ctx = C;
}

// p[i] += offset (mod 256).
void OffsetBytes(uint8_t* p, size_t n, uint8_t offset) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(p[i] + offset);
}

// Tokens padded to a multiple of 16 in the token-lane arrays (whole vectors on every target).
inline size_t PaddedTokens(size_t T) { return (T + 15) / 16 * 16; }

// out[i] = float(sym[i] - maxq) * step: one run of a coordinate's symbols, dequantised.
template <typename Sym>
void DequantRun(const Sym* sym, size_t len, int32_t maxq, float step, float* out) {
  for (size_t i = 0; i < len; ++i)
    out[i] = static_cast<float>(static_cast<int32_t>(sym[i]) - maxq) * step;
}

// out[i] = q[i] + maxq (q null: padding, all maxq): one run of a slot's symbols.
template <typename Sym>
void EmitRun(const int32_t* q, size_t len, int32_t maxq, Sym* out) {
  if (!q) {
    std::fill(out, out + len, static_cast<Sym>(maxq));
    return;
  }
  for (size_t i = 0; i < len; ++i) out[i] = static_cast<Sym>(q[i] + maxq);
}

}  // namespace

// What the sections of one calibration derive from it, once (Calibration::Plan).
struct PcaPlan {
  struct Head {
    // Coded coordinates in the encoder's order (ascending) and their steps.
    std::vector<uint32_t> enc_coord;
    std::vector<float> enc_step, enc_inv;
    std::vector<uint32_t> enc_slot;  // each coordinate's slot
    // The same coordinates in the decoder's order (by slot), their slots and steps.
    std::vector<uint32_t> dec_coord, dec_slot;
    std::vector<float> dec_step;
    PcaAmxAxes amx;  // the same axes times their steps for the AMX decoder, where supported
    PcaAmxBasis enc_amx;  // the encoder's axes for its projection on AMX, where supported
    PcaVnniBasis enc_vnni;  // or with VNNI, where the CPU has it (n == 0: the float kernels)
    // The finest step over the spread of the head's vectors (internal::NeedsSplitOperands).
    double finest_step_to_spread = 0;
  };
  struct Section {
    std::vector<Slot> slots;
    uint32_t num_ctx = 0, coded = 0;
    std::vector<Head> heads;
    // Per slot: its head and index in the head's encoder order (head == kPad: padding).
    std::vector<uint32_t> slot_head, slot_k;
  };
  static constexpr uint32_t kPad = ~0u;
  std::vector<Section> sections;  // layer * tensors + tensor

  // The AVX-512 decoders' axes of one head, where the tiles are not there to take their place.
  struct LaneAxes {
    std::vector<float> lanes;  // in token lanes
    PcaVnniAxes vnni;          // as int16 for VNNI, where the CPU has it
    PcaVnniAxes vnni_bytes;    // and partly int8 (quads == 0: no coordinate can be)
    std::vector<float> dec_variance;  // the calibration's, in decoder order (VNNI only)
  };
  // A section's, built by the first decode that needs them (Calibrate's trial plans only
  // encode), each section on its own so that one decode waits for its own section alone.
  // `cal` is the plan's own.
  const LaneAxes& Lanes(const Calibration& cal, size_t section, uint32_t head) const;
  struct SectionLanes {
    std::once_flag once;
    std::vector<LaneAxes> heads;
  };
  std::unique_ptr<SectionLanes[]> section_lanes;  // sections.size(), set by BuildPcaPlan
};

const PcaPlan::LaneAxes& PcaPlan::Lanes(const Calibration& cal, size_t section,
                                        uint32_t head) const {
  SectionLanes& sl = section_lanes[section];
  std::call_once(sl.once, [&] {
    const uint32_t tensors = cal.TensorsPerLayer(), H = cal.num_kv_heads, D = cal.head_dim;
    sl.heads.resize(H);
    for (uint32_t h = 0; h < H; ++h) {
      const Head& hp = sections[section].heads[h];
      const HeadTransform& ht = cal.At(static_cast<uint32_t>(section / tensors),
                                       static_cast<uint32_t>(section % tensors), h);
      LaneAxes& a = sl.heads[h];
      const size_t n = hp.dec_coord.size();
      // Where the tiles decode, only their int8 heads read these axes (the int8 ones); the AVX2
      // sums read the int16 ones wherever Highway dispatches to AVX2 (AVX-512 cores pinned so
      // too).
      const bool tiles = PcaAmxSupported(), lanes = !tiles && PcaLanesSupported();
      if (!tiles && (PcaAvx2Supported() || (lanes && PcaVnniSupported())))
        BuildPcaVnniAxes(ht.basis.data(), hp.dec_coord.data(), hp.dec_step.data(), nullptr, n,
                         D, &a.vnni);
      if (!tiles && !lanes) continue;
      if (tiles && !PcaAmxInt8Supported()) continue;
      if (lanes) BuildPcaLanesAxes(ht.basis.data(), hp.dec_coord.data(), n, D, &a.lanes);
      if (!PcaVnniSupported()) continue;
      a.dec_variance.assign(n, 0.0f);
      for (size_t k = 0; k < n; ++k) a.dec_variance[k] = ht.variance[hp.dec_coord[k]];
      BuildPcaVnniAxes(ht.basis.data(), hp.dec_coord.data(), hp.dec_step.data(),
                       a.dec_variance.data(), n, D, &a.vnni_bytes);
    }
  });
  return sl.heads[head];
}

namespace {

// The head's finest step over the rms distance of its vectors to the mean (infinite when it
// codes no coordinate): whether the tiles split their operands (internal/pca_amx.h).
double FinestStepToSpread(const HeadTransform& ht) {
  double energy = 0;
  float finest = INFINITY;
  for (size_t c = 0; c < ht.variance.size(); ++c) {
    energy += ht.variance[c];
    if (ht.step[c] > 0) finest = std::min(finest, ht.step[c]);
  }
  return energy > 0 ? finest / std::sqrt(energy) : 0.0;
}

std::shared_ptr<const PcaPlan> BuildPcaPlan(const Calibration& cal) {
  auto plan = std::make_shared<PcaPlan>();
  const uint32_t tensors = cal.TensorsPerLayer(), H = cal.num_kv_heads, D = cal.head_dim;
  plan->sections.resize(size_t{cal.num_layers} * tensors);
  plan->section_lanes = std::make_unique<PcaPlan::SectionLanes[]>(plan->sections.size());
  for (uint32_t l = 0; l < cal.num_layers; ++l)
    for (uint32_t t = 0; t < tensors; ++t) {
      PcaPlan::Section& sp = plan->sections[size_t{l} * tensors + t];
      PlanSlots(cal, l, t, &sp.slots, &sp.num_ctx, &sp.coded);
      sp.heads.resize(H);
      std::vector<uint32_t> local(size_t{H} * D, 0);  // (head, coord) -> encoder index
      for (uint32_t h = 0; h < H; ++h) {
        const HeadTransform& ht = cal.At(l, t, h);
        PcaPlan::Head& hp = sp.heads[h];
        for (uint32_t c = 0; c < D; ++c)
          if (ht.step[c] > 0) {
            local[size_t{h} * D + c] = static_cast<uint32_t>(hp.enc_coord.size());
            hp.enc_coord.push_back(c);
            hp.enc_step.push_back(ht.step[c]);
            hp.enc_inv.push_back(1.0f / ht.step[c]);
          }
      }
      for (size_t j = 0; j < sp.slots.size(); ++j) {
        const Slot& sl = sp.slots[j];
        if (sl.coord == D) {
          sp.slot_head.push_back(PcaPlan::kPad);
          sp.slot_k.push_back(0);
          continue;
        }
        sp.slot_head.push_back(sl.head);
        sp.slot_k.push_back(local[size_t{sl.head} * D + sl.coord]);
        PcaPlan::Head& hp = sp.heads[sl.head];
        hp.enc_slot.resize(hp.enc_coord.size());
        hp.enc_slot[sp.slot_k.back()] = static_cast<uint32_t>(j);
        hp.dec_coord.push_back(sl.coord);
        hp.dec_slot.push_back(static_cast<uint32_t>(j));
        hp.dec_step.push_back(cal.At(l, t, sl.head).step[sl.coord]);
      }
      if (PcaAmxSupported())
        for (uint32_t h = 0; h < H; ++h) {
          PcaPlan::Head& hp = sp.heads[h];
          const HeadTransform& ht = cal.At(l, t, h);
          hp.finest_step_to_spread = FinestStepToSpread(ht);
          BuildPcaAmxAxes(ht.basis.data(), hp.dec_coord.data(), hp.dec_step.data(),
                          hp.dec_coord.size(), D, &hp.amx);
          // The encoder decides at the calibration's steps (it projects before it searches the
          // block's step code); the decoder at the block's own.
          BuildPcaAmxBasis(ht.basis.data(), hp.enc_coord.data(), hp.enc_coord.size(), D,
                           NeedsSplitOperands(hp.finest_step_to_spread), &hp.enc_amx);
        }
      else if (PcaVnniSupported() || PcaAvx2Supported())
        for (uint32_t h = 0; h < H; ++h) {
          PcaPlan::Head& hp = sp.heads[h];
          const HeadTransform& ht = cal.At(l, t, h);
          hp.finest_step_to_spread = FinestStepToSpread(ht);
          if (VnniProjectionFits(hp.finest_step_to_spread))
            BuildPcaVnniBasis(ht.basis.data(), hp.enc_coord.data(), hp.enc_coord.size(), D,
                              &hp.enc_vnni);
        }
    }
  return plan;
}

}  // namespace

// The angles' cosines and sines, per (token, pair); every key section of a block shares them.
const RopeTable& RopeTableFor(RopeTable* t, size_t T, size_t D, uint64_t first_position,
                              float theta) {
  if (t->tokens == T && t->dim == D && t->first_position == first_position && t->theta == theta)
    return *t;
  const size_t half = D / 2;
  if (t->offsets_tokens != T || t->offsets_dim != D || t->offsets_theta != theta) {
    t->freq.resize(half);
    t->offset_cos.resize(T * half);
    t->offset_sin.resize(T * half);
    for (size_t j = 0; j < half; ++j)
      t->freq[j] = std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(j) / D);
    for (size_t tok = 0; tok < T; ++tok)
      for (size_t j = 0; j < half; ++j) {
        const double ang = static_cast<double>(tok) * t->freq[j];
        t->offset_cos[tok * half + j] = std::cos(ang);
        t->offset_sin[tok * half + j] = std::sin(ang);
      }
    t->offsets_tokens = T;
    t->offsets_dim = D;
    t->offsets_theta = theta;
  }
  // cos and sin of (first_position + tok) freq by the angle-addition formulas, in double.
  t->cos.resize(T * half);
  t->sin.resize(T * half);
  std::vector<double> c0(half), s0(half);
  for (size_t j = 0; j < half; ++j) {
    const double ang = static_cast<double>(first_position) * t->freq[j];
    c0[j] = std::cos(ang);
    s0[j] = std::sin(ang);
  }
  for (size_t tok = 0; tok < T; ++tok)
    for (size_t j = 0; j < half; ++j) {
      const size_t i = tok * half + j;
      const double c = t->offset_cos[i], s = t->offset_sin[i];
      t->cos[i] = static_cast<float>(c0[j] * c - s0[j] * s);
      t->sin[i] = static_cast<float>(s0[j] * c + c0[j] * s);
    }
  t->tokens = T;
  t->dim = D;
  t->first_position = first_position;
  t->theta = theta;
  return *t;
}

void RotateRope(float* x, size_t T, size_t H, size_t D, uint64_t first_position, float theta,
                bool inverse, RopeTable* table) {
  RopeTable local;
  const RopeTable& t = RopeTableFor(table ? table : &local, T, D, first_position, theta);
  RopeRows(x, T, H, D, t.cos.data(), t.sin.data(), inverse);
}

// Encoding runs per head on token-lane arrays ([d][t], [k][t]): each lane is one token, so every
// sum (the projection in d order, a token's squared norm and error: every head's centred energy
// in d order, then every head's quantisation terms in k order) adds its terms in the order of
// the scalar definition, on every SIMD target.
absl::Status ProjectPca(const uint8_t* in, const TensorShape& s, const Calibration& cal,
                        uint32_t layer, uint32_t tensor, uint64_t first_position,
                        SectionScratch* sc, PcaProjection* pr) {
  const size_t T = s.tokens, H = s.heads, D = s.head_dim, tp = PaddedTokens(T);
  const std::shared_ptr<const PcaPlan> plan = cal.Plan();
  const PcaPlan::Section& sp = plan->sections[size_t{layer} * cal.TensorsPerLayer() + tensor];
  const bool rope = tensor == 0 && cal.rope_theta > 0;
  const PcaEncodeKernel kernel = ChoosePcaEncodeKernel();
  const bool amx = kernel == PcaEncodeKernel::kAmxBf16;
  // Without AMX, VNNI cores project as int16 dot products where the decoder would sum in lanes
  // (not where tests pin Highway to another target, or switch VNNI off). Where every head does,
  // each reads its rows from the block (converts, rotates back and checks them in its pass: the
  // tensor is not written as floats first).
  // The tiles read their rows from the block likewise, where every head takes them.
  // AVX2 cores likewise, with vpmaddwd (internal/pca_avx2.h).
  const bool vnni = kernel == PcaEncodeKernel::kAvx512Vnni;
  const bool avx2 = kernel == PcaEncodeKernel::kAvx2;
  auto project = avx2 ? &PcaEncodeHeadAvx2 : &PcaEncodeHeadVnni;
  const bool rows_typed = s.dtype == DType::kFloat32 || s.dtype == DType::kFloat16 ||
                          s.dtype == DType::kBFloat16;
  bool direct = (vnni || avx2) && PcaVnniEncodesDim(D) && rows_typed;
  for (const PcaPlan::Head& hp : sp.heads)
    direct = direct && (hp.enc_vnni.n > 0 || hp.enc_coord.empty());
  bool amx_rows = amx && rows_typed;
  for (const PcaPlan::Head& hp : sp.heads) amx_rows = amx_rows && hp.enc_amx.kpad > 0;
  direct = direct || amx_rows;
  PcaRope angles{};
  if (direct && rope) {
    const RopeTable& t = RopeTableFor(&sc->rope, T, D, first_position, cal.rope_theta);
    angles = {t.cos.data(), t.sin.data()};
  }
  if (!direct) {
    sc->f.resize(s.values());
    ToFloat(in, s.dtype, sc->f.data(), s.values());
    if (!AllFinite(sc->f.data(), s.values()))
      return absl::InvalidArgumentError("pca section: non-finite input");
    if (rope) RotateRope(sc->f.data(), T, H, D, first_position, cal.rope_theta, true, &sc->rope);
  }
  const PcaRows::Type type = s.dtype == DType::kFloat16    ? PcaRows::Type::kFloat16
                             : s.dtype == DType::kBFloat16 ? PcaRows::Type::kBFloat16
                                                           : PcaRows::Type::kFloat32;
  // Per head: its coordinates, [k][t] (k < kpad on the tiles, else < its coded count).
  pr->ybase.assign(H + 1, 0);
  for (size_t h = 0; h < H; ++h) {
    const PcaPlan::Head& hp = sp.heads[h];
    const size_t rows = amx && hp.enc_amx.kpad > 0 ? hp.enc_amx.kpad : hp.enc_coord.size();
    pr->ybase[h + 1] = pr->ybase[h] + rows * tp;
  }
  pr->y.resize(pr->ybase[H]);
  // Per token: squared norm and centred energy (summed over heads).
  pr->pd.assign(2 * tp, 0.0);
  double* norm2 = pr->pd.data();
  double* err2 = pr->pd.data() + tp;
  std::vector<float>& xt = sc->mn;  // one head's vectors, [d][t], centred in place
  xt.resize(D * tp);
  for (size_t h = 0; h < H; ++h) {
    const HeadTransform& ht = cal.At(layer, tensor, static_cast<uint32_t>(h));
    const PcaPlan::Head& hp = sp.heads[h];
    const size_t n = hp.enc_coord.size();
    float* y = pr->y.data() + pr->ybase[h];
    if (amx_rows) {
      const PcaInput rows{in + h * D * DTypeBytes(s.dtype), type, H * D};
      if (!PcaEncodeHeadAmxRows(rows, rope ? &angles : nullptr, T, D, ht.mean.data(),
                                hp.enc_amx, tp, norm2, err2, y, &sc->amx.coords))
        return absl::InvalidArgumentError("pca section: non-finite input");
      continue;
    }
    if (amx && hp.enc_amx.kpad > 0) {  // the tiles take the rows as they are
      PcaEncodeHeadAmx(sc->f.data() + h * D, H * D, T, D, ht.mean.data(), hp.enc_amx, tp, norm2,
                       err2, y, &sc->amx.coords);
      continue;
    }
    if (direct) {
      const PcaInput rows{in + h * D * DTypeBytes(s.dtype), type, H * D};
      if (!project(rows, rope ? &angles : nullptr, T, D, ht.mean.data(), hp.enc_vnni, tp, norm2,
                   err2, y, &sc->vnni))
        return absl::InvalidArgumentError("pca section: non-finite input");
      continue;
    }
    if ((vnni || avx2) && hp.enc_vnni.n > 0) {
      const PcaInput rows{sc->f.data() + h * D, PcaRows::Type::kFloat32, H * D};
      if (!project(rows, nullptr, T, D, ht.mean.data(), hp.enc_vnni, tp, norm2, err2, y,
                   &sc->vnni))
        return absl::InvalidArgumentError("pca section: non-finite input (after RoPE)");
      continue;
    }
    for (size_t t0 = 0; t0 < T; t0 += 16) {  // transpose, 16 tokens at a time
      const size_t tn = std::min<size_t>(16, T - t0);
      for (size_t d = 0; d < D; ++d) {
        const float* src = sc->f.data() + (t0 * H + h) * D + d;
        float* dst = xt.data() + d * tp + t0;
        for (size_t i = 0; i < tn; ++i) dst[i] = src[i * H * D];
      }
    }
    for (size_t d = 0; d < D; ++d)
      std::fill(xt.data() + d * tp + T, xt.data() + (d + 1) * tp, 0.0f);
    PcaCenterT(xt.data(), tp, D, ht.mean.data(), norm2, err2);
    if (n > 0) PcaProjectT(xt.data(), tp, D, ht.basis.data(), hp.enc_coord.data(), n, y);
  }
  return absl::OkStatus();
}

absl::Status EncodePca(const uint8_t* in, const TensorShape& s, const Calibration& cal,
                       uint32_t layer, uint32_t tensor, uint64_t first_position, float step_scale,
                       const PcaProjection& pr, SectionScratch* sc, std::vector<uint8_t>* out,
                       rans::CoderStats* stats, rans::SharedEncoder* shared) {
  const size_t T = s.tokens, H = s.heads, D = s.head_dim, tp = PaddedTokens(T);
  const std::shared_ptr<const PcaPlan> plan = cal.Plan();
  const PcaPlan::Section& sp = plan->sections[size_t{layer} * cal.TensorsPerLayer() + tensor];
  const std::vector<Slot>& slots = sp.slots;
  if (pr.ybase.size() != H + 1 || pr.pd.size() != 2 * tp)
    return absl::InternalError("pca section: projection of another shape");
  // q: per head [k][t] in the head's encoder order, heads one after the other.
  std::vector<size_t> qbase(H + 1, 0);
  for (size_t h = 0; h < H; ++h) qbase[h + 1] = qbase[h] + sp.heads[h].enc_coord.size() * tp;
  std::vector<int32_t>& q = sc->pq;
  // Per token: squared norm and squared coding error (the centred energy, then per coded
  // coordinate its quantisation error less its energy: the basis is orthonormal).
  std::vector<double>& pd = sc->pd;
  pd = pr.pd;
  double* norm2 = pd.data();
  double* err2 = pd.data() + tp;
  std::vector<int32_t>& tok_max = sc->pm;  // per token, max |q| over the section
  tok_max.assign(tp, 0);
  std::vector<float>& steps = sc->ps;  // the head's steps times the scale, and their inverses
  const bool avx512 = PcaLanesSupported() && DispatchesToAvx512();  // else the Highway kernel
  const size_t nslots = slots.size(), nsym = T * nslots;
  // On AVX-512, whole token groups go straight to their runs as int8 (saturated): no int32
  // coordinates written and read back. Where a coordinate left after the exact tokens needs
  // more than a byte, they are quantised again into q.
  const bool runs = avx512 && T % kRun == 0 && sp.coded > 0;
  auto quantize = [&](bool to_runs, double* e2, int32_t* most) {
    if (!to_runs) q.resize(qbase[H]);
    for (size_t h = 0; h < H; ++h) {
      const PcaPlan::Head& hp = sp.heads[h];
      const size_t n = hp.enc_coord.size();
      steps.resize(2 * n);
      for (size_t k = 0; k < n; ++k) {
        steps[k] = step_scale == 1.0f ? hp.enc_step[k] : hp.enc_step[k] * step_scale;
        steps[n + k] = step_scale == 1.0f ? hp.enc_inv[k] : 1.0f / steps[k];
      }
      const float* y = pr.y.data() + pr.ybase[h];
      const float limit = static_cast<float>(kMaxQ);
      if (to_runs) {
        PcaQuantizeHeadRunsAvx512(y, n, tp, steps.data(), steps.data() + n, limit,
                                  hp.enc_slot.data(), nslots,
                                  reinterpret_cast<int8_t*>(sc->syms8.data()), e2, most);
      } else if (avx512) {
        PcaQuantizeHeadAvx512(y, n, tp, steps.data(), steps.data() + n, limit,
                              q.data() + qbase[h], e2, most);
      } else {
        std::vector<float>& gain = sc->pg;
        gain.assign(tp, 0.0f);
        for (size_t k = 0; k < n; ++k)  // k order on every target: the same exact-token choice
          PcaQuantizeT(y + k * tp, tp, steps[n + k], steps[k], limit,
                       q.data() + qbase[h] + k * tp, gain.data(), most);
        for (size_t t = 0; t < tp; ++t) e2[t] += gain[t];
      }
    }
  };
  if (runs) {
    sc->syms8.resize(nsym);
    for (size_t j = 0; j < nslots; ++j)  // padding: zeros
      if (sp.slot_head[j] == PcaPlan::kPad)
        for (size_t g = 0; g < T / kRun; ++g)
          std::memset(&sc->syms8[(g * nslots + j) * kRun], 0, kRun);
  }
  quantize(runs, err2, tok_max.data());
  // Tokens the calibration fits badly are stored exactly, in place of their coordinates (which
  // become zeros, cheap to code). These are the attention sinks: in SmolLM2 the first token's
  // relative error is 10-70x the block median in most layers, and decoding it exactly alone
  // takes the model's KL at 1.5 bits/value from 0.55 to 0.11 nats.
  std::vector<uint16_t> exact;
  {
    std::vector<double> rel(T);
    for (size_t tok = 0; tok < T; ++tok)
      rel[tok] = std::max(err2[tok], 0.0) / std::max(norm2[tok], 1e-30);
    std::vector<double> sorted = rel;
    std::nth_element(sorted.begin(), sorted.begin() + T / 2, sorted.end());
    const double limit = kExactTokenFactor * sorted[T / 2];
    // The largest errors first, ties by token (a stable sort's order), only the few we may take.
    const size_t m = std::min(MaxExactTokens(T), T);
    std::vector<uint32_t> order(T);
    std::iota(order.begin(), order.end(), 0u);
    std::partial_sort(order.begin(), order.begin() + m, order.end(), [&](uint32_t a, uint32_t b) {
      return rel[a] > rel[b] || (rel[a] == rel[b] && a < b);
    });
    // The sequence's first token is kept whatever its error, beside the others: it is the
    // attention sink most heads put most of their weight on, so its error reaches every query.
    // The rule above misses it in 10 of Qwen2.5's 56 sections (its error there is near the
    // median's); keeping it exact halves the model's KL at 1.5 bits/value (docs/codec.md).
    const bool sink = first_position == 0;
    if (sink) exact.push_back(0);
    for (size_t i = 0; i < m && rel[order[i]] > limit; ++i)
      if (order[i] != 0 || !sink) exact.push_back(static_cast<uint16_t>(order[i]));
    std::sort(exact.begin(), exact.end());
  }
  for (uint16_t tok : exact) tok_max[tok] = 0;
  const int32_t maxq = *std::max_element(tok_max.begin(), tok_max.begin() + T);
  const bool in_runs = runs && maxq <= 127;
  if (runs && !in_runs) {  // the same q again (the errors and maxima already known)
    std::vector<double> e2(pd.begin() + tp, pd.end());
    std::vector<int32_t> most(tp, 0);
    quantize(false, e2.data(), most.data());
  }
  for (uint16_t tok : exact) {
    if (in_runs) {
      for (size_t j = 0; j < nslots; ++j)
        sc->syms8[((tok / kRun) * nslots + j) * kRun + tok % kRun] = 0;
    } else {
      for (size_t i = tok; i < q.size(); i += tp) q[i] = 0;
    }
  }
  ByteWriter w(out);
  w.U16(static_cast<uint16_t>(maxq));
  w.U16(static_cast<uint16_t>(sp.coded));
  w.U16(static_cast<uint16_t>(exact.size()));
  const size_t row_bytes = H * D * DTypeBytes(s.dtype);
  for (uint16_t tok : exact) w.U16(tok);
  for (uint16_t tok : exact) w.Raw(in + tok * row_bytes, row_bytes);
  if (sp.coded == 0) return absl::OkStatus();
  if (!shared) return absl::InternalError("pca section: no shared stream");
  const uint32_t alphabet = 2 * static_cast<uint32_t>(maxq) + 1;
  if (in_runs) {  // q + maxq
    OffsetBytes(sc->syms8.data(), nsym, static_cast<uint8_t>(maxq));
    rans::Encode(sc->syms8.data(), nsym, alphabet, sp.num_ctx, &sc->rans, out, stats,
                 rans::kMaxLanes, nullptr, shared);
    return absl::OkStatus();
  }
  // Runs of 16 tokens of one slot, slot after slot, token group after token group.
  const size_t full = T / kRun, rest = T % kRun;  // whole runs, and the last run's length
  auto emit = [&](auto* syms) {
    for (size_t j = 0; j < nslots; ++j) {
      const uint32_t h = sp.slot_head[j];
      const int32_t* src = h == PcaPlan::kPad ? nullptr : q.data() + qbase[h] + sp.slot_k[j] * tp;
      if (src) {
        EmitRuns(src, full, kRun, kRun * nslots, maxq, syms + j * kRun);
      } else {
        for (size_t g = 0; g < full; ++g)
          EmitRun(src, kRun, maxq, syms + g * kRun * nslots + j * kRun);
      }
      if (rest)
        EmitRun(src ? src + full * kRun : nullptr, rest, maxq,
                syms + full * kRun * nslots + j * rest);
    }
    rans::Encode(syms, nsym, alphabet, sp.num_ctx, &sc->rans, out, stats, rans::kMaxLanes,
                 nullptr, shared);
  };
  if (alphabet <= 256) {
    sc->syms8.resize(nsym);
    emit(sc->syms8.data());
  } else {
    sc->syms.resize(nsym);
    emit(sc->syms.data());
  }
  return absl::OkStatus();
}

absl::Status DecodePca(std::span<const uint8_t> payload, const TensorShape& s,
                       const Calibration& cal, uint32_t layer, uint32_t tensor,
                       uint64_t first_position, float step_scale, SectionScratch* sc, uint8_t* out,
                       rans::SharedDecoder* shared) {
  const size_t T = s.tokens, H = s.heads, D = s.head_dim, tp = PaddedTokens(T);
  const std::shared_ptr<const PcaPlan> plan = cal.Plan();
  const size_t section = size_t{layer} * cal.TensorsPerLayer() + tensor;
  const PcaPlan::Section& sp = plan->sections[section];
  const uint32_t coded = sp.coded;
  ByteReader r(payload, "pca section");
  uint16_t maxq, coded_in;
  STRATA_RETURN_IF_ERROR(r.Read(&maxq));
  STRATA_RETURN_IF_ERROR(r.Read(&coded_in));
  if (coded_in != coded)
    return absl::DataLossError(absl::StrCat("pca section: ", coded_in,
                                            " coded coordinates, the calibration has ", coded));
  if (maxq > kMaxQ) return absl::DataLossError("pca section: symbol range too large");
  uint16_t num_exact;
  STRATA_RETURN_IF_ERROR(r.Read(&num_exact));
  if (num_exact > MaxExactTokens(T) + 1)  // + 1: the sequence's sink
    return absl::DataLossError("pca section: too many exact tokens");
  std::vector<uint16_t> exact(num_exact);
  for (uint16_t& tok : exact) {
    STRATA_RETURN_IF_ERROR(r.Read(&tok));
    if (tok >= T || (&tok != exact.data() && tok <= (&tok)[-1]))
      return absl::DataLossError("pca section: exact tokens out of range or order");
  }
  const size_t row_bytes = H * D * DTypeBytes(s.dtype);
  const uint8_t* exact_rows;
  STRATA_RETURN_IF_ERROR(r.Take(num_exact * row_bytes, &exact_rows));
  sc->f.resize(s.values());
  const size_t nslots = sp.slots.size();
  std::vector<float>& yt = sc->row;  // one head's dequantised coordinates, [k][t] in slot order
  const size_t full = T / kRun, rest = T % kRun;  // whole symbol runs, and the last run's length
  // Per head: out[t][h] = mean + sum of the coordinates times their axes, in slot order.
  const PcaDecodeKernel kernel = ChoosePcaDecodeKernel();
  const bool amx = kernel == PcaDecodeKernel::kAmxBf16 || kernel == PcaDecodeKernel::kAmxInt8;
  const bool amx_int8 = kernel == PcaDecodeKernel::kAmxInt8;
  const bool rope = tensor == 0 && cal.rope_theta > 0;
  // Without AMX, AVX-512 cores sum with the tokens in the vector lanes, through the tiles' store
  // pass.
  const bool lanes = D % 32 == 0 && (kernel == PcaDecodeKernel::kAvx512 ||
                                     kernel == PcaDecodeKernel::kAvx512Vnni);
  // On byte symbols, where the plan has the axes.
  const bool vnni = lanes && kernel == PcaDecodeKernel::kAvx512Vnni;
  // Cores with AVX2 but neither: integer sums of byte symbols (internal/pca_avx2.h).
  const bool avx2 = kernel == PcaDecodeKernel::kAvx2 && D % 32 == 0 && D <= 256 &&
                    2 * uint32_t{maxq} + 1 <= 256;
  // When every head goes through the tiles, the lanes or AVX2's sums, they also rotate the keys
  // and convert to the block's type (two passes less).
  bool direct = (amx || lanes || avx2) && coded > 0 && s.dtype != DType::kFloat8E4M3;
  if (amx)
    for (const PcaPlan::Head& hp : sp.heads) direct = direct && hp.amx.kpad > 0;
  if (avx2 && direct)
    for (uint32_t h = 0; h < H; ++h)
      direct = direct && plan->Lanes(cal, section, h).vnni.pairs > 0;
  PcaRows rows{sc->f.data(), PcaRows::Type::kFloat32, H * D};
  if (direct) {
    rows.data = out;
    if (s.dtype == DType::kFloat16) rows.type = PcaRows::Type::kFloat16;
    if (s.dtype == DType::kBFloat16) rows.type = PcaRows::Type::kBFloat16;
  }
  PcaRope angles{};
  const bool direct_rope = direct && rope;
  if (direct_rope) {
    const RopeTable& t = RopeTableFor(&sc->rope, T, D, first_position, cal.rope_theta);
    angles = {t.cos.data(), t.sin.data()};
  }
  bool refused = false;  // a head the direct AVX2 path was to take (a bug, never data)
  auto reconstruct = [&](auto* syms) {
    for (size_t h = 0; h < H; ++h) {
      const HeadTransform& ht = cal.At(layer, tensor, static_cast<uint32_t>(h));
      const PcaPlan::Head& hp = sp.heads[h];
      const size_t n = hp.dec_coord.size();
      PcaRows head_rows = rows;
      head_rows.data = static_cast<uint8_t*>(rows.data) +
                       h * D * (rows.type == PcaRows::Type::kFloat32 ? 4 : 2);
      if (amx && syms && hp.amx.kpad > 0) {
        const PcaSymbols ps{syms, sizeof(*syms) == 2, nslots, T, int32_t{maxq}};
        if (amx_int8 && sizeof(*syms) == 1) {  // int8 terms, where the VNNI rule admits them all
          const PcaPlan::LaneAxes& la = plan->Lanes(cal, section, static_cast<uint32_t>(h));
          if (la.vnni_bytes.pairs == 0 && la.vnni_bytes.quads > 0 &&
              PcaVnniBytesFit(la.vnni_bytes, hp.dec_step.data(), la.dec_variance.data(), n,
                              step_scale) &&
              PcaReconstructAmxInt8(ps, hp.dec_slot.data(), n, la.vnni_bytes, D, step_scale,
                                    ht.mean.data(), direct_rope ? &angles : nullptr, head_rows,
                                    &sc->amx))
            continue;
        }
        // The block's own steps decide (its step code may make them finer than calibrated).
        const bool split = NeedsSplitOperands(hp.finest_step_to_spread * step_scale);
        PcaReconstructAmx(ps, hp.dec_slot.data(), n, hp.amx, split, D, step_scale,
                          ht.mean.data(), direct_rope ? &angles : nullptr, head_rows, &sc->amx);
        continue;
      }
      if (avx2 && syms) {
        const PcaSymbols ps{syms, sizeof(*syms) == 2, nslots, T, int32_t{maxq}};
        const PcaPlan::LaneAxes& la = plan->Lanes(cal, section, static_cast<uint32_t>(h));
        if (PcaReconstructAvx2(ps, hp.dec_slot.data(), n, la.vnni, D, step_scale,
                               ht.mean.data(), direct_rope ? &angles : nullptr, head_rows,
                               &sc->amx.sums))
          continue;
        if (direct) {  // the rows are the block's type: no other path may write them
          refused = true;
          continue;
        }
      }
      // Only the paths that use them build a section's lane axes (not fp8 or coded-out ones).
      const PcaPlan::LaneAxes* la =
          direct && lanes ? &plan->Lanes(cal, section, static_cast<uint32_t>(h)) : nullptr;
      if (la != nullptr && vnni && sizeof(*syms) == 1 && la->vnni.pairs > 0) {
        const PcaSymbols ps{syms, false, nslots, T, int32_t{maxq}};
        // int8 terms where they add little to this block's own quantisation noise.
        const bool bytes = la->vnni_bytes.quads > 0 && PcaVnniBytesAvailable() &&
                           PcaVnniBytesFit(la->vnni_bytes, hp.dec_step.data(),
                                           la->dec_variance.data(), n, step_scale);
        PcaReconstructVnni(ps, hp.dec_slot.data(), n, bytes ? la->vnni_bytes : la->vnni, D,
                           step_scale, ht.mean.data(),
                           direct_rope ? &angles : nullptr, head_rows, &sc->amx.sums);
        continue;
      }
      yt.resize(std::max<size_t>(1, n * tp));
      for (size_t k = 0; k < n; ++k) {
        const float step = step_scale == 1.0f ? hp.dec_step[k] : hp.dec_step[k] * step_scale;
        DequantRuns(syms + hp.dec_slot[k] * kRun, full, kRun, kRun * nslots, int32_t{maxq}, step,
                    yt.data() + k * tp);
        if (rest)
          DequantRun(syms + full * kRun * nslots + hp.dec_slot[k] * rest, rest, int32_t{maxq},
                     step, yt.data() + k * tp + full * kRun);
      }
      if (la != nullptr) {
        PcaReconstructLanes(yt.data(), tp, T, n, la->lanes, D, ht.mean.data(),
                            direct_rope ? &angles : nullptr, head_rows, &sc->amx.sums);
        continue;
      }
      PcaReconstruct(yt.data(), tp, T, n, ht.basis.data(), hp.dec_coord.data(), D,
                     ht.mean.data(), sc->f.data() + h * D, H * D);
    }
  };
  if (coded == 0) {
    reconstruct(static_cast<const uint8_t*>(nullptr));  // every head decodes as its mean
  } else {
    if (!shared) return absl::DataLossError("pca section: blob has no shared stream");
    const size_t nsym = T * nslots;
    const uint32_t alphabet = 2 * uint32_t{maxq} + 1;
    auto take = [&](auto* syms) -> absl::Status {
      STRATA_RETURN_IF_ERROR(rans::Decode(r, nsym, alphabet, sp.num_ctx, &sc->rans, syms,
                                          rans::kMaxLanes, shared));
      reconstruct(syms);
      return absl::OkStatus();
    };
    if (alphabet <= 256) {
      sc->syms8.resize(nsym);
      STRATA_RETURN_IF_ERROR(take(sc->syms8.data()));
    } else {
      sc->syms.resize(nsym);
      STRATA_RETURN_IF_ERROR(take(sc->syms.data()));
    }
  }
  if (refused) return absl::InternalError("pca section: the AVX2 decoder refused a head");
  if (r.remaining() != 0) return absl::DataLossError("pca section: trailing bytes");
  if (!direct) {
    if (rope) RotateRope(sc->f.data(), T, H, D, first_position, cal.rope_theta, false, &sc->rope);
    FromFloat(sc->f.data(), s.dtype, out, s.values());
  }
  for (size_t i = 0; i < exact.size(); ++i)
    std::memcpy(out + exact[i] * row_bytes, exact_rows + i * row_bytes, row_bytes);
  return absl::OkStatus();
}

void AddPcaSpreads(const Calibration& cal, uint32_t layer, uint32_t tensor, size_t tokens,
                   bool skip_first, const PcaProjection& pr, std::vector<double>* spreads) {
  const std::shared_ptr<const PcaPlan> plan = cal.Plan();
  const PcaPlan::Section& sp = plan->sections[size_t{layer} * cal.TensorsPerLayer() + tensor];
  const size_t tp = PaddedTokens(tokens), whole = tokens / 16 * 16;
  const size_t first = skip_first ? 1 : 0;
  if (tokens <= first) return;
  const double coded = static_cast<double>(tokens - first);
  for (size_t h = 0; h < sp.heads.size() && h + 1 < pr.ybase.size(); ++h) {
    const PcaPlan::Head& hp = sp.heads[h];
    for (size_t k = 0; k < hp.enc_coord.size(); ++k) {
      // The block's tokens only (the float kernels' padding holds the centred mean), less the
      // sequence's first, which is kept exact: whole vectors of 16 from an aligned token (16
      // where the first is skipped), the tokens before and after them one by one.
      const float* y = pr.y.data() + pr.ybase[h] + k * tp;
      const size_t from = first == 0 ? 0 : std::min<size_t>(16, whole);
      double sum = 0;
      for (size_t t = first; t < from; ++t) sum += double{y[t]} * y[t];
      if (whole > from) sum += SumSquares(y + from, whole - from);
      for (size_t t = std::max(whole, first); t < tokens; ++t) sum += double{y[t]} * y[t];
      AddSpread(sum / coded, hp.enc_step[k], coded, spreads);
    }
  }
}

float PcaStepScale(uint8_t code) {
  // 2^(i/32) rounded to float, i = 0 .. 31 (a table: exp2f may differ between C libraries).
  static constexpr float kOctave[32] = {
      0x1p+0f,        0x1.059b0ep+0f, 0x1.0b5586p+0f, 0x1.11301ep+0f, 0x1.172b84p+0f,
      0x1.1d4874p+0f, 0x1.2387a6p+0f, 0x1.29e9e0p+0f, 0x1.306fe0p+0f, 0x1.371a74p+0f,
      0x1.3dea64p+0f, 0x1.44e086p+0f, 0x1.4bfdaep+0f, 0x1.5342b6p+0f, 0x1.5ab07ep+0f,
      0x1.6247ecp+0f, 0x1.6a09e6p+0f, 0x1.71f75ep+0f, 0x1.7a1148p+0f, 0x1.82589ap+0f,
      0x1.8ace54p+0f, 0x1.93737cp+0f, 0x1.9c4918p+0f, 0x1.a5503cp+0f, 0x1.ae89fap+0f,
      0x1.b7f770p+0f, 0x1.c199bep+0f, 0x1.cb720ep+0f, 0x1.d5818ep+0f, 0x1.dfc974p+0f,
      0x1.ea4afap+0f, 0x1.f50766p+0f};
  if (code == 0) return 1.0f;
  return std::ldexp(kOctave[code % 32], code / 32 - 4);
}

}  // namespace internal

std::shared_ptr<const internal::PcaPlan> Calibration::Plan() const {
  std::lock_guard<std::mutex> g(plan_.mu);
  if (!plan_.plan) plan_.plan = internal::BuildPcaPlan(*this);
  return plan_.plan;
}

}  // namespace strata::codec
