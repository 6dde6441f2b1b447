// Lossless fp16/bf16 sections: byte-plane split.
//
// Payload:
//   u8 contexts of the high plane
//   u8 high-plane mode: 0 stored, 1 rANS
//   high bytes                          sign, exponent and top mantissa bits: skewed, coded
//   u8 low-plane mode: 0 stored, 1 rANS (one context)
//   low bytes                           mostly mantissa noise: coded only when that pays
//                                       (order-0 entropy, estimated on a 1/8 sample, < 7.85 bits)
#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12 warns about its own AVX-512 headers (undefined upper halves it then overwrites).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "codec/internal/byte_io.h"
#include "codec/internal/kernels.h"
#include "codec/internal/sections.h"
#include "common/status_macros.h"

namespace strata::codec::internal {
namespace {
bool g_planes_force_scalar = false;
bool g_write_byte_planes = false;
uint8_t g_coder_written = 0;
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
  rans::Encode(sc->hi.data(), n, 256, ctx, &sc->rans, out, &hi_stats, RansLanes(CoderWritten()));
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
    rans::Encode(sc->lo.data(), n, 256, 1, &sc->rans, out, stats, RansLanes(CoderWritten()));
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

absl::Status DecodeLossless(std::span<const uint8_t> payload, const TensorShape& s, uint8_t coder,
                            SectionScratch* sc, uint8_t* out) {
  if (coder == kCoderExpPlanes) return DecodeLosslessPlanes(payload, s, sc, out);
  const size_t n = s.values();
  const int lanes = RansLanes(coder);
  if (lanes == 0) return absl::DataLossError("lossless section: unknown entropy coder");
  ByteReader r(payload, "lossless section");
  uint8_t ctx, hi_mode, lo_mode;
  STRATA_RETURN_IF_ERROR(r.Read(&ctx));
  STRATA_RETURN_IF_ERROR(r.Read(&hi_mode));
  if (ctx == 0) return absl::DataLossError("lossless section: no rANS contexts");
  sc->hi.resize(n);
  sc->lo.resize(n);
  const uint8_t* hi = sc->hi.data();
  if (hi_mode == 0) {
    STRATA_RETURN_IF_ERROR(r.Take(n, &hi));
  } else if (hi_mode == 1) {
    STRATA_RETURN_IF_ERROR(rans::Decode(r, n, 256, ctx, &sc->rans, sc->hi.data(), lanes));
  } else {
    return absl::DataLossError("lossless section: unknown high-plane mode");
  }
  STRATA_RETURN_IF_ERROR(r.Read(&lo_mode));
  const uint8_t* lo = nullptr;
  if (lo_mode == 0) {
    STRATA_RETURN_IF_ERROR(r.Take(n, &lo));
  } else if (lo_mode == 1) {
    STRATA_RETURN_IF_ERROR(rans::Decode(r, n, 256, 1, &sc->rans, sc->lo.data(), lanes));
    lo = sc->lo.data();
  } else {
    return absl::DataLossError("lossless section: unknown low-plane mode");
  }
  if (r.remaining() != 0) return absl::DataLossError("lossless section: trailing bytes");
  MergeBytes(lo, hi, reinterpret_cast<uint16_t*>(out), n);
  return absl::OkStatus();
}

// ---- Coder 3: fp16 exponent planes (fast lossless layout) -------------------------------------
//
// Payload:
//   u32 records_bytes
//   records: one per group of 32 consecutive fp16 values (n / 32 of them):
//     u8  emax | w << 5       largest exponent field of the group; w = code width, 0..5
//     u32 sign mask           bit i = sign of value i
//     u32 mantissa bit 9 mask, u32 mantissa bit 8 mask
//     w x u32                 plane b: bit b of code_i, code_i = min(emax - exp_i, 2^w - 1)
//     32 bytes                low mantissa bytes
//   tail: (n % 32) values, raw little-endian fp16
//   exceptions: one byte per escaped value (code_i == 2^w - 1), its exponent field, in value
//               order; the payload ends with them.
// w is chosen per group to minimise 32 w + 8 * escapes. Everything is fixed-width bit planes,
// so both directions are a few AVX-512 mask instructions per 64 input bytes.
namespace {
constexpr int kPG = 32;
// A group record at its widest: emax|w byte, sign, two mantissa-bit masks, five code planes,
// 32 low mantissa bytes.
constexpr size_t kMaxRecord = 13 + 5 * 4 + kPG;

// Scalar/SIMD-shared width choice: escapes[w] = values with code >= 2^w - 1.
inline int ChooseWidth(const int* esc) {
  int best = 0, best_cost = 8 * esc[0];
  for (int w = 1; w <= 5; ++w) {
    const int cost = kPG * w + 8 * esc[w];
    if (cost < best_cost) best = w, best_cost = cost;
  }
  return best;
}

// `col` (column mode): the base exponent of each of the 32 values; nullptr: the group's max.
size_t EncodeGroupScalar(const uint16_t* v, const uint8_t* col, uint8_t* rec,
                         std::vector<uint8_t>* exc) {
  int e[kPG], base[kPG], emax = 0;
  for (int i = 0; i < kPG; ++i) {
    e[i] = (v[i] >> 10) & 31;
    emax = std::max(emax, e[i]);
  }
  for (int i = 0; i < kPG; ++i) base[i] = col ? col[i] : emax;
  if (col) emax = 0;
  int esc[6] = {};
  for (int i = 0; i < kPG; ++i)
    for (int w = 0; w <= 5; ++w) esc[w] += base[i] - e[i] >= (1 << w) - 1;
  const int w = ChooseWidth(esc);
  const int lim = (1 << w) - 1;
  uint32_t sign = 0, m9 = 0, m8 = 0, planes[5] = {};
  for (int i = 0; i < kPG; ++i) {
    sign |= uint32_t(v[i] >> 15) << i;
    m9 |= uint32_t{(v[i] >> 9) & 1u} << i;
    m8 |= uint32_t{(v[i] >> 8) & 1u} << i;
    const int code = std::min(base[i] - e[i], lim);
    for (int b = 0; b < w; ++b) planes[b] |= uint32_t((code >> b) & 1) << i;
    if (code == lim) exc->push_back(static_cast<uint8_t>(e[i]));
  }
  rec[0] = static_cast<uint8_t>(emax | w << 5);
  std::memcpy(rec + 1, &sign, 4);
  std::memcpy(rec + 5, &m9, 4);
  std::memcpy(rec + 9, &m8, 4);
  std::memcpy(rec + 13, planes, 4 * w);
  uint8_t* lo = rec + 13 + 4 * w;
  for (int i = 0; i < kPG; ++i) lo[i] = static_cast<uint8_t>(v[i]);
  return 13 + 4 * w + kPG;
}

// Decodes one record; returns its size or 0 when malformed. *exc advances past the exceptions.
size_t DecodeGroupScalar(const uint8_t* rec, size_t avail, const uint8_t* col, const uint8_t** exc,
                         const uint8_t* exc_end, uint16_t* v) {
  if (avail < 13 + kPG) return 0;
  const int emax = rec[0] & 31, w = rec[0] >> 5;
  if (w > 5 || avail < size_t(13 + 4 * w + kPG) || (col && emax != 0)) return 0;
  const int lim = (1 << w) - 1;
  uint32_t sign, m9, m8, planes[5];
  std::memcpy(&sign, rec + 1, 4);
  std::memcpy(&m9, rec + 5, 4);
  std::memcpy(&m8, rec + 9, 4);
  std::memcpy(planes, rec + 13, 4 * w);
  const uint8_t* lo = rec + 13 + 4 * w;
  for (int i = 0; i < kPG; ++i) {
    int code = 0;
    for (int b = 0; b < w; ++b) code |= int((planes[b] >> i) & 1) << b;
    int e;
    if (code == lim) {
      if (*exc >= exc_end || **exc > 31) return 0;
      e = *(*exc)++;
    } else {
      const int base = col ? col[i] : emax;
      if (code > base) return 0;
      e = base - code;
    }
    v[i] = static_cast<uint16_t>(((sign >> i) & 1) << 15 | e << 10 | ((m9 >> i) & 1) << 9 |
                                 ((m8 >> i) & 1) << 8 | lo[i]);
  }
  return 13 + 4 * w + kPG;
}

#if defined(__x86_64__)
#define STRATA_PLANES_SIMD 1
bool PlanesSimd() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") &&
                         __builtin_cpu_supports("avx512vbmi2") && __builtin_cpu_supports("bmi2");
  return ok && !g_planes_force_scalar;
}
#define STRATA_PLANES_FN \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi2,popcnt,bmi2")))

// Largest exponent field of each of the C channels over the rows (C % 32 == 0).
STRATA_PLANES_FN void ColumnMaxAvx512(const uint16_t* in, size_t rows, size_t C, uint8_t* col) {
  const __m512i emask = _mm512_set1_epi16(0x7C00);
  for (size_t k = 0; k < C; k += kPG) {
    __m512i m = _mm512_setzero_si512();
    for (size_t t = 0; t < rows; ++t)
      m = _mm512_max_epu16(m, _mm512_and_si512(_mm512_loadu_si512(in + t * C + k), emask));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(col + k),
                        _mm512_cvtepi16_epi8(_mm512_srli_epi16(m, 10)));
  }
}

// Groups g0 .. g0 + groups - 1 of the tensor `in`; exceptions appended at exc + *exc_n.
STRATA_PLANES_FN size_t EncodeGroupsAvx512(const uint16_t* in, size_t g0, size_t groups,
                                           const uint8_t* col, size_t C, uint8_t* out, uint8_t* exc,
                                           size_t* exc_n) {
  uint8_t* o = out;
  uint8_t* x = exc + *exc_n;
  in += g0 * kPG;
  size_t co = col ? (g0 * kPG) % C : 0;  // column mode: channel offset of the group, (g * 32) % C
  const __m512i emask = _mm512_set1_epi16(0x7C00);
  for (size_t g = 0; g < groups; ++g) {
    const __m512i v = _mm512_loadu_si512(in + g * kPG);
    const __m512i ef = _mm512_and_si512(v, emask);
    // Horizontal max of the exponent field.
    __m256i m = _mm256_max_epu16(_mm512_castsi512_si256(ef), _mm512_extracti64x4_epi64(ef, 1));
    __m128i m1 = _mm_max_epu16(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    m1 = _mm_max_epu16(m1, _mm_shuffle_epi32(m1, 0x4E));
    m1 = _mm_max_epu16(m1, _mm_shuffle_epi32(m1, 0xB1));
    m1 = _mm_max_epu16(m1, _mm_srli_epi32(m1, 16));
    int emax = (_mm_cvtsi128_si32(m1) & 0x7C00) >> 10;
    const __m512i e = _mm512_srli_epi16(ef, 10);
    __m512i base = _mm512_set1_epi16(static_cast<int16_t>(emax));
    if (col) {
      base = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + co)));
      emax = 0;
      co = co + kPG == C ? 0 : co + kPG;  // no division per group
    }
    const __m512i d = _mm512_sub_epi16(base, e);
    // Escapes at each width, then the width of least cost (ChooseWidth, without branches).
    const int e1 = _mm_popcnt_u32(_mm512_cmpge_epu16_mask(d, _mm512_set1_epi16(1)));
    const int e2 = _mm_popcnt_u32(_mm512_cmpge_epu16_mask(d, _mm512_set1_epi16(3)));
    const int e3 = _mm_popcnt_u32(_mm512_cmpge_epu16_mask(d, _mm512_set1_epi16(7)));
    const int e4 = _mm_popcnt_u32(_mm512_cmpge_epu16_mask(d, _mm512_set1_epi16(15)));
    const int e5 = _mm_popcnt_u32(_mm512_cmpge_epu16_mask(d, _mm512_set1_epi16(31)));
    int w = 0, cost = 8 * kPG, c;
    c = kPG * 1 + 8 * e1;
    w = c < cost ? 1 : w;
    cost = c < cost ? c : cost;
    c = kPG * 2 + 8 * e2;
    w = c < cost ? 2 : w;
    cost = c < cost ? c : cost;
    c = kPG * 3 + 8 * e3;
    w = c < cost ? 3 : w;
    cost = c < cost ? c : cost;
    c = kPG * 4 + 8 * e4;
    w = c < cost ? 4 : w;
    cost = c < cost ? c : cost;
    c = kPG * 5 + 8 * e5;
    w = c < cost ? 5 : w;
    const __m512i lim = _mm512_set1_epi16(static_cast<int16_t>((1 << w) - 1));
    const __m512i code = _mm512_min_epu16(d, lim);
    o[0] = static_cast<uint8_t>(emax | w << 5);
    const uint32_t sign = _mm512_movepi16_mask(v);
    const uint32_t m9 = _mm512_test_epi16_mask(v, _mm512_set1_epi16(0x200));
    const uint32_t m8 = _mm512_test_epi16_mask(v, _mm512_set1_epi16(0x100));
    // All five planes are stored (the buffer has room for the widest record); the next field
    // overwrites the unused ones.
    std::memcpy(o + 1, &sign, 4);
    std::memcpy(o + 5, &m9, 4);
    std::memcpy(o + 9, &m8, 4);
    // Each plane stored on its own (an array copied in one 20-byte memcpy went through the
    // stack: five narrow stores, then wider loads that cannot be forwarded from them).
    for (int b = 0; b < 5; ++b) {
      const uint32_t pl =
          _mm512_test_epi16_mask(code, _mm512_set1_epi16(static_cast<int16_t>(1 << b)));
      std::memcpy(o + 13 + 4 * b, &pl, 4);
    }
    o += 13 + 4 * w;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm512_cvtepi16_epi8(v));
    o += kPG;
    const __mmask32 em = _mm512_cmpeq_epi16_mask(code, lim);
    // Compress in a register and store all 32 bytes (memory-destination vpcompressb is
    // microcoded and slow on Zen 4); the exception buffer has 64 bytes of slack.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(x),
                        _mm256_maskz_compress_epi8(em, _mm512_cvtepi16_epi8(e)));
    x += _mm_popcnt_u32(em);
  }
  *exc_n = static_cast<size_t>(x - exc);
  return static_cast<size_t>(o - out);
}

