// Rate control for quant blocks: how many bits each layer's keys and values get.
//
// A bit budget (CodecParams::rate_bits): each block is coded with the most bits per layer that
// keep its blob within the budget, at most the spec's key/value bits.
//
// The per-layer settings climb a ladder of (key bits, value bits): (2,2), (2,3), (3,3), (3,4),
// ... up to the ceiling, a value bit first at each rung (keys carry the outlier channels,
// which `:ol` keeps exactly anyway). The search encodes whole blocks and keeps only encodes whose
// real size fits, so the budget holds exactly, whatever the data; sizes grow with the rung
// almost always, which is what makes a binary search pay:
//   1. the highest rung every layer can take (binary search, ~log2(rungs) encodes);
//   2. then the first m layers one rung higher, m as large as still fits (binary search,
//      ~log2(layers) encodes). Earlier layers get the extra bits: their errors travel through
//      every later layer of the model.
// A block that exceeds the budget even at (2,2) everywhere is coded at (2,2): stored, not
// refused. Cost: about log2(rungs) + log2(layers) + 1 encodes per block (8 for a 28-layer model
// with a k4v4 ceiling), so encode speed drops by that factor; decode is unchanged (the blob's
// sections carry their bits).
//
// A pca bit budget: one factor scales all of the calibration's steps in the block
// (CodecParams::pca_step_code, 2^(1/32) apart), the finest that fits. A common factor keeps the
// calibration's allocation: every coded coordinate's quantisation noise changes by the same
// ratio, which is what reverse water-filling asks of a rate change (coordinates the calibration
// dropped stay dropped). A size model picks the codes to try: each coded coordinate's spread
// over the block (the entropy of a Laplacian rounded to the step, per coordinate), scaled by
// what the encoder's earlier blocks really took, and corrected by each trial's real size for
// the neighbouring codes. pca projects the block once and tries one code for most blocks
// (quantise and code); xl (each layer predicted from the one below as decoded at that code)
// takes its spreads from a trial, so starts at its previous block's code: two for most. Once a
// pca search has coded a block, the encoder's next blocks of the same calibration, budget and
// layout go in one pass instead (codec/pca_rate_control.cc), each section at a code of its own.
//
// An error target (CodecParams::error_target): each layer's keys and each layer's values get
// the fewest bits, at most the ceiling, whose relative RMS error ||x - x'|| / ||x|| over the
// block stays within the target. A section's error depends on its own bits only (sections are
// quantised and predicted independently), so every section runs its own binary search over
// 2..ceiling in the same trial encodes: ~log2(ceiling - 1) encode-and-decode rounds (3 for a
// k8v8 ceiling) and a final encode. A section that misses the target even at the ceiling is
// coded at the ceiling. Without the block on the CPU (a device encoder's sections) nothing can
// be measured: every section is coded at the ceiling, which meets any target the ceiling meets.
#include <array>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "codec/codec.h"
#include "codec/internal/encoder_scratch.h"
#include "codec/internal/sections.h"
#include "codec/internal/size_model.h"
#include "common/status_macros.h"

namespace strata::codec {
namespace {

std::vector<std::pair<uint8_t, uint8_t>> Ladder(uint8_t max_key, uint8_t max_value) {
  std::vector<std::pair<uint8_t, uint8_t>> rungs;
  uint8_t k = 2, v = 2;
  rungs.push_back({k, v});
  while (k < max_key || v < max_value) {
    if ((v <= k && v < max_value) || k >= max_key)
      ++v;
    else
      ++k;
    rungs.push_back({k, v});
  }
  return rungs;
}

// Trial encodes on the CPU go through a source that keeps each section's quantiser output by
// bits, so a section is quantised once per bit width it is tried at; only the entropy coding
// runs again. It also notes where each section lies in the block.
class SectionCache {
 public:
  SectionCache(const KvLayout& layout, const CodecParams& params, std::span<const uint8_t> block)
      : tensors_(layout.TensorsPerLayer()),
        params_(params),
        block_(block),
        slots_(size_t{layout.num_layers} * tensors_),
        where_(slots_.size()) {}

