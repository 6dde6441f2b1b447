// The pca reconstruction on AMX tiles (codec/internal/pca_amx.h). Per head, the decoder's sum
// is a product out^T[c][t] = A[c][k] * Y[k][t]: A, the axes times their steps, is the
// calibration's (built once per plan); Y, the coordinates, comes straight from the symbol runs,
// whose [slot][16 tokens] layout is already the tiles' pair layout but for interleaving two
// slots. Each 16 x 16 block of sums is then transposed to token rows, scaled (the section's
// step scale) and the mean added, the keys rotated and the rows written in the block's type, in
// one pass.
// The store pass (internal/pca_store_avx512.h) is shared with the AVX-512 decoders without AMX.
// Functions carry their own target attributes: nothing here runs unless PcaAmxAvailable().
#include "codec/internal/pca_amx.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "codec/half.h"
#include "codec/internal/pca_avx512.h"
#include "codec/internal/pca_store_avx512.h"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define STRATA_PCA_AMX 1
// GCC 12's AVX-512 headers start conversions from _mm512_undefined_*(), which it then reports.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#endif

namespace strata::codec::internal {

namespace {

#ifdef STRATA_PCA_AMX
using avx512::PairIndex;
using avx512::RoundToBf16;
using avx512::Transpose16;
#endif

std::atomic<bool> g_enabled_for_test{true};
std::atomic<bool> g_encode_enabled_for_test{true};
std::atomic<uint64_t> g_heads_decoded{0};
std::atomic<uint64_t> g_heads_decoded_in_bf16{0};
std::atomic<uint64_t> g_heads_projected_in_bf16{0};
std::atomic<bool> g_int8_enabled_for_test{true};
std::atomic<uint64_t> g_heads_decoded_int8{0};

#ifdef STRATA_PCA_AMX

constexpr long kArchReqXcompPerm = 0x1023;  // arch_prctl: ask for an extended state component
constexpr long kXfeatureXtiledata = 18;     // the AMX tile data

bool DetectAmx() {
  // The operator's switch (and the benchmarks' baseline): STRATA_CODEC_AMX=0.
  if (const char* env = std::getenv("STRATA_CODEC_AMX"); env && std::strcmp(env, "0") == 0)
    return false;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq"))
    return false;
  // AMX-BF16 (CPUID.7.0:EDX[22]), AMX-TILE (EDX[24]), AVX512-BF16 (CPUID.7.1:EAX[5]).
  unsigned a, b, c, d;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
  if (!((d >> 22) & 1) || !((d >> 24) & 1)) return false;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(1));
  if (!((a >> 5) & 1)) return false;
  // The OS saves the tile state (XCR0 bits 17 and 18) ...
  unsigned lo, hi;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;
  // ... and lets this process use it (Linux 5.16+ asks each process to request it).
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

#define STRATA_AMX_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))

// The coordinates (symbol - maxq) of a whole run of 16 symbols at p, as floats.
template <typename Sym>
STRATA_AMX_TARGET inline __m512 RunCoords(const Sym* p, __m512i maxq) {
  __m512i v;
  if constexpr (sizeof(Sym) == 1) {
    v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  return _mm512_cvtepi32_ps(_mm512_sub_epi32(v, maxq));
}

// The coordinates (symbol - maxq) of one slot for the 16 tokens of group g, as floats; zero
// for tokens past the end.
template <typename Sym>
STRATA_AMX_TARGET inline __m512 SlotCoords(const Sym* sym, const PcaSymbols& s, size_t g,
                                           uint32_t j, __m512i maxq) {
  const size_t full = s.tokens / 16, rest = s.tokens % 16;
  if (g < full) return RunCoords(sym + g * 16 * s.nslots + size_t{j} * 16, maxq);
  const __mmask16 live = static_cast<__mmask16>((1u << rest) - 1);
  const Sym* p = sym + full * 16 * s.nslots + size_t{j} * rest;
  __m512i v;
  if constexpr (sizeof(Sym) == 1) {
    v = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(live, p));
  } else {
    v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(live, p));
  }
  return _mm512_maskz_cvtepi32_ps(live, _mm512_sub_epi32(v, maxq));
}

// Two vectors of 16 coordinates as 16 bf16 pairs (a[i], b[i]).
STRATA_AMX_TARGET inline __m512i Pairs(__m512 a, __m512 b, __m512i idx) {
  return _mm512_permutexvar_epi16(idx, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
}

// Group g's coordinates in the tiles' pair layout: row kp holds, per token, coordinates 2 kp
// and 2 kp + 1. A coordinate is hi + lo, hi its bf16 and lo the rest (|q| <= 256: zero; up to
// 2047, at most 4: both exact). Groups past the end are zero. Returns whether any lo is not.
template <typename Sym>
STRATA_AMX_TARGET bool PairCoords(const PcaSymbols& s, const uint32_t* slot, size_t n,
                                  size_t kpad, size_t g, uint16_t* hi, uint16_t* lo) {
  if (g * 16 >= s.tokens) {
    std::memset(hi, 0, kpad * 16 * sizeof(uint16_t));
    std::memset(lo, 0, kpad * 16 * sizeof(uint16_t));
    return false;
  }
  const Sym* sym = static_cast<const Sym*>(s.sym);
  const __m512i maxq = _mm512_set1_epi32(s.maxq), idx = PairIndex();
  const __m512 zero = _mm512_setzero_ps();
  if (s.maxq <= 256 && g < s.tokens / 16) {  // a whole group (most): no masks, one base
    const Sym* base = sym + g * 16 * s.nslots;
    auto coords = [&](uint32_t j) STRATA_AMX_TARGET {
      return RunCoords(base + size_t{j} * 16, maxq);
    };
    size_t kp = 0;
    for (; 2 * kp + 1 < n; ++kp)
      _mm512_storeu_si512(hi + kp * 32, Pairs(coords(slot[2 * kp]), coords(slot[2 * kp + 1]), idx));
    if (2 * kp < n) {
      _mm512_storeu_si512(hi + kp * 32, Pairs(coords(slot[2 * kp]), zero, idx));
      ++kp;
    }
    for (; kp < kpad / 2; ++kp) _mm512_storeu_si512(hi + kp * 32, _mm512_setzero_si512());
    return false;
  }
  if (s.maxq <= 256) {  // every coordinate exact in bf16; the remainders stay zero
    for (size_t kp = 0; kp < kpad / 2; ++kp) {
      const size_t k0 = 2 * kp, k1 = k0 + 1;
      const __m512 a = k0 < n ? SlotCoords(sym, s, g, slot[k0], maxq) : zero;
      const __m512 b = k1 < n ? SlotCoords(sym, s, g, slot[k1], maxq) : zero;
      _mm512_storeu_si512(hi + kp * 32, Pairs(a, b, idx));
    }
    return false;
  }
  __mmask16 rest = 0;
  for (size_t kp = 0; kp < kpad / 2; ++kp) {
    const size_t k0 = 2 * kp, k1 = k0 + 1;
    const __m512 a = k0 < n ? SlotCoords(sym, s, g, slot[k0], maxq) : zero;
    const __m512 b = k1 < n ? SlotCoords(sym, s, g, slot[k1], maxq) : zero;
    const __m512 a_hi = RoundToBf16(a), b_hi = RoundToBf16(b);
    const __m512 a_lo = _mm512_sub_ps(a, a_hi), b_lo = _mm512_sub_ps(b, b_hi);
    rest |= _mm512_cmpneq_ps_mask(a_lo, zero) | _mm512_cmpneq_ps_mask(b_lo, zero);
    _mm512_storeu_si512(hi + kp * 32, Pairs(a_hi, b_hi, idx));
    _mm512_storeu_si512(lo + kp * 32, Pairs(a_lo, b_lo, idx));
  }
  return rest != 0;
}

// Group g's coordinates as token rows (the tiles' A operand): y[t * kpad + k], coordinates k and
// k + 1 of token t in one dword, from PairCoords's pair layout by a dword transpose per 32
// coordinates. Transposing the coordinates (n per token) costs less than transposing the sums
// (dim per token) did when the tiles' roles were the other way round.
STRATA_AMX_TARGET inline void RowsFromPairs(const uint16_t* pairs, size_t kpad, uint16_t* y) {
  for (size_t k = 0; k < kpad; k += 32) {
    __m512 r[16];
    for (int j = 0; j < 16; ++j)
      r[j] = _mm512_loadu_ps(reinterpret_cast<const float*>(pairs + (k / 2 + j) * 32));
    Transpose16(r);
    for (int t = 0; t < 16; ++t)
      _mm512_storeu_ps(reinterpret_cast<float*>(y + t * kpad + k), r[t]);
  }
}

// The decoder's tiles: 0-3 sums (two groups of 16 tokens x two blocks of 16 columns, token
// rows), 4 and 5 the two groups' coordinates (A: token rows, 32 coordinates), 6 and 7 the axes
// of the two column blocks (B: 16 coordinate pairs x 16 columns).
STRATA_AMX_TARGET inline void LoadCoordTiles(const uint16_t* y0, const uint16_t* y1,
                                             size_t stride) {
  _tile_loadd(4, y0, stride);
  _tile_loadd(5, y1, stride);
}
// The axes' pair rows k / 2 .. k / 2 + 15 at columns c .. c + 31 (PcaAmxAxes's layout).
STRATA_AMX_TARGET inline void LoadAxisTiles(const uint16_t* a, size_t dim) {
  _tile_loadd(6, a, dim * 2 * sizeof(uint16_t));
  _tile_loadd(7, a + 32, dim * 2 * sizeof(uint16_t));
}
// Eight tiles of 16 rows of 64 bytes.
STRATA_AMX_TARGET inline void ConfigureTiles() {
  AmxTileConfig cfg;
  for (int i = 0; i < 8; ++i) {
    cfg.rows[i] = 16;
    cfg.colsb[i] = 64;
  }
  _tile_loadconfig(&cfg);
}
STRATA_AMX_TARGET inline void ZeroSums() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}
// Four independent sums between two products into the same one (their latency).
STRATA_AMX_TARGET inline void AddProducts() {
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 5, 6);
  _tile_dpbf16ps(2, 4, 7);
  _tile_dpbf16ps(3, 5, 7);
}

