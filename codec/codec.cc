#include "codec/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "codec/cross_layer.h"
#include "codec/half.h"
#include "codec/internal/encoder_scratch.h"
#include "codec/internal/kernels.h"
#include "codec/internal/sections.h"
#include "codec/internal/size_model.h"
#include "common/status_macros.h"
#include "common/strings.h"

namespace strata::codec {

using internal::SectionScratch;
using internal::ShapeOf;
using internal::TensorShape;

std::string_view ModeName(Mode m) {
  switch (m) {
    case Mode::kRaw: return "raw";
    case Mode::kLossless: return "lossless";
    case Mode::kQuant: return "quant";
    case Mode::kGroupwise: return "groupwise";
    case Mode::kPca: return "pca";
    case Mode::kCrossLayer: return "xl";
  }
  return "unknown";
}

absl::Status CodecParams::Validate(const KvLayout& layout) const {
  STRATA_RETURN_IF_ERROR(layout.Validate());
  auto bits_ok = [](uint8_t b) { return b >= 2 && b <= 8; };
  // pca and xl alike: a calibration named (pca:bR, xl:sS or C alone ask for one still to be
  // made), an optional bit budget, no error target.
  auto calibrated = [&]() -> absl::Status {
    if (calibration_id == 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "codec: ", std::string(ModeName(mode)),
          " mode needs a calibration id (calibrate the namespace first)"));
    if (rate_bits != 0 && !(rate_bits > 0 && rate_bits <= 16))
      return absl::InvalidArgumentError(
          "codec: a bit budget (rate_bits) needs 0 < R <= 16 bits per value");
    if (error_target != 0)
      return absl::InvalidArgumentError("codec: an error target is a quant option");
    return absl::OkStatus();
  };
  if (pca_step_code != 0 && !UsesCalibration(mode))
    return absl::InvalidArgumentError("codec: a step scale is a pca or xl option");
  switch (mode) {
    case Mode::kRaw: return absl::OkStatus();
    case Mode::kLossless:
      if (layout.dtype != DType::kFloat16 && layout.dtype != DType::kBFloat16)
        return absl::InvalidArgumentError("codec: lossless mode needs fp16 or bf16 tensors");
      return absl::OkStatus();
    case Mode::kQuant:
    case Mode::kGroupwise: break;
    case Mode::kPca:
      if (layout.dtype == DType::kFloat8E4M3)
        return absl::InvalidArgumentError("codec: pca mode does not take fp8 tensors");
      if (layout.num_layers > 65535) return absl::InvalidArgumentError("codec: too many layers");
      return calibrated();
    case Mode::kCrossLayer:
      if (absl::Status s = CrossLayerLayoutSupported(layout); !s.ok())
        return absl::InvalidArgumentError(absl::StrCat("codec: ", s.message()));
      return calibrated();
    default: return absl::InvalidArgumentError("codec: unknown mode");
  }
  if (layout.dtype == DType::kFloat8E4M3)
    return absl::InvalidArgumentError("codec: quantising fp8 tensors is not supported");
  if (layout.num_layers > 65535) return absl::InvalidArgumentError("codec: too many layers");
  if (!bits_ok(key_bits) || !bits_ok(value_bits))
    return absl::InvalidArgumentError("codec: bits must be in 2..8");
  for (uint8_t b : layer_key_bits)
    if (!bits_ok(b)) return absl::InvalidArgumentError("codec: per-layer key bits must be 2..8");
  for (uint8_t b : layer_value_bits)
    if (!bits_ok(b)) return absl::InvalidArgumentError("codec: per-layer value bits must be 2..8");
  if (!layer_key_bits.empty() && layer_key_bits.size() != layout.num_layers)
    return absl::InvalidArgumentError("codec: per-layer key bits must name every layer");
  if (!layer_value_bits.empty() && layer_value_bits.size() != layout.num_layers)
    return absl::InvalidArgumentError("codec: per-layer value bits must name every layer");
  if (group_size == 0) return absl::InvalidArgumentError("codec: group_size must be > 0");
  if (rate_bits != 0 && (mode != Mode::kQuant || !(rate_bits > 0 && rate_bits <= 16)))
    return absl::InvalidArgumentError(
        "codec: a bit budget (rate_bits) is a quant or pca option, in (0, 16] bits per value");
  if (error_target != 0 && (mode != Mode::kQuant || !(error_target > 0 && error_target <= 1)))
    return absl::InvalidArgumentError(
        "codec: an error target is a quant option, a relative RMS error in (0, 1]");
  if (error_target != 0 && rate_bits != 0)
    return absl::InvalidArgumentError(
        "codec: a bit budget (rR) and an error target (eE) exclude each other");
  if (mode == Mode::kQuant) {
    if (hadamard && (layout.head_dim & (layout.head_dim - 1)) != 0)
      return absl::InvalidArgumentError("codec: Hadamard rotation needs a power-of-two head_dim");
    if (group_size > layout.ValuesPerTokenPerTensor())
      return absl::InvalidArgumentError("codec: quant group_size exceeds the channels per token");
  }
  return absl::OkStatus();
}

