// Cross-layer transform coding of a KV block (codec mode `xl`, codec/codec.h): each layer's
// keys and values are coded as one vector per token (every kv head's key, RoPE undone, and
// value: width 2 * kv_heads * head_dim), after a linear prediction from the decoded layer below.
//
// Why: a layer's K and V are projections of the residual stream, which each layer only nudges,
// so the layer below predicts most of a layer (81-89 % of SmolLM2's variance). Coding the
// residual of that prediction with one PCA per layer cut the model's KL at equal rate 3-5x on
// SmolLM2 and ~1.7x on Qwen2.5 against the per-head pca mode (docs/codec.md, "One transform per
// layer and a prediction from the layer below (xl)"); it decodes 5-10x slower.
//
// Per token and layer l the decoder computes, in the calibration's units (each head's values
// divided by its scale),
//   hat_l = mean_l + (hat_{l-1} - mean_{l-1}) P_l + sum over coded k of q_k step_k axis_k
// (P_0 = 0), then scales back and redoes RoPE on the keys. The encoder quantises the residual's
// coordinates against its own hat_{l-1}, computed by the same code in the same order (tiles or
// float kernels: internal/cross_layer_amx.h), so the prediction never drifts from the decoder's.
// The sequence's first token (first_position 0, the attention sink) is stored as given.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "strata/kv_layout.h"

namespace strata::codec {

namespace internal {
struct CrossLayerTiles;  // cross_layer.cc: the AMX operands
}

struct CrossLayerOptions {
  // The quantiser step of every coded coordinate, in units of each head's rms per value on the
  // samples (divided further by the square root of its importance).
  double step = 0.7;
  // The predictor's ridge regularisation: ridge * samples added to the normal equations'
  // diagonal (in the units above). 0.1 did best of 0.01-1 on SmolLM2.
  double ridge = 0.1;
  // > 0: keys are coded with RoPE undone (rotate-half, this theta); sample block i starts at
  // token position first_positions[i] (default i * tokens_per_block).
  double rope_theta = 0;
  std::vector<uint64_t> first_positions;
  // Per (layer, tensor): how much the model minds each tensor's relative error
  // (model_quality.py sensitivity). Empty: all 1.
  std::vector<double> importance;
  uint32_t version = 1;  // the namespace's counter (v1, v2, ...), carried by the artefact
  // How many sample blocks are coded to measure the rate the calibration gives (sample_bits).
  size_t rate_samples = 4;
};

// One layer's transform, in the calibration's units.
struct CrossLayerTransform {
  std::vector<float> mean;       // width
  std::vector<float> predictor;  // width x width, [below][this]; empty for layer 0
  std::vector<float> axes;       // coded x width, row k = axis k (residual PCA, by variance)
  std::vector<float> step;       // coded
};

inline constexpr uint32_t kCrossLayerMagic = 0x58564B53;  // "SKVX" little-endian
inline constexpr uint16_t kCrossLayerFormat = 2;

struct CrossLayerCalibration {
  uint32_t version = 1;  // the namespace's counter; informational, as a pca calibration's
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  float rope_theta = 0;
  float step = 0;         // the step asked for (CrossLayerOptions::step)
  float sample_bits = 0;  // bits per value of the first samples' payloads (0: not measured)
  // Per (layer, tensor, head): the divisor that brings the head's values to the units above.
  std::vector<float> scale;
  std::vector<CrossLayerTransform> layers;
  // The products' bf16 operands (internal/cross_layer_amx.h), built by CalibrateCrossLayer and
  // Parse where the CPU runs one of their kernels (AMX tiles, AVX512-BF16, AVX2 FMAs), the
  // width is a multiple of 32 and every step at least 2^-3. Coding then takes them
  // for blocks of a multiple of 32 tokens.
  std::shared_ptr<const internal::CrossLayerTiles> tiles;