STRATA_AMX_TARGET void ReconstructTiles(const PcaSymbols& s, const uint32_t* slot, size_t n,
                                        const PcaAmxAxes& axes, bool split, size_t dim,
                                        float scale, const float* mean, const PcaRope* rope,
                                        const PcaRows& out, PcaAmxScratch* sc) {
  const size_t kpad = axes.kpad, groups = (s.tokens + 15) / 16, block = kpad * 16;
  // One group's pair layout (hi, lo), then both groups' token rows (hi 0, hi 1, lo 0, lo 1).
  // Every tile row on a cache line of its own (block and dim * 16 are multiples of 32 words).
  sc->coords.resize(6 * block + kCacheLine / sizeof(uint16_t));
  sc->sums.resize(2 * dim * 16 + kCacheLine / sizeof(float));
  uint16_t* pair_hi = AlignToCacheLine(sc->coords.data());
  uint16_t* pair_lo = pair_hi + block;
  uint16_t* y_hi[2] = {pair_lo + block, pair_lo + 2 * block};
  uint16_t* y_lo[2] = {pair_lo + 3 * block, pair_lo + 4 * block};
  float* const sums = AlignToCacheLine(sc->sums.data());
  float* rows[2] = {sums, sums + dim * 16};
  ConfigureTiles();
  const uint16_t* hi = axes.hi.data();
  const uint16_t* lo = axes.lo.data();
  const size_t ystride = kpad * sizeof(uint16_t), rstride = dim * sizeof(float);
  const size_t esize = out.type == PcaRows::Type::kFloat32 ? 4 : 2;
  // Rows aligned to the stores' width are streamed past the caches, as the VNNI decoder's are
  // (a block is written once, and megabytes); others are asked for, to write, a pair ahead.
  const bool stream = avx512::StreamsRows(out);
  for (size_t g = 0; g < groups; g += 2) {
    // The next pair's output rows, asked for (to write) while this pair's tiles run: the rows
    // are the block's, seldom in cache, and the store pass otherwise waits on them (0-15 %
    // faster decode in alternating runs on real KV, noisy; docs/codec.md).
    const size_t t_end = stream ? 0 : std::min(s.tokens, (g + 4) * 16);
    for (size_t t = (g + 2) * 16; t < t_end; ++t) {
      const char* row = static_cast<const char*>(out.data) + t * out.stride * esize;
      for (size_t b = 0; b < dim * esize; b += 64) _mm_prefetch(row + b, _MM_HINT_ET0);
    }
    bool lo_rows[2];
    for (int i = 0; i < 2; ++i) {
      lo_rows[i] = s.wide ? PairCoords<uint16_t>(s, slot, n, kpad, g + i, pair_hi, pair_lo)
                          : PairCoords<uint8_t>(s, slot, n, kpad, g + i, pair_hi, pair_lo);
      RowsFromPairs(pair_hi, kpad, y_hi[i]);
      if (lo_rows[i]) RowsFromPairs(pair_lo, kpad, y_lo[i]);
    }
    const bool rest = lo_rows[0] || lo_rows[1];
    for (int i = 0; i < 2; ++i)
      if (rest && !lo_rows[i]) std::memset(y_lo[i], 0, block * sizeof(uint16_t));
    for (size_t c = 0; c < dim; c += 32) {
      ZeroSums();
      for (size_t k = 0; k < kpad; k += 32) {
        const size_t at = k / 2 * dim * 2 + c * 2;  // pair row k / 2, column c
        LoadCoordTiles(y_hi[0] + k, y_hi[1] + k, ystride);
        LoadAxisTiles(hi + at, dim);
        AddProducts();
        if (split) {
          LoadAxisTiles(lo + at, dim);
          AddProducts();
        }
        if (rest) {  // coordinates beyond 256 (rare): their remainders times the axes' hi
          LoadCoordTiles(y_lo[0] + k, y_lo[1] + k, ystride);
          LoadAxisTiles(hi + at, dim);
          AddProducts();
        }
      }
      _tile_stored(0, rows[0] + c, rstride);
      _tile_stored(1, rows[1] + c, rstride);
      _tile_stored(2, rows[0] + c + 16, rstride);
      _tile_stored(3, rows[1] + c + 16, rstride);
    }
    for (size_t i = 0; i < 2 && g + i < groups; ++i) {
      const size_t first = (g + i) * 16;
      avx512::StoreTokenGroup(rows[i], dim, scale, mean, std::min<size_t>(16, s.tokens - first),
                              rope, first, out, stream);
    }
  }
  if (stream) _mm_sfence();  // the streamed rows visible before whoever the caller tells
  _tile_release();
}

