// Rate control for quant blocks (CodecParams::rate_bits): each block is coded with the most bits
// per layer that keep its blob within the budget, at most the spec's key/value bits.
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
#include <array>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/codec.h"
#include "codec/internal/sections.h"
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
  // Trial encodes on the CPU go through a source that keeps each section's quantiser output by
  // bits, so a section is quantised once per bit width it is tried at; only the entropy coding
  // runs again. Only the widths of the rungs still in play are kept (bounded memory).
  const uint32_t tensors = layout.TensorsPerLayer();
  std::vector<std::array<std::unique_ptr<SectionArrays>, 9>> cache(size_t{layers} * tensors);
  internal::SectionScratch quantise_scratch;
  const SectionSource cpu_source = [&](const SectionHandoff& h, SectionArrays* out) {
    auto& slot = cache[size_t{h.layer} * tensors + (h.is_key ? 0 : 1)][h.bits];
    if (!slot) {
      auto arrays = std::make_unique<SectionArrays>();
      internal::TensorShape shape;
      shape.tokens = h.tokens;
      shape.heads = h.heads;
      shape.head_dim = h.head_dim;
      shape.dtype = h.dtype;
      shape.is_key = h.is_key;
      STRATA_RETURN_IF_ERROR(internal::QuantiseToArrays(block.data() + h.out_offset, shape,
                                                        h.bits, params, &quantise_scratch,
                                                        arrays.get()));
      slot = std::move(arrays);
    }
    *out = *slot;
    return absl::OkStatus();
  };
  // Forgets the widths no rung in [from, to] uses.
  auto keep_only = [&](size_t from, size_t to) {
    for (auto& section : cache)
      for (size_t b = 0; b < section.size(); ++b) {
        bool used = false;
        for (size_t r = from; r <= to && r < rungs.size(); ++r)
          used |= rungs[r].first == b || rungs[r].second == b;
        if (!used) section[b].reset();
      }
  };
  if (!source) {
    if (block.size() != layout.BlockBytes())
      return absl::InvalidArgumentError(absl::StrCat("codec: block has ", block.size(),
                                                     " bytes, layout needs ",
                                                     layout.BlockBytes()));
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

}  // namespace strata::codec
