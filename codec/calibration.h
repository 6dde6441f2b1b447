// Calibrated transform coding (codec modes `pca` and `xl`): a per-namespace artefact, computed
// once from sample blocks, that the encoder and decoder of every blob of the mode must share.
// A Calibration is either a per-head one (pca, the format below) or holds a cross-layer one
// (xl, codec/cross_layer.h, magic "SKVX"); Parse takes either, and the daemon stores, copies and
// hands out both alike.
//
// For each layer, tensor (K, V; or the MLA latent) and kv head a Calibration holds the mean head
// vector, an orthonormal basis (the principal axes of the samples, by decreasing variance) and a
// quantiser step per basis coordinate; step 0 means the coordinate is dropped and decodes as
// the mean. Blobs carry the calibration's id (a hash of its serialized bytes), so a blob is
// never decoded with another basis: a decoder that does not hold the id refuses the blob.
//
// Serialized format (little-endian), version kCalibrationFormat:
//   0    4   magic "SKVP"
//   4    2   format version
//   6    2   reserved, zero
//   8    4   calibration version (the namespace's counter: v1, v2, ...; informational)
//   12   4   num_layers
//   16   4   num_kv_heads
//   20   4   head_dim
//   24   1   kind (common KvKind)
//   25   1   key handling: 0 keys as stored; 1 RoPE undone before the transform (rotate-half
//            pairs j, j + D/2, angle position * theta^(-2j/D)), so blobs carry their position
//   26   2   reserved, zero
//   28   4   target bits per value (f32; what Calibrate aimed for)
//   32   4   achieved bits per value on the samples (f32)
//   36   4   RoPE theta (f32; key handling 1), else zero
//   40   ... per (layer, tensor, head), layer-major: f32 mean[D], f32 basis[D][D] (row i = axis
//            i), f32 variance[D], f32 step[D]
//   end-4 4  CRC32C of every preceding byte
// The id is the FNV-1a 64 hash of all bytes (trailer included), never zero.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <mutex>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "strata/kv_layout.h"

namespace strata::codec {

namespace internal {
struct PcaPlan;  // pca.cc: what the sections derive from a calibration
}
struct CrossLayerCalibration;  // codec/cross_layer.h

inline constexpr uint32_t kCalibrationMagic = 0x50564B53;  // "SKVP" little-endian
inline constexpr uint16_t kCalibrationFormat = 1;

// One (layer, tensor, head)'s transform. Coordinates are ordered by decreasing variance.
struct HeadTransform {
  std::vector<float> mean;      // head_dim
  std::vector<float> basis;     // head_dim x head_dim, row i = axis i
  std::vector<float> variance;  // per coordinate, on the samples
  std::vector<float> step;      // per coordinate; 0 = dropped
};

class Calibration {
 public:
  // Geometry the calibration applies to (dtype and tokens_per_block are not part of it).
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  KvKind kind = KvKind::kSeparateKV;
  uint32_t version = 1;
  float target_bits = 0;
  float sample_bits = 0;
  // > 0: keys are coded with RoPE undone (key handling 1). Post-RoPE keys of different
  // positions are rotated copies of one distribution, which smears the principal axes: on
  // SmolLM2 the same relative MSE needs ~0.75 fewer bits per key value with RoPE undone.
  float rope_theta = 0;
  // (layer * tensors + tensor) * num_kv_heads + head. Empty for a cross-layer calibration.
  std::vector<HeadTransform> heads;
  // Set for a cross-layer calibration (codec mode xl): the artefact is its serialization, and
  // the fields above mirror its geometry, version, sample rate and RoPE.
  std::shared_ptr<const CrossLayerCalibration> cross_layer;

  // The calibration of mode xl made of `xl` (its fields copied as above); `id`, when known, is
  // CalibrationIdOf its serialization (else computed here, so that Id() never writes later).
  static Calibration OfCrossLayer(std::shared_ptr<const CrossLayerCalibration> xl,
                                  uint64_t id = 0);
  // "pca" or "xl": the codec mode the calibration serves.
  std::string_view ModeName() const { return cross_layer ? "xl" : "pca"; }

  uint32_t TensorsPerLayer() const { return kind == KvKind::kMlaLatent ? 1 : 2; }
  const HeadTransform& At(uint32_t layer, uint32_t tensor, uint32_t head) const {
    return heads[(size_t{layer} * TensorsPerLayer() + tensor) * num_kv_heads + head];
  }
  // Whether blocks of `layout` can be coded with this calibration.
  absl::Status Matches(const KvLayout& layout) const;
  // Structural and numeric checks (sizes, finite values, non-negative steps).
  absl::Status Validate() const;
  // About what the parsed calibration takes in memory: its floats, the xl tiles' operands, and
  // for pca the plan its coders build on first use (~2 more copies of the axes).
  uint64_t MemoryBytes() const;

