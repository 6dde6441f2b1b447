// Strata's KV-block codec: turns one block's KV tensors into a self-describing blob and back.
//
// Input/output layout of a block (KvLayout): for each layer, K then V (or one MLA latent), each a
// row-major [tokens_per_block][num_kv_heads][head_dim] tensor of `dtype`, layers back to back.
// That is KvLayout::BlockBytes() bytes.
//
// Modes:
//   raw        the bytes, framed (header, CRC).
//   lossless   fp16: per group of 32 values, the exponents as bit-packed offsets below the
//              group's largest (escapes for the rest), sign and mantissa bits raw (fast, no
//              entropy coder). bf16: byte-plane split; the high byte (sign, exponent, top mantissa
//              bits) is rANS-coded with per-(layer, tensor, channel group) statistics, the low
//              byte is rANS-coded when that pays and stored otherwise. Bit-exact.
//   quant      lossy: KIVI axes (keys: a step per channel; values: a step per token and channel
//              group), optional Hadamard rotation of each head vector, closed-loop token-delta
//              prediction against the previous token's reconstruction (the block's first token
//              is the anchor), int2..int8 step sizes (range / (2^bits - 1), as plain intN),
//              and rANS coding of the symbols with per-(layer, tensor, channel group) tables.
//              Bits can be set per layer. Deterministic: same input and params, same bytes.
//   groupwise  the plain baseline: groups of `group_size` consecutive values, asymmetric
//              min/max, fp16 scale and zero per group, codes bit-packed (no entropy coding).
//   pca        calibrated transform coding (codec/calibration.h): each head vector projected on
//              a per-(layer, tensor, head) PCA basis calibrated once per namespace, coordinates
//              quantised with the calibration's steps (trailing ones dropped), rANS-coded. The
//              blob names its calibration by id; the Encoder and Decoder find it in the
//              CalibrationSet they are given and refuse blobs whose calibration they lack.
//   xl         calibrated cross-layer transform coding (codec/cross_layer.h): each layer's keys
//              and values coded as one vector per token after a prediction from the decoded
//              layer below. Like pca, the blob names its calibration (a cross-layer one).
//
// Pure library: no I/O, no threads. Encoder and Decoder keep scratch buffers between calls; use
// one per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codec/blob.h"
#include "codec/calibration.h"
#include "codec/rans.h"
#include "strata/kv_layout.h"

namespace strata::codec {

// 5 is skipped: mode values double as section types, and 5 is the shared stream's.
enum class Mode : uint8_t {
  kRaw = 1,
  kLossless = 2,
  kQuant = 3,
  kGroupwise = 4,
  kPca = 6,
  kCrossLayer = 7  // "xl"
};
static_assert(static_cast<uint8_t>(Mode::kPca) == kModeCalibrated);
static_assert(static_cast<uint8_t>(Mode::kCrossLayer) == kModeCrossLayer);
std::string_view ModeName(Mode m);
// The modes whose blobs are coded with a namespace's calibration (pca, xl).
inline bool UsesCalibration(Mode m) { return ModeNamesCalibration(static_cast<uint8_t>(m)); }

struct CodecParams {
  Mode mode = Mode::kRaw;
  uint8_t key_bits = 4;  // quant and groupwise: 2..8
  uint8_t value_bits = 4;
  uint16_t group_size = 64;  // groupwise: values per group; quant: channels per value step
  bool hadamard = false;     // quant: rotate each head vector (head_dim a power of two)
  bool token_delta = true;   // quant: predict each token from the previous reconstruction
  // quant: keep the keys' outlier channels exactly (fp16, dense-and-sparse as in KVQuant):
  // channels whose mean square over the block exceeds 16x the median of their head, at most
  // head_dim/16 per head.
  bool key_outliers = false;
  // quant and pca: a bit budget per block, in bits per value of the whole blob (0: none).
  // quant: the encoder picks each block's bits per layer, at most key_bits / value_bits: the
  // most that keep the blob within the budget (codec/rate_control.cc). A block that exceeds it
  // even at 2 bits everywhere is stored at 2 bits (nothing is refused for its size).
  // pca and xl: the encoder scales all of the calibration's steps by the finest common factor
  // that keeps the blob within the budget (pca_step_code below, chosen per block); a block that
  // exceeds it even at the coarsest is stored at the coarsest (or raw where that is smaller:
  // Encoder::Encode). The search keeps every section's coordinates (4 bytes per coded
  // coordinate and token: up to twice the fp16 block), and the Encoder keeps that buffer for
  // its next block. pca, once the Encoder has coded a block of the same calibration, budget
  // and layout: one pass instead, each section at a factor of its own that keeps what is left
  // of the budget for the sections after it (codec/pca_rate_control.cc;
  // Encoder::set_pca_one_pass).
  float rate_bits = 0;
  // quant: a quality target per block instead (0: none), as the relative RMS error
  // ||x - x'|| / ||x|| of each layer's keys and of its values: each gets the fewest bits, at
  // most key_bits / value_bits, that stay within it (codec/rate_control.cc). Sections that miss
  // it even at the ceiling are coded at the ceiling. Not together with rate_bits.
  float error_target = 0;
  // Per-layer bit allocation (quant and groupwise); empty means key_bits / value_bits everywhere.
  std::vector<uint8_t> layer_key_bits;
  std::vector<uint8_t> layer_value_bits;
  // pca, xl: the calibration blobs are coded with (Calibration::Id()). Zero in a spec that
  // only asks for a rate (`pca:b1.5`) or a step (`xl:s0.7`): a tool that calibrates (codec_eval,
  // the namespace's calibration command) resolves it; the Encoder refuses it.
  uint64_t calibration_id = 0;
  // xl: the step a calibration for this spec is made with (CrossLayerOptions::step), when
  // calibration_id is not yet known.
  float xl_step = 0;
  float pca_target_bits = 0;  // pca: the rate asked for, when calibration_id is not yet known
  // pca: the rate a calibration for this spec aims at: pca_target_bits, else the budget of
  // `pca:rC` (0: neither).
  float PcaCalibrationBits() const { return pca_target_bits > 0 ? pca_target_bits : rate_bits; }
  // pca and xl: every step of the calibration times 2^((code - 128) / 32) in this block (0: as
  // calibrated, the same as 128); each section carries it. Rate control sets it; 1 .. 255 span
  // 1/16 .. 16 times the calibrated steps (about -4 .. +4 bits per coded coordinate).
  uint8_t pca_step_code = 0;
  // pca: the position of the block's first token in its sequence (per block, not part of the
  // spec; < 2^32). A calibration that undoes RoPE needs it and the blob carries it; at 0 the
  // encoder keeps the sequence's first token (the attention sink) exact.
  uint64_t first_position = 0;

