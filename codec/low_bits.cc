#include "codec/internal/low_bits.h"

#include <algorithm>
#include <bit>
#include <cstring>

#if defined(__x86_64__)
#if defined(__GNUC__) && !defined(__clang__)
// GCC's AVX-512 headers start some intrinsics from _mm*_undefined_*(), which -Wall flags.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define STRATA_LOW_BITS_BMI2 1
#endif

namespace strata::codec::internal {
namespace {

bool g_force_scalar = false;

// Mask of the low r bits of each of the 8 bytes of a word.
inline uint64_t ByteMask(int r) { return ((uint64_t{1} << r) - 1) * 0x0101010101010101ull; }

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline void Store64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }

// 8 bytes (low r bits each) <-> 8r bits, by shifts.
inline uint64_t Gather8(uint64_t v, int r) {
  uint64_t o = 0;
  for (int i = 0; i < 8; ++i) o |= ((v >> (8 * i)) & ((uint64_t{1} << r) - 1)) << (i * r);
  return o;
}
inline uint64_t Scatter8(uint64_t v, int r) {
  uint64_t o = 0;
  for (int i = 0; i < 8; ++i) o |= ((v >> (i * r)) & ((uint64_t{1} << r) - 1)) << (8 * i);
  return o;
}

template <bool kBmi2>
inline uint64_t Pack8(uint64_t v, int r, uint64_t mask);
template <bool kBmi2>
inline uint64_t Unpack8(uint64_t v, int r, uint64_t mask);

template <>
inline uint64_t Pack8<false>(uint64_t v, int r, uint64_t) {
  return Gather8(v, r);
}
template <>
inline uint64_t Unpack8<false>(uint64_t v, int r, uint64_t) {
  return Scatter8(v, r);
}
#if STRATA_LOW_BITS_BMI2
template <>
__attribute__((target("bmi2"), always_inline)) inline uint64_t Pack8<true>(uint64_t v, int,
                                                                           uint64_t mask) {
  return _pext_u64(v, mask);
}
template <>
__attribute__((target("bmi2"), always_inline)) inline uint64_t Unpack8<true>(uint64_t v, int,
                                                                             uint64_t mask) {
  return _pdep_u64(v, mask);
}
#define STRATA_BMI2_FN __attribute__((target("bmi2")))
#else
#define STRATA_BMI2_FN
#endif

template <bool kBmi2>
STRATA_BMI2_FN void PackImpl(const uint8_t* lo, size_t n, int r, uint8_t* out) {
  const uint64_t mask = ByteMask(r);
  const size_t groups = n / 8;
  for (size_t g = 0; g < groups; ++g)
    Store64(out + g * r, Pack8<kBmi2>(Load64(lo + 8 * g), r, mask));
  if (const size_t t = n % 8) {
    uint8_t tail[8] = {};
    std::memcpy(tail, lo + 8 * groups, t);
    Store64(out + groups * r, Pack8<kBmi2>(Load64(tail), r, mask));
  }
}

// Unpacks groups g0.. (8 values each) to the end.
template <bool kBmi2>
STRATA_BMI2_FN void UnpackImpl(const uint8_t* in, size_t n, int r, uint8_t* out, size_t g0) {
  const uint64_t mask = ByteMask(r);
  const size_t groups = n / 8, bytes = LowBitsBytes(n, r);
  size_t g = g0;
  // Groups whose 8-byte load stays inside the packed bytes.
  for (; g < groups && g * r + 8 <= bytes; ++g)
    Store64(out + 8 * g, Unpack8<kBmi2>(Load64(in + g * r), r, mask));
  // The rest (at most 8 groups and the tail) from a zero-padded copy.
  uint8_t buf[8 * 8 + 16] = {};
  const size_t left = bytes - g * r;  // <= 8 r + r
  if (left != 0) std::memcpy(buf, in + g * r, left);  // `in` may be null when there is nothing
  const size_t total = (n + 7) / 8;  // groups including a partial one
  for (size_t k = 0; g < total; ++g, ++k)
    Store64(out + 8 * g, Unpack8<kBmi2>(Load64(buf + k * r), r, mask));
}

#if STRATA_LOW_BITS_BMI2
__attribute__((target("avx512f,avx512bw,avx512vbmi2"))) size_t ExpandRowVbmi2(const uint8_t* in,
                                                                              const uint64_t* keep,
                                                                              size_t C,
                                                                              uint8_t* out) {
  const uint8_t* p = in;
  for (size_t c = 0, k = 0; c < C; c += 64, ++k) {
    const __mmask64 m = keep[k];
    _mm512_storeu_si512(out + c, _mm512_maskz_expand_epi8(m, _mm512_loadu_si512(p)));
    p += std::popcount(static_cast<uint64_t>(m));
  }
  return static_cast<size_t>(p - in);
}

// 64 values per step: a masked load of their 8r bytes, vpermb puts group q's r bytes in qword q,
// vpmultishiftqb takes byte i of each qword from bit i * r on, and the mask keeps r bits.
// Returns the number of whole 8-value groups done. The loads never pass the packed bytes.
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) size_t UnpackVbmi(const uint8_t* in,
                                                                         size_t n, int r,
                                                                         uint8_t* out) {
  alignas(64) uint8_t perm[64], shifts[64];
  for (int q = 0; q < 8; ++q)
    for (int i = 0; i < 8; ++i) {
      perm[8 * q + i] = static_cast<uint8_t>(std::min(63, q * r + i));
      shifts[8 * q + i] = static_cast<uint8_t>(i * r);
    }
  const __m512i pv = _mm512_load_si512(perm), sv = _mm512_load_si512(shifts);
  const __m512i mv = _mm512_set1_epi8(static_cast<char>((1u << r) - 1));
  const __mmask64 lm = (uint64_t{1} << (8 * r)) - 1;
  const size_t blocks = n / 64;
  for (size_t b = 0; b < blocks; ++b) {
    const __m512i v = _mm512_maskz_loadu_epi8(lm, in + b * 8 * r);
    const __m512i w = _mm512_multishift_epi64_epi8(sv, _mm512_permutexvar_epi8(pv, v));
    _mm512_storeu_si512(out + 64 * b, _mm512_and_si512(w, mv));
  }
  return blocks * 8;
}