// AMX-INT8 (CPUID.7.0:EDX[25]) where the tiles are there, with AVX512-VBMI for the byte
// permutes that interleave the symbols. STRATA_CODEC_AMX_INT8=0 leaves the int8 heads to the bf16
// tiles (the operator's switch, and the benchmarks' baseline).
bool DetectAmxInt8() {
  if (const char* env = std::getenv("STRATA_CODEC_AMX_INT8"); env && std::strcmp(env, "0") == 0)
    return false;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512vbmi") || !__builtin_cpu_supports("avx512vnni"))
    return false;
  unsigned a, b, c, d;
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
  return (d >> 25) & 1;
}

#define STRATA_AMX_INT8_TARGET                                                                \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,amx-tile," \
                        "amx-bf16,amx-int8")))

// Coordinates 4q .. 4q + 3 (ordered: their slots) for the 16 tokens of group g, interleaved per
// token: token t's four raw symbols in dword t (the tiles' unsigned bytes); zero past n and past
// the last token. `idx`: byte 4t + i from byte 16i + t (a 4 x 16 transpose).
STRATA_AMX_INT8_TARGET inline __m512i QuadRun(const uint8_t* sym, const PcaSymbols& s, size_t g,
                                              const uint32_t* ordered, size_t n, size_t q,
                                              __m512i idx) {
  const size_t full = s.tokens / 16, rest = s.tokens % 16;
  const uint32_t* j = ordered + 4 * q;
  __m512i v;
  if (g < full && 4 * q + 4 <= n) {  // most: whole runs, one base
    const uint8_t* base = sym + g * 16 * s.nslots;
    auto run = [&](int i) STRATA_AMX_INT8_TARGET {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(base + size_t{j[i]} * 16));
    };
    v = _mm512_castsi128_si512(run(0));
    v = _mm512_inserti32x4(v, run(1), 1);
    v = _mm512_inserti32x4(v, run(2), 2);
    v = _mm512_inserti32x4(v, run(3), 3);
  } else {
    const __mmask16 live = g < full ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << rest) - 1);
    __m128i r[4];
    for (size_t i = 0; i < 4; ++i) {
      if (4 * q + i >= n) {
        r[i] = _mm_setzero_si128();
      } else if (g < full) {
        r[i] = _mm_loadu_si128(
            reinterpret_cast<const __m128i*>(sym + (g * s.nslots + j[i]) * 16));
      } else {
        r[i] = _mm_maskz_loadu_epi8(live, sym + full * 16 * s.nslots + size_t{j[i]} * rest);
      }
    }
    v = _mm512_inserti32x4(_mm512_castsi128_si512(r[0]), r[1], 1);
    v = _mm512_inserti32x4(v, r[2], 2);
    v = _mm512_inserti32x4(v, r[3], 3);
  }
  return _mm512_permutexvar_epi8(idx, v);
}

