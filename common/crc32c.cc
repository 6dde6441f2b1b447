#include "common/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#include <nmmintrin.h>
#endif

namespace strata {
namespace {

constexpr uint32_t kPolyReflected = 0x82F63B78u;

struct Tables {
  // Slicing-by-8 tables for the portable path.
  uint32_t slice[8][256];
  // x^(2^k) mod P, reflected, for combining CRCs of adjacent ranges.
  uint32_t x2n[32];
};

// a(x) * b(x) mod P over reflected 32-bit polynomials.
uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPolyReflected : b >> 1;
  }
  return p;
}

Tables BuildTables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolyReflected : c >> 1;
    t.slice[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 8; ++s) {
      uint32_t prev = t.slice[s - 1][i];
      t.slice[s][i] = (prev >> 8) ^ t.slice[0][prev & 0xff];
    }
  }
  uint32_t p = 1u << 30;  // x^1
  t.x2n[0] = p;
  for (int n = 1; n < 32; ++n) t.x2n[n] = p = MultModP(p, p);
  return t;
}

const Tables& tables() {
  static const Tables t = BuildTables();
  return t;
}

// x^n mod P.
uint32_t XPowModP(uint64_t n) {
  const Tables& t = tables();
  uint32_t p = 1u << 31;  // x^0
  for (unsigned k = 0; n; n >>= 1, ++k)
    if (n & 1) p = MultModP(t.x2n[k & 31], p);
  return p;
}

// x^(8 * len) mod P: the operator that appends `len` zero bytes to a CRC register. The last
// one is kept per thread: the pieces of a pushed block, combined one by one, are of one size.
uint32_t ZeroBytesOperator(size_t len) {
  thread_local size_t last_len = 0;
  thread_local uint32_t last_op = 1u << 31;  // x^0: len 0 appends nothing
  if (len != last_len) {
    last_op = XPowModP(uint64_t{len} * 8);
    last_len = len;
  }
  return last_op;
}

uint32_t RawPortable(uint32_t crc, const uint8_t* p, size_t n) {
  const Tables& t = tables();
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= crc;
    crc = t.slice[7][v & 0xff] ^ t.slice[6][(v >> 8) & 0xff] ^ t.slice[5][(v >> 16) & 0xff] ^
          t.slice[4][(v >> 24) & 0xff] ^ t.slice[3][(v >> 32) & 0xff] ^
          t.slice[2][(v >> 40) & 0xff] ^ t.slice[1][(v >> 48) & 0xff] ^ t.slice[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ t.slice[0][(crc ^ *p++) & 0xff];
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t RawHardware(uint32_t crc, const uint8_t* p, size_t n) {
  // Three independent streams hide the crc32 instruction's 3-cycle latency; the stripe length is
  // fixed so the two shift operators are computed once.
  constexpr size_t kStripe = 8192;
  static const uint32_t shift1 = ZeroBytesOperator(kStripe);
  static const uint32_t shift2 = ZeroBytesOperator(2 * kStripe);
  uint64_t c0 = crc;
  while (n >= 3 * kStripe) {
    uint64_t c1 = 0, c2 = 0;
    const uint8_t* p1 = p + kStripe;
    const uint8_t* p2 = p + 2 * kStripe;
    for (size_t i = 0; i < kStripe; i += 8) {
      uint64_t v0, v1, v2;
      std::memcpy(&v0, p + i, 8);
      std::memcpy(&v1, p1 + i, 8);
      std::memcpy(&v2, p2 + i, 8);
      c0 = _mm_crc32_u64(c0, v0);
      c1 = _mm_crc32_u64(c1, v1);
      c2 = _mm_crc32_u64(c2, v2);
    }
    c0 = MultModP(shift2, static_cast<uint32_t>(c0)) ^ MultModP(shift1, static_cast<uint32_t>(c1)) ^
         static_cast<uint32_t>(c2);
    p += 3 * kStripe;
    n -= 3 * kStripe;
  }
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c0 = _mm_crc32_u64(c0, v);
    p += 8;
    n -= 8;
  }
  uint32_t c = static_cast<uint32_t>(c0);
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}

// Folding with carry-less multiplies (VPCLMULQDQ, 4 x 512-bit accumulators): each 128-bit lane
// L||H is carried 2048 bits forward as L*x^(2048+64) + H*x^2048 mod P, which keeps the message
// congruent mod P while the multiplies run far faster than the crc32 instruction. The folded
// 256 bytes are then finished with crc32. A product clmul(A, K) of reflected operands equals
// A*K*x in the 128-bit lane, hence the constants x^(e-1). Derived in-process from MultModP.
struct FoldConstants {
  uint64_t k_lo, k_hi;
};

FoldConstants FoldBy(uint64_t bits) {
  return {uint64_t{XPowModP(bits + 64 - 1)} << 32, uint64_t{XPowModP(bits - 1)} << 32};
}

__attribute__((target("avx512f"), always_inline)) inline __m512i FoldConstantVector() {
  static const FoldConstants k = FoldBy(2048);
  const auto lo = static_cast<long long>(k.k_lo), hi = static_cast<long long>(k.k_hi);
  return _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo);
}