namespace {

// The calibrated modes' spec after the mode: `<ask>X` (a calibration still to be made, X in
// (0, ask_max], into *asked) or a 16 hex digit calibration id, then optionally `:rC` (a bit
// budget); or `rC` alone. False when the parts are none of these.
bool ParseCalibratedSpec(const std::vector<absl::string_view>& parts, char ask, float ask_max,
                         float* asked, CodecParams* p) {
  auto budget = [&](absl::string_view part) {
    float cap;
    if (!absl::StartsWith(part, "r") || !absl::SimpleAtof(part.substr(1), &cap) ||
        !(cap > 0 && cap <= 16))
      return false;
    p->rate_bits = cap;
    return true;
  };
  if (parts.size() == 2 && budget(parts[1])) return true;  // rC alone
  if (parts.size() < 2 || parts.size() > 3 || (parts.size() == 3 && !budget(parts[2])))
    return false;
  float x;
  if (!parts[1].empty() && parts[1][0] == ask && absl::SimpleAtof(parts[1].substr(1), &x) &&
      x > 0 && x <= ask_max) {
    *asked = x;
    return true;
  }
  return parts[1].size() == 16 && absl::SimpleHexAtoi(parts[1], &p->calibration_id) &&
         p->calibration_id != 0;
}

}  // namespace

absl::StatusOr<CodecParams> ParseCodecSpec(std::string_view spec_in) {
  absl::string_view spec = AsAbsl(spec_in);
  CodecParams p;
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("codec spec '", spec, "': ", why));
  };
  if (spec == "raw") return p;
  if (spec == "lossless") {
    p.mode = Mode::kLossless;
    return p;
  }
  if (absl::StartsWith(spec, "int")) {  // intN-gG
    std::vector<absl::string_view> parts = absl::StrSplit(spec.substr(3), "-g");
    uint32_t bits, group;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &bits) ||
        !absl::SimpleAtoi(parts[1], &group) || bits < 2 || bits > 8 || group == 0 || group > 65535)
      return bad("expected intN-gG with N in 2..8");
    p.mode = Mode::kGroupwise;
    p.key_bits = p.value_bits = static_cast<uint8_t>(bits);
    p.group_size = static_cast<uint16_t>(group);
    return p;
  }
  std::vector<absl::string_view> parts = absl::StrSplit(spec, ':');
  if (parts[0] == "pca") {
    p.mode = Mode::kPca;
    if (ParseCalibratedSpec(parts, 'b', 8, &p.pca_target_bits, &p)) return p;
    return bad(
        "expected pca:bR (R bits per value, 0 < R <= 8) or pca:<16 hex digit id>, then "
        "optionally :rC (at most C bits per value per block), or pca:rC alone");
  }
  if (parts[0] == "xl") {
    p.mode = Mode::kCrossLayer;
    if (ParseCalibratedSpec(parts, 's', 16, &p.xl_step, &p)) return p;
    return bad("expected xl:sS (step S in units of each head's rms, 0 < S <= 16) or xl:<16 hex "
               "digit id>, then optionally :rC (at most C bits per value per block), or xl:rC "
               "alone");
  }
  if (parts[0] != "quant")
    return bad("unknown mode (raw, lossless, intN-gG, quant:..., pca:..., xl:...)");
  p.mode = Mode::kQuant;
  for (size_t i = 1; i < parts.size(); ++i) {
    absl::string_view t = parts[i];
    uint32_t v;
    if (t == "had") {
      p.hadamard = true;
    } else if (t == "nodelta") {
      p.token_delta = false;
    } else if (t == "ol") {
      p.key_outliers = true;
    } else if (float r; absl::StartsWith(t, "r") && absl::SimpleAtof(t.substr(1), &r)) {
      if (!(r > 0 && r <= 16)) return bad("a bit budget rR needs 0 < R <= 16 bits per value");
      p.rate_bits = r;
    } else if (float e; absl::StartsWith(t, "e") && absl::SimpleAtof(t.substr(1), &e)) {
      if (!(e > 0 && e <= 1)) return bad("an error target eE needs 0 < E <= 1 (relative RMS)");
      p.error_target = e;
    } else if (absl::StartsWith(t, "g") && absl::SimpleAtoi(t.substr(1), &v) && v > 0 &&
               v < 65536) {
      p.group_size = static_cast<uint16_t>(v);
    } else if (t.size() == 4 && t[0] == 'k' && t[2] == 'v' && t[1] >= '2' && t[1] <= '8' &&
               t[3] >= '2' && t[3] <= '8') {
      p.key_bits = static_cast<uint8_t>(t[1] - '0');
      p.value_bits = static_cast<uint8_t>(t[3] - '0');
    } else {
      return bad(absl::StrCat("unknown option '", t, "'"));
    }
  }
  if (p.rate_bits > 0 && p.error_target > 0)
    return bad("a bit budget (rR) and an error target (eE) exclude each other");
  return p;
}