bool HaveVbmi() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vbmi");
  return ok && !g_force_scalar;
}

bool HaveVbmi2() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vbmi2");
  return ok && !g_force_scalar;
}
#endif

bool HaveBmi2() {
#if STRATA_LOW_BITS_BMI2
  static const bool ok = __builtin_cpu_supports("bmi2");
  return ok && !g_force_scalar;
#else
  return false;
#endif
}

}  // namespace

void ForceScalarLowBitsForTesting(bool on) { g_force_scalar = on; }

void PackLowBits(const uint8_t* lo, size_t n, int r, uint8_t* out) {
  if (HaveBmi2())
    PackImpl<true>(lo, n, r, out);
  else
    PackImpl<false>(lo, n, r, out);
}

#if STRATA_LOW_BITS_BMI2
// vpcompressb into a register and a masked store of the kept bytes (vpcompressb to memory is
// microcoded on Zen 4); the store never passes them, so in-place rows stay intact.
__attribute__((target("avx512f,avx512bw,avx512vbmi2"))) size_t CompactVbmi2(uint8_t* lo, size_t T,
                                                                            size_t C,
                                                                            const uint64_t* keep) {
  uint8_t* dst = lo;
  for (size_t t = 0; t < T; ++t) {
    const uint8_t* row = lo + t * C;
    for (size_t c = 0, k = 0; c < C; c += 64, ++k) {
      const size_t len = std::min<size_t>(64, C - c);
      const __mmask64 in_mask = len == 64 ? ~uint64_t{0} : (uint64_t{1} << len) - 1;
      const __m512i v = _mm512_maskz_loadu_epi8(in_mask, row + c);
      const uint64_t m = keep[k];
      const int kept = std::popcount(m);
      const __mmask64 out_mask = kept == 64 ? ~uint64_t{0} : (uint64_t{1} << kept) - 1;
      _mm512_mask_storeu_epi8(dst, out_mask, _mm512_maskz_compress_epi8(m, v));
      dst += kept;
    }
  }
  return static_cast<size_t>(dst - lo);
}
#endif

size_t CompactLowBits(uint8_t* lo, size_t T, size_t C, const uint64_t* keep) {
#if STRATA_LOW_BITS_BMI2
  if (HaveVbmi2()) return CompactVbmi2(lo, T, C, keep);
#endif
  uint8_t* dst = lo;
  for (size_t t = 0; t < T; ++t) {
    const uint8_t* row = lo + t * C;
    for (size_t c = 0; c < C;) {
      const bool kept = (keep[c / 64] >> (c % 64)) & 1;
      size_t e = c + 1;
      while (e < C && (((keep[e / 64] >> (e % 64)) & 1) == kept)) ++e;
      if (kept) {
        std::memmove(dst, row + c, e - c);
        dst += e - c;
      }
      c = e;
    }
  }
  return static_cast<size_t>(dst - lo);
}

size_t ExpandLowBitsRow(const uint8_t* in, const uint64_t* keep, size_t C, uint8_t* out) {
#if STRATA_LOW_BITS_BMI2
  if (HaveVbmi2()) return ExpandRowVbmi2(in, keep, C, out);
#endif
  const uint8_t* p = in;
  for (size_t c = 0; c < C;) {
    const bool kept = (keep[c / 64] >> (c % 64)) & 1;
    size_t e = c + 1;
    while (e < C && (((keep[e / 64] >> (e % 64)) & 1) == kept)) ++e;
    if (kept) {
      std::memcpy(out + c, p, e - c);
      p += e - c;
    } else {
      std::memset(out + c, 0, e - c);
    }
    c = e;
  }
  return static_cast<size_t>(p - in);
}

bool UnpackLowBits(const uint8_t* in, size_t n, int r, uint8_t* out) {
  const size_t bits = n * static_cast<size_t>(r);
  if (bits % 8 != 0 && (in[bits / 8] >> (bits % 8)) != 0) return false;
  size_t g0 = 0;
#if STRATA_LOW_BITS_BMI2
  if (HaveVbmi()) g0 = UnpackVbmi(in, n, r, out);
#endif
  if (HaveBmi2())
    UnpackImpl<true>(in, n, r, out, g0);
  else
    UnpackImpl<false>(in, n, r, out, g0);
  return true;
}

}  // namespace strata::codec::internal
