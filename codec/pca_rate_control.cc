// A pca bit budget in one pass (Encoder::EncodePcaInOnePass). The block search
// (codec/rate_control.cc) finds the finest step code common to every section whose blob fits:
// it projects every section first and keeps the projections (twice the block's bytes, out of
// the caches) for its trial encodes. Once the encoder has coded a block of the same calibration
// and budget, this codes each section as soon as it is projected, as an encode without a budget
// does, at a code of its own (a section entry's `bits` byte already carries one):
//
//   - The plan: the sections not coded yet share what is left of the budget at one code, the
//     finest whose predicted bytes fit. A common code is what reverse water-filling asks of a
//     rate change (every coded coordinate's noise scaled alike), so the codes stay close to
//     each other, and each plan takes in the bytes the sections before it really took.
//   - The prediction at a code: the size model (internal/size_model.h) of the section at hand,
//     from its projection, plus the last block's spreads of the sections after it, scaled by
//     how this block's recent sections (this one's included, older ones weighing less) model
//     against the last block's same sections at that code; each section's model times its
//     ratio of coded to modelled bytes in the last block, and all of it times how this block's
//     coded sections compare with those ratios so far. The drift is taken at the code planned,
//     not as one factor: a block twice as loud as the last moves every coordinate's spread by
//     an octave, which no single factor of bytes describes at every code.
//   - Each plan leaves a hundredth of a section unspent, so the last section's own error rarely
//     takes the blob past the budget. Where it does, that section is coded again (its
//     projection is still at hand) at coarser codes; where even code 255 misses, the caller
//     searches the block as a fresh encoder would.
//   - A block the last one says little about goes to the search as well, as soon as a section
//     shows it: one whose spreads lie far from the same section's last time, or whose plan
//     moves by more than an octave from the section before's (kUnlikeShift, kPlanJump below).
//
// The blob is within the budget by construction and spends all but about a hundredth of a
// section of it; it differs from the search's (its codes move by a few from section to
// section, more in a block's last sections where a plan erred) and from a fresh encoder's, which
// searches its first block. The record of the last block is a spreads vector per section
// (8 KiB each: 0.44 MiB for 56 sections), for the last four calibrations, budgets and layouts
// the encoder met.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <utility>

#include "codec/codec.h"
#include "codec/internal/encoder_scratch.h"
#include "codec/internal/sections.h"
#include "codec/internal/size_model.h"
#include "common/status_macros.h"

