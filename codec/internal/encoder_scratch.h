// What an Encoder keeps between calls (codec/codec.cc, codec/rate_control.cc and
// codec/pca_rate_control.cc share it): buffers reused from block to block and a pca bit
// budget's record of the last block.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "codec/codec.h"
#include "codec/internal/sections.h"
#include "codec/rans.h"

namespace strata::codec {

namespace internal {

inline TensorShape ShapeOf(const KvLayout& l, uint32_t tensor) {
  TensorShape s;
  s.tokens = l.tokens_per_block;
  s.heads = l.num_kv_heads;
  s.head_dim = l.head_dim;
  s.dtype = l.dtype;
  s.is_key = tensor == 0;
  return s;
}

// A pca blob's bytes outside its sections' payloads: header, a table of `sections` + 1 entries
// (the shared stream's too), the stream's final states, trailer.
inline double PcaBlobFixedBytes(size_t sections) {
  return static_cast<double>(kHeaderBytes + (sections + 1) * kSectionEntryBytes +
                             sizeof(rans::SharedEncoder::x) + kTrailerBytes);
}

// A pca bit budget's last block of one calibration, budget and layout: each section's spreads
// (internal/size_model.h), which stand for the sections a one-pass encode has not reached yet,
// and the ratio of coded to modelled bytes.
struct PcaBudgetHistory {
  uint64_t calibration_id = 0;
  float rate_bits = 0;
  KvLayout layout;  // the blocks' it was taken from
  size_t sections = 0;
  std::vector<double> spreads;  // sections x kSpreadBins
  double ratio = 0;             // 0: none yet (the next block searches)
  std::vector<double> ratios;   // each section's (empty: `ratio` for every one)
  int code = 128;               // the last block's first section's code
};

// The histories of the calibrations, budgets and layouts an encoder met last (a transcoder's
// victims come from several namespaces; a client's thread may serve several): a few slots, the
// least recently used one made anew.
class PcaBudgetHistories {
 public:
  // This key's history (nullptr: none).
  PcaBudgetHistory* Find(uint64_t calibration_id, float rate_bits, const KvLayout& layout) {
    for (size_t i = 0; i < kSlots; ++i) {
      PcaBudgetHistory& h = slots_[i];
      if (h.sections > 0 && h.calibration_id == calibration_id && h.rate_bits == rate_bits &&
          h.layout == layout) {
        used_[i] = ++clock_;
        return &h;
      }
    }
    return nullptr;
  }
  // This key's history, emptied (its spreads' buffer kept), in the least recently used slot
  // where it has none.
  PcaBudgetHistory& Start(uint64_t calibration_id, float rate_bits, const KvLayout& layout,
                          size_t sections) {
    PcaBudgetHistory* h = Find(calibration_id, rate_bits, layout);
    if (!h) {
      const size_t oldest = static_cast<size_t>(
          std::min_element(used_.begin(), used_.end()) - used_.begin());
      used_[oldest] = ++clock_;
      h = &slots_[oldest];
    }
    std::vector<double> spreads = std::move(h->spreads);
    *h = PcaBudgetHistory{};
    h->calibration_id = calibration_id;
    h->rate_bits = rate_bits;
    h->layout = layout;
    h->sections = sections;
    h->spreads = std::move(spreads);
    return *h;
  }

 private:
  static constexpr size_t kSlots = 4;
  std::array<PcaBudgetHistory, kSlots> slots_;
  std::array<uint64_t, kSlots> used_{};
  uint64_t clock_ = 0;
};

}  // namespace internal

struct Encoder::Scratch {
  internal::SectionScratch sec;
  rans::SharedEncoder shared;
  SectionArrays arrays;  // EncodeFromSections: what the source hands over, reused
  // pca: a section's projection; during a bit budget's search, every section's of the block
  // (kept_projections: they hold this block's, from ProjectPcaBlock on).
  std::vector<internal::PcaProjection> projections{1};
  bool keep_projections = false, kept_projections = false;
  std::vector<double>* xl_spreads = nullptr;  // during a bit budget's search (CollectXlSpreads)
  internal::PcaBudgetHistories pca_histories;
  // A one-pass encode's spreads (codec/pca_rate_control.cc).
  std::vector<double> section_spreads, future_spreads, recent_spreads, recent_last_spreads;
};

}  // namespace strata::codec
