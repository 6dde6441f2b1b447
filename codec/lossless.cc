// Lossless fp16/bf16 sections: byte-plane split.
//
// Payload:
//   u8 contexts of the high plane
//   u8 high-plane mode: 0 stored, 1 rANS
//   high bytes                          sign, exponent and top mantissa bits: skewed, coded
//   u8 low-plane mode: 0 stored, 1 rANS (one context)
//   low bytes                           mostly mantissa noise: coded only when that pays
#include <cstring>

#include "codec/internal/byte_io.h"
#include "codec/internal/kernels.h"
#include "codec/internal/sections.h"
#include "common/status_macros.h"

namespace strata::codec::internal {
namespace {
// Code the low plane when its entropy is under this many bits per byte (else store it).
constexpr double kLowPlaneCodeBelow = 7.85;
}  // namespace

absl::Status EncodeLossless(const uint8_t* in, const TensorShape& s, SectionScratch* sc,
                            std::vector<uint8_t>* out, rans::CoderStats* stats) {
  const size_t n = s.values();
  sc->lo.resize(n);
  sc->hi.resize(n);
  SplitBytes(reinterpret_cast<const uint16_t*>(in), sc->lo.data(), sc->hi.data(), n);
  const uint32_t ctx = NumChannelContexts(s);
  ByteWriter w(out);
  w.U8(static_cast<uint8_t>(ctx));
  const size_t mode_at = w.Skip(1);
  rans::CoderStats hi_stats;
  rans::Encode(sc->hi.data(), n, 256, ctx, &sc->rans, out, &hi_stats, RansLanes(kCoderWritten));
  if (out->size() - mode_at - 1 >= n) {  // incompressible: store
    out->resize(mode_at + 1);
    (*out)[mode_at] = 0;
    w.Raw(sc->hi.data(), n);
    hi_stats.stream_bits = 8 * n;
    hi_stats.table_bits = 0;
  } else {
    (*out)[mode_at] = 1;
  }
  if (stats) stats->Add(hi_stats);
  const double lo_entropy = rans::EmpiricalEntropyBits(sc->lo.data(), n, 256, 1);
  if (n > 0 && lo_entropy < kLowPlaneCodeBelow * static_cast<double>(n)) {
    w.U8(1);
    rans::Encode(sc->lo.data(), n, 256, 1, &sc->rans, out, stats, RansLanes(kCoderWritten));
  } else {
    w.U8(0);
    w.Raw(sc->lo.data(), n);
    if (stats) {
      stats->entropy_bits += lo_entropy;
      stats->stream_bits += 8 * n;
      stats->symbols += n;
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeLossless(std::span<const uint8_t> payload, const TensorShape& s,
                            uint8_t coder, SectionScratch* sc, uint8_t* out) {
  const size_t n = s.values();
  const int lanes = RansLanes(coder);
  if (lanes == 0) return absl::DataLossError("lossless section: unknown entropy coder");
  ByteReader r(payload, "lossless section");
  uint8_t ctx, hi_mode, lo_mode;
  RETURN_IF_ERROR(r.Read(&ctx));
  RETURN_IF_ERROR(r.Read(&hi_mode));
  if (ctx == 0) return absl::DataLossError("lossless section: no rANS contexts");
  sc->hi.resize(n);
  sc->lo.resize(n);
  const uint8_t* hi = sc->hi.data();
  if (hi_mode == 0) {
    RETURN_IF_ERROR(r.Take(n, &hi));
  } else if (hi_mode == 1) {
    RETURN_IF_ERROR(rans::Decode(r, n, 256, ctx, &sc->rans, sc->hi.data(), lanes));
  } else {
    return absl::DataLossError("lossless section: unknown high-plane mode");
  }
  RETURN_IF_ERROR(r.Read(&lo_mode));
  const uint8_t* lo = nullptr;
  if (lo_mode == 0) {
    RETURN_IF_ERROR(r.Take(n, &lo));
  } else if (lo_mode == 1) {
    RETURN_IF_ERROR(rans::Decode(r, n, 256, 1, &sc->rans, sc->lo.data(), lanes));
    lo = sc->lo.data();
  } else {
    return absl::DataLossError("lossless section: unknown low-plane mode");
  }
  if (r.remaining() != 0) return absl::DataLossError("lossless section: trailing bytes");
  MergeBytes(lo, hi, reinterpret_cast<uint16_t*>(out), n);
  return absl::OkStatus();
}

}  // namespace strata::codec::internal
