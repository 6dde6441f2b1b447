// What an Encoder keeps between calls (codec/codec.cc, codec/rate_control.cc and
// codec/pca_rate_control.cc share it): buffers reused from block to block and a pca bit
// budget's record of the last block.
#pragma once

#include <cstdint>
#include <memory>
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

// A pca bit budget's last block of one calibration and budget: each section's spreads
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
  internal::PcaBudgetHistory pca_history;
  // A one-pass encode's spreads (codec/pca_rate_control.cc).
  std::vector<double> section_spreads, future_spreads, recent_spreads, recent_last_spreads;
};

}  // namespace strata::codec