  SectionSource Source() {
    return [this](const SectionHandoff& h, SectionArrays* out) {
      const size_t index = Index(h.layer, h.is_key);
      where_[index] = {h.out_offset, h.out_bytes, h.dtype};
      auto& slot = slots_[index][h.bits];
      if (!slot) {
        auto arrays = std::make_unique<SectionArrays>();
        internal::TensorShape shape;
        shape.tokens = h.tokens;
        shape.heads = h.heads;
        shape.head_dim = h.head_dim;
        shape.dtype = h.dtype;
        shape.is_key = h.is_key;
        STRATA_RETURN_IF_ERROR(internal::QuantiseToArrays(block_.data() + h.out_offset, shape,
                                                          h.bits, params_, &scratch_,
                                                          arrays.get()));
        slot = std::move(arrays);
      }
      *out = *slot;
      return absl::OkStatus();
    };
  }
  size_t Index(uint32_t layer, bool is_key) const {
    return size_t{layer} * tensors_ + (is_key ? 0 : 1);
  }
  size_t sections() const { return slots_.size(); }
  // Forgets the quantiser outputs at widths `keep(bits)` says no longer matter.
  template <typename Keep>
  void KeepOnly(Keep keep) {
    for (size_t i = 0; i < slots_.size(); ++i)
      for (size_t b = 0; b < slots_[i].size(); ++b)
        if (!keep(i, b)) slots_[i][b].reset();
  }
  // ||x - x'|| / ||x|| of section `index` (0 for an all-zero section), once a trial encode
  // has described it.
  double RelativeError(size_t index, std::span<const uint8_t> decoded) {
    const Where& w = where_[index];
    const size_t n = w.bytes / DTypeBytes(w.dtype);
    x_.resize(n);
    y_.resize(n);
    internal::ToFloat(block_.data() + w.offset, w.dtype, x_.data(), n);
    internal::ToFloat(decoded.data() + w.offset, w.dtype, y_.data(), n);
    double err = 0, energy = 0;
    for (size_t i = 0; i < n; ++i) {
      const double d = double{x_[i]} - double{y_[i]};
      err += d * d;
      energy += double{x_[i]} * double{x_[i]};
    }
    return energy > 0 ? std::sqrt(err / energy) : (err > 0 ? INFINITY : 0.0);
  }