std::string CodecSpecString(const CodecParams& p) {
  switch (p.mode) {
    case Mode::kRaw: return "raw";
    case Mode::kLossless: return "lossless";
    case Mode::kGroupwise: return absl::StrCat("int", p.key_bits, "-g", p.group_size);
    case Mode::kPca:
      return absl::StrCat(
          "pca",
          p.calibration_id != 0   ? absl::StrCat(":", CalibrationIdString(p.calibration_id))
          : p.pca_target_bits > 0 ? absl::StrCat(":b", p.pca_target_bits)
                                  : "",
          p.rate_bits > 0 ? absl::StrCat(":r", p.rate_bits) : "");
    case Mode::kCrossLayer:
      return absl::StrCat(
          "xl",
          p.calibration_id != 0 ? absl::StrCat(":", CalibrationIdString(p.calibration_id))
          : p.xl_step > 0       ? absl::StrCat(":s", p.xl_step)
                                : "",
          p.rate_bits > 0 ? absl::StrCat(":r", p.rate_bits) : "");
    case Mode::kQuant: {
      std::string s = absl::StrCat("quant:k", p.key_bits, "v", p.value_bits);
      if (p.group_size != 64) absl::StrAppend(&s, ":g", p.group_size);
      if (p.hadamard) absl::StrAppend(&s, ":had");
      if (!p.token_delta) absl::StrAppend(&s, ":nodelta");
      if (p.key_outliers) absl::StrAppend(&s, ":ol");
      if (p.rate_bits > 0) absl::StrAppend(&s, ":r", p.rate_bits);
      if (p.error_target > 0) absl::StrAppend(&s, ":e", p.error_target);
      return s;
    }
  }
  return "unknown";
}

namespace internal {

void ToFloat(const uint8_t* in, DType dtype, float* out, size_t n) {
  switch (dtype) {
    case DType::kFloat16: HalfToFloatRow(reinterpret_cast<const uint16_t*>(in), out, n); break;
    case DType::kBFloat16: BF16ToFloatRow(reinterpret_cast<const uint16_t*>(in), out, n); break;
    case DType::kFloat32: std::memcpy(out, in, n * 4); break;
    default: std::memset(out, 0, n * 4);
  }
}

void FromFloat(const float* in, DType dtype, uint8_t* out, size_t n) {
  switch (dtype) {
    case DType::kFloat16: FloatToHalfRow(in, reinterpret_cast<uint16_t*>(out), n); break;
    case DType::kBFloat16: FloatToBF16Row(in, reinterpret_cast<uint16_t*>(out), n); break;
    case DType::kFloat32: std::memcpy(out, in, n * 4); break;
    default: break;
  }
}

void HadamardRows(float* x, size_t rows, size_t n) { HadamardRowsSimd(x, rows, n); }

}  // namespace internal

namespace {

// Coders whose symbols (the split coder: its high part) go to the blob's shared stream.
bool IsSharedCapable(uint8_t coder) {
  return coder == internal::kCoderShared || coder == internal::kCoderSplit;
}

SectionType SectionTypeOf(Mode m) { return static_cast<SectionType>(static_cast<uint8_t>(m)); }

}  // namespace

struct Decoder::Scratch {
  SectionScratch sec;
  rans::SharedDecoder shared;
};

Encoder::Encoder() : scratch_(std::make_unique<Scratch>()) {}
void Encoder::BeginPcaSearch() {
  scratch_->keep_projections = true;
  scratch_->kept_projections = false;
}
absl::Status Encoder::ProjectPcaBlock(const KvLayout& layout, const CodecParams& params,
                                      std::span<const uint8_t> block,
                                      std::vector<double>* spreads) {
  spreads->clear();
  std::shared_ptr<const Calibration> cal =
      calibrations_ ? calibrations_->Find(params.calibration_id) : nullptr;
  if (!cal || cal->ModeName() != ModeName(Mode::kPca) || !cal->Matches(layout).ok() ||
      params.first_position > UINT32_MAX)
    return absl::OkStatus();
  const uint32_t tensors = layout.TensorsPerLayer();
  const size_t tensor_bytes = layout.BlockBytes() / (size_t{layout.num_layers} * tensors);
  const size_t sections = size_t{layout.num_layers} * tensors;
  std::vector<internal::PcaProjection>& kept = scratch_->projections;
  if (kept.size() < sections) kept.resize(sections);
  // Each section's spreads are kept too: the next block's one-pass encode reads them
  // (codec/pca_rate_control.cc) once the search has set the history's ratio.
  internal::PcaBudgetHistory& history =
      scratch_->pca_histories.Start(params.calibration_id, params.rate_bits, layout, sections);
  history.spreads.assign(sections * internal::kSpreadBins, 0.0);
  std::vector<double>& one = scratch_->section_spreads;
  for (uint32_t l = 0; l < layout.num_layers; ++l) {
    for (uint32_t t = 0; t < tensors; ++t) {
      const TensorShape shape = ShapeOf(layout, t);
      const size_t index = size_t{l} * tensors + t;
      STRATA_RETURN_IF_ERROR(internal::ProjectPca(block.data() + index * tensor_bytes, shape,
                                                  *cal, l, t, params.first_position,
                                                  &scratch_->sec, &kept[index]));
      one.assign(internal::kSpreadBins, 0.0);
      internal::AddPcaSpreads(*cal, l, t, shape.tokens, params.first_position == 0,
                              kept[index], &one);
      std::copy(one.begin(), one.end(),
                history.spreads.begin() + static_cast<ptrdiff_t>(index * internal::kSpreadBins));
    }
  }
  spreads->assign(internal::kSpreadBins, 0.0);
  for (size_t i = 0; i < sections; ++i)
    for (int b = 0; b < internal::kSpreadBins; ++b)
      (*spreads)[b] += history.spreads[i * internal::kSpreadBins + b];
  scratch_->keep_projections = scratch_->kept_projections = true;
  return absl::OkStatus();
}
void Encoder::EndPcaSearch() {
  scratch_->keep_projections = scratch_->kept_projections = false;
  scratch_->xl_spreads = nullptr;
}
void Encoder::CollectXlSpreads(std::vector<double>* spreads) { scratch_->xl_spreads = spreads; }
Encoder::~Encoder() = default;
Decoder::Decoder() : scratch_(std::make_unique<Scratch>()) {}
Decoder::~Decoder() = default;