namespace strata::codec {
namespace {

constexpr int kCodes = 255;
// The share of a section's predicted bytes each plan leaves unspent.
constexpr double kSectionMargin = 0.01;
// How many sections' worth of bytes the last block's ratio and spreads weigh against this
// block's coded sections.
constexpr double kPriorSections = 4;
// How much of the drift so far each section keeps: a block's sections differ from the last
// block's more in some layers than in others.
constexpr double kDriftDecay = 0.8;

// Blocks the last block's records say little about go to the search (their sections after
// the one at hand would be planned from those records). Such a block's section lies, on
// average over its spreads, more than six octaves from the same section's last time (in the
// real KV of two models consecutive blocks' sections lie within 12 bins, 0.4 of an octave; a
// block 16 times quieter than the last, 4 octaves, the plan still follows). Or a section's
// plan moves more than an octave from the section before's (in the real KV at most 3 codes):
// the sections before it were coded on a plan that was wrong.
constexpr double kUnlikeShift = 6 * 32;
constexpr int kPlanJump = 32;

using Spreads = std::vector<double>;

// The bins [lo, hi) outside which `v` is zero (lo == hi: all of it).
struct Range {
  size_t lo = 0, hi = 0;
};
Range NonZero(const Spreads& v) {
  Range r{0, v.size()};
  while (r.lo < r.hi && v[r.lo] == 0) ++r.lo;
  while (r.hi > r.lo && v[r.hi - 1] == 0) --r.hi;
  if (r.lo == r.hi) r = {v.size(), 0};  // empty: any range contains it
  return r;
}

// The mean bin of `v`'s symbols within `r` (0 where it has none).
double MeanBin(const double* v, Range r) {
  double n = 0, sum = 0;
  for (size_t b = r.lo; b < r.hi; ++b) {
    n += v[b];
    sum += v[b] * static_cast<double>(b);
  }
  return n > 0 ? sum / n : 0.0;
}

}  // namespace

absl::StatusOr<bool> Encoder::EncodePcaInOnePass(const KvLayout& layout,
                                                 const CodecParams& params,
                                                 std::span<const uint8_t> block,
                                                 std::vector<uint8_t>* blob, EncodeStats* stats) {
  const uint32_t tensors = layout.TensorsPerLayer();
  const size_t sections = size_t{layout.num_layers} * tensors;
  internal::PcaBudgetHistory* found =
      scratch_->pca_histories.Find(params.calibration_id, params.rate_bits, layout);
  if (!found || found->ratio <= 0 || found->sections != sections) return false;
  internal::PcaBudgetHistory& history = *found;
  // The history counts as this block's only once the block is coded: an error or a miss on the
  // way leaves it to the search, which makes it again.
  const double last_ratio = std::exchange(history.ratio, 0.0);
  BlobHeader h;
  h.mode = static_cast<uint8_t>(Mode::kPca);
  h.layout = layout;
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<const Calibration> cal,
                          CalibrationFor(layout, params, &h));
  ++budget_trial_encodes_;
  const uint64_t values = layout.BlockBytes() / DTypeBytes(layout.dtype);
  const double budget = std::floor(static_cast<double>(params.rate_bits) *
                                   static_cast<double>(values) / 8.0);
  // Bytes outside the sections (header, table, the stream's final states, trailer), and in each
  // section the sequence's first token, kept exact, which the model leaves out.
  const double fixed = internal::PcaBlobFixedBytes(sections);
  const double sink = params.first_position == 0 ? static_cast<double>(layout.num_kv_heads) *
                                                       layout.head_dim * DTypeBytes(layout.dtype)
                                                 : 0.0;
  constexpr size_t kBins = internal::kSpreadBins;
  auto last_block = [&](size_t i) { return history.spreads.data() + i * kBins; };
  std::vector<double>& ratios = history.ratios;
  if (ratios.size() != sections) ratios.assign(sections, last_ratio);
  // The last block's sections after this one, each weighted by its ratio.
  Spreads& future = scratch_->future_spreads;
  future.assign(kBins, 0.0);
  for (size_t i = 0; i < sections; ++i)
    for (size_t b = 0; b < kBins; ++b) future[b] += ratios[i] * last_block(i)[b];
  // Every spreads vector below is zero outside bins [lo, hi), which grows with this block's
  // sections: the model and the sums run over those bins only.
  Range range = NonZero(future);
  auto model = [&](const Spreads& v, int c) {
    if (range.lo >= range.hi) return 0.0;
    return internal::ModelBytes(std::span(v).subspan(range.lo, range.hi - range.lo), c,
                                range.lo);
  };
  const double prior = kPriorSections * model(future, history.code) /
                       static_cast<double>(sections);
  // This block's coded sections against their prediction (the last block's ratios), and,
  // decaying from section to section, their spreads beside the last block's same sections.
  double coded = 0, predicted = 0;
  Spreads& recent = scratch_->recent_spreads;
  Spreads& recent_last = scratch_->recent_last_spreads;
  recent.assign(kBins, 0.0);
  recent_last.assign(kBins, 0.0);
  double spent = 0;  // their bytes
  double modelled = 0;
  int code = history.code, first_code = 0;
  int planned = code;  // the section before's plan