 private:
  struct Where {
    size_t offset = 0, bytes = 0;
    DType dtype = DType::kFloat16;
  };
  const uint32_t tensors_;
  const CodecParams& params_;
  std::span<const uint8_t> block_;
  std::vector<std::array<std::unique_ptr<SectionArrays>, 9>> slots_;
  std::vector<Where> where_;
  internal::SectionScratch scratch_;
  std::vector<float> x_, y_;
};

// pca: step codes 1 .. kPcaCodes; the search's limits.
constexpr int kPcaCodes = 255;
constexpr int kPcaMaxTrials = 10;
// The size model's search: until the model has been measured against a neighbouring code for a
// calibration and budget, a fitting code's finer neighbour is always tried; then unless
// predicted over the budget by more than three times the model's recent error (a running mean
// that forgets at kPcaErrorDecay per observation, but never below the last, nor below
// kPcaModelErrorFloor).
constexpr double kPcaErrorDecay = 0.5;
constexpr double kPcaModelErrorFloor = 3e-4;
constexpr int kPcaCheckEvery = 8;  // blocks: a fitting code's finer neighbour is tried anyway
constexpr int kPcaBiasCodes = 8;   // codes from the anchor the per-code correction reaches
// The model's error on a block beyond which the search stops following it there.
constexpr double kPcaModelTrust = 0.01;

absl::Status CheckBlockSize(const KvLayout& layout, std::span<const uint8_t> block) {
  if (block.size() == layout.BlockBytes()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("codec: block has ", block.size(),
                                                 " bytes, layout needs ", layout.BlockBytes()));
}

}  // namespace

absl::Status Encoder::EncodeWithinRate(const KvLayout& layout, const CodecParams& params,
                                       std::span<const uint8_t> block,
                                       const SectionSource* source, std::vector<uint8_t>* blob,
                                       EncodeStats* stats) {
  const uint64_t values = layout.BlockBytes() / DTypeBytes(layout.dtype);
  const auto budget = static_cast<uint64_t>(std::floor(
      static_cast<double>(params.rate_bits) * static_cast<double>(values) / 8.0));
  const auto rungs = Ladder(params.key_bits, params.value_bits);
  const uint32_t layers = layout.num_layers;
  CodecParams trial = params;
  trial.rate_bits = 0;
  trial.layer_key_bits.assign(layers, 0);
  trial.layer_value_bits.assign(layers, 0);
  SectionCache cache(layout, params, block);
  const SectionSource cpu_source = cache.Source();
  // Forgets the widths no rung in [from, to] uses.
  auto keep_only = [&](size_t from, size_t to) {
    cache.KeepOnly([&](size_t, size_t b) {
      for (size_t r = from; r <= to && r < rungs.size(); ++r)
        if (rungs[r].first == b || rungs[r].second == b) return true;
      return false;
    });
  };
  if (!source) {
    STRATA_RETURN_IF_ERROR(CheckBlockSize(layout, block));
    source = &cpu_source;
  }
  std::vector<uint8_t> attempt;
  size_t chosen_rung = 0;  // the plan of the blob in *blob
  uint32_t chosen_raised = 0;
  // Encodes with the first `raised` layers on rung `rung` + 1 and the rest on `rung`; true (and
  // the blob in *blob) when it fits the budget.
  auto plan = [&](size_t rung, uint32_t raised) {
    for (uint32_t l = 0; l < layers; ++l) {
      const auto& [k, v] = rungs[l < raised ? rung + 1 : rung];
      trial.layer_key_bits[l] = k;
      trial.layer_value_bits[l] = v;
    }
  };
  auto fits = [&](size_t rung, uint32_t raised, bool keep_anyway) -> absl::StatusOr<bool> {
    plan(rung, raised);
    STRATA_RETURN_IF_ERROR(EncodeImpl(layout, trial, block, source, &attempt, nullptr));
    const bool ok = attempt.size() <= budget;
    if (ok || keep_anyway) {
      blob->swap(attempt);
      chosen_rung = rung;
      chosen_raised = raised;
    }
    return ok;
  };
  // 1. The highest rung for every layer: rungs below `lo` fit, from `hi` on they do not.
  size_t lo = 0, hi = rungs.size();  // invariant: the answer is in [lo - 1, hi - 1]
  bool any = false;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    STRATA_ASSIGN_OR_RETURN(bool ok, fits(mid, 0, false));
    if (ok) {
      any = true;
      lo = mid + 1;
    } else {
      hi = mid;
    }
    keep_only(lo > 0 ? lo - 1 : 0, hi);  // the best fit so far and the lowest misfit
  }
  if (!any) {  // not even the floor fits: stored at the floor
    STRATA_ASSIGN_OR_RETURN(bool ok, fits(0, 0, true));
    (void)ok;
  } else if (const size_t rung = lo - 1; rung + 1 < rungs.size()) {
    // 2. The first m layers one rung higher: m = 0 fits (step 1), m = layers does not. A trial
    // that fits replaces *blob; one that does not leaves it.
    uint32_t mlo = 1, mhi = layers;
    while (mlo < mhi) {
      const uint32_t mid = (mlo + mhi) / 2;
      STRATA_ASSIGN_OR_RETURN(bool ok, fits(rung, mid, false));
      if (ok)
        mlo = mid + 1;
      else
        mhi = mid;
    }
  }
  if (stats) {  // the chosen plan once more, counted (trial encodes are not); the same bytes
    plan(chosen_rung, chosen_raised);
    STRATA_RETURN_IF_ERROR(EncodeImpl(layout, trial, block, source, &attempt, stats));
    blob->swap(attempt);
  }
  return absl::OkStatus();
}