// Returns the bytes of records consumed, or SIZE_MAX when malformed.
STRATA_PLANES_FN size_t DecodeGroupsAvx512(const uint8_t* rec, size_t avail, size_t groups,
                                           const uint8_t* col, size_t C, const uint8_t** exc,
                                           const uint8_t* exc_end, uint16_t* out) {
  const uint8_t* p = rec;
  const uint8_t* end = rec + avail;
  const uint8_t* x = *exc;
  const __m512i k31 = _mm512_set1_epi16(31);
  size_t co = 0;  // column mode: channel offset of group g, (g * 32) % C
  for (size_t g = 0; g < groups; ++g) {
    if (end - p < 13 + kPG) return SIZE_MAX;
    const int emax = p[0] & 31, w = p[0] >> 5;
    if (w > 5 || end - p < 13 + 4 * w + kPG || (col && emax != 0)) return SIZE_MAX;
    uint32_t sign, m9, m8;
    std::memcpy(&sign, p + 1, 4);
    std::memcpy(&m9, p + 5, 4);
    std::memcpy(&m8, p + 9, 4);
    __m512i code = _mm512_setzero_si512();
    const uint8_t* q = p + 13;
    for (int b = 0; b < w; ++b, q += 4) {
      uint32_t pl;
      std::memcpy(&pl, q, 4);
      code = _mm512_mask_add_epi16(code, pl, code, _mm512_set1_epi16(static_cast<int16_t>(1 << b)));
    }
    const __m512i lim = _mm512_set1_epi16(static_cast<int16_t>((1 << w) - 1));
    const __m512i vmax =
        col ? _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + co)))
            : _mm512_set1_epi16(static_cast<int16_t>(emax));
    if (col) co = co + kPG == C ? 0 : co + kPG;
    const __mmask32 em = _mm512_cmpeq_epi16_mask(code, lim);
    if (_mm512_mask_cmpgt_epu16_mask(~em, code, vmax)) return SIZE_MAX;
    __m512i e = _mm512_sub_epi16(vmax, code);
    if (em) {
      const size_t k = _mm_popcnt_u32(em);
      if (static_cast<size_t>(exc_end - x) < k) return SIZE_MAX;
      const size_t left = static_cast<size_t>(exc_end - x);
      const __m256i raw =
          left >= 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))
                     : _mm256_maskz_loadu_epi8(_bzhi_u32(~0u, static_cast<uint32_t>(left)), x);
      const __m512i xe = _mm512_cvtepu8_epi16(_mm256_maskz_expand_epi8(em, raw));
      if (_mm512_mask_cmpgt_epu16_mask(em, xe, k31)) return SIZE_MAX;
      e = _mm512_mask_mov_epi16(e, em, xe);
      x += k;
    }
    __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
    v = _mm512_or_si512(v, _mm512_slli_epi16(e, 10));
    v = _mm512_mask_add_epi16(v, sign, v, _mm512_set1_epi16(static_cast<int16_t>(0x8000)));
    v = _mm512_mask_add_epi16(v, m9, v, _mm512_set1_epi16(0x200));
    v = _mm512_mask_add_epi16(v, m8, v, _mm512_set1_epi16(0x100));
    _mm512_storeu_si512(out + g * kPG, v);
    p = q + kPG;
  }
  *exc = x;
  return static_cast<size_t>(p - rec);
}
#endif
}  // namespace

