// Codec mode xl's calibration as a namespace artefact (codec/cross_layer.h): its serialization,
// parsed with every check before anything is allocated for it, and the layouts it can code.
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/calibration.h"
#include "codec/cross_layer.h"
#include "codec/internal/byte_io.h"
#include "codec/internal/cross_layer_amx.h"
#include "codec/internal/cross_layer_layout.h"
#include "codec/rans.h"
#include "common/crc32c.h"
#include "common/status_macros.h"

namespace strata::codec {

using internal::ByteReader;
using internal::ByteWriter;

namespace {

// The fewest bytes an artefact of this geometry takes (header, scales, per layer the coded
// count and mean, every predictor, no coded coordinate, the CRC), without overflow.
using Wide = unsigned __int128;
Wide MinBytes(uint64_t layers, uint64_t heads, uint64_t dim) {
  const Wide w = Wide{2} * heads * dim;
  return 44 + Wide{layers} * 2 * heads * 4 + Wide{layers} * (4 + w * 4) +
         (layers > 0 ? layers - 1 : 0) * w * w * 4;
}

bool AllFiniteFloats(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

}  // namespace

std::vector<uint8_t> CrossLayerCalibration::Serialize() const {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.U32(kCrossLayerMagic);
  w.U16(kCrossLayerFormat);
  w.U16(0);
  w.U32(version);
  w.U32(num_layers);
  w.U32(num_kv_heads);
  w.U32(head_dim);
  w.Raw(&rope_theta, 4);
  w.Raw(&step, 4);
  w.Raw(&sample_bits, 4);
  w.Raw(scale.data(), scale.size() * 4);
  for (const CrossLayerTransform& tr : layers) {
    w.U32(static_cast<uint32_t>(tr.step.size()));
    for (const std::vector<float>* v : {&tr.mean, &tr.predictor, &tr.axes, &tr.step})
      w.Raw(v->data(), v->size() * 4);
  }
  w.U32(Crc32c(out.data(), out.size()));
  return out;
}

absl::StatusOr<CrossLayerCalibration> CrossLayerCalibration::Parse(std::span<const uint8_t> bytes) {
  auto bad = [](const std::string& why) {
    return absl::DataLossError(absl::StrCat("cross-layer calibration: ", why));
  };
  if (bytes.size() < 44) return bad("truncated");
  const size_t body = bytes.size() - 4;
  uint32_t crc;
  std::memcpy(&crc, bytes.data() + body, 4);
  if (crc != Crc32c(bytes.data(), body)) return bad("CRC32C mismatch");
  ByteReader r(bytes.data(), body, "cross-layer calibration");
  uint32_t magic = 0;
  uint16_t format = 0, reserved = 0;
  CrossLayerCalibration c;
  STRATA_RETURN_IF_ERROR(r.Read(&magic));
  STRATA_RETURN_IF_ERROR(r.Read(&format));
  STRATA_RETURN_IF_ERROR(r.Read(&reserved));
  if (magic != kCrossLayerMagic) return bad("bad magic");
  if (format != kCrossLayerFormat) return bad(absl::StrCat("unknown format ", format));
  if (reserved != 0) return bad("reserved field set");
  STRATA_RETURN_IF_ERROR(r.Read(&c.version));
  STRATA_RETURN_IF_ERROR(r.Read(&c.num_layers));
  STRATA_RETURN_IF_ERROR(r.Read(&c.num_kv_heads));
  STRATA_RETURN_IF_ERROR(r.Read(&c.head_dim));
  STRATA_RETURN_IF_ERROR(r.Read(&c.rope_theta));
  STRATA_RETURN_IF_ERROR(r.Read(&c.step));
  STRATA_RETURN_IF_ERROR(r.Read(&c.sample_bits));
  if (!(c.step > 0) || !std::isfinite(c.step) || !(c.sample_bits >= 0) ||
      !std::isfinite(c.sample_bits))
    return bad("step or sample bits out of range");
  // Every float takes 4 bytes: a geometry the artefact's size cannot hold (every predictor and
  // mean, no coordinate coded) is refused before anything is allocated for it.
  const uint64_t w = uint64_t{2} * c.num_kv_heads * c.head_dim;
  if (c.num_layers == 0 || w == 0 || w > 65536 ||
      MinBytes(c.num_layers, c.num_kv_heads, c.head_dim) > bytes.size())
    return bad("geometry disagrees with the size");
  if (!std::isfinite(c.rope_theta) || !(c.rope_theta == 0 || c.rope_theta >= 1))
    return bad("bad rope_theta");
  auto floats = [&](std::vector<float>* v, size_t n) -> absl::Status {
    const uint8_t* p;
    STRATA_RETURN_IF_ERROR(r.Take(n * 4, &p));
    v->resize(n);
    if (n > 0) std::memcpy(v->data(), p, n * 4);
    return absl::OkStatus();
  };
  STRATA_RETURN_IF_ERROR(floats(&c.scale, size_t{c.num_layers} * 2 * c.num_kv_heads));
  for (float x : c.scale)
    if (!(x > 0) || !std::isfinite(x)) return bad("a scale is not positive and finite");
  c.layers.resize(c.num_layers);
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    CrossLayerTransform& tr = c.layers[l];
    uint32_t n = 0;
    STRATA_RETURN_IF_ERROR(r.Read(&n));
    if (n > w) return bad(absl::StrCat("layer ", l, " codes more coordinates than its width"));
    STRATA_RETURN_IF_ERROR(floats(&tr.mean, w));
    STRATA_RETURN_IF_ERROR(floats(&tr.predictor, l > 0 ? w * w : 0));
    STRATA_RETURN_IF_ERROR(floats(&tr.axes, size_t{n} * w));
    STRATA_RETURN_IF_ERROR(floats(&tr.step, n));
    if (!AllFiniteFloats(tr.mean) || !AllFiniteFloats(tr.predictor) || !AllFiniteFloats(tr.axes))
      return bad(absl::StrCat("layer ", l, " holds a non-finite value"));
    for (float st : tr.step)
      if (!(st > 0) || !std::isfinite(st)) return bad(absl::StrCat("layer ", l, " step"));
  }
  if (r.remaining() != 0) return bad("trailing bytes");
  internal::BuildCrossLayerTiles(&c);
  return c;
}

uint64_t CrossLayerCalibration::Id() const { return CalibrationIdOf(Serialize()); }

uint64_t CrossLayerCalibration::MinSerializedBytes(const KvLayout& l) {
  const Wide n = MinBytes(l.num_layers, l.num_kv_heads, l.head_dim);
  return n > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(n);
}

namespace internal {

absl::Status CrossLayerLayoutFits(const KvLayout& l, uint32_t layers, uint32_t heads,
                                  uint32_t dim, float rope_theta) {
  STRATA_RETURN_IF_ERROR(l.Validate());
  if (l.kind != KvKind::kSeparateKV)
    return absl::InvalidArgumentError("cross-layer coding needs separate K and V tensors");
  if (l.dtype != DType::kFloat16 && l.dtype != DType::kBFloat16 && l.dtype != DType::kFloat32)
    return absl::InvalidArgumentError(
        absl::StrCat("cross-layer coding takes fp16, bf16 or fp32 "
                     "blocks, not ",
                     std::string(DTypeName(l.dtype))));
  if (l.num_layers != layers || l.num_kv_heads != heads || l.head_dim != dim)
    return absl::InvalidArgumentError(absl::StrCat(
        "cross-layer calibration is for ", layers, " layers x ", heads, " heads x ", dim,
        ", the block is ", l.num_layers, " x ", l.num_kv_heads, " x ", l.head_dim));
  if (l.tokens_per_block % rans::kCtxRun != 0 || l.tokens_per_block > 65535)
    return absl::InvalidArgumentError(absl::StrCat(
        "cross-layer coding needs tokens per block a multiple of 16 (at most 65520), not ",
        l.tokens_per_block));
  if (rope_theta > 0 && dim % 2 != 0)
    return absl::InvalidArgumentError("cross-layer coding: RoPE needs an even head_dim");
  return absl::OkStatus();
}

}  // namespace internal

absl::Status CrossLayerLayoutSupported(const KvLayout& l) {
  STRATA_RETURN_IF_ERROR(internal::CrossLayerLayoutFits(l, l.num_layers, l.num_kv_heads, l.head_dim, 0));
  if (const uint64_t floor = CrossLayerCalibration::MinSerializedBytes(l);
      floor > kMaxCalibrationArtefactBytes)
    return absl::InvalidArgumentError(absl::StrCat(
        "an xl calibration for ", l.num_layers, " layers of ", 2 * uint64_t{l.num_kv_heads},
        " x ", l.head_dim, " values takes at least ", floor >> 20,
        " MiB (a predictor of (2 x kv heads x head_dim)^2 floats per layer), over the ",
        kMaxCalibrationArtefactBytes >> 20, " MiB a daemon stores; use a pca policy"));
  return absl::OkStatus();
}

absl::Status CrossLayerCalibration::Matches(const KvLayout& l) const {
  STRATA_RETURN_IF_ERROR(
      internal::CrossLayerLayoutFits(l, num_layers, num_kv_heads, head_dim, rope_theta));
  const size_t w = Width();
  bool ok = layers.size() == num_layers && scale.size() == size_t{num_layers} * 2 * num_kv_heads;
  for (size_t i = 0; ok && i < layers.size(); ++i) {
    const CrossLayerTransform& tr = layers[i];
    ok = tr.mean.size() == w && tr.predictor.size() == (i > 0 ? w * w : 0) && tr.step.size() <= w &&
         tr.axes.size() == tr.step.size() * w;
  }
  if (!ok) return absl::InvalidArgumentError("cross-layer calibration: malformed");
  return absl::OkStatus();
}

}  // namespace strata::codec
