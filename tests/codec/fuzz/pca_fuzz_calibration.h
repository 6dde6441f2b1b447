// The calibrations the decoder fuzz target holds, so that mutated pca and xl blobs reach their
// sections: calibrated (deterministically) on synthetic KV of the seeds' geometry, RoPE undone.
// codec_fuzz_seeds writes blobs with them; the fuzz target adds them to its decoder's set.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "codec/calibration.h"
#include "codec/cross_layer.h"
#include "codec/synthetic_kv.h"

namespace strata::codec::fuzz {

inline std::shared_ptr<const Calibration> PcaFuzzCalibration(const KvLayout& layout) {
  const std::vector<uint8_t> data = GenerateSyntheticKv(layout, 2);
  const std::span<const uint8_t> all(data);
  std::vector<std::span<const uint8_t>> blocks = {all.first(layout.BlockBytes()),
                                                  all.subspan(layout.BlockBytes())};
  CalibrateOptions o;
  o.bits_per_value = 2.0;
  o.rope_theta = 10000;
  auto cal = Calibrate(layout, blocks, o);
  return cal.ok() ? std::make_shared<const Calibration>(*std::move(cal)) : nullptr;
}

// The cross-layer (xl) one, of the same samples.
inline std::shared_ptr<const Calibration> XlFuzzCalibration(const KvLayout& layout) {
  const std::vector<uint8_t> data = GenerateSyntheticKv(layout, 2);
  const std::span<const uint8_t> all(data);
  std::vector<std::span<const uint8_t>> blocks = {all.first(layout.BlockBytes()),
                                                  all.subspan(layout.BlockBytes())};
  CrossLayerOptions o;
  o.step = 0.5;
  o.rope_theta = 10000;
  auto cal = CalibrateCrossLayer(layout, blocks, o);
  if (!cal.ok()) return nullptr;
  return std::make_shared<const Calibration>(
      Calibration::OfCrossLayer(std::make_shared<const CrossLayerCalibration>(*std::move(cal))));
}

}  // namespace strata::codec::fuzz