  size_t Width() const { return size_t{2} * num_kv_heads * head_dim; }
  // The fewest bytes an artefact for `layout` can take (every predictor and mean, no coded
  // coordinate): a geometry whose floor exceeds the store's limit cannot use mode xl.
  static uint64_t MinSerializedBytes(const KvLayout& layout);
  // Serialized (little-endian): u32 magic "SKVX", u16 format version kCrossLayerFormat, u16
  // zero, u32 version, num_layers, num_kv_heads, head_dim, f32 rope_theta, step, sample_bits,
  // f32 scale[layers][2][heads],
  // then per layer u32 coded n, f32 mean[width], f32 predictor[width][width] (from layer 1),
  // f32 axes[n][width], f32 step[n]; a CRC32C of every preceding byte. Parse checks all of it
  // (DataLoss otherwise) and builds the tiles' operands as CalibrateCrossLayer does.
  std::vector<uint8_t> Serialize() const;
  static absl::StatusOr<CrossLayerCalibration> Parse(std::span<const uint8_t> bytes);
  // CalibrationIdOf(Serialize()): what a blob of this coder would name.
  uint64_t Id() const;
  size_t Coded(uint32_t layer) const { return layers[layer].step.size(); }
  // Whether blocks of `layout` can be coded with it (separate K and V, the same geometry,
  // tokens per block a multiple of 16).
  absl::Status Matches(const KvLayout& layout) const;
};

// Whether mode xl can code blocks of `layout` at all: separate K and V of fp16, bf16 or fp32,
// tokens per block a multiple of 16, and an artefact that can fit a daemon's store
// (kMaxCalibrationArtefactBytes: a width x width predictor per layer). InvalidArgument saying
// which, at namespace open rather than at the first calibration.
absl::Status CrossLayerLayoutSupported(const KvLayout& layout);

// From sample blocks of `layout`: per layer the heads' scales, the mean, the predictor (ridge
// regression of the layer on the layer below, both as given), the PCA of the prediction's
// residual, and the coordinates worth coding (some sample reaches half a step); then the first
// opts.rate_samples samples are coded to measure sample_bits.
absl::StatusOr<CrossLayerCalibration> CalibrateCrossLayer(
    const KvLayout& layout, std::span<const std::span<const uint8_t>> blocks,
    const CrossLayerOptions& opts);

// Payload: u32 magic "SXL2", u32 the stream's offset in the payload, then per layer: u16 maxq
// (symbols are q + maxq), u16 exact tokens e, e u16 token indexes, the e tokens' rows as given
// (keys then values, the block's type), and the rANS tables of the coded coordinates (runs of
// 16 tokens of one coordinate, 16 contexts by the coordinate's rank); then one rANS stream of
// every layer's symbols (128 states, rans::FinishShared; coded last layer first, so the decoder
// takes layer 0 first); a CRC32C of all preceding bytes closes it. Payloads of magic "SXL1"
// (session 44's: each layer's stream, states included, after its tables; no offset) decode too.
// `reconstruction`, when given (one block), receives what DecodeCrossLayer will write for the
// payload where it takes the same way (tiles or float kernels). `step_scale` multiplies every
// step of the calibration (a bit budget's search sets it; the decoder must be given the same).
// `spreads`, when given, receives every layer's coded coordinates of the prediction's residual
// as a bit budget's size model takes them (internal::AddSpread, the calibrated steps).
absl::Status EncodeCrossLayer(const CrossLayerCalibration& cal, const KvLayout& layout,
                              std::span<const uint8_t> block, uint64_t first_position,
                              std::vector<uint8_t>* out, std::span<uint8_t> reconstruction = {},
                              float step_scale = 1.0f, std::vector<double>* spreads = nullptr);
// DataLoss for a payload that is not one EncodeCrossLayer wrote for this calibration's shape.
// `verify_crc` false skips the payload's own CRC32C (the blob's, which covers it, was checked
// by the caller, or the caller fuzzes what lies behind it); every other check stays.
absl::Status DecodeCrossLayer(const CrossLayerCalibration& cal, const KvLayout& layout,
                              std::span<const uint8_t> payload, uint64_t first_position,
                              std::span<uint8_t> out, float step_scale = 1.0f,
                              bool verify_crc = true);

namespace internal {
// Tests: EncodeCrossLayer writes "SXL1" payloads (a stream per layer) while on (process-wide).
void XlWriteLayerStreamsForTesting(bool on);
}  // namespace internal

}  // namespace strata::codec