// Group g's symbols as the tiles' A operand: chunk c (coordinates 64c .. 64c + 63 in the axes'
// order) as 16 token rows of 64 bytes at rows + 1024c; zero past n and past the last token.
STRATA_AMX_INT8_TARGET void ByteRows(const PcaSymbols& s, const uint32_t* ordered, size_t n,
                                     size_t chunks, size_t g, uint8_t* rows) {
  if (g * 16 >= s.tokens) {
    std::memset(rows, 0, chunks * 1024);
    return;
  }
  alignas(64) static constexpr uint8_t kIdx[64] = {
      0, 16, 32, 48, 1, 17, 33, 49, 2,  18, 34, 50, 3,  19, 35, 51, 4,  20, 36, 52, 5,  21,
      37, 53, 6, 22, 38, 54, 7, 23, 39, 55, 8, 24, 40, 56, 9, 25, 41, 57, 10, 26, 42, 58, 11, 27,
      43, 59, 12, 28, 44, 60, 13, 29, 45, 61, 14, 30, 46, 62, 15, 31, 47, 63};
  const __m512i idx = _mm512_load_si512(kIdx);
  const uint8_t* sym = static_cast<const uint8_t*>(s.sym);
  for (size_t c = 0; c < chunks; ++c) {
    __m512 r[16];
    for (size_t i = 0; i < 16; ++i) {
      const size_t q = 16 * c + i;
      r[i] = 4 * q < n ? _mm512_castsi512_ps(QuadRun(sym, s, g, ordered, n, q, idx))
                       : _mm512_setzero_ps();
    }
    Transpose16(r);  // quad rows of token dwords -> token rows of quads
    for (size_t t = 0; t < 16; ++t)
      _mm512_store_ps(reinterpret_cast<float*>(rows + c * 1024 + t * 64), r[t]);
  }
}

// A group's int32 sums [t][dim], in place, as floats: (sum - maxq * sum of the column's terms)
// times the column's unit (the VNNI decoder's operations: the same bits).
STRATA_AMX_INT8_TARGET void BytesToFloats(float* rows, size_t count, size_t dim,
                                          const PcaVnniAxes& axes, int32_t maxq) {
  const __m512i m = _mm512_set1_epi32(maxq);
  for (size_t c = 0; c < dim; c += 16) {
    const __m512i off = _mm512_mullo_epi32(m, _mm512_loadu_si512(axes.byte_sum.data() + c));
    const __m512 unit = _mm512_loadu_ps(axes.byte_scale.data() + c);
    for (size_t t = 0; t < count; ++t) {
      float* p = rows + t * dim + c;
      const __m512i sum = _mm512_load_si512(p);
      _mm512_store_ps(p, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sum, off)), unit));
    }
  }
}

