// A pca namespace for codec tests: synthetic KV (2 layers, 2 heads of 128, 64 tokens per
// block) whose first four blocks calibrate it, and an encoder and a decoder that know it.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "codec/calibration.h"
#include "codec/codec.h"
#include "codec/synthetic_kv.h"
#include "tests/codec/test_layout.h"

namespace strata::codec::test {

// Blocks from the fifth are for encoding, at their positions (p.first_position: the fifth's).
struct CalibratedSynthetic {
  CalibratedSynthetic(size_t blocks, const CalibrateOptions& o)
      : kv(GenerateSyntheticKv(layout, static_cast<uint32_t>(blocks), SyntheticKvParams{})) {
    std::vector<std::span<const uint8_t>> samples;
    for (size_t i = 0; i < 4; ++i) samples.push_back(Block(i));
    auto cal = Calibrate(layout, samples, o);
    EXPECT_TRUE(cal.ok()) << cal.status();
    if (!cal.ok()) return;
    p.mode = Mode::kPca;
    p.calibration_id = set.Add(std::make_shared<const Calibration>(*std::move(cal)));
    p.first_position = 4 * 64;
    enc.set_calibrations(&set);
    dec.set_calibrations(&set);
  }
  std::span<const uint8_t> Block(size_t i) const { return std::span(kv).subspan(i * bb, bb); }
  const KvLayout layout = Layout(2, 2, 128, 64);
  const size_t bb = layout.BlockBytes();
  const std::vector<uint8_t> kv;
  CalibrationSet set;
  CodecParams p;
  Encoder enc;
  Decoder dec;
};

// Calibration options at this many bits per value.
inline CalibrateOptions AtBits(double bits) {
  CalibrateOptions o;
  o.bits_per_value = bits;
  return o;
}

}  // namespace strata::codec::test