  absl::Status Validate(const KvLayout& layout) const;
  uint8_t KeyBits(uint32_t layer) const {
    return layer < layer_key_bits.size() ? layer_key_bits[layer] : key_bits;
  }
  uint8_t ValueBits(uint32_t layer) const {
    return layer < layer_value_bits.size() ? layer_value_bits[layer] : value_bits;
  }
};

// Spec strings: "raw", "lossless", "int4-g64" (groupwise, 4 bits, group 64), and
// "quant:k3v4[:g64][:had][:nodelta][:ol][:r2.5|:e0.05]" (key bits 3, value bits 4, value group
// 64, Hadamard on, token delta off, key outlier channels kept exactly, at most 2.5 bits per
// value per block, or a relative error of at most 0.05 per layer's keys and values, with
// per-layer bits of at most k3v4); "pca:<16 hex digits>" (calibrated
// transform coding with that calibration) and "pca:bR" (R bits per value, for a calibration
// still to be made), either optionally with ":rC" (at most C bits per value per block), and
// "pca:rC" (at most C bits per value per block with the calibration the context gives: a
// namespace's calibrated at C, a cold codec's the blob's own); "xl:<16 hex digits>" (cross-layer
// coding with that calibration) and "xl:sS" (a calibration still to be made, at step S), either
// optionally with ":rC" as pca's, and "xl:rC" (a namespace's calibrated at step 0.5, a cold
// codec's the blob's own).
absl::StatusOr<CodecParams> ParseCodecSpec(std::string_view spec);
std::string CodecSpecString(const CodecParams& p);

struct EncodeStats {
  rans::CoderStats coder;  // entropy-coded streams only
  uint64_t values = 0;
  uint64_t blob_bytes = 0;
  // When set, quant mode appends the symbols it entropy-codes (all sections, in order), so
  // benchmarks can run other coders on exactly the same stream.
  std::vector<uint16_t>* symbol_sink = nullptr;
  // Adds another encode's counts (not its symbols).
  void Add(const EncodeStats& o) {
    coder.Add(o.coder);
    values += o.values;
    blob_bytes += o.blob_bytes;
  }
};

// A quant or groupwise section that a device codec handles itself (codec/cuda/): the fields the
// CUDA kernels take. The Decoder hands each over with its entropy coding already undone
// (DecodeOptions::device_sections); the Encoder describes each it asks a SectionSource for (the
// geometry and flags; the arrays are then empty). Spans point into the blob or the codec's
// scratch and are valid during the call only.
struct SectionHandoff {
  enum class Kind { kQuant, kGroupwise } kind = Kind::kQuant;
  uint32_t layer = 0;
  bool is_key = true;
  uint8_t bits = 0;
  uint32_t tokens = 0, heads = 0, head_dim = 0;
  DType dtype = DType::kFloat16;
  size_t out_offset = 0;  // where the section's tensor lies in the block
  size_t out_bytes = 0;
  // kGroupwise: the section's payload (codec/groupwise.cc), group from its header.
  std::span<const uint8_t> payload;
  uint16_t group = 0;  // kQuant: channels per value step (values); kGroupwise: values per group
  // kQuant (codec/quant.cc): the quantiser's flags and arrays, symbols widened to u16 with the
  // zero residual at 2^(bits+1).
  bool hadamard = false, token_delta = false;
  bool key_outliers = false;  // kQuant keys, encoding: keep the outlier channels (`:ol`)
  std::span<const uint16_t> mu16, steps16, syms, outlier_idx;
  std::span<const uint8_t> a16, outlier_vals;
};

// What a device encoder computed for one section where the block lives, for the Encoder to
// entropy-code and frame as it frames its own (Encoder::EncodeFromSections).
struct SectionArrays {
  // kGroupwise: the section's whole payload (codec/groupwise.cc).
  std::vector<uint8_t> payload;
  // kQuant: the quantiser's fields in payload order (codec/quant.cc): fp16 centres [C],
  // predictor weights [C] (token delta only), fp16 steps, symbols [T * C] (zero residual at
  // 2^(bits+1)), and under `:ol` the kept channels (ascending) and their input elements [T][W].
  std::vector<uint16_t> mu16, steps16, syms, outlier_idx;
  std::vector<uint8_t> a16, outlier_vals;
};
// Fills *out for the section described (its arrays empty); OK when it did.
using SectionSource = std::function<absl::Status(const SectionHandoff&, SectionArrays* out)>;

class Encoder {
 public:
  Encoder();
  ~Encoder();
  // pca and xl bit budgets: the whole encodes this encoder's searches ran (the kept ones
  // included), and its one-pass encodes, begun or whole; benchmarks and tests take differences.
  uint64_t budget_trial_encodes() const { return budget_trial_encodes_; }
  // pca bit budgets: the blocks coded in one pass (counted among the trial encodes too).
  uint64_t budget_one_pass_encodes() const { return budget_one_pass_encodes_; }
  // Blocks Encode stored raw because their pca or xl blob came out larger than the block.
  uint64_t raw_fallbacks() const { return raw_fallbacks_; }
  // pca bit budgets: after a block of the same calibration and budget, code each block in one
  // pass (on by default; off, every block is searched for the finest common step code that
  // fits: tests and A/B runs).
  void set_pca_one_pass(bool on) { pca_one_pass_ = on; }
  // Where pca mode finds its calibrations; must outlive the Encoder's use of it.
  void set_calibrations(const CalibrationSet* set) { calibrations_ = set; }
  // `block` holds layout.BlockBytes() bytes. Replaces the contents of *blob: the mode's blob,
  // or, for pca and xl, a raw one where that is smaller (raw_fallbacks).
  absl::Status Encode(const KvLayout& layout, const CodecParams& params,
                      std::span<const uint8_t> block, std::vector<uint8_t>* blob,
                      EncodeStats* stats = nullptr);
  // The same blob from sections a device encoder quantised (quant and groupwise modes only;
  // the block itself is not read). What the source returns is checked as a decoder checks a
  // payload (sizes, symbol range, outlier channels): InvalidArgument when it does not fit.
  absl::Status EncodeFromSections(const KvLayout& layout, const CodecParams& params,
                                  const SectionSource& source, std::vector<uint8_t>* blob,
                                  EncodeStats* stats = nullptr);