// PcaReconstructAmxInt8 on a head that qualifies: per pair of token groups, their symbols as
// byte rows, then per 32 columns the tiles (0-3 the int32 sums of two groups by two blocks of
// 16 columns, 4-5 the groups' symbols, 6-7 the columns' int8 terms: 16 quads x 16 columns,
// PcaVnniAxes's layout as it is), then the floats and the store pass.
STRATA_AMX_INT8_TARGET void ReconstructTilesInt8(const PcaSymbols& s, const uint32_t* slot,
                                                 size_t n, const PcaVnniAxes& axes, size_t dim,
                                                 float scale, const float* mean,
                                                 const PcaRope* rope, const PcaRows& out,
                                                 PcaAmxScratch* sc) {
  const size_t groups = (s.tokens + 15) / 16, chunks = axes.quad_pitch / 16;
  const size_t block = chunks * 1024;  // bytes of one group's rows
  // Both groups' byte rows, then the slots in the axes' order (in sc->coords' 16-bit words).
  sc->coords.resize((2 * block + 4 * n + kCacheLine) / 2);
  uint8_t* const a0 = AlignToCacheLine(reinterpret_cast<uint8_t*>(sc->coords.data()));
  uint8_t* const a1 = a0 + block;
  uint32_t* const ordered = reinterpret_cast<uint32_t*>(a1 + block);
  for (size_t i = 0; i < n; ++i) ordered[i] = slot[axes.order[i]];
  sc->sums.resize(2 * dim * 16 + kCacheLine / sizeof(float));
  float* const sums = AlignToCacheLine(sc->sums.data());
  float* rows[2] = {sums, sums + dim * 16};
  ConfigureTiles();
  const uint8_t* const terms = reinterpret_cast<const uint8_t*>(axes.bytes.data());
  const size_t pitch = axes.quad_pitch * 64, rstride = dim * sizeof(float);
  const bool stream = avx512::StreamsRows(out);
  for (size_t g = 0; g < groups; g += 2) {
    ByteRows(s, ordered, n, chunks, g, a0);
    ByteRows(s, ordered, n, chunks, g + 1, a1);
    for (size_t c = 0; c < dim; c += 32) {
      ZeroSums();
      const uint8_t* b = terms + c / 16 * pitch;
      for (size_t k = 0; k < block; k += 1024) {
        _tile_loadd(4, a0 + k, 64);
        _tile_loadd(5, a1 + k, 64);
        _tile_loadd(6, b + k, 64);
        _tile_loadd(7, b + pitch + k, 64);
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 5, 6);
        _tile_dpbusd(2, 4, 7);
        _tile_dpbusd(3, 5, 7);
      }
      _tile_stored(0, rows[0] + c, rstride);
      _tile_stored(1, rows[1] + c, rstride);
      _tile_stored(2, rows[0] + c + 16, rstride);
      _tile_stored(3, rows[1] + c + 16, rstride);
    }
    for (size_t i = 0; i < 2 && g + i < groups; ++i) {
      const size_t first = (g + i) * 16, count = std::min<size_t>(16, s.tokens - first);
      BytesToFloats(rows[i], count, dim, axes, s.maxq);
      avx512::StoreTokenGroup(rows[i], dim, scale, mean, count, rope, first, out, stream);
    }
  }
  if (stream) _mm_sfence();  // the streamed rows visible before whoever the caller tells
  _tile_release();
}

// The encoder's operand for the group of 16 tokens from t0 (`live` of them; the rest zero),
// token i's row at x + i * stride: per 32 columns, each token's values less the mean, split into
// bf16 hi and (where `lo` is given) lo halves (32 of each, in column order: word j is the pair of
// columns 2j, 2j + 1), then transposed so that row c / 2 holds the pair of every token (the
// tiles' pair layout; rows `pitch` words apart). Each token's squared norm and centred energy
// are summed on the way. False where a value is not finite (the rest is then undefined).
STRATA_AMX_TARGET bool PairGroup(const float* x, size_t stride, size_t t0, size_t live,
                                 size_t dim, const float* mean, size_t pitch, double* norm2,
                                 double* err2, uint16_t* hi, uint16_t* lo) {
  __m512 n[16], e[16];
  for (int i = 0; i < 16; ++i) n[i] = e[i] = _mm512_setzero_ps();
  constexpr int kNotFinite = 0x01 | 0x08 | 0x10 | 0x80;  // fpclass: NaNs and infinities
  __mmask16 bad = 0;
  for (size_t c = 0; c < dim; c += 32) {
    const __m512 ma = _mm512_loadu_ps(mean + c), mb = _mm512_loadu_ps(mean + c + 16);
    __m512 h[16], l[16];
    for (size_t i = 0; i < 16; ++i) {
      if (i >= live) {
        h[i] = l[i] = _mm512_setzero_ps();
        continue;
      }
      const float* row = x + i * stride + c;
      const __m512 a = _mm512_loadu_ps(row), b = _mm512_loadu_ps(row + 16);
      bad |= _mm512_fpclass_ps_mask(a, kNotFinite) | _mm512_fpclass_ps_mask(b, kNotFinite);
      n[i] = _mm512_fmadd_ps(a, a, _mm512_fmadd_ps(b, b, n[i]));
      const __m512 ca = _mm512_sub_ps(a, ma), cb = _mm512_sub_ps(b, mb);
      e[i] = _mm512_fmadd_ps(ca, ca, _mm512_fmadd_ps(cb, cb, e[i]));
      if (!lo) {  // the conversion rounds to nearest even, as RoundToBf16 does
        h[i] = reinterpret_cast<__m512>(_mm512_cvtne2ps_pbh(cb, ca));
        continue;
      }
      const __m512 ah = RoundToBf16(ca), bh = RoundToBf16(cb);
      h[i] = reinterpret_cast<__m512>(_mm512_cvtne2ps_pbh(bh, ah));
      l[i] = reinterpret_cast<__m512>(
          _mm512_cvtne2ps_pbh(_mm512_sub_ps(cb, bh), _mm512_sub_ps(ca, ah)));
    }
    Transpose16(h);
    if (lo) Transpose16(l);
    for (int j = 0; j < 16; ++j) {
      const size_t at = (c / 2 + j) * pitch + t0 * 2;
      _mm512_storeu_ps(reinterpret_cast<float*>(hi + at), h[j]);
      if (lo) _mm512_storeu_ps(reinterpret_cast<float*>(lo + at), l[j]);
    }
  }
  for (size_t i = 0; i < live; ++i) {
    norm2[t0 + i] += _mm512_reduce_add_ps(n[i]);
    err2[t0 + i] += _mm512_reduce_add_ps(e[i]);
  }
  return bad == 0;
}