namespace {

// A groupwise payload from a device encoder, checked as DecodeGroupwise checks one.
absl::Status CheckGroupwisePayload(std::span<const uint8_t> payload,
                                   const internal::TensorShape& s, uint8_t bits, uint16_t group) {
  const size_t n = s.values(), ng = (n + group - 1) / group;
  uint16_t g = 0;
  if (payload.size() >= 3) std::memcpy(&g, payload.data() + 1, 2);
  if (payload.size() != 3 + ng * 4 + (n * bits + 7) / 8 || payload[0] != bits || g != group)
    return absl::InvalidArgumentError(
        "groupwise section from a device: payload disagrees with the section");
  if (!internal::GroupwiseParamsFinite(payload.data() + 3, ng))  // NaN: input not finite
    return absl::InvalidArgumentError("codec: groupwise mode needs finite values (use lossless)");
  return absl::OkStatus();
}

// What EncodeFromSections asks its source for.
SectionHandoff DescribeSection(const CodecParams& params, const internal::TensorShape& shape,
                               uint32_t layer, uint8_t bits, size_t offset, size_t bytes) {
  SectionHandoff h;
  h.kind = params.mode == Mode::kQuant ? SectionHandoff::Kind::kQuant
                                       : SectionHandoff::Kind::kGroupwise;
  h.layer = layer;
  h.is_key = shape.is_key;
  h.bits = bits;
  h.tokens = shape.tokens;
  h.heads = shape.heads;
  h.head_dim = shape.head_dim;
  h.dtype = shape.dtype;
  h.out_offset = offset;
  h.out_bytes = bytes;
  if (params.mode == Mode::kGroupwise)
    h.group = params.group_size;
  else if (!shape.is_key)
    h.group = static_cast<uint16_t>(std::min<size_t>(params.group_size, shape.channels()));
  h.hadamard = params.hadamard;
  h.token_delta = params.token_delta;
  h.key_outliers = params.key_outliers && shape.is_key;
  return h;
}

}  // namespace

absl::Status Encoder::Encode(const KvLayout& layout, const CodecParams& params,
                             std::span<const uint8_t> block, std::vector<uint8_t>* blob,
                             EncodeStats* stats) {
  EncodeStats coded;
  if (stats) coded.symbol_sink = stats->symbol_sink;
  STRATA_RETURN_IF_ERROR(
      EncodeImpl(layout, params, block, nullptr, blob, stats ? &coded : nullptr));
  // A block a calibrated mode codes into more bytes than it holds (values far from its
  // calibration's: noise, garbage a buggy engine published) is stored raw: exact, and smaller
  // (a budget's coarsest codes missed such blocks by up to 4x the block). quant and intN-gG
  // keep their blobs: their CUDA encoder (EncodeFromSections, the block on the device) writes
  // the same bytes as this one, and only their settings make them grow (groups of two values,
  // blocks of one token), whatever the values.
  if (UsesCalibration(params.mode) && blob->size() > RawBlobBytes(block.size())) {
    ++raw_fallbacks_;
    CodecParams raw;
    raw.mode = Mode::kRaw;
    return EncodeImpl(layout, raw, block, nullptr, blob, stats);
  }
  if (stats) stats->Add(coded);
  return absl::OkStatus();
}

absl::Status Encoder::EncodeFromSections(const KvLayout& layout, const CodecParams& params,
                                         const SectionSource& source, std::vector<uint8_t>* blob,
                                         EncodeStats* stats) {
  if (params.mode != Mode::kQuant && params.mode != Mode::kGroupwise)
    return absl::InvalidArgumentError(absl::StrCat(
        "codec: mode ", std::string(ModeName(params.mode)),
        " is not encoded from device sections (only quant and groupwise are)"));
  if (!source) return absl::InvalidArgumentError("codec: no section source");
  return EncodeImpl(layout, params, {}, &source, blob, stats);
}