// pca and xl alike: a trial is a whole encode at one step code (pca keeps its sections'
// projections between trials; xl codes every layer again, since each layer's prediction comes
// from the one below as decoded at that code).
absl::Status Encoder::EncodeCalibratedWithinRate(const KvLayout& layout,
                                                 const CodecParams& params,
                                                 std::span<const uint8_t> block,
                                                 std::vector<uint8_t>* blob, EncodeStats* stats) {
  STRATA_RETURN_IF_ERROR(CheckBlockSize(layout, block));
  const bool xl = params.mode == Mode::kCrossLayer;
  if (!xl && pca_one_pass_) {  // after a block of this calibration and budget: one pass
    STRATA_ASSIGN_OR_RETURN(const bool coded,
                            EncodePcaInOnePass(layout, params, block, blob, stats));
    if (coded) return absl::OkStatus();
  }
  const uint64_t values = layout.BlockBytes() / DTypeBytes(layout.dtype);
  const double budget = std::floor(static_cast<double>(params.rate_bits) *
                                   static_cast<double>(values) / 8.0);
  CodecParams trial = params;
  trial.rate_bits = 0;
  std::vector<uint8_t> attempt;
  EncodeStats trial_stats, chosen_stats;
  int fit = kPcaCodes + 1, miss = 0;  // the finest code known to fit, the coarsest known not to
  // The size model's spreads: pca's from the block's projection (every section projected once,
  // kept for the trials, which quantise and code); xl's from each trial's residuals. Whatever
  // way this returns, the encoder forgets both (an xl spreads pointer would dangle).
  BeginPcaSearch();
  absl::Cleanup end_search = [this] { EndPcaSearch(); };
  std::vector<double> spreads;
  if (xl) {
    CollectXlSpreads(&spreads);
  } else {
    STRATA_RETURN_IF_ERROR(ProjectPcaBlock(layout, params, block, &spreads));
  }
  int last_code = 0;  // the last trial's (its blob in `attempt` where it missed)
  auto encode = [&](int code) -> absl::StatusOr<double> {
    ++budget_trial_encodes_;
    last_code = code;
    if (xl) spreads.clear();
    trial.pca_step_code = static_cast<uint8_t>(code);
    trial_stats = EncodeStats{};
    STRATA_RETURN_IF_ERROR(
        EncodeImpl(layout, trial, block, nullptr, &attempt, stats ? &trial_stats : nullptr));
    const auto size = static_cast<double>(attempt.size());
    if (size <= budget && code < fit) {
      fit = code;
      blob->swap(attempt);
      chosen_stats = trial_stats;
    } else if (size > budget && code > miss) {
      miss = code;
    }
    return size;
  };
  // The size model (ModelBytes) times this block's ratio of real to modelled bytes, plus the
  // sequence's first token kept exact. pca's first trial takes the finest code predicted to
  // fit, with the ratio of the encoder's last block of the namespace (within ~0.4 % of this
  // one's on real KV); xl's the code its last block ended at (its spreads come from a trial).
  // A trial's real size then sets this block's ratio, which predicts the neighbouring codes'
  // sizes to ~0.1 % (a code moves them 0.5-1.5 %), and to ~0.02 % once corrected by the error
  // per code the model showed on recent blocks. A code finer than one that fits is tried unless
  // predicted to overshoot the budget by more than three times the error such predictions had
  // lately (at least kPcaModelErrorFloor; always, until one was measured for this calibration
  // and budget), and on every kPcaCheckEvery-th block anyway, which keeps that error
  // measured: about one trial for most pca blocks of real KV, and the finest code that fits
  // unless the model errs by more than that. Where the model keeps erring one way, the steps
  // double (bytes the model does not scale, such as exact tokens, weigh most near the coarsest
  // codes).
  const bool hinted = pca_rate_hint_.calibration_id == params.calibration_id &&
                      pca_rate_hint_.rate_bits == params.rate_bits;
  double ratio = hinted && pca_rate_hint_.model_ratio > 0 ? pca_rate_hint_.model_ratio : 1.0;
  // 0: not measured yet (every fitting code's finer neighbour is then tried).
  double model_error = hinted ? pca_rate_hint_.model_error : 0.0;
  double bias = hinted ? pca_rate_hint_.model_bias : 0.0;
  const int unchecked = hinted ? pca_rate_hint_.unchecked_blocks + 1 : 0;
  const bool check_neighbour = unchecked >= kPcaCheckEvery;
  const uint32_t tensors = layout.TensorsPerLayer();
  const double sink = params.first_position == 0
                          ? static_cast<double>(layout.num_layers) * tensors *
                                layout.num_kv_heads * layout.head_dim * DTypeBytes(layout.dtype)
                          : 0.0;
  // Anchored at a trial of this block (code `anchor`), the model's slope is corrected by what
  // it was off per code on recent blocks (`bias`, a relative error per code), over at most
  // kPcaBiasCodes codes and by at most a factor of two.
  int anchor = 0;
  auto correction = [&](int c) {
    const int away = std::clamp(anchor - c, -kPcaBiasCodes, kPcaBiasCodes);
    return std::clamp(1 + bias * away, 0.5, 2.0);
  };
  auto predict = [&](int c) {
    const double raw = ratio * internal::ModelBytes(spreads, c) + sink;
    return anchor == 0 ? raw : raw * correction(c);
  };
  // The finest code in [lo, hi] predicted within `limit` (hi where none is).
  auto finest = [&](double limit, int lo, int hi) {
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (predict(mid) <= limit)
        hi = mid;
      else
        lo = mid + 1;
    }
    return hi;
  };
  int code = xl ? (hinted ? pca_rate_hint_.code : 128) : finest(budget, 1, kPcaCodes);
  bool checked = false;  // a finer neighbour of a fitting code was tried
  int last_step = 0;     // the last move, finer < 0 < coarser
  double block_error = 0;  // how far the anchored model erred on this block's last trial
  int prev_code = 0;       // this block's trial before the last, and its size
  double prev_size = 0;
  for (int trials = 0; trials < kPcaMaxTrials; ++trials) {
    const double predicted = predict(code);
    STRATA_ASSIGN_OR_RETURN(const double size, encode(code));
    // How far the anchored model erred, where the trial is a near neighbour of the anchor (the
    // per-code correction's reach; a far jump says little about the next neighbour).
    const int away = anchor - code;
    if (anchor != 0 && away != 0 && std::abs(away) <= kPcaBiasCodes && predicted > 0) {
      const double raw = predicted / correction(code);
      bias = (1 - kPcaErrorDecay) * bias + kPcaErrorDecay * (size / raw - 1) / away;
      block_error = std::abs(size / predicted - 1);
      model_error =
          model_error == 0
              ? std::max(block_error, kPcaModelErrorFloor)
              : std::max({block_error,
                          (1 - kPcaErrorDecay) * model_error + kPcaErrorDecay * block_error,
                          kPcaModelErrorFloor});
    }
    const double modelled = internal::ModelBytes(spreads, code);
    if (modelled > 0 && size > sink) {
      ratio = (size - sink) / modelled;
      anchor = code;
    }
    if (fit == miss + 1 || fit == 1 || miss == kPcaCodes) break;
    const bool fits = size <= budget;
    if (fits && anchor == code && !check_neighbour && model_error > 0 &&
        predict(code - 1) > budget * (1 + 3 * model_error))
      break;  // the model rules the finer code out
    checked |= fits;
    // The model's pick among the codes not yet tried on the side the trial points to.
    const int lo = miss + 1, hi = std::min(fit - 1, kPcaCodes);
    int next = fits ? finest(budget, lo, code - 1) : finest(budget, code + 1, hi);
    if ((block_error > kPcaModelTrust || anchor == 0) && prev_code != 0) {
      // The model is off on this block (bytes it does not scale, such as tables and exact
      // tokens, weigh most in small blocks and near the coarsest codes): a secant step through
      // this block's last two trials instead, where their sizes fall with the code.
      const double slope = (size - prev_size) / (code - prev_code);
      if (slope < 0)
        next = code + static_cast<int>(std::clamp(std::ceil((budget - size) / slope),
                                                  -1.0 * kPcaCodes, 1.0 * kPcaCodes));
      else if ((last_step < 0) == fits && last_step != 0)
        next = code + 2 * last_step;  // no slope to follow: double the step
    }
    prev_code = code;
    prev_size = size;
    if (fit <= kPcaCodes && miss > 0) {  // at least a quarter of the way into the bracket
      const int quarter = std::max(1, (fit - miss) / 4);
      next = std::clamp(next, miss + quarter, fit - quarter);
    }
    next = std::clamp(next, lo, hi);
    last_step = next - code;
    code = next;
  }
  if (fit > kPcaCodes) {  // not even the coarsest steps fit: stored at the coarsest
    if (last_code != kPcaCodes) STRATA_RETURN_IF_ERROR(encode(kPcaCodes).status());
    if (fit > kPcaCodes) {  // it missed: its blob is in `attempt`
      blob->swap(attempt);
      chosen_stats = trial_stats;
    }
  }
  pca_rate_hint_ = {params.calibration_id, params.rate_bits, std::min(fit, kPcaCodes), ratio,
                    model_error, bias, checked ? 0 : std::min(unchecked, kPcaCheckEvery)};
  internal::PcaBudgetHistory* history =
      xl || spreads.empty()
          ? nullptr
          : scratch_->pca_histories.Find(params.calibration_id, params.rate_bits, layout);
  if (history) {  // the next block of this budget goes in one pass
    const int kept = std::min(fit, kPcaCodes);
    const double fixed = internal::PcaBlobFixedBytes(size_t{layout.num_layers} * tensors);
    const double model = internal::ModelBytes(spreads, kept);
    const double coded = static_cast<double>(blob->size()) - fixed - sink;
    history->ratio = model > 0 && coded > 0 ? coded / model : 0.0;
    history->code = kept;
  }
  if (stats) stats->Add(chosen_stats);
  return absl::OkStatus();
}