inline size_t Live(size_t t0, size_t tokens) {
  return t0 < tokens ? std::min<size_t>(16, tokens - t0) : 0;
}

// Words between the paired rows (PairGroup, ProjectTiles): tpad pairs and two cache lines. At
// 256 tokens the rows would lie 1 KiB apart, and a 32-token block's 64 rows (dim 128), which
// every block of coordinates loads again, would map to 8 of L1's 64 sets, more lines than their
// ways: the tile loads then came from L2 (the projection 5-7 % slower, in-process A/B).
inline size_t PairPitch(size_t tpad) { return tpad * 2 + 64; }

// Sums 0 and 1 (and with kBlocks 2, sums 2 and 3) <- the axes' rows k .. k + 16 * kBlocks - 1
// times the vectors of tokens t .. t + 31, over every column.
template <int kBlocks>
STRATA_AMX_TARGET inline void ProjectRows(const uint16_t* xh, const uint16_t* xl, size_t dim,
                                          size_t xstride, const PcaAmxBasis& basis,
                                          size_t astride, size_t k, size_t t, bool split) {
  auto load_axes = [&](const uint16_t* a) STRATA_AMX_TARGET {
    _tile_loadd(4, a, astride);
    if constexpr (kBlocks == 2) _tile_loadd(5, a + 16 * (astride / sizeof(uint16_t)), astride);
  };
  auto products = [&]() STRATA_AMX_TARGET {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (kBlocks == 2) {
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  };
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (kBlocks == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (size_t c = 0; c < dim; c += 32) {
    const size_t at = k * dim + c, xt0 = (c / 2) * (xstride / sizeof(uint16_t)) + 2 * t;
    load_axes(basis.hi.data() + at);
    _tile_loadd(6, xh + xt0, xstride);
    _tile_loadd(7, xh + xt0 + 32, xstride);
    products();
    if (!split) continue;
    _tile_loadd(6, xl + xt0, xstride);
    _tile_loadd(7, xl + xt0 + 32, xstride);
    products();
    load_axes(basis.lo.data() + at);
    _tile_loadd(6, xh + xt0, xstride);
    _tile_loadd(7, xh + xt0 + 32, xstride);
    products();
  }
}

// y = the axes' rows times the paired vectors (PairGroup's layout, rows `pitch` words apart).
// Tiles as in ReconstructTiles, the roles swapped: 0-3 the coordinates (two blocks of 16 rows
// k x two groups of 16 tokens), 4 and 5 the axes' rows k, 6 and 7 the two groups' vectors.
STRATA_AMX_TARGET void ProjectTiles(const uint16_t* xh, const uint16_t* xl, size_t dim,
                                    size_t pitch, const PcaAmxBasis& basis, size_t tp, float* y) {
  const size_t kpad = basis.kpad;
  ConfigureTiles();
  const size_t astride = dim * sizeof(uint16_t), xstride = pitch * sizeof(uint16_t);
  const size_t ystride = tp * sizeof(float);
  const bool split = !basis.lo.empty();
  if (!split) g_heads_projected_in_bf16.fetch_add(1, std::memory_order_relaxed);
  for (size_t t = 0; t < tp; t += 32)  // a group pair's vectors stay in L1 for every k
    for (size_t k = 0; k < kpad; k += 32) {
      if (k + 16 < kpad) {
        ProjectRows<2>(xh, xl, dim, xstride, basis, astride, k, t, split);
      } else {  // the last 16 rows (kpad = 16 mod 32): half the products
        ProjectRows<1>(xh, xl, dim, xstride, basis, astride, k, t, split);
      }
      float* o = y + k * tp + t;
      _tile_stored(0, o, ystride);
      if (t + 16 < tp) _tile_stored(1, o + 16, ystride);
      if (k + 16 < kpad) {
        _tile_stored(2, o + 16 * tp, ystride);
        if (t + 16 < tp) _tile_stored(3, o + 16 * tp + 16, ystride);
      }
    }
  _tile_release();
}

STRATA_AMX_TARGET void EncodeHeadTiles(const float* x, size_t stride, size_t tokens, size_t dim,
                                       const float* mean, const PcaAmxBasis& basis, size_t tp,
                                       double* norm2, double* err2, float* y,
                                       std::vector<uint16_t>* scratch) {
  const size_t tpad = (tp + 31) / 32 * 32, pitch = PairPitch(tpad), half = dim / 2 * pitch;
  scratch->resize((basis.lo.empty() ? 1 : 2) * half + kCacheLine / sizeof(uint16_t));
  uint16_t* xh = AlignToCacheLine(scratch->data());  // pitch: whole lines per pair row
  uint16_t* xl = basis.lo.empty() ? nullptr : xh + half;
  for (size_t t0 = 0; t0 < tpad; t0 += 16)
    PairGroup(t0 < tokens ? x + t0 * stride : x, stride, t0, Live(t0, tokens), dim, mean, pitch,
              norm2, err2, xh, xl);
  ProjectTiles(xh, xl, dim, pitch, basis, tp, y);
}

// The same from the block's rows: each group's 16 rows converted (and rotated back) into a
// float scratch that stays in L1, then paired and checked; the next group's rows prefetched.
STRATA_AMX_TARGET bool EncodeHeadTilesFromRows(const PcaInput& in, const PcaRope* rope,
                                               size_t tokens, size_t dim, const float* mean,
                                               const PcaAmxBasis& basis, size_t tp,
                                               double* norm2, double* err2, float* y,
                                               std::vector<uint16_t>* scratch) {
  const size_t tpad = (tp + 31) / 32 * 32, pitch = PairPitch(tpad), half = dim / 2 * pitch;
  const size_t pairs = (basis.lo.empty() ? 1 : 2) * half;
  // The pairs, then 16 rows of floats; every pair row on whole cache lines.
  scratch->resize(pairs + 2 * 16 * dim + kCacheLine / sizeof(uint16_t));
  uint16_t* xh = AlignToCacheLine(scratch->data());
  uint16_t* xl = basis.lo.empty() ? nullptr : xh + half;
  float* rows = reinterpret_cast<float*>(xh + pairs);
  const size_t es = in.type == PcaRows::Type::kFloat32 ? sizeof(float) : sizeof(uint16_t);
  for (size_t t0 = 0; t0 < tpad; t0 += 16) {
    const size_t live = Live(t0, tokens);
    for (size_t i = 0; i < live; ++i) {
      if (t0 + 16 + i < tokens) {  // the next group's row, from L3 or memory
        const char* next = static_cast<const char*>(in.data) + (t0 + 16 + i) * in.stride * es;
        for (size_t b = 0; b < dim * es; b += 64) _mm_prefetch(next + b, _MM_HINT_T0);
      }
      avx512::LoadRow(in, t0 + i, dim, rope, rows + i * dim);
    }
    if (!PairGroup(rows, dim, t0, live, dim, mean, pitch, norm2, err2, xh, xl)) return false;
  }
  ProjectTiles(xh, xl, dim, pitch, basis, tp, y);
  return true;
}

#endif  // STRATA_PCA_AMX

}  // namespace

bool PcaAmxSupported() {
#ifdef STRATA_PCA_AMX
  static const bool detected = DetectAmx();
  return detected;
#else
  return false;
#endif
}

bool PcaAmxAvailable() {
  return PcaAmxSupported() && g_enabled_for_test.load(std::memory_order_relaxed);
}

void SetPcaAmxEnabledForTest(bool enabled) { g_enabled_for_test.store(enabled); }

void SetPcaAmxEncodeEnabledForTest(bool enabled) { g_encode_enabled_for_test.store(enabled); }

bool PcaAmxEncodeAvailable() {
  return PcaAmxAvailable() && g_encode_enabled_for_test.load(std::memory_order_relaxed);
}

bool PcaAmxInt8Supported() {
#ifdef STRATA_PCA_AMX
  static const bool detected = PcaAmxSupported() && DetectAmxInt8();
  return detected;
#else
  return false;
#endif
}

bool PcaAmxInt8Available() {
  return PcaAmxInt8Supported() && g_int8_enabled_for_test.load(std::memory_order_relaxed);
}

void SetPcaAmxInt8EnabledForTest(bool enabled) { g_int8_enabled_for_test.store(enabled); }

uint64_t PcaAmxInt8HeadsDecoded() {
  return g_heads_decoded_int8.load(std::memory_order_relaxed);
}

bool PcaReconstructAmxInt8(const PcaSymbols& s, const uint32_t* slot, size_t n,
                           const PcaVnniAxes& axes, size_t dim, float scale, const float* mean,
                           const PcaRope* rope, const PcaRows& out, PcaAmxScratch* scratch) {
#ifdef STRATA_PCA_AMX
  if (!PcaAmxInt8Supported() || s.wide || s.maxq > 127 || axes.pairs != 0 || axes.quads == 0 ||
      axes.order.size() != n || dim % 32 != 0 || dim > 256 || s.tokens == 0)
    return false;
  ReconstructTilesInt8(s, slot, n, axes, dim, scale, mean, rope, out, scratch);
  g_heads_decoded_int8.fetch_add(1, std::memory_order_relaxed);
  return true;
#else
  (void)s, (void)slot, (void)n, (void)axes, (void)dim, (void)scale, (void)mean, (void)rope,
      (void)out, (void)scratch;
  return false;
#endif
}

uint64_t PcaAmxHeadsDecoded() { return g_heads_decoded.load(std::memory_order_relaxed); }
uint64_t PcaAmxHeadsDecodedInBf16() {
  return g_heads_decoded_in_bf16.load(std::memory_order_relaxed);
}
uint64_t PcaAmxHeadsProjectedInBf16() {
  return g_heads_projected_in_bf16.load(std::memory_order_relaxed);
}

namespace {

// Each axis coords[k], times steps[k] where given, split into bf16 hi and lo halves (lo only
// with_lo); (k, c) at [(k / 2 * dim + c) * 2 + k % 2] (by_column: the decoder's B operand, pair
// rows of columns) or at [k * dim + c] (the encoder's rows).
template <typename Split>
void SplitAxes(const float* basis, const uint32_t* coords, const float* steps, size_t n,
               size_t dim, bool by_column, bool with_lo, Split* out) {
  out->hi.clear();
  out->lo.clear();
  out->kpad = 0;
  if (dim == 0 || dim % 32 != 0 || n == 0) return;
  // The decoder's k is the products' inner dimension (32 bf16 per tile row: 16 pair rows); the
  // encoder's, the axes tile's rows (16 per tile).
  const size_t kpad = by_column ? (n + 31) / 32 * 32 : (n + 15) / 16 * 16;
  out->kpad = kpad;
  out->hi.assign(dim * kpad, 0);
  if (with_lo) out->lo.assign(dim * kpad, 0);
  for (size_t k = 0; k < n; ++k)
    for (size_t c = 0; c < dim; ++c) {
      const float a = (steps ? steps[k] : 1.0f) * basis[size_t{coords[k]} * dim + c];
      const uint16_t h = FloatToBF16(a);
      const size_t at = by_column ? (k / 2 * dim + c) * 2 + k % 2 : k * dim + c;
      out->hi[at] = h;
      if (with_lo) out->lo[at] = FloatToBF16(a - BF16ToFloat(h));
    }
}

}  // namespace

void BuildPcaAmxAxes(const float* basis, const uint32_t* coords, const float* steps, size_t n,
                     size_t dim, PcaAmxAxes* axes) {
  SplitAxes(basis, coords, steps, n, dim, /*by_column=*/true, /*with_lo=*/true, axes);
}

void BuildPcaAmxBasis(const float* basis, const uint32_t* coords, size_t n, size_t dim,
                      bool split, PcaAmxBasis* out) {
  SplitAxes(basis, coords, nullptr, n, dim, /*by_column=*/false, split, out);
}

void PcaEncodeHeadAmx(const float* x, size_t stride, size_t tokens, size_t dim, const float* mean,
                      const PcaAmxBasis& basis, size_t tp, double* norm2, double* err2, float* y,
                      std::vector<uint16_t>* scratch) {
#ifdef STRATA_PCA_AMX
  EncodeHeadTiles(x, stride, tokens, dim, mean, basis, tp, norm2, err2, y, scratch);
#else
  (void)x, (void)stride, (void)tokens, (void)dim, (void)mean, (void)basis, (void)tp, (void)norm2,
      (void)err2, (void)y, (void)scratch;
#endif
}

bool PcaEncodeHeadAmxRows(const PcaInput& in, const PcaRope* rope, size_t tokens, size_t dim,
                          const float* mean, const PcaAmxBasis& basis, size_t tp, double* norm2,
                          double* err2, float* y, std::vector<uint16_t>* scratch) {
#ifdef STRATA_PCA_AMX
  return EncodeHeadTilesFromRows(in, rope, tokens, dim, mean, basis, tp, norm2, err2, y,
                                 scratch);
#else
  (void)in, (void)rope, (void)tokens, (void)dim, (void)mean, (void)basis, (void)tp, (void)norm2,
      (void)err2, (void)y, (void)scratch;
  return false;
#endif
}

void PcaReconstructAmx(const PcaSymbols& s, const uint32_t* slot, size_t n,
                       const PcaAmxAxes& axes, bool split, size_t dim, float scale,
                       const float* mean, const PcaRope* rope, const PcaRows& out,
                       PcaAmxScratch* scratch) {
#ifdef STRATA_PCA_AMX
  ReconstructTiles(s, slot, n, axes, split, dim, scale, mean, rope, out, scratch);
  g_heads_decoded.fetch_add(1, std::memory_order_relaxed);
  if (!split) g_heads_decoded_in_bf16.fetch_add(1, std::memory_order_relaxed);
#else
  (void)s, (void)slot, (void)n, (void)axes, (void)split, (void)dim, (void)scale, (void)mean,
      (void)rope, (void)out, (void)scratch;
#endif
}

}  // namespace strata::codec::internal