 private:
  absl::Status EncodeImpl(const KvLayout& layout, const CodecParams& params,
                          std::span<const uint8_t> block, const SectionSource* source,
                          std::vector<uint8_t>* blob, EncodeStats* stats);
  // params.rate_bits > 0: the per-layer bits search (codec/rate_control.cc).
  absl::Status EncodeWithinRate(const KvLayout& layout, const CodecParams& params,
                                std::span<const uint8_t> block, const SectionSource* source,
                                std::vector<uint8_t>* blob, EncodeStats* stats);
  // pca or xl with params.rate_bits > 0: the block's step scale search (codec/rate_control.cc).
  absl::Status EncodeCalibratedWithinRate(const KvLayout& layout, const CodecParams& params,
                                          std::span<const uint8_t> block,
                                          std::vector<uint8_t>* blob, EncodeStats* stats);
  // During a search: every pca section's projection is kept (by ProjectPcaBlock) and reused
  // by the trials of the same block.
  void BeginPcaSearch();
  // pca, during a search: projects every section of `block` (kept for the trials that follow)
  // and sets `spreads` to their spreads (internal::AddPcaSpreads), keeping each section's for
  // the next block's one pass (the history, whose ratio the search sets once done). Leaves
  // `spreads` empty where the calibration is not this encoder's or not pca's (the first trial
  // then says why).
  absl::Status ProjectPcaBlock(const KvLayout& layout, const CodecParams& params,
                               std::span<const uint8_t> block, std::vector<double>* spreads);
  // xl, during a search: each encode until EndPcaSearch adds its residuals' spreads to `spreads`
  // (the caller clears it between trials).
  void CollectXlSpreads(std::vector<double>* spreads);
  void EndPcaSearch();
  // params.error_target > 0: the per-section bits search (codec/rate_control.cc).
  absl::Status EncodeWithinError(const KvLayout& layout, const CodecParams& params,
                                 std::span<const uint8_t> block, const SectionSource* source,
                                 std::vector<uint8_t>* blob, EncodeStats* stats);