  Spreads& one = scratch_->section_spreads;
  one.assign(kBins, 0.0);
  rans::CoderStats coder, section_coder;
  rans::SharedEncoder& shared = scratch_->shared;
  shared.Reset();
  BlobWriter w(blob, h, static_cast<uint32_t>(sections + 1));
  const size_t tensor_bytes = layout.BlockBytes() / sections;
  internal::PcaProjection& projection = scratch_->projections[0];
  uint32_t saved_x[rans::kMaxLanes];
  for (size_t i = 0; i < sections; ++i) {
    const auto l = static_cast<uint32_t>(i / tensors), t = static_cast<uint32_t>(i % tensors);
    const internal::TensorShape shape = internal::ShapeOf(layout, t);
    const uint8_t* in = block.data() + i * tensor_bytes;
    STRATA_RETURN_IF_ERROR(internal::ProjectPca(in, shape, *cal, l, t, params.first_position,
                                                &scratch_->sec, &projection));
    internal::AddPcaSpreads(*cal, l, t, shape.tokens, params.first_position == 0, projection,
                            &one);
    const Range own = NonZero(one);
    range = {std::min(range.lo, own.lo), std::max(range.hi, own.hi)};
    const double* last = last_block(i);
    if (std::abs(MeanBin(one.data(), range) - MeanBin(last, range)) > kUnlikeShift)
      return false;  // the caller searches the block
    for (size_t b = range.lo; b < range.hi; ++b) {
      future[b] -= ratios[i] * last[b];
      recent[b] = kDriftDecay * recent[b] + one[b];
      recent_last[b] = kDriftDecay * recent_last[b] + last[b];
    }
    // The plan for this section and those after it, all at one code: the sections after it
    // as the last block's, times how this block's recent sections (this one's included) model
    // against the last block's at that code.
    const double ratio = prior + predicted > 0 ? (prior + coded) / (prior + predicted) : 1.0;
    const double left = budget - fixed - spent;
    const auto remaining = static_cast<double>(sections - i);
    auto fits = [&](int c) {
      const double now = model(recent, c), then = model(recent_last, c);
      const double drift = now > 0 && then > 0 ? now / then : 1.0;
      const double bytes =
          ratio * (ratios[i] * model(one, c) + drift * std::max(model(future, c), 0.0)) +
          sink * remaining;
      return bytes * (1 + kSectionMargin / remaining) <= left;
    };
    code = std::clamp(code, 1, kCodes);
    if (fits(code)) {
      while (code > 1 && fits(code - 1)) --code;
    } else {
      while (code < kCodes && !fits(code)) ++code;
    }
    if (i > 0 && std::abs(code - planned) > kPlanJump) return false;  // as above
    planned = code;
    // Coded; the last section again at coarser codes while the blob would miss the budget.
    const BlobWriter::Mark mark = w.Position();
    std::memcpy(saved_x, shared.x, sizeof(saved_x));
    const size_t saved_used = shared.used;
    double bytes = 0;
    for (;;) {
      SectionEntry e;
      e.type = SectionType::kPca;
      e.layer = static_cast<uint16_t>(l);
      e.tensor = static_cast<uint8_t>(t);
      e.bits = static_cast<uint8_t>(code);
      std::vector<uint8_t>* out = w.BeginSection(e);
      section_coder = rans::CoderStats{};
      STRATA_RETURN_IF_ERROR(internal::EncodePca(
          in, shape, *cal, l, t, params.first_position, internal::PcaStepScale(e.bits),
          projection, &scratch_->sec, out, stats ? &section_coder : nullptr, &shared));
      w.EndSection();
      size_t words = 0;
      for (size_t k = saved_used; k < shared.used; ++k) words += shared.end[k] - shared.begin[k];
      bytes = static_cast<double>(out->size() - mark.bytes + 2 * words);
      if (i + 1 < sections || spent + bytes <= budget - fixed) break;
      if (code == kCodes) return false;  // the caller searches the block
      w.RewindTo(mark);
      std::memcpy(shared.x, saved_x, sizeof(saved_x));
      shared.used = saved_used;
      // The section's own bytes per modelled byte say how far to go; at least one code.
      const double at = model(one, code);
      int next = code + 1;
      while (next < kCodes && at > 0 &&
             (bytes - sink) / at * model(one, next) + sink > budget - fixed - spent)
        ++next;
      code = next;
    }
    if (i == 0) first_code = code;
    if (spent + bytes > budget - fixed) return false;  // the sections after it cannot fit
    coder.Add(section_coder);
    spent += bytes;
    const double own_model = model(one, code);
    coded += std::max(bytes - sink, 0.0);
    predicted += ratios[i] * own_model;
    // Never 0: every ratio weighs its section's spreads into `future`, whose nonzero bins must
    // cover every section's for the range above to hold.
    if (own_model > 0) ratios[i] = std::max(bytes - sink, 1.0) / own_model;
    modelled += own_model;
    double* slot = history.spreads.data() + i * kBins;  // this block's, for the next block
    for (size_t b = range.lo; b < range.hi; ++b) {
      slot[b] = one[b];
      one[b] = 0;
    }
  }
  SectionEntry e;
  e.type = SectionType::kStream;
  e.coder = internal::kCoderRans128;
  rans::FinishShared(&shared, w.BeginSection(e), stats ? &coder : nullptr);
  w.EndSection();
  STRATA_RETURN_IF_ERROR(w.Finish());
  if (blob->size() > budget) return false;  // the accounting above is exact: never, but safe
  ++budget_one_pass_encodes_;
  history.ratio = modelled > 0 ? coded / modelled : 0.0;
  history.code = first_code;
  if (stats) {
    stats->coder.Add(coder);
    stats->values += values;
    stats->blob_bytes += blob->size();
  }
  return true;
}

}  // namespace strata::codec
