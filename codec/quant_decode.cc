// The decoder of lossy `quant` sections (format and encoder: quant.cc).
#include <algorithm>
#include <bit>
#include <cstring>

#include "codec/half.h"
#include "codec/internal/byte_io.h"
#include "codec/internal/kernels.h"
#include "codec/internal/low_bits.h"
#include "codec/internal/sections.h"
#include "common/status_macros.h"

namespace strata::codec::internal {

namespace {

// ---- DecodeQuant's steps ----------------------------------------------------------------------

// A section's fields in front of the symbols, checked; pointers into the payload.
struct QuantHeader {
  uint8_t axis = 0, flags = 0, ctx = 0;
  bool delta = false, had = false;
  size_t group = 0, ngroups = 0, nsteps = 0;
  uint16_t nout = 0;  // outlier channels
  const uint8_t* out_idx = nullptr;
  const uint8_t* out_vals = nullptr;
  const uint8_t* mu_p = nullptr;
  const uint8_t* a_p = nullptr;
  const uint8_t* st_p = nullptr;
};

absl::Status ReadQuantHeader(ByteReader& r, const TensorShape& s, uint8_t bits, QuantHeader* h) {
  const size_t T = s.tokens, C = s.channels();
  uint8_t b;
  uint16_t group16;
  STRATA_RETURN_IF_ERROR(r.Read(&b));
  STRATA_RETURN_IF_ERROR(r.Read(&h->axis));
  STRATA_RETURN_IF_ERROR(r.Read(&h->flags));
  STRATA_RETURN_IF_ERROR(r.Read(&h->ctx));
  STRATA_RETURN_IF_ERROR(r.Read(&group16));
  if (b != bits) return absl::DataLossError("quant section: bits disagree with the table");
  if (h->axis > 1) return absl::DataLossError("quant section: unknown axis");
  if (h->flags & ~(kFlagTokenDelta | kFlagHadamard | kFlagKeyOutliers))
    return absl::DataLossError("quant section: unknown flags");
  if (h->ctx == 0) return absl::DataLossError("quant section: no rANS contexts");
  h->delta = h->flags & kFlagTokenDelta;
  h->had = h->flags & kFlagHadamard;
  if (h->had && (s.head_dim & (s.head_dim - 1)) != 0)
    return absl::DataLossError("quant section: Hadamard flag with a non-power-of-two head_dim");
  h->group = C;
  if (h->axis == 1) {
    if (group16 == 0 || group16 > C) return absl::DataLossError("quant section: bad group");
    h->group = group16;
  } else if (group16 != 0) {
    return absl::DataLossError("quant section: group set on a per-channel section");
  }
  h->ngroups = (C + h->group - 1) / h->group;
  if (h->flags & kFlagKeyOutliers) {
    STRATA_RETURN_IF_ERROR(r.Read(&h->nout));
    if (h->nout > C) return absl::DataLossError("quant section: more outliers than channels");
    STRATA_RETURN_IF_ERROR(r.Take(size_t{h->nout} * 2, &h->out_idx));
    for (size_t i = 0; i < h->nout; ++i) {
      uint16_t c;
      std::memcpy(&c, h->out_idx + 2 * i, 2);
      if (c >= C) return absl::DataLossError("quant section: outlier channel out of range");
    }
    STRATA_RETURN_IF_ERROR(r.Take(T * h->nout * DTypeBytes(s.dtype), &h->out_vals));
  }
  STRATA_RETURN_IF_ERROR(r.Take(C * 2, &h->mu_p));
  if (h->delta) STRATA_RETURN_IF_ERROR(r.Take(C, &h->a_p));
  h->nsteps = h->axis == 0 ? C : T * h->ngroups;
  STRATA_RETURN_IF_ERROR(r.Take(h->nsteps * 2, &h->st_p));
  return absl::OkStatus();
}

// How the decoded symbols are to be read back into values.
struct QuantSymbols {
  bool narrow = false;  // in sc->syms8 (else sc->syms)
  int split_r = 0;      // split coder: the low bits per value, in sc->lo (else 0)
  int32_t offset = 0;   // the symbol of a zero residual (split: with the high part's base off)
  std::vector<uint64_t> keep;  // split with outliers: channels that keep low bits
};

// The split coder's symbols: the high part into sc->syms8, the low bits into sc->lo.
absl::Status DecodeSplitSymbols(ByteReader& r, const TensorShape& s, const QuantHeader& h,
                                uint8_t bits, SectionScratch* sc, rans::SharedDecoder* shared,
                                QuantSymbols* q) {
  const size_t T = s.tokens, C = s.channels(), n = s.values();
  const uint32_t alphabet = 4u << bits;
  uint8_t r8, hcoder;
  uint16_t base;
  STRATA_RETURN_IF_ERROR(r.Read(&r8));
  STRATA_RETURN_IF_ERROR(r.Read(&hcoder));
  STRATA_RETURN_IF_ERROR(r.Read(&base));
  if (r8 < 1 || r8 > 7 || r8 >= bits)
    return absl::DataLossError("quant section: split low bits out of range");
  const int hlanes = RansLanes(hcoder);
  if (hlanes == 0 && hcoder != kCoderShared)
    return absl::DataLossError("quant section: unknown high-part coder");
  if (hcoder == kCoderShared && !shared)
    return absl::DataLossError(
        "quant section: high part in a shared stream, but the blob has no stream section");
  if (base >= (alphabet >> r8)) return absl::DataLossError("quant section: split base too large");
  const uint32_t ahi = std::min<uint32_t>(256, (alphabet >> r8) - base);
  sc->syms8.resize(n);
  STRATA_RETURN_IF_ERROR(rans::Decode(r, n, ahi, h.ctx, &sc->rans, sc->syms8.data(), hlanes,
                                      hcoder == kCoderShared ? shared : nullptr));
  // Low bits: every value's, or all but the outlier channels' (see the layout above).
  size_t kept = C;
  if ((h.flags & kFlagKeyOutliers) && !h.had && h.nout > 0) {
    q->keep.assign((C + 63) / 64, 0);
    for (size_t c = 0; c < C; ++c) q->keep[c / 64] |= uint64_t{1} << (c % 64);
    for (size_t i = 0; i < h.nout; ++i) {
      uint16_t c;
      std::memcpy(&c, h.out_idx + 2 * i, 2);  // < C, checked above; duplicates count once
      q->keep[c / 64] &= ~(uint64_t{1} << (c % 64));
    }
    kept = 0;
    for (uint64_t k : q->keep) kept += static_cast<size_t>(std::popcount(k));
  }
  const size_t lo_values = T * kept;
  const uint8_t* packed;
  STRATA_RETURN_IF_ERROR(r.Take(LowBitsBytes(lo_values, r8), &packed));
  sc->lo.resize(lo_values + 64);  // + 64: ExpandLowBitsRow reads a whole vector
  if (!UnpackLowBits(packed, lo_values, r8, sc->lo.data()))
    return absl::DataLossError("quant section: nonzero padding after the low bits");
  q->split_r = r8;
  q->offset -= static_cast<int32_t>(base) << r8;
  q->narrow = true;
  return absl::OkStatus();
}

absl::Status DecodeQuantSymbols(ByteReader& r, const TensorShape& s, const QuantHeader& h,
                                uint8_t bits, uint8_t coder, SectionScratch* sc,
                                rans::SharedDecoder* shared, QuantSymbols* q) {
  const size_t n = s.values();
  const uint32_t alphabet = 4u << bits;
  q->offset = 1 << (bits + 1);
  // Alphabets up to 256 (bits <= 6) decode to bytes: half the symbol traffic.
  q->narrow = alphabet <= 256;
  q->split_r = 0;
  const int lanes = RansLanes(coder);
  if (coder == kCoderSplit) {
    STRATA_RETURN_IF_ERROR(DecodeSplitSymbols(r, s, h, bits, sc, shared, q));
  } else if (q->narrow) {
    sc->syms8.resize(n);
    STRATA_RETURN_IF_ERROR(
        rans::Decode(r, n, alphabet, h.ctx, &sc->rans, sc->syms8.data(), lanes, shared));
  } else {
    sc->syms.resize(n);
    STRATA_RETURN_IF_ERROR(rans::Decode(r, n, alphabet, h.ctx, &sc->rans, sc->syms.data(), lanes));
  }
  if (r.remaining() != 0) return absl::DataLossError("quant section: trailing bytes");
  return absl::OkStatus();
}

// The centres, predictor weights and steps into sc (steps of values: all of them in
// sc->steps16, the rows' own taken by DequantRows).
absl::Status LoadCentresAndSteps(const QuantHeader& h, size_t C, SectionScratch* sc) {
  sc->mu.resize(C);
  sc->a.assign(C, 0.0f);
  for (size_t c = 0; c < C; ++c) {
    uint16_t hv;
    std::memcpy(&hv, h.mu_p + 2 * c, 2);
    sc->mu[c] = HalfToFloat(hv);
    if (h.delta) {
      if (h.a_p[c] > 16) return absl::DataLossError("quant section: predictor weight above 1");
      sc->a[c] = static_cast<float>(h.a_p[c]) / 16.0f;
    }
  }
  sc->steps16.resize(h.nsteps);
  std::memcpy(sc->steps16.data(), h.st_p, h.nsteps * 2);
  sc->step.resize(C);
  if (h.axis == 0)
    for (size_t c = 0; c < C; ++c) sc->step[c] = HalfToFloat(sc->steps16[c]);
  return absl::OkStatus();
}

// Reconstructs every row into `out` (in the section's dtype).
void DequantRows(const TensorShape& s, const QuantHeader& h, const QuantSymbols& q,
                 SectionScratch* sc, uint8_t* out) {
  const size_t T = s.tokens, C = s.channels();
  const size_t group = h.group, ngroups = h.ngroups;
  const bool had = h.had;
  const int split_r = q.split_r;
  const bool narrow = q.narrow;
  const int32_t offset = q.offset;
  sc->xh.assign(sc->mu.begin(), sc->mu.end());
  sc->row.resize(C);
  const size_t out_row = C * DTypeBytes(s.dtype);
  // Split low bits, one C-value row per token: spread over their channels first where the
  // outlier channels kept none (those get 0).
  const uint8_t* lo_rows = split_r ? sc->lo.data() : nullptr;
  if (split_r && !q.keep.empty()) {
    sc->lo_row.resize(T * C + 64);  // + 64: ExpandLowBitsRow writes whole vectors
    size_t at = 0;
    for (size_t t = 0; t < T; ++t)
      at += ExpandLowBitsRow(sc->lo.data() + at, q.keep.data(), C, sc->lo_row.data() + t * C);
    lo_rows = sc->lo_row.data();
  }
  // fp16 output of byte symbols (every quant mode but bf16/fp32 output and 16-bit symbols): all
  // rows in one kernel call.
  const bool rows_at_once = s.dtype == DType::kFloat16 && narrow;
  if (rows_at_once)
    DequantRowsF16(sc->syms8.data(), lo_rows, split_r, sc->mu.data(), sc->a.data(), sc->step.data(),
                   sc->steps16.data(), h.axis == 1 ? group : 0, sc->xh.data(),
                   reinterpret_cast<uint16_t*>(out), T, C, offset, had ? s.head_dim : 0);
  for (size_t t = 0; t < (rows_at_once ? 0 : T); ++t) {
    size_t step_group = 0;
    if (h.axis == 1) {
      step_group = group;
      for (size_t g = 0; g < ngroups; ++g) sc->step[g] = HalfToFloat(sc->steps16[t * ngroups + g]);
    }
    // fp16 output: dequantise and convert (with :had, rotate each head vector) in one pass.
    uint16_t* out16 =
        s.dtype == DType::kFloat16 ? reinterpret_cast<uint16_t*>(out + t * out_row) : nullptr;
    const size_t had_dim = had ? s.head_dim : 0;
    if (split_r) {
      DequantRowSplitF16(sc->syms8.data() + t * C, lo_rows + t * C, split_r, sc->mu.data(),
                         sc->a.data(), sc->step.data(), step_group, sc->xh.data(), out16, C, offset,
                         had_dim);
    } else if (narrow)
      DequantRowF16(sc->syms8.data() + t * C, sc->mu.data(), sc->a.data(), sc->step.data(),
                    step_group, sc->xh.data(), out16, C, offset, had_dim);
    else
      DequantRowF16(sc->syms.data() + t * C, sc->mu.data(), sc->a.data(), sc->step.data(),
                    step_group, sc->xh.data(), out16, C, offset, had_dim);
    if (had && !out16) {
      std::memcpy(sc->row.data(), sc->xh.data(), C * 4);
      HadamardRowsSimd(sc->row.data(), s.heads, s.head_dim);
      FromFloat(sc->row.data(), s.dtype, out + t * out_row, C);
    } else if (!out16) {
      FromFloat(sc->xh.data(), s.dtype, out + t * out_row, C);
    }
  }
}

// The outlier channels' kept input values over what the rows wrote there.
void RestoreOutliers(const TensorShape& s, const QuantHeader& h, SectionScratch* sc, uint8_t* out) {
  const size_t T = s.tokens, eb = DTypeBytes(s.dtype), out_row = s.channels() * eb;
  const size_t nout = h.nout;
  std::vector<uint16_t>& idx = sc->steps16;  // free again: a copy of the channel indices
  idx.resize(nout);
  std::memcpy(idx.data(), h.out_idx, nout * 2);
  for (size_t t = 0; t < T; ++t) {
    uint8_t* row = out + t * out_row;
    const uint8_t* vals = h.out_vals + t * nout * eb;
    if (eb == 2) {  // a memcpy of a runtime size per value was ~4% of an `ol` decode
      for (size_t i = 0; i < nout; ++i) std::memcpy(row + idx[i] * 2, vals + i * 2, 2);
    } else {
      for (size_t i = 0; i < nout; ++i) std::memcpy(row + idx[i] * eb, vals + i * eb, eb);
    }
  }
}

}  // namespace

namespace {

// A section's header and symbols, the coder checked against the blob (both decoders start so).
absl::Status ReadQuantSection(std::span<const uint8_t> payload, const TensorShape& s,
                              uint8_t bits, uint8_t coder, SectionScratch* sc,
                              rans::SharedDecoder* shared, QuantHeader* h, QuantSymbols* q) {
  if (RansLanes(coder) == 0 && coder != kCoderSplit && coder != kCoderShared)
    return absl::DataLossError("quant section: unknown entropy coder");
  if (coder == kCoderShared && (bits > 6 || !shared))
    return absl::DataLossError(
        bits > 6 ? "quant section: shared-stream coder on a section of more than 6 bits"
                 : "quant section: shared-stream coder in a blob without a stream section");
  if (coder != kCoderShared && coder != kCoderSplit) shared = nullptr;
  ByteReader r(payload, "quant section");
  STRATA_RETURN_IF_ERROR(ReadQuantHeader(r, s, bits, h));
  return DecodeQuantSymbols(r, s, *h, bits, coder, sc, shared, q);
}

}  // namespace

absl::Status DecodeQuantHandoff(std::span<const uint8_t> payload, const TensorShape& s,
                                uint8_t bits, uint8_t coder, SectionScratch* sc,
                                rans::SharedDecoder* shared, SectionHandoff* out) {
  QuantHeader h;
  QuantSymbols q;
  STRATA_RETURN_IF_ERROR(ReadQuantSection(payload, s, bits, coder, sc, shared, &h, &q));
  if (h.delta)
    for (size_t c = 0; c < s.channels(); ++c)
      if (h.a_p[c] > 16) return absl::DataLossError("quant section: predictor weight above 1");
  // Every symbol widened to u16 with the zero residual at 2^(bits+1), the split coder's two
  // parts joined (outlier channels without low bits get 0 there, as DequantRows gives them).
  const size_t T = s.tokens, C = s.channels(), n = s.values();
  const int32_t shift = (1 << (bits + 1)) - q.offset;
  sc->syms.resize(n);
  uint16_t* syms = sc->syms.data();
  if (q.split_r) {
    const uint8_t* lo = sc->lo.data();
    if (!q.keep.empty()) {
      sc->lo_row.resize(T * C + 64);
      size_t at = 0;
      for (size_t t = 0; t < T; ++t)
        at += ExpandLowBitsRow(sc->lo.data() + at, q.keep.data(), C, sc->lo_row.data() + t * C);
      lo = sc->lo_row.data();
    }
    for (size_t i = 0; i < n; ++i)
      syms[i] = static_cast<uint16_t>(((int32_t{sc->syms8[i]} << q.split_r) | lo[i]) + shift);
  } else if (q.narrow) {
    for (size_t i = 0; i < n; ++i) syms[i] = static_cast<uint16_t>(sc->syms8[i] + shift);
  }
  sc->steps16.resize(h.nsteps);
  std::memcpy(sc->steps16.data(), h.st_p, h.nsteps * 2);
  // Copies: the payload's u16 fields need not be 2-byte aligned.
  sc->mu16.resize(C);
  std::memcpy(sc->mu16.data(), h.mu_p, C * 2);
  sc->out_idx.resize(h.nout);
  if (h.nout > 0) std::memcpy(sc->out_idx.data(), h.out_idx, size_t{h.nout} * 2);
  out->kind = SectionHandoff::Kind::kQuant;
  out->bits = bits;
  out->tokens = s.tokens;
  out->heads = s.heads;
  out->head_dim = s.head_dim;
  out->dtype = s.dtype;
  out->is_key = h.axis == 0;
  out->group = static_cast<uint16_t>(h.axis == 1 ? h.group : 0);
  out->hadamard = h.had;
  out->token_delta = h.delta;
  out->mu16 = sc->mu16;
  out->a16 = h.delta ? std::span<const uint8_t>(h.a_p, C) : std::span<const uint8_t>();
  out->steps16 = sc->steps16;
  out->syms = {syms, n};
  out->outlier_idx = sc->out_idx;
  out->outlier_vals = {h.out_vals, T * h.nout * DTypeBytes(s.dtype)};
  return absl::OkStatus();
}

absl::Status DecodeQuant(std::span<const uint8_t> payload, const TensorShape& s, uint8_t bits,
                         uint8_t coder, SectionScratch* sc, uint8_t* out,
                         rans::SharedDecoder* shared) {
  QuantHeader h;
  QuantSymbols q;
  STRATA_RETURN_IF_ERROR(ReadQuantSection(payload, s, bits, coder, sc, shared, &h, &q));
  STRATA_RETURN_IF_ERROR(LoadCentresAndSteps(h, s.channels(), sc));
  DequantRows(s, h, q, sc, out);
  if (h.nout > 0) RestoreOutliers(s, h, sc, out);
  return absl::OkStatus();
}

}  // namespace strata::codec::internal