absl::Status Encoder::EncodeWithinError(const KvLayout& layout, const CodecParams& params,
                                        std::span<const uint8_t> block,
                                        const SectionSource* source, std::vector<uint8_t>* blob,
                                        EncodeStats* stats) {
  CodecParams trial = params;
  trial.error_target = 0;
  if (source) return EncodeImpl(layout, trial, block, source, blob, stats);  // the ceiling
  STRATA_RETURN_IF_ERROR(CheckBlockSize(layout, block));
  SectionCache cache(layout, params, block);
  const SectionSource cpu_source = cache.Source();
  // Each section's answer lies in [lo, hi]: hi meets the target (or is the ceiling).
  const uint32_t layers = layout.num_layers;
  const bool separate = layout.TensorsPerLayer() == 2;
  std::vector<uint8_t> lo(cache.sections(), 2), hi(cache.sections());
  for (uint32_t l = 0; l < layers; ++l) {
    hi[cache.Index(l, true)] = params.key_bits;
    if (separate) hi[cache.Index(l, false)] = params.value_bits;
  }
  trial.layer_key_bits.assign(layers, 0);
  trial.layer_value_bits.assign(layers, 0);
  // Plans every section at bits_of(section); a single-tensor layout codes the value width too.
  auto plan = [&](auto bits_of) {
    for (uint32_t l = 0; l < layers; ++l) {
      trial.layer_key_bits[l] = bits_of(cache.Index(l, true));
      trial.layer_value_bits[l] = separate ? bits_of(cache.Index(l, false)) : params.value_bits;
    }
  };
  std::vector<uint8_t> attempt, decoded(block.size());
  Decoder decoder;
  for (;;) {
    bool open = false;
    std::vector<uint8_t> mid(cache.sections());
    for (size_t i = 0; i < mid.size(); ++i) {
      mid[i] = static_cast<uint8_t>((lo[i] + hi[i]) / 2);
      open |= lo[i] < hi[i];
    }
    if (!open) break;
    plan([&](size_t i) { return mid[i]; });
    STRATA_RETURN_IF_ERROR(EncodeImpl(layout, trial, block, &cpu_source, &attempt, nullptr));
    STRATA_RETURN_IF_ERROR(decoder.Decode(attempt, decoded));
    for (size_t i = 0; i < mid.size(); ++i) {
      if (lo[i] == hi[i]) continue;
      if (cache.RelativeError(i, decoded) <= params.error_target)
        hi[i] = mid[i];
      else
        lo[i] = static_cast<uint8_t>(mid[i] + 1);
    }
    cache.KeepOnly([&](size_t i, size_t b) { return b >= lo[i] && b <= hi[i]; });
  }
  plan([&](size_t i) { return hi[i]; });
  return EncodeImpl(layout, trial, block, &cpu_source, blob, stats);
}

}  // namespace strata::codec