// CRC register of the 256 folded bytes, from state 0.
__attribute__((target("avx512f,sse4.2"), always_inline)) inline uint32_t FinishFolded(__m512i a0,
                                                                                      __m512i a1,
                                                                                      __m512i a2,
                                                                                      __m512i a3) {
  alignas(64) uint8_t folded[256];
  _mm512_store_si512(folded, a0);
  _mm512_store_si512(folded + 64, a1);
  _mm512_store_si512(folded + 128, a2);
  _mm512_store_si512(folded + 192, a3);
  uint64_t c = 0;
  for (int i = 0; i < 256; i += 8) {
    uint64_t v;
    std::memcpy(&v, folded + i, 8);
    c = _mm_crc32_u64(c, v);
  }
  return static_cast<uint32_t>(c);
}

__attribute__((target("avx512f,vpclmulqdq"), always_inline)) inline __m512i FoldData(__m512i a,
                                                                                     __m512i k,
                                                                                     __m512i data) {
  __m512i lo = _mm512_clmulepi64_epi128(a, k, 0x00);
  __m512i hi = _mm512_clmulepi64_epi128(a, k, 0x11);
  return _mm512_ternarylogic_epi64(lo, hi, data, 0x96);  // lo ^ hi ^ data
}

__attribute__((target("avx512f,vpclmulqdq"), always_inline)) inline __m512i Fold(
    __m512i a, __m512i k, const uint8_t* next) {
  return FoldData(a, k, _mm512_loadu_si512(next));
}

__attribute__((target("avx512f,vpclmulqdq,sse4.2"))) uint32_t RawFolding(uint32_t crc,
                                                                         const uint8_t* p,
                                                                         size_t n) {
  const __m512i kk = FoldConstantVector();
  __m512i a0 = _mm512_loadu_si512(p), a1 = _mm512_loadu_si512(p + 64);
  __m512i a2 = _mm512_loadu_si512(p + 128), a3 = _mm512_loadu_si512(p + 192);
  a0 = _mm512_xor_si512(a0, _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(crc))));
  p += 256;
  n -= 256;
  while (n >= 256) {
    a0 = Fold(a0, kk, p);
    a1 = Fold(a1, kk, p + 64);
    a2 = Fold(a2, kk, p + 128);
    a3 = Fold(a3, kk, p + 192);
    p += 256;
    n -= 256;
  }
  const uint32_t c = FinishFolded(a0, a1, a2, a3);
  return RawHardware(c, p, n);
}