absl::StatusOr<std::shared_ptr<const Calibration>> Encoder::CalibrationFor(
    const KvLayout& layout, const CodecParams& params, BlobHeader* h) const {
  std::shared_ptr<const Calibration> cal =
      calibrations_ ? calibrations_->Find(params.calibration_id) : nullptr;
  if (!cal)
    return absl::NotFoundError(absl::StrCat("codec: calibration ",
                                            CalibrationIdString(params.calibration_id),
                                            " is not known to this encoder"));
  if (cal->ModeName() != ModeName(params.mode))
    return absl::InvalidArgumentError(absl::StrCat(
        "codec: calibration ", CalibrationIdString(params.calibration_id), " is for mode ",
        std::string(cal->ModeName()), ", not ", std::string(ModeName(params.mode))));
  STRATA_RETURN_IF_ERROR(cal->Matches(layout));
  h->calibration_id = params.calibration_id;
  if (params.first_position > UINT32_MAX)
    return absl::InvalidArgumentError("codec: calibrated block position beyond 2^32");
  // Recorded with or without RoPE: a daemon that re-codes the blob (a cold codec) must know
  // whether it begins its sequence (position 0, whose first token is kept exact).
  h->first_position = static_cast<uint32_t>(params.first_position);
  h->flags = kFlagEntropy;
  return cal;
}

absl::Status Encoder::EncodeImpl(const KvLayout& layout, const CodecParams& params,
                                 std::span<const uint8_t> block, const SectionSource* source,
                                 std::vector<uint8_t>* blob, EncodeStats* stats) {
  STRATA_RETURN_IF_ERROR(params.Validate(layout));
  if (params.rate_bits > 0 && UsesCalibration(params.mode))
    return EncodeCalibratedWithinRate(layout, params, block, blob, stats);
  if (params.rate_bits > 0) return EncodeWithinRate(layout, params, block, source, blob, stats);
  if (params.error_target > 0)
    return EncodeWithinError(layout, params, block, source, blob, stats);
  if (!source && block.size() != layout.BlockBytes())
    return absl::InvalidArgumentError(absl::StrCat("codec: block has ", block.size(),
                                                   " bytes, layout needs ", layout.BlockBytes()));
  BlobHeader h;
  h.mode = static_cast<uint8_t>(params.mode);
  h.layout = layout;
  std::shared_ptr<const Calibration> cal;
  if (UsesCalibration(params.mode)) {
    STRATA_ASSIGN_OR_RETURN(cal, CalibrationFor(layout, params, &h));
  }
  if (params.mode == Mode::kQuant || params.mode == Mode::kGroupwise) {
    h.group_size = params.group_size;
    h.key_bits = params.key_bits;
    h.value_bits = params.value_bits;
  }
  if (params.mode == Mode::kQuant) {
    h.flags = kFlagEntropy | (params.hadamard ? kFlagHadamard : 0) |
              (params.token_delta ? kFlagTokenDelta : 0) |
              (params.key_outliers ? kFlagKeyOutliers : 0);
  } else if (params.mode == Mode::kLossless) {
    h.flags = kFlagEntropy;
  }
  rans::CoderStats coder;
  if (params.mode == Mode::kRaw) {
    BlobWriter w(blob, h, 1);
    SectionEntry e;
    e.type = SectionType::kRaw;
    w.BeginSection(e)->insert(blob->end(), block.begin(), block.end());
    w.EndSection();
    STRATA_RETURN_IF_ERROR(w.Finish());
  } else if (params.mode == Mode::kCrossLayer) {
    if (source) return absl::InternalError("codec: xl blocks are not encoded from sections");
    BlobWriter w(blob, h, 1);
    SectionEntry e;
    e.type = SectionType::kCrossLayer;
    e.bits = params.pca_step_code;  // the step scale's code, as a pca section's
    STRATA_RETURN_IF_ERROR(EncodeCrossLayer(*cal->cross_layer, layout, block,
                                            params.first_position, w.BeginSection(e), {},
                                            internal::PcaStepScale(e.bits),
                                            scratch_->xl_spreads));
    w.EndSection();
    STRATA_RETURN_IF_ERROR(w.Finish());
  } else {
    const uint32_t tensors = layout.TensorsPerLayer();
    // Quant sections of <= 6 bits (and the split coder's high parts) code their symbols into one
    // stream, the blob's last section.
    bool use_shared = params.mode == Mode::kPca;
    if (params.mode == Mode::kQuant)
      for (uint32_t l = 0; l < layout.num_layers; ++l)
        for (uint32_t t = 0; t < tensors; ++t)
          use_shared |= IsSharedCapable(
              internal::QuantCoder(t == 0 ? params.KeyBits(l) : params.ValueBits(l)));
    scratch_->shared.Reset();
    BlobWriter w(blob, h, layout.num_layers * tensors + (use_shared ? 1 : 0));
    const size_t tensor_bytes = layout.BlockBytes() / (size_t{layout.num_layers} * tensors);
    for (uint32_t l = 0; l < layout.num_layers; ++l) {
      for (uint32_t t = 0; t < tensors; ++t) {
        const TensorShape shape = ShapeOf(layout, t);
        const size_t offset = (size_t{l} * tensors + t) * tensor_bytes;
        const uint8_t* in = source ? nullptr : block.data() + offset;
        const uint8_t bits = t == 0 ? params.KeyBits(l) : params.ValueBits(l);
        if (source) {
          const SectionHandoff want = DescribeSection(params, shape, l, bits, offset, tensor_bytes);
          SectionArrays& arrays = scratch_->arrays;
          for (auto* v : {&arrays.mu16, &arrays.steps16, &arrays.syms, &arrays.outlier_idx})
            v->clear();
          for (auto* v : {&arrays.payload, &arrays.a16, &arrays.outlier_vals}) v->clear();
          STRATA_RETURN_IF_ERROR((*source)(want, &arrays));
        }
        SectionEntry e;
        e.type = SectionTypeOf(params.mode);
        e.layer = static_cast<uint16_t>(l);
        e.tensor = static_cast<uint8_t>(t);
        e.bits = params.mode == Mode::kLossless ? 0
                 : params.mode == Mode::kPca    ? params.pca_step_code
                                                : bits;
        const bool planes = params.mode == Mode::kLossless && layout.dtype == DType::kFloat16 &&
                            !internal::WriteBytePlanes();
        e.coder = params.mode == Mode::kGroupwise || params.mode == Mode::kPca ? 0
                  : planes                        ? internal::kCoderExpPlanes
                  : params.mode == Mode::kQuant   ? internal::QuantCoder(bits)
                                                  : internal::CoderWritten();
        std::vector<uint8_t>* out = w.BeginSection(e);
        switch (params.mode) {
          case Mode::kLossless:
            STRATA_RETURN_IF_ERROR(
                planes ? internal::EncodeLosslessPlanes(in, shape, &scratch_->sec, out, &coder)
                       : internal::EncodeLossless(in, shape, &scratch_->sec, out, &coder));
            break;
          case Mode::kQuant: {
            uint8_t written = e.coder;
            const bool last = l + 1 == layout.num_layers && t + 1 == tensors;
            scratch_->sec.prefetch = last || !in ? nullptr : in + tensor_bytes;
            scratch_->sec.prefetch_bytes = last || !in ? 0 : tensor_bytes;
            STRATA_RETURN_IF_ERROR(
                source ? internal::EncodeQuantArrays(scratch_->arrays, shape, bits, params,
                                                     &scratch_->sec, out, stats ? &coder : nullptr,
                                                     stats ? stats->symbol_sink : nullptr,
                                                     &written, &scratch_->shared)
                       : internal::EncodeQuant(in, shape, bits, params, &scratch_->sec, out,
                                               stats ? &coder : nullptr,  // a pass: on demand
                                               stats ? stats->symbol_sink : nullptr, &written,
                                               &scratch_->shared));
            if (written != e.coder) w.SetSectionCoder(written);
            break;
          }
          case Mode::kGroupwise:
            if (source) {
              const std::vector<uint8_t>& payload = scratch_->arrays.payload;
              STRATA_RETURN_IF_ERROR(
                  CheckGroupwisePayload(payload, shape, bits, params.group_size));
              out->insert(out->end(), payload.begin(), payload.end());
              break;
            }
            STRATA_RETURN_IF_ERROR(internal::EncodeGroupwise(in, shape, bits, params.group_size,
                                                             &scratch_->sec, out, &coder));
            break;
          case Mode::kPca: {
            const size_t index = scratch_->keep_projections ? size_t{l} * tensors + t : 0;
            std::vector<internal::PcaProjection>& kept = scratch_->projections;
            if (kept.size() <= index) kept.resize(size_t{layout.num_layers} * tensors);
            if (!scratch_->kept_projections)
              STRATA_RETURN_IF_ERROR(internal::ProjectPca(in, shape, *cal, l, t,
                                                          params.first_position, &scratch_->sec,
                                                          &kept[index]));
            STRATA_RETURN_IF_ERROR(internal::EncodePca(
                in, shape, *cal, l, t, params.first_position, internal::PcaStepScale(e.bits),
                kept[index], &scratch_->sec, out, stats ? &coder : nullptr, &scratch_->shared));
            break;
          }
          default: return absl::InternalError("codec: unreachable mode");
        }
        w.EndSection();
      }
    }
    if (use_shared) {
      SectionEntry e;
      e.type = SectionType::kStream;
      e.coder = internal::kCoderRans128;
      rans::FinishShared(&scratch_->shared, w.BeginSection(e), stats ? &coder : nullptr);
      w.EndSection();
    }
    STRATA_RETURN_IF_ERROR(w.Finish());
  }
  if (stats) {
    stats->coder.Add(coder);
    stats->values += layout.BlockBytes() / DTypeBytes(layout.dtype);
    stats->blob_bytes += blob->size();
  }
  return absl::OkStatus();
}