  std::vector<uint8_t> Serialize() const;
  // Parses and validates either kind (by magic); DataLoss on anything malformed (CRC, sizes,
  // reserved fields).
  static absl::StatusOr<Calibration> Parse(std::span<const uint8_t> bytes);

  // The id blobs carry: FNV-1a 64 of Serialize(), never zero. Computed once (the object is
  // not meant to change after Calibrate or Parse).
  uint64_t Id() const;

  // The pca sections' plan (symbol order, coded coordinates per head), built on first use and
  // shared by every encoder and decoder of this object; a copy builds its own. Thread-safe.
  std::shared_ptr<const internal::PcaPlan> Plan() const;

 private:
  mutable uint64_t id_ = 0;
  // Not copied: a copy (Calibrate's trials change the steps between copies) starts empty.
  struct PlanCache {
    std::mutex mu;
    std::shared_ptr<const internal::PcaPlan> plan;  // guarded by mu
    PlanCache() = default;
    PlanCache(const PlanCache&) {}
    PlanCache& operator=(const PlanCache&) {
      std::lock_guard<std::mutex> g(mu);
      plan.reset();
      return *this;
    }
  };
  mutable PlanCache plan_;
};

// The largest artefact a daemon stores (gRPC messages are capped at 64 MiB): checked by the
// daemon, and by the client before it calibrates or sends one.
inline constexpr uint64_t kMaxCalibrationArtefactBytes = 60ull << 20;

std::string CalibrationIdString(uint64_t id);  // 16 hex digits
// The id of a serialized calibration artefact: FNV-1a 64 of its bytes, never zero.
uint64_t CalibrationIdOf(std::span<const uint8_t> serialized);
// The codec mode a serialized artefact is for, from its magic alone: "pca", "xl", or "" for
// neither (what a daemon checks before it parses an artefact put into a namespace).
std::string_view CalibrationModeOf(std::span<const uint8_t> serialized);

struct CalibrateOptions {
  double bits_per_value = 1.5;  // target, over every value of a block (dropped ones included)
  // Distortion weight of keys against values in the bit allocation (each head's MSE relative to
  // its variance).
  double key_weight = 1.0;
  uint32_t version = 1;
  // > 0: undo RoPE (rotate-half, this theta) on the keys; sample block i then starts at token
  // position first_positions[i] (default i * tokens_per_block).
  double rope_theta = 0;
  std::vector<uint64_t> first_positions;
  // What an error costs, per (layer, tensor, head) in the order of Calibration::heads: a
  // symmetric positive semi-definite head_dim x head_dim matrix M each (row-major), so that an
  // error e in a head vector costs e^T M e. For keys the second moment of the queries that read
  // them (their logits' error), for values W_o^T W_o of the output projection (the residual
  // stream's); see model_quality.py's distortion_metric. Each head's distortion stays relative
  // to its own energy under M, as with the identity. Empty: the identity (mean squared error).
  std::vector<float> metric;
  // How much the model minds each head's (relative) distortion, per (layer, tensor) or per
  // (layer, tensor, head) in the order of Calibration::heads: the bit allocation minimises the
  // sum of these times each head's error relative to its energy. Layers differ by 100x in what
  // the same relative error costs the model's outputs (SmolLM2: KL 6e-5 to 7e-3 nats per layer
  // coded at 1.5 bits/value), which no statistic of the KV shows; model_quality.py sensitivity
  // measures it. Empty: all 1.
  std::vector<double> importance;
  // With importances: no coordinate gets more than this many bits fewer than it would without
  // them (< 0: no floor). Without a floor, 1.5 bits/value did worse than no importances on both
  // models (KL 0.25 vs 0.033 SmolLM2, 0.031 vs 0.018 Qwen2.5) while 2-3 bits did 1.5-2x better;
  // 0.5 keeps most of the gain at 2 bits and up and most of the loss away at 1-1.5.
  double importance_floor_bits = 0.5;
  // > 0: a coordinate gets at least this many bits of the allocation's model or none (one the
  // importances' floor keeps gets this many). The model prices a coordinate's first bits by the
  // Gaussian rate-distortion bound; the uniform quantiser and the entropy coder pay more there:
  // a quarter bit of the model (a step of 2.9 sigma) codes at 0.74 bits and removes 38 % of the
  // variance, half a bit at 0.99 bits for 52 %, three quarters at 1.21 for 65 %. At 0.75 on real
  // KV at 1.5 bits/value: 17 % fewer coded coordinates, the codec up to 13 % faster, the same
  // squared error at equal rate and SmolLM2's KL as good, but Qwen2.5's KL 46 % worse: the
  // directions of little variance carry something its attention reads. Hence off by default
  // (docs/codec.md, "Pca speed", "Fewer, better-coded coordinates").
  double min_coordinate_bits = 0;
};

// Calibrates from sample blocks of `layout` (each layout.BlockBytes() bytes): per head PCA
// (covariance, Jacobi eigendecomposition), then the bit allocation of AllocateBits over all
// coordinates of the block (then min_coordinate_bits), with the model budget adjusted until the
// quantised samples' order-0 entropy meets the target.
absl::StatusOr<Calibration> Calibrate(const KvLayout& layout,
                                      std::span<const std::span<const uint8_t>> blocks,
                                      const CalibrateOptions& opts);

// Bit allocation for the Gaussian rate-distortion model D_i(b) = w_i * var_i * 2^(-2 b): the
// b_i in multiples of `quantum` (0..max_bits) minimising sum D_i(b_i) with sum b_i <= budget.
// D_i is convex and decreasing in b, so taking the quanta one at a time by largest distortion
// reduction is optimal (the DP optimum; tests compare with an exhaustive DP); it is the
// discrete form of reverse water-filling.
std::vector<double> AllocateBits(std::span<const double> weighted_variance, double budget,
                                 double quantum = 0.25, double max_bits = 8.0);
// The same from a starting allocation `bits` (counted against the budget).
std::vector<double> AllocateBitsFrom(std::span<const double> weighted_variance,
                                     std::vector<double> bits, double budget,
                                     double quantum = 0.25, double max_bits = 8.0);

// Eigen-decomposition of a symmetric n x n matrix (row-major, double) by cyclic Jacobi
// rotations: eigenvalues descending, vectors[i * n + j] = component j of eigenvector i.
void SymmetricEigen(std::vector<double> a, size_t n, std::vector<double>* values,
                    std::vector<double>* vectors);

// The same by Householder reduction to tridiagonal form and implicit QR steps: O(n^3) once,
// where Jacobi sweeps cost that each; for the cross-layer transform's 384-512 wide covariances
// (Jacobi took ~110 s for SmolLM2's 30). Eigenvectors agree with SymmetricEigen's up to sign
// (and within a cluster of equal eigenvalues, up to a rotation).
void SymmetricEigenHouseholder(std::vector<double> a, size_t n, std::vector<double>* values,
                               std::vector<double>* vectors);

// Calibrations a process holds, by id. Thread-safe. With a byte budget (the daemon's and the
// client's caches: a recalibrated namespace must not grow a long-lived process by a parsed
// artefact per version, ~80 MB each for an xl one), adding one evicts the least recently found
// or added calibrations beyond the budget that nobody else holds: a caller that keeps the
// shared_ptr Find or Add gave it (a pin) keeps that calibration in the set, so a decode between
// an Ensure and its Decoder never loses the one it asked for. An evicted calibration is fetched
// again (from the daemon's store, or the cluster) when a blob names it.
class CalibrationSet {
 public:
  // 0: no budget (keeps everything, as tests and codec_eval want).
  explicit CalibrationSet(uint64_t max_bytes = 0) : max_bytes_(max_bytes) {}

