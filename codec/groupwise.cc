// Plain group-wise intN sections, the baseline every lossy mode is compared with: groups of G
// consecutive values (along the channels of a token), asymmetric min/max with fp16 scale and
// zero per group, codes bit-packed LSB first. No transform, no entropy coding.
//
// Payload: u8 bits, u16 group, fp16 scale[ngroups], fp16 zero[ngroups], packed codes.
// Input that is not finite is refused, as every lossy mode refuses it: a NaN would round to an
// undefined code and an infinity stretch its group's scale over every other value.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "codec/half.h"
#include "codec/internal/byte_io.h"
#include "codec/internal/sections.h"
#include "common/status_macros.h"

namespace strata::codec::internal {

bool GroupwiseParamsFinite(const uint8_t* scales, size_t groups) {
  for (size_t i = 0; i < 2 * groups; ++i) {
    uint16_t h;
    std::memcpy(&h, scales + 2 * i, 2);
    if ((h & 0x7C00) == 0x7C00) return false;
  }
  return true;
}

absl::Status EncodeGroupwise(const uint8_t* in, const TensorShape& s, uint8_t bits, uint16_t group,
                             SectionScratch* sc, std::vector<uint8_t>* out,
                             rans::CoderStats* stats) {
  const size_t n = s.values();
  const size_t ng = (n + group - 1) / group;
  const int levels = (1 << bits) - 1;
  sc->f.resize(n);
  ToFloat(in, s.dtype, sc->f.data(), n);
  ByteWriter w(out);
  w.U8(bits);
  w.U16(group);
  const size_t scale_at = w.Skip(ng * 4);
  const size_t packed_bytes = (n * bits + 7) / 8;
  const size_t codes_at = w.Skip(packed_bytes + 8);  // +8: the packer's last 64-bit store
  uint8_t* scales = out->data() + scale_at;
  uint8_t* zeros = scales + ng * 2;
  uint8_t* codes = out->data() + codes_at;
  std::vector<uint8_t>& q8 = sc->lo;
  q8.resize(n);
  for (size_t g = 0; g < ng; ++g) {
    const size_t i0 = g * group, i1 = std::min(n, i0 + group);
    float lo = sc->f[i0], hi = sc->f[i0];
    bool finite = std::isfinite(lo);
    for (size_t i = i0 + 1; i < i1; ++i) {
      lo = std::min(lo, sc->f[i]);
      hi = std::max(hi, sc->f[i]);
      finite &= std::isfinite(sc->f[i]);
    }
    if (!finite)
      return absl::InvalidArgumentError(
          "codec: groupwise mode needs finite values (use lossless)");
    float st = (hi - lo) / static_cast<float>(levels);
    if (!(st >= 6.103515625e-05f)) st = 6.103515625e-05f;
    const uint16_t st16 = FloatToHalf(std::min(st, 65504.0f));
    const uint16_t z16 = FloatToHalf(lo);
    std::memcpy(scales + 2 * g, &st16, 2);
    std::memcpy(zeros + 2 * g, &z16, 2);
    const float stf = HalfToFloat(st16), zf = HalfToFloat(z16), inv = 1.0f / stf;
    for (size_t i = i0; i < i1; ++i) {
      float q = std::nearbyint((sc->f[i] - zf) * inv);
      q = std::clamp(q, 0.0f, static_cast<float>(levels));
      q8[i] = static_cast<uint8_t>(q);
    }
  }
  // Pack.
  uint64_t acc = 0;
  int nbits = 0;
  uint8_t* dst = codes;
  for (size_t i = 0; i < n; ++i) {
    acc |= uint64_t{q8[i]} << nbits;
    nbits += bits;
    if (nbits >= 32) {
      std::memcpy(dst, &acc, 4);
      dst += 4;
      acc >>= 32;
      nbits -= 32;
    }
  }
  std::memcpy(dst, &acc, 8);
  out->resize(codes_at + packed_bytes);
  if (stats) {
    stats->entropy_bits += rans::EmpiricalEntropyBits(q8.data(), n, 256, 1);
    stats->stream_bits += packed_bytes * 8;
    stats->symbols += n;
  }
  return absl::OkStatus();
}

absl::Status DecodeGroupwise(std::span<const uint8_t> payload, const TensorShape& s, uint8_t bits,
                             SectionScratch* sc, uint8_t* out) {
  const size_t n = s.values();
  ByteReader r(payload, "groupwise section");
  uint8_t b;
  uint16_t group;
  STRATA_RETURN_IF_ERROR(r.Read(&b));
  STRATA_RETURN_IF_ERROR(r.Read(&group));
  if (b != bits) return absl::DataLossError("groupwise section: bits disagree with the table");
  if (group == 0) return absl::DataLossError("groupwise section: zero group size");
  const size_t ng = (n + group - 1) / group;
  const uint8_t* scales;
  const uint8_t* codes;
  STRATA_RETURN_IF_ERROR(r.Take(ng * 4, &scales));
  const uint8_t* zeros = scales + ng * 2;
  const size_t packed_bytes = (n * bits + 7) / 8;
  STRATA_RETURN_IF_ERROR(r.Take(packed_bytes, &codes));
  if (r.remaining() != 0) return absl::DataLossError("groupwise section: trailing bytes");
  if (!GroupwiseParamsFinite(scales, ng))
    return absl::DataLossError("groupwise section: a scale or zero is not finite");
  sc->f.resize(n);
  const uint32_t mask = (1u << bits) - 1;
  size_t bitpos = 0;
  for (size_t g = 0; g < ng; ++g) {
    uint16_t st16, z16;
    std::memcpy(&st16, scales + 2 * g, 2);
    std::memcpy(&z16, zeros + 2 * g, 2);
    const float st = HalfToFloat(st16), z = HalfToFloat(z16);
    const size_t i0 = g * group, i1 = std::min(n, i0 + group);
    for (size_t i = i0; i < i1; ++i, bitpos += bits) {
      // Read up to 16 bits starting at bitpos without running past the packed bytes.
      const size_t byte = bitpos >> 3;
      uint32_t v = codes[byte];
      if (byte + 1 < packed_bytes) v |= uint32_t{codes[byte + 1]} << 8;
      const uint32_t q = (v >> (bitpos & 7)) & mask;
      sc->f[i] = z + static_cast<float>(q) * st;
    }
  }
  FromFloat(sc->f.data(), s.dtype, out, n);
  return absl::OkStatus();
}

}  // namespace strata::codec::internal