namespace {

absl::Status CheckSections(const BlobView& v) {
  const BlobHeader& h = v.header;
  const Mode mode = static_cast<Mode>(h.mode);
  if (mode == Mode::kRaw) {
    if (v.sections.size() != 1 || v.sections[0].type != SectionType::kRaw ||
        v.sections[0].size != h.decoded_bytes)
      return absl::DataLossError("blob: a raw blob holds one section of the block's size");
    return absl::OkStatus();
  }
  if (mode == Mode::kCrossLayer) {
    const SectionEntry* s = v.sections.size() == 1 ? &v.sections[0] : nullptr;
    if (!s || s->type != SectionType::kCrossLayer || s->layer != 0 || s->tensor != 0 ||
        s->coder != 0)
      return absl::DataLossError("blob: an xl blob holds one cross-layer section");
    if (h.layout.dtype == DType::kFloat8E4M3)
      return absl::DataLossError("blob: quantised fp8 blob");
    return absl::OkStatus();
  }
  if (mode != Mode::kLossless && mode != Mode::kQuant && mode != Mode::kGroupwise &&
      mode != Mode::kPca)
    return absl::DataLossError(absl::StrCat("blob: unknown mode ", h.mode));
  if ((mode == Mode::kLossless) && h.layout.dtype != DType::kFloat16 &&
      h.layout.dtype != DType::kBFloat16)
    return absl::DataLossError("blob: lossless blob of a dtype it cannot hold");
  if (mode != Mode::kLossless && h.layout.dtype == DType::kFloat8E4M3)
    return absl::DataLossError("blob: quantised fp8 blob");
  const uint32_t tensors = h.layout.TensorsPerLayer();
  const uint64_t tensor_sections = uint64_t{h.layout.num_layers} * tensors;
  if (v.sections.size() == tensor_sections + 1) {
    const SectionEntry& s = v.sections.back();
    if ((mode != Mode::kQuant && mode != Mode::kPca) || s.type != SectionType::kStream)
      return absl::DataLossError("blob: section count disagrees with the layout");
    if (s.layer != 0 || s.tensor != 0 || s.bits != 0 || s.coder != internal::kCoderRans128)
      return absl::DataLossError("blob: malformed stream section");
  } else if (v.sections.size() != tensor_sections) {
    return absl::DataLossError("blob: section count disagrees with the layout");
  }
  for (size_t i = 0; i < tensor_sections; ++i) {
    const SectionEntry& s = v.sections[i];
    if (s.layer != i / tensors || s.tensor != i % tensors ||
        s.type != static_cast<SectionType>(h.mode))
      return absl::DataLossError(absl::StrCat("blob: section ", i, " is out of order"));
    if (mode == Mode::kPca && s.coder != 0)  // its bits are the step scale's code
      return absl::DataLossError(absl::StrCat("blob: pca section ", i, " has a coder"));
    if (mode != Mode::kLossless && mode != Mode::kPca && (s.bits < 2 || s.bits > 8))
      return absl::DataLossError(absl::StrCat("blob: section ", i, " has ", s.bits, " bits"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// A groupwise section's payload for a device decoder, its header checked as DecodeGroupwise does.
absl::Status GroupwiseHandoff(std::span<const uint8_t> payload, const internal::TensorShape& s,
                              uint8_t bits, SectionHandoff* h) {
  if (payload.size() < 3) return absl::DataLossError("groupwise section: truncated");
  uint16_t group;
  std::memcpy(&group, payload.data() + 1, 2);
  if (payload[0] != bits) return absl::DataLossError("groupwise section: bits disagree");
  if (group == 0) return absl::DataLossError("groupwise section: zero group size");
  const size_t n = s.values(), ng = (n + group - 1) / group;
  if (payload.size() != 3 + ng * 4 + (n * bits + 7) / 8)
    return absl::DataLossError("groupwise section: payload size disagrees with its header");
  if (!internal::GroupwiseParamsFinite(payload.data() + 3, ng))
    return absl::DataLossError("groupwise section: a scale or zero is not finite");
  h->kind = SectionHandoff::Kind::kGroupwise;
  h->bits = bits;
  h->group = group;
  h->tokens = s.tokens;
  h->heads = s.heads;
  h->head_dim = s.head_dim;
  h->dtype = s.dtype;
  h->payload = payload;
  return absl::OkStatus();
}

absl::Status HandOff(const DecodeOptions& opts, const SectionEntry& e, size_t offset,
                     size_t bytes, SectionHandoff& h) {
  h.layer = e.layer;
  h.out_offset = offset;
  h.out_bytes = bytes;
  return opts.device_sections(h);
}

}  // namespace

absl::Status Decoder::Decode(std::span<const uint8_t> blob, std::span<uint8_t> out,
                             DecodeOptions opts) {
  ParseOptions po;
  po.verify_crc = opts.verify_crc;
  STRATA_ASSIGN_OR_RETURN(BlobView v, ParseBlob(blob, po));
  STRATA_RETURN_IF_ERROR(CheckSections(v));
  const KvLayout& layout = v.header.layout;
  if (out.size() != layout.BlockBytes())
    return absl::InvalidArgumentError(absl::StrCat(
        "codec: output holds ", out.size(), " bytes, blob decodes to ", layout.BlockBytes()));
  const Mode mode = static_cast<Mode>(v.header.mode);
  std::shared_ptr<const Calibration> cal;
  if (UsesCalibration(mode)) {
    if (calibrations_) cal = calibrations_->Find(v.header.calibration_id);
    if (!cal)
      return absl::NotFoundError(absl::StrCat(
          "codec: blob needs calibration ", CalibrationIdString(v.header.calibration_id),
          ", which this decoder does not hold (fetch the namespace's calibrations)"));
    if (cal->ModeName() != ModeName(mode))
      return absl::DataLossError(absl::StrCat(
          "blob: a ", std::string(ModeName(mode)), " blob names calibration ",
          CalibrationIdString(v.header.calibration_id), ", which is for mode ",
          std::string(cal->ModeName())));
    if (absl::Status st = cal->Matches(layout); !st.ok())
      return absl::DataLossError(absl::StrCat("blob: ", st.message()));
  }
  if (mode == Mode::kRaw) {
    std::memcpy(out.data(), v.Payload(v.sections[0]).data(), out.size());
    return absl::OkStatus();
  }
  if (mode == Mode::kCrossLayer)  // on the CPU, device sections or not (they are quant's)
    return DecodeCrossLayer(*cal->cross_layer, layout, v.Payload(v.sections[0]),
                            v.header.first_position, out,
                            internal::PcaStepScale(v.sections[0].bits), opts.verify_crc);
  const uint32_t tensors = layout.TensorsPerLayer();
  const size_t tensor_bytes = layout.BlockBytes() / (size_t{layout.num_layers} * tensors);
  // With a shared stream (the last section) the sections are decoded last to first: the stream
  // is read from the states the encoder ended with, after the first section.
  size_t count = v.sections.size();
  rans::SharedDecoder* shared = nullptr;
  if (!v.sections.empty() && v.sections.back().type == SectionType::kStream) {
    shared = &scratch_->shared;
    STRATA_RETURN_IF_ERROR(rans::StartShared(v.Payload(v.sections.back()), shared));
    --count;
  }
  for (size_t i = count; i-- > 0;) {
    const SectionEntry& s = v.sections[i];
    const TensorShape shape = ShapeOf(layout, s.tensor);
    uint8_t* dst = out.data() + (size_t{s.layer} * tensors + s.tensor) * tensor_bytes;
    absl::Status st;
    switch (mode) {
      case Mode::kLossless:
        st = internal::DecodeLossless(v.Payload(s), shape, s.coder, &scratch_->sec, dst);
        break;
      case Mode::kQuant:
        if (opts.device_sections) {
          SectionHandoff h;
          st = internal::DecodeQuantHandoff(v.Payload(s), shape, s.bits, s.coder, &scratch_->sec,
                                            shared, &h);
          if (st.ok()) st = HandOff(opts, s, dst - out.data(), tensor_bytes, h);
          break;
        }
        st = internal::DecodeQuant(v.Payload(s), shape, s.bits, s.coder, &scratch_->sec, dst,
                                   shared);
        break;
      case Mode::kGroupwise:
        if (opts.device_sections) {
          SectionHandoff h;
          st = GroupwiseHandoff(v.Payload(s), shape, s.bits, &h);
          if (st.ok()) st = HandOff(opts, s, dst - out.data(), tensor_bytes, h);
          break;
        }
        st = internal::DecodeGroupwise(v.Payload(s), shape, s.bits, &scratch_->sec, dst);
        break;
      case Mode::kPca:
        st = internal::DecodePca(v.Payload(s), shape, *cal, s.layer, s.tensor,
                                 v.header.first_position, internal::PcaStepScale(s.bits),
                                 &scratch_->sec, dst, shared);
        break;
      default: st = absl::InternalError("codec: unreachable mode");
    }
    if (!st.ok())
      return absl::Status(
          st.code(), absl::StrCat("layer ", s.layer, s.tensor ? " V: " : " K: ", st.message()));
  }
  if (shared) return rans::FinishShared(*shared);
  return absl::OkStatus();
}

absl::StatusOr<BlobInfo> InspectBlob(std::span<const uint8_t> blob) {
  STRATA_ASSIGN_OR_RETURN(BlobView v, ParseBlob(blob));
  STRATA_RETURN_IF_ERROR(CheckSections(v));
  BlobInfo info;
  info.layout = v.header.layout;
  info.blob_bytes = blob.size();
  info.sections = v.sections;
  CodecParams& p = info.params;
  p.mode = static_cast<Mode>(v.header.mode);
  p.calibration_id = v.header.calibration_id;
  p.first_position = v.header.first_position;
  if (p.mode == Mode::kQuant || p.mode == Mode::kGroupwise) {
    p.key_bits = v.header.key_bits;
    p.value_bits = v.header.value_bits;
    p.group_size = v.header.group_size;
    p.hadamard = v.header.flags & kFlagHadamard;
    p.token_delta = v.header.flags & kFlagTokenDelta;
    p.key_outliers = v.header.flags & kFlagKeyOutliers;
    bool per_layer = false;
    for (const SectionEntry& s : v.sections)
      per_layer |=
          s.type != SectionType::kStream && s.bits != (s.tensor == 0 ? p.key_bits : p.value_bits);
    if (per_layer) {
      const uint32_t tensors = info.layout.TensorsPerLayer();
      p.layer_key_bits.assign(info.layout.num_layers, p.key_bits);
      p.layer_value_bits.assign(info.layout.num_layers, p.value_bits);
      for (const SectionEntry& s : v.sections)
        if (s.type != SectionType::kStream)
          (s.tensor == 0 ? p.layer_key_bits : p.layer_value_bits)[s.layer] = s.bits;
      if (tensors == 1) p.layer_value_bits.clear();
    }
  }
  return info;
}

absl::StatusOr<std::vector<uint8_t>> Encode(const KvLayout& layout, const CodecParams& params,
                                            std::span<const uint8_t> block) {
  Encoder e;
  std::vector<uint8_t> blob;
  STRATA_RETURN_IF_ERROR(e.Encode(layout, params, block, &blob));
  return blob;
}

absl::Status Decode(std::span<const uint8_t> blob, std::span<uint8_t> out) {
  Decoder d;
  return d.Decode(blob, out);
}

}  // namespace strata::codec