  // pca with params.rate_bits > 0, after a block of the same calibration and budget: every
  // section coded once, each at the step code its share of what is left of the budget allows
  // (codec/pca_rate_control.cc). False where it could not keep the blob within the budget, or
  // where a section showed the last block's records say little about this one (the caller
  // searches then).
  absl::StatusOr<bool> EncodePcaInOnePass(const KvLayout& layout, const CodecParams& params,
                                          std::span<const uint8_t> block,
                                          std::vector<uint8_t>* blob, EncodeStats* stats);
  // A calibrated mode's calibration, checked against the layout, and its header fields.
  absl::StatusOr<std::shared_ptr<const Calibration>> CalibrationFor(const KvLayout& layout,
                                                                    const CodecParams& params,
                                                                    BlobHeader* h) const;

  struct Scratch;
  std::unique_ptr<Scratch> scratch_;
  const CalibrationSet* calibrations_ = nullptr;
  // Where the last pca or xl bit budget search ended, and its size model: the next block's
  // search starts there.
  struct PcaRateHint {
    uint64_t calibration_id = 0;
    float rate_bits = 0;
    int code = 128;
    double model_ratio = 0;  // the blob's bytes over the size model's (0: unknown)
    double model_error = 0;  // the model's recent relative error within a block
    double model_bias = 0;   // and its recent relative error per code, signed
    int unchecked_blocks = 0;  // blocks since a fitting code's finer neighbour was last tried
  } pca_rate_hint_;
  uint64_t budget_trial_encodes_ = 0, budget_one_pass_encodes_ = 0, raw_fallbacks_ = 0;
  bool pca_one_pass_ = true;
};

// OK when the sink took the section (the Decoder then leaves its bytes of `out` alone).
using SectionSink = std::function<absl::Status(const SectionHandoff&)>;

struct DecodeOptions {
  bool verify_crc = true;  // false only for fuzzing the parsers behind the checksum
  // Quant and groupwise sections go to this sink instead of being reconstructed into `out`.
  SectionSink device_sections;
};

class Decoder {
 public:
  Decoder();
  ~Decoder();
  // Where pca blobs' calibrations are looked up; without it (or without the blob's id in it)
  // a pca blob is refused with NotFound.
  void set_calibrations(const CalibrationSet* set) { calibrations_ = set; }
  // `out` must hold exactly the blob's layout BlockBytes().
  absl::Status Decode(std::span<const uint8_t> blob, std::span<uint8_t> out,
                      DecodeOptions opts = {});

 private:
  struct Scratch;
  std::unique_ptr<Scratch> scratch_;
  const CalibrationSet* calibrations_ = nullptr;
};

// Header, codec parameters and section table of a blob, validated (CRC included).
struct BlobInfo {
  KvLayout layout;
  CodecParams params;
  std::vector<SectionEntry> sections;
  uint64_t blob_bytes = 0;
};
absl::StatusOr<BlobInfo> InspectBlob(std::span<const uint8_t> blob);

// The CPU path each part of the codec takes in this process, which sets its speed (the same
// mode runs 5-10x apart between cores with and without AMX or AVX512-BF16: docs/codec.md, "CPU
// kernels"): part "rans" (avx512, avx2, scalar), "pca_decode" and "pca_encode" (amx-int8,
// amx-bf16, avx512-vnni, avx512, avx2, float), "xl_products" (amx-bf16, avx512-bf16, avx2-fma,
// float). DescribeCpuKernels: the same as one line, "rans avx512, pca_decode ...".
struct CpuKernel {
  std::string part, kernel;
};
std::vector<CpuKernel> CpuKernels();
std::string DescribeCpuKernels();

// One-shot helpers.
absl::StatusOr<std::vector<uint8_t>> Encode(const KvLayout& layout, const CodecParams& params,
                                            std::span<const uint8_t> block);
absl::Status Decode(std::span<const uint8_t> blob, std::span<uint8_t> out);

}  // namespace strata::codec
