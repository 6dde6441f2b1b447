// Scalar IEEE half (fp16) and bfloat16 conversions, round-to-nearest-even. The SIMD paths in
// kernels.cc produce the same bits (F16C / Highway demotions round to nearest even as well).
#pragma once

#include <bit>
#include <cstdint>

namespace strata::codec {

inline float HalfToFloat(uint16_t h) {
  uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while (!(mant & 0x400));
      bits = sign | ((127 - 15 - e) << 23) | ((mant & 0x3FF) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

// fp16 of `f`, rounded to nearest even, except that anything past fp16's largest finite value
// (65504), infinities included, saturates to it with its sign: the codec's fp16 is always
// finite or NaN. A lossy reconstruction of a value near the limit (a quantiser's error, a
// transform's sum) may round past it, and an infinity in decoded KV turns attention's softmax
// into NaNs. NaNs stay NaNs (quiet).
inline uint16_t FloatToHalf(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7FFFFFFF;
  if (absx > 0x7F800000) return static_cast<uint16_t>(sign | 0x7E00);    // NaN
  if (absx >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7BFF);  // >= 65520: 65504
  if (absx < 0x38800000) {  // result is subnormal or zero
    // value = absx as float; half subnormal unit is 2^-24.
    float a = std::bit_cast<float>(absx);
    // Scale so that the rounding happens at integer resolution; the float add rounds to even.
    float scaled = a * 16777216.0f;  // 2^24, exact
    // Round to nearest even integer via the magic-number trick (exact for values < 2^23).
    float r = (scaled + 8388608.0f) - 8388608.0f;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  uint32_t mant_odd = (absx >> 13) & 1;
  absx += 0xC8000FFF + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return static_cast<uint16_t>(sign | (absx >> 13));
}

inline float BF16ToFloat(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }

inline uint16_t FloatToBF16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  x += 0x7FFF + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace strata::codec