// 256 bytes to dst: through the caches, or (kStream, dst 64-byte aligned) with non-temporal
// stores that skip reading dst's lines in first.
template <bool kStream>
__attribute__((target("avx512f"), always_inline)) inline void Store256(uint8_t* dst, __m512i d0,
                                                                       __m512i d1, __m512i d2,
                                                                       __m512i d3) {
  if constexpr (kStream) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), d0);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + 64), d1);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + 128), d2);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + 192), d3);
  } else {
    _mm512_storeu_si512(dst, d0);
    _mm512_storeu_si512(dst + 64, d1);
    _mm512_storeu_si512(dst + 128, d2);
    _mm512_storeu_si512(dst + 192, d3);
  }
}

template <bool kStream>
__attribute__((target("avx512f,vpclmulqdq,sse4.2"))) uint32_t RawCopyFolding(uint32_t crc,
                                                                             uint8_t* dst,
                                                                             const uint8_t* p,
                                                                             size_t n) {
  const __m512i kk = FoldConstantVector();
  __m512i d0 = _mm512_loadu_si512(p), d1 = _mm512_loadu_si512(p + 64);
  __m512i d2 = _mm512_loadu_si512(p + 128), d3 = _mm512_loadu_si512(p + 192);
  Store256<kStream>(dst, d0, d1, d2, d3);
  __m512i a0 =
      _mm512_xor_si512(d0, _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(crc))));
  __m512i a1 = d1, a2 = d2, a3 = d3;
  p += 256;
  dst += 256;
  n -= 256;
  while (n >= 256) {
    d0 = _mm512_loadu_si512(p);
    d1 = _mm512_loadu_si512(p + 64);
    d2 = _mm512_loadu_si512(p + 128);
    d3 = _mm512_loadu_si512(p + 192);
    Store256<kStream>(dst, d0, d1, d2, d3);
    a0 = FoldData(a0, kk, d0);
    a1 = FoldData(a1, kk, d1);
    a2 = FoldData(a2, kk, d2);
    a3 = FoldData(a3, kk, d3);
    p += 256;
    dst += 256;
    n -= 256;
  }
  const uint32_t c = FinishFolded(a0, a1, a2, a3);
  std::memcpy(dst, p, n);
  // Non-temporal stores are weakly ordered: whoever is told next that the bytes are there
  // (an acknowledgement, a Commit) must see them.
  if constexpr (kStream) _mm_sfence();
  return RawHardware(c, p, n);
}

bool HasFolding() {
  static const bool has = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("vpclmulqdq") && __builtin_cpu_supports("sse4.2");
  return has;
}

bool HasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t reg = ~crc;
#if defined(__x86_64__)
  if (n >= 1024 && HasFolding()) return ~RawFolding(reg, p, n);
  if (HasSse42()) return ~RawHardware(reg, p, n);
#endif
  return ~RawPortable(reg, p, n);
}

uint32_t CopyWithCrc32c(void* dst, const void* src, size_t n, uint32_t crc) {
#if defined(__x86_64__)
  if (n >= 1024 && HasFolding())
    return ~RawCopyFolding<false>(~crc, static_cast<uint8_t*>(dst),
                                  static_cast<const uint8_t*>(src), n);
#endif
  std::memcpy(dst, src, n);
  return Crc32c(dst, n, crc);
}

uint32_t CopyWithCrc32cStreaming(void* dst, const void* src, size_t n, uint32_t crc) {
#if defined(__x86_64__)
  // Up to dst's next 64-byte line through the caches; the rest streams.
  const size_t head = (64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64;
  if (n >= head + 1024 && HasFolding()) {
    if (head > 0) crc = CopyWithCrc32c(dst, src, head, crc);
    return ~RawCopyFolding<true>(~crc, static_cast<uint8_t*>(dst) + head,
                                 static_cast<const uint8_t*>(src) + head, n - head);
  }
#endif
  return CopyWithCrc32c(dst, src, n, crc);
}

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, size_t len_b) {
  return MultModP(ZeroBytesOperator(len_b), crc_a) ^ crc_b;
}

bool Crc32cIsHardwareAccelerated() {
#if defined(__x86_64__)
  return HasSse42();
#else
  return false;
#endif
}

}  // namespace strata