void ForceScalarPlanesForTesting(bool on) { g_planes_force_scalar = on; }
uint8_t CoderWritten() { return g_coder_written ? g_coder_written : kCoderWritten; }
uint8_t QuantCoder(uint8_t bits) {
  if (g_coder_written) return g_coder_written;
  return bits >= 7 ? kCoderSplit : kCoderShared;
}
void SetCoderWrittenForTesting(uint8_t coder) { g_coder_written = coder; }
void WriteBytePlanesForTesting(bool on) { g_write_byte_planes = on; }
bool WriteBytePlanes() { return g_write_byte_planes; }

absl::Status EncodeLosslessPlanes(const uint8_t* in, const TensorShape& s, SectionScratch* sc,
                                  std::vector<uint8_t>* out, rans::CoderStats* stats) {
  if (s.dtype != DType::kFloat16) return absl::InternalError("lossless planes: fp16 only");
  const size_t n = s.values(), groups = n / kPG, tail = n % kPG;
  const uint16_t* v = reinterpret_cast<const uint16_t*>(in);
  const size_t C = s.channels();
  ByteWriter w(out);
  // Keys: exponents relative to their channel's largest (per-channel scales, outlier channels);
  // values (per-token scales) and odd widths: relative to the group's largest.
  const bool column = s.is_key && C % kPG == 0 && s.tokens > 0;
  w.U8(column ? 1 : 0);
  const uint8_t* col = nullptr;
  if (column) {
    const size_t col_at = w.Skip(C + 32);  // +32: slack for the 32-byte loads, trimmed below
    uint8_t* cp = out->data() + col_at;
#ifdef STRATA_PLANES_SIMD
    if (PlanesSimd()) {
      ColumnMaxAvx512(v, s.tokens, C, cp);
    } else
#endif
    {
      std::memset(cp, 0, C);
      for (size_t t = 0; t < s.tokens; ++t)
        for (size_t c = 0; c < C; ++c)
          cp[c] = std::max<uint8_t>(cp[c], static_cast<uint8_t>((v[t * C + c] >> 10) & 31));
    }
    sc->mu.resize((C + 3) / 4 + 8);  // a stable copy: `out` may move below
    std::memcpy(sc->mu.data(), cp, C);
    col = reinterpret_cast<const uint8_t*>(sc->mu.data());
    out->resize(col_at + C);
  }
  const size_t len_at = w.Skip(4);
  sc->lo.resize(n + 64);  // exceptions: at most one byte per value
  size_t rec_bytes = 0, exc_n = 0;
  const size_t rec_at = out->size();
#ifdef STRATA_PLANES_SIMD
  if (PlanesSimd()) {
    // Batches of groups, each given its worst-case room and trimmed after: room for the whole
    // section at once (2 bytes per value) was zero-filled out of cache; batches made encoding
    // 3-5% faster.
    constexpr size_t kBatch = 256;
    for (size_t g = 0; g < groups; g += kBatch) {
      const size_t k = std::min(kBatch, groups - g);
      const size_t at = w.Skip(k * kMaxRecord);
      const size_t bytes =
          EncodeGroupsAvx512(v, g, k, col, C, out->data() + at, sc->lo.data(), &exc_n);
      out->resize(at + bytes);
      rec_bytes += bytes;
    }
  } else
#endif
  {
    w.Skip(groups * kMaxRecord);
    uint8_t* rec = out->data() + rec_at;
    sc->hi.clear();
    for (size_t g = 0; g < groups; ++g)
      rec_bytes += EncodeGroupScalar(v + g * kPG, col ? col + (g * kPG) % C : nullptr,
                                     rec + rec_bytes, &sc->hi);
    exc_n = sc->hi.size();
    if (exc_n) std::memcpy(sc->lo.data(), sc->hi.data(), exc_n);
    out->resize(rec_at + rec_bytes);
  }
  if (rec_bytes > UINT32_MAX) return absl::InternalError("lossless planes: section too large");
  const uint32_t len32 = static_cast<uint32_t>(rec_bytes);
  std::memcpy(out->data() + len_at, &len32, 4);
  w.Raw(v + groups * kPG, 2 * tail);
  w.Raw(sc->lo.data(), exc_n);
  if (stats) {
    const uint64_t bits = 8 * (1 + (column ? C : 0) + 4 + rec_bytes + 2 * tail + exc_n);
    stats->stream_bits += bits;
    stats->entropy_bits += static_cast<double>(bits);
    stats->symbols += n;
  }
  return absl::OkStatus();
}

