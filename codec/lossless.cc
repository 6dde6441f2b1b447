// Lossless fp16/bf16 sections: byte-plane split.
//
// Payload:
//   u8 contexts of the high plane
//   u8 high-plane mode: 0 stored, 1 rANS
//   high bytes                          sign, exponent and top mantissa bits: skewed, coded
//   u8 low-plane mode: 0 stored, 1 rANS (one context)
//   low bytes                           mostly mantissa noise: coded only when that pays
//                                       (order-0 entropy, estimated on a 1/8 sample, < 7.85 bits)
#include <cmath>
#include <cstring>

#include "codec/internal/byte_io.h"
#include "codec/internal/kernels.h"
#include "codec/internal/sections.h"
#include "common/status_macros.h"

namespace strata::codec::internal {
namespace {
// Code the low plane when its entropy is under this many bits per byte (else store it).
constexpr double kLowPlaneCodeBelow = 7.85;

// Order-0 entropy in bits per byte, estimated from every 8th 256-byte chunk (all of it when
// short). Only steers the store-or-code decision, so a sample is enough and is deterministic.
double SampledEntropyPerByte(const uint8_t* p, size_t n) {
  uint32_t h[4][256] = {};
  size_t used = 0;
  const size_t chunk = 256, stride = n >= 64 * 2048 ? 2048 : chunk;
  for (size_t at = 0; at + chunk <= n; at += stride, used += chunk)
    for (size_t i = 0; i < chunk; i += 4) {
      ++h[0][p[at + i]];
      ++h[1][p[at + i + 1]];
      ++h[2][p[at + i + 2]];
      ++h[3][p[at + i + 3]];
    }
  for (size_t i = (n / chunk) * chunk; stride == chunk && i < n; ++i, ++used) ++h[0][p[i]];
  if (used == 0) return 0;
  double bits = 0;
  for (int b = 0; b < 256; ++b) {
    const uint32_t c = h[0][b] + h[1][b] + h[2][b] + h[3][b];
    if (c) bits += c * std::log2(static_cast<double>(used) / c);
  }
  return bits / static_cast<double>(used);
}
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
  if (n > 0 && SampledEntropyPerByte(sc->lo.data(), n) < kLowPlaneCodeBelow) {
    w.U8(1);
    rans::Encode(sc->lo.data(), n, 256, 1, &sc->rans, out, stats, RansLanes(kCoderWritten));
  } else {
    w.U8(0);
    w.Raw(sc->lo.data(), n);
    if (stats) {
      stats->entropy_bits += rans::EmpiricalEntropyBits(sc->lo.data(), n, 256, 1);
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