  // Adds (or keeps, if the id is already present) and returns the id.
  uint64_t Add(std::shared_ptr<const Calibration> c);
  // The same, returning the calibration the set holds under that id (`c`, or the one already
  // there): the pin that keeps it in the set. (Pinning `c` itself would not, when two threads
  // parsed the same id and the other's copy went in.)
  std::shared_ptr<const Calibration> Insert(std::shared_ptr<const Calibration> c);
  std::shared_ptr<const Calibration> Find(uint64_t id) const;
  std::vector<uint64_t> Ids() const;

  uint64_t max_bytes() const { return max_bytes_; }
  // What the held calibrations take (Calibration::MemoryBytes), and how many were evicted.
  uint64_t bytes() const;
  uint64_t evictions() const;

 private:
  struct Entry {
    std::shared_ptr<const Calibration> cal;
    uint64_t bytes = 0;
    mutable uint64_t last_used = 0;  // tick_ when last found or added
  };
  // Moves what goes into `dropped`, to be freed after the lock.
  void EvictLocked(uint64_t keep, std::vector<std::shared_ptr<const Calibration>>* dropped);

  const uint64_t max_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Entry> map_;  // guarded by mu_
  mutable uint64_t tick_ = 0;                // guarded by mu_
  uint64_t bytes_ = 0, evictions_ = 0;       // guarded by mu_
};

}  // namespace strata::codec