absl::Status DecodeLosslessPlanes(std::span<const uint8_t> payload, const TensorShape& s,
                                  SectionScratch* sc, uint8_t* out) {
  if (s.dtype != DType::kFloat16)
    return absl::DataLossError("lossless section: exponent-plane layout of a non-fp16 tensor");
  const size_t n = s.values(), groups = n / kPG, tail = n % kPG;
  const size_t C = s.channels();
  ByteReader r(payload, "lossless section");
  uint8_t mode;
  STRATA_RETURN_IF_ERROR(r.Read(&mode));
  const uint8_t* col = nullptr;
  if (mode == 1) {
    if (C % kPG != 0) return absl::DataLossError("lossless section: column bases need C % 32 == 0");
    const uint8_t* cp;
    STRATA_RETURN_IF_ERROR(r.Take(C, &cp));
    sc->lo.resize(C + 32);  // a copy with slack for the 32-byte loads
    for (size_t c = 0; c < C; ++c) {
      if (cp[c] > 31) return absl::DataLossError("lossless section: column base out of range");
      sc->lo[c] = cp[c];
    }
    col = sc->lo.data();
  } else if (mode != 0) {
    return absl::DataLossError("lossless section: unknown exponent base mode");
  }
  uint32_t rec_bytes;
  STRATA_RETURN_IF_ERROR(r.Read(&rec_bytes));
  const uint8_t* rec;
  STRATA_RETURN_IF_ERROR(r.Take(rec_bytes, &rec));
  const uint8_t* raw;
  STRATA_RETURN_IF_ERROR(r.Take(2 * tail, &raw));
  const uint8_t* exc = r.pos();
  const uint8_t* exc_end = exc + r.remaining();
  uint16_t* v = reinterpret_cast<uint16_t*>(out);
  size_t used = 0;
#ifdef STRATA_PLANES_SIMD
  if (PlanesSimd()) {
    used = DecodeGroupsAvx512(rec, rec_bytes, groups, col, C, &exc, exc_end, v);
    if (used == SIZE_MAX) return absl::DataLossError("lossless section: malformed group");
  } else
#endif
  {
    for (size_t g = 0; g < groups; ++g) {
      const size_t k =
          DecodeGroupScalar(rec + used, rec_bytes - used, col ? col + (g * kPG) % C : nullptr, &exc,
                            exc_end, v + g * kPG);
      if (k == 0) return absl::DataLossError("lossless section: malformed group");
      used += k;
    }
  }
  if (used != rec_bytes) return absl::DataLossError("lossless section: trailing group bytes");
  if (exc != exc_end) return absl::DataLossError("lossless section: trailing exception bytes");
  std::memcpy(v + groups * kPG, raw, 2 * tail);
  return absl::OkStatus();
}

}  // namespace strata::codec::internal
