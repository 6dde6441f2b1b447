// The per-thread math of the CUDA codec kernels, written once for both compilers: nvcc compiles
// every function here as __host__ __device__ (kernels.cu launches it), g++ as plain inline C++
// (tests/codec/cuda_math_test.cc runs the same plans on the host, walking the same grid and the
// same thread indices, and compares with the CPU codec byte for byte). No CUDA header, no absl.
//
// A plan (GroupwiseEncodePlan, QuantEncodePlan, ...) is the sequence of steps of one operation.
// It runs on an executor with two entry points:
//   ex.ForEach(count, op)              op(i) for every i < count: one thread per i, kThreads
//                                      threads per block, ceil(count / kThreads) blocks;
//   ex.Hadamard(x, rows, n, scale)     one block per row of n floats, HadamardThreads(n) threads,
//                                      butterfly stages separated by barriers (HadamardStage).
// Steps run in order (one kernel each, so a step sees everything the previous ones wrote).
//
// Float rules (so the GPU reproduces the CPU codec's bits): every add, subtract, multiply,
// divide and square root is rounded on its own, to nearest even (device: the __f*_rn intrinsics,
// which nvcc never fuses into an FMA; host: plain operators under -ffp-contract=off, as the CPU
// codec is built); rounding to an integer is half-to-even (rintf / std::nearbyint, what the
// CPU's std::nearbyint and hn::Round do), except the predictor weight, which the CPU rounds with
// std::lround (half away from zero). Reductions run in the CPU's order: one thread owns a whole
// sum (a channel over the tokens, a group over its channels) and adds in the CPU's sequence.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define STRATA_HD __host__ __device__ __forceinline__
#else
#define STRATA_HD inline
#endif

namespace strata::codec::cuda::math {

// Element types, as strata/kv_layout.h numbers DType (device_codec.cc checks they agree).
inline constexpr uint8_t kF16 = 1;
inline constexpr uint8_t kBF16 = 2;
inline constexpr uint8_t kF32 = 3;

inline constexpr uint32_t kThreads = 256;            // ForEach: threads per block
inline constexpr float kMinStep = 6.103515625e-05f;  // 2^-14, smallest normal fp16
inline constexpr float kMaxStep = 65504.0f;          // largest finite fp16

// ---- Scalar float operations, rounded on their own ------------------------------------------

STRATA_HD float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
STRATA_HD float Sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
STRATA_HD float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
STRATA_HD float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
// Round half to even (the default rounding mode on the host).
STRATA_HD float RoundEven(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}
// Round half away from zero, as std::lround.
STRATA_HD long RoundAway(float x) {
#if defined(__CUDA_ARCH__)
  return lroundf(x);
#else
  return std::lround(x);
#endif
}
// std::min / std::max / std::clamp, with their choice of operand on ties (signed zeros).
STRATA_HD float Min(float a, float b) { return b < a ? b : a; }
STRATA_HD float Max(float a, float b) { return a < b ? b : a; }
STRATA_HD float Clamp(float v, float lo, float hi) { return v < lo ? lo : (hi < v ? hi : v); }

STRATA_HD uint32_t BitsOf(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
STRATA_HD float FloatOf(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
STRATA_HD bool IsFinite(float f) { return (BitsOf(f) & 0x7F800000u) != 0x7F800000u; }

// ---- fp16 / bf16 <-> float (round to nearest even; the CPU codec's bits) --------------------

STRATA_HD float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact in float
    return FloatOf(BitsOf(Mul(static_cast<float>(m), 5.9604644775390625e-08f)) | sign);
  }
  if (e == 31) return FloatOf(sign | 0x7F800000u | (m << 13));
  return FloatOf(sign | ((e + 112u) << 23) | (m << 13));
}

STRATA_HD uint16_t FloatToHalfBits(float f) {
  const uint32_t x = BitsOf(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t mag = x & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);  // NaN made quiet
  if (mag == 0x7F800000u) return static_cast<uint16_t>(sign | 0x7BFFu);  // saturates, as below
  const uint32_t e = mag >> 23;
  const uint32_t m = mag & 0x7FFFFFu;
  uint32_t h, rem, half;
  if (e >= 113) {  // normal fp16 range (or overflow): keep 10 of 23 mantissa bits
    h = ((e - 112u) << 10) | (m >> 13);
    rem = m & 0x1FFFu;
    half = 0x1000u;
  } else {  // below 2^-14: units of 2^-24; the value is (m | 1 << 23) * 2^(e - 126) units
    const uint32_t s = 126u - e;  // >= 14
    const uint32_t full = e == 0 ? m : (m | 0x800000u);
    if (s > 24) return static_cast<uint16_t>(sign);  // below a quarter unit (or float subnormal)
    h = full >> s;
    rem = full & ((1u << s) - 1u);
    half = 1u << (s - 1);
  }
  if (rem > half || (rem == half && (h & 1u))) ++h;  // a carry may round up into the exponent
  if (h >= 0x7C00u) h = 0x7BFFu;  // a finite overflow saturates (FloatToHalf, codec/half.h)
  return static_cast<uint16_t>(sign | h);
}

STRATA_HD float BF16BitsToFloat(uint16_t b) { return FloatOf(uint32_t{b} << 16); }

STRATA_HD uint16_t FloatToBF16Bits(float f) {
  uint32_t x = BitsOf(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

STRATA_HD uint16_t Load16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (uint32_t{p[1]} << 8));
}
STRATA_HD void Store16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

// Element i of a tensor of `dtype` (kF16, kBF16, kF32; anything else reads as 0).
STRATA_HD float LoadAsFloat(const void* p, uint8_t dtype, uint64_t i) {
  if (dtype == kF16) return HalfBitsToFloat(static_cast<const uint16_t*>(p)[i]);
  if (dtype == kBF16) return BF16BitsToFloat(static_cast<const uint16_t*>(p)[i]);
  if (dtype == kF32) return static_cast<const float*>(p)[i];
  return 0.0f;
}
STRATA_HD void StoreFromFloat(void* p, uint8_t dtype, uint64_t i, float v) {
  if (dtype == kF16) {
    static_cast<uint16_t*>(p)[i] = FloatToHalfBits(v);
  } else if (dtype == kBF16) {
    static_cast<uint16_t*>(p)[i] = FloatToBF16Bits(v);
  } else if (dtype == kF32) {
    static_cast<float*>(p)[i] = v;
  }
}

// A step of `range` over 2^bits - 1 levels, as fp16 in [2^-14, 65504] (NaN gives 2^-14).
STRATA_HD uint16_t StepToHalf(float range, int levels) {
  float st = Div(range, static_cast<float>(levels));
  if (!(st >= kMinStep)) st = kMinStep;
  if (st > kMaxStep) st = kMaxStep;
  return FloatToHalfBits(st);
}

// ---- Group-wise intN (codec/groupwise.cc) ----------------------------------------------------
// Payload: u8 bits, u16 group, fp16 scale[ng], fp16 zero[ng], codes bit-packed LSB first.

STRATA_HD uint64_t GroupwiseGroups(uint64_t n, uint32_t group) { return (n + group - 1) / group; }
STRATA_HD uint64_t GroupwisePackedBytes(uint64_t n, uint32_t bits) { return (n * bits + 7) / 8; }
STRATA_HD uint64_t GroupwisePayloadBytes(uint64_t n, uint32_t bits, uint32_t group) {
  return 3 + 4 * GroupwiseGroups(n, group) + GroupwisePackedBytes(n, bits);
}

struct GroupwiseArgs {
  const void* in = nullptr;  // encoder input / decoder output tensor of `dtype`
  void* out = nullptr;
  uint8_t dtype = kF16;
  uint64_t n = 0;
  uint32_t bits = 4;
  uint32_t group = 64;
  uint8_t* payload = nullptr;         // encoder: written
  const uint8_t* cpayload = nullptr;  // decoder: read
  STRATA_HD uint64_t groups() const { return GroupwiseGroups(n, group); }
  STRATA_HD uint64_t packed() const { return GroupwisePackedBytes(n, bits); }
};

inline constexpr uint16_t kGroupwiseNotFinite = 0x7E00;  // fp16 NaN

// Thread g: min/max of group g (sequential, so signed zeros pick as the CPU's std::min does),
// its fp16 scale and zero; thread 0 also writes the 3-byte header.
struct GroupwiseParamsOp {
  GroupwiseArgs a;
  STRATA_HD void operator()(uint64_t g) const {
    const uint64_t ng = a.groups();
    if (g == 0) {
      a.payload[0] = static_cast<uint8_t>(a.bits);
      Store16(a.payload + 1, static_cast<uint16_t>(a.group));
    }
    const uint64_t i0 = g * a.group;
    const uint64_t i1 = i0 + a.group < a.n ? i0 + a.group : a.n;
    float lo = LoadAsFloat(a.in, a.dtype, i0), hi = lo;
    bool finite = IsFinite(lo);
    for (uint64_t i = i0 + 1; i < i1; ++i) {
      const float x = LoadAsFloat(a.in, a.dtype, i);
      lo = Min(lo, x);
      hi = Max(hi, x);
      finite = finite && IsFinite(x);
    }
    if (!finite) {  // a NaN scale and zero: the host refuses the payload (GroupwiseParamsFinite)
      Store16(a.payload + 3 + 2 * g, kGroupwiseNotFinite);
      Store16(a.payload + 3 + 2 * ng + 2 * g, kGroupwiseNotFinite);
      return;
    }
    const int levels = (1 << a.bits) - 1;
    float st = Div(Sub(hi, lo), static_cast<float>(levels));
    if (!(st >= kMinStep)) st = kMinStep;
    Store16(a.payload + 3 + 2 * g, FloatToHalfBits(Min(st, kMaxStep)));
    Store16(a.payload + 3 + 2 * ng + 2 * g, FloatToHalfBits(lo));
  }
};

// The code of value i, from its group's fp16 scale and zero already in the payload.
STRATA_HD uint32_t GroupwiseCode(const GroupwiseArgs& a, const uint8_t* payload, uint64_t i) {
  const uint64_t g = i / a.group, ng = a.groups();
  const uint16_t st16 = Load16(payload + 3 + 2 * g);
  if (st16 == kGroupwiseNotFinite) return 0;
  const float st = HalfBitsToFloat(st16);
  const float z = HalfBitsToFloat(Load16(payload + 3 + 2 * ng + 2 * g));
  const float inv = Div(1.0f, st);
  const float levels = static_cast<float>((1 << a.bits) - 1);
  const float q = Clamp(RoundEven(Mul(Sub(LoadAsFloat(a.in, a.dtype, i), z), inv)), 0.0f, levels);
  return static_cast<uint32_t>(q);
}

// Thread j: packed byte j (bits 8j..8j+7 of the LSB-first code stream; zero past the last code).
struct GroupwisePackOp {
  GroupwiseArgs a;
  STRATA_HD void operator()(uint64_t j) const {
    const uint64_t bit0 = 8 * j;
    uint32_t byte = 0;
    for (uint64_t i = bit0 / a.bits; i < a.n && i * a.bits < bit0 + 8; ++i) {
      const uint32_t code = GroupwiseCode(a, a.payload, i);
      const uint64_t at = i * a.bits;
      byte |= at >= bit0 ? code << (at - bit0) : code >> (bit0 - at);
    }
    a.payload[3 + 4 * a.groups() + j] = static_cast<uint8_t>(byte);
  }
};

// Thread i: value i = zero + code * scale, in `dtype`.
struct GroupwiseDecodeOp {
  GroupwiseArgs a;
  STRATA_HD void operator()(uint64_t i) const {
    const uint64_t g = i / a.group, ng = a.groups(), packed = a.packed();
    const float st = HalfBitsToFloat(Load16(a.cpayload + 3 + 2 * g));
    const float z = HalfBitsToFloat(Load16(a.cpayload + 3 + 2 * ng + 2 * g));
    const uint8_t* codes = a.cpayload + 3 + 4 * ng;
    const uint64_t bitpos = i * a.bits, byte = bitpos >> 3;
    uint32_t v = codes[byte];
    if (byte + 1 < packed) v |= uint32_t{codes[byte + 1]} << 8;
    const uint32_t q = (v >> (bitpos & 7)) & ((1u << a.bits) - 1u);
    StoreFromFloat(a.out, a.dtype, i, Add(z, Mul(static_cast<float>(q), st)));
  }
};

template <class Exec>
void GroupwiseEncodePlan(Exec& ex, const GroupwiseArgs& a) {
  ex.ForEach(a.groups(), GroupwiseParamsOp{a});
  ex.ForEach(a.packed(), GroupwisePackOp{a});
}
template <class Exec>
void GroupwiseDecodePlan(Exec& ex, const GroupwiseArgs& a) {
  ex.ForEach(a.n, GroupwiseDecodeOp{a});
}

// ---- Orthonormal Walsh-Hadamard transform of rows of n floats (n a power of two) ------------
// The CPU's butterflies in the CPU's order: stages h = 1, 2, 4, ..., n/2; pair k of a stage is
// (i, i + h) with i = (k / h) * 2h + k % h, giving (a + b, a - b); then each value times `scale`
// (1 / sqrt(n), computed by the caller as the CPU does). Self-inverse.

// The CPU's scale (codec/kernels.cc): 1 / sqrt(n), each rounded to nearest. Host only.
inline float HadamardScale(uint32_t n) { return 1.0f / std::sqrt(static_cast<float>(n)); }

STRATA_HD uint32_t HadamardThreads(uint32_t n) { return n >= 512 ? 256 : (n >= 2 ? n / 2 : 1); }

// Thread `tid` of a block of `threads` in stage h: its butterflies k = tid, tid + threads, ...
STRATA_HD void HadamardStage(float* v, uint32_t n, uint32_t h, uint32_t tid, uint32_t threads) {
  for (uint32_t k = tid; k < n / 2; k += threads) {
    const uint32_t i = (k / h) * 2 * h + k % h;
    const float x = v[i], y = v[i + h];
    v[i] = Add(x, y);
    v[i + h] = Sub(x, y);
  }
}

// ---- Lossy quant mode (codec/quant.cc) -------------------------------------------------------
// One section: T tokens x C channels (heads x head_dim). Keys (axis 0): a step per channel over
// the block. Values (axis 1): a step per token and group of G channels. Closed-loop prediction:
//   p = mu + a * (xh - mu);  q = clamp(round((x - p) / step));  xh = p + q * step;  sym = q +
//   2^(bits+1)
// with xh = mu before the first token. One thread per channel walks the tokens in order.

struct QuantArgs {
  uint32_t T = 0, C = 0, heads = 0, head_dim = 0;
  uint32_t bits = 4;
  uint32_t group = 0;  // values: channels per step; keys: C
  bool key_axis = true;
  bool token_delta = true;
  bool hadamard = false;
  float hadamard_scale = 1.0f;
  uint8_t dtype = kF16;
  const void* in = nullptr;       // encoder input tensor, T x C of dtype
  void* out = nullptr;            // decoder output tensor
  float* f = nullptr;             // scratch T x C floats (encoder: input; decoder: reconstruction)
  float* mu = nullptr;            // scratch C floats: the centres as float (fp16-rounded)
  float* a = nullptr;             // scratch C floats: the predictor weights as float
  uint32_t* nonfinite = nullptr;  // set to 1 when an input value is NaN or infinite
  uint16_t* mu16 = nullptr;       // [C]
  uint8_t* a16 = nullptr;         // [C] in 1/16 (0 without token delta)
  uint16_t* steps16 = nullptr;    // [C] keys; [T * groups()] values
  uint16_t* syms = nullptr;       // [T * C]
  // Keys with outlier channels kept exactly (mode `:ol`, codec/quant.cc TakeKeyOutliers): up to
  // per_head channels per head, whose input the section keeps and whose values it codes as 0.
  bool outliers = false;
  uint32_t per_head = 0;           // max(1, head_dim / 16)
  float* ms = nullptr;             // encoder scratch [C]: each channel's sum of squares
  float* head_scratch = nullptr;   // encoder scratch [C]: each head's sums, sorted
  uint16_t* out_count = nullptr;   // encoder [heads]: outlier channels of each head
  uint16_t* out_idx = nullptr;     // encoder [heads * per_head], ascending per head;
                                   // decoder: the payload's nout ascending channels
  uint8_t* out_vals = nullptr;     // encoder [T * heads * per_head] elements of dtype (token,
                                   // head, slot); decoder: the payload's [T * nout] elements
  uint32_t nout = 0;               // decoder: outlier channels in the payload
  STRATA_HD uint32_t groups() const { return key_axis ? 1 : (C + group - 1) / group; }
  STRATA_HD uint64_t steps() const { return key_axis ? C : uint64_t{T} * groups(); }
  STRATA_HD int32_t offset() const { return 1 << (bits + 1); }
  STRATA_HD uint32_t step_index(uint32_t t, uint32_t c) const {
    return key_axis ? c : t * groups() + c / group;
  }
};

struct ToFloatOp {
  const void* in;
  uint8_t dtype;
  float* f;
  STRATA_HD void operator()(uint64_t i) const { f[i] = LoadAsFloat(in, dtype, i); }
};
struct FromFloatOp {
  const float* f;
  uint8_t dtype;
  void* out;
  STRATA_HD void operator()(uint64_t i) const { StoreFromFloat(out, dtype, i, f[i]); }
};

// ---- Outlier channels of keys (`:ol`) ----
// Thread c: the channel's sum of squares over the tokens (from 0.0f, in token order), as the
// CPU's SumSquaresRow accumulates it row by row.
struct KeyMeanSquareOp {
  QuantArgs a;
  STRATA_HD void operator()(uint64_t c) const {
    float acc = 0.0f;
    for (uint32_t t = 0; t < a.T; ++t) {
      const float x = a.f[uint64_t{t} * a.C + c];
      acc = Add(acc, Mul(x, x));
    }
    a.ms[c] = acc;
  }
};

// Thread h: head h's outlier channels: those whose sum of squares is over 16 times the head's
// median (the element at head_dim / 2 in sorted order) and over 0, the largest first (ties:
// the lower channel), at most per_head, then in ascending channel order.
struct KeyOutlierSelectOp {
  QuantArgs a;
  STRATA_HD void operator()(uint64_t h) const {
    const uint32_t D = a.head_dim;
    const float* ms = a.ms + h * D;
    float* sorted = a.head_scratch + h * D;
    for (uint32_t i = 0; i < D; ++i) {  // insertion sort: head_dim is small
      const float v = ms[i];
      uint32_t j = i;
      for (; j > 0 && v < sorted[j - 1]; --j) sorted[j] = sorted[j - 1];
      sorted[j] = v;
    }
    const float bar = Mul(16.0f, sorted[D / 2]);
    uint16_t* chosen = a.out_idx + h * a.per_head;
    uint32_t n = 0;
    while (n < a.per_head) {
      int64_t best = -1;
      for (uint32_t i = 0; i < D; ++i) {
        const float v = ms[i];
        if (!(v > bar && v > 0.0f)) continue;
        bool taken = false;
        for (uint32_t k = 0; k < n; ++k) taken = taken || chosen[k] == h * D + i;
        if (taken) continue;
        if (best < 0 || v > ms[best]) best = i;  // ties keep the lower channel
      }
      if (best < 0) break;
      chosen[n++] = static_cast<uint16_t>(h * D + static_cast<uint32_t>(best));
    }
    for (uint32_t i = 1; i < n; ++i) {
      const uint16_t v = chosen[i];
      uint32_t j = i;
      for (; j > 0 && v < chosen[j - 1]; --j) chosen[j] = chosen[j - 1];
      chosen[j] = v;
    }
    a.out_count[h] = static_cast<uint16_t>(n);
  }
};

STRATA_HD uint32_t ElementBytes(uint8_t dtype) { return dtype == kF32 ? 4 : 2; }

// Thread t * heads + h: keeps token t's input elements of head h's outlier channels (their
// bytes, as the payload stores them), flags a non-finite one, and zeroes them in f.
struct KeyOutlierTakeOp {
  QuantArgs a;
  STRATA_HD void operator()(uint64_t k) const {
    const uint64_t t = k / a.heads, h = k % a.heads;
    const uint32_t eb = ElementBytes(a.dtype);
    const uint8_t* in = static_cast<const uint8_t*>(a.in);
    for (uint32_t i = 0; i < a.out_count[h]; ++i) {
      const uint64_t c = a.out_idx[h * a.per_head + i];
      const uint64_t e = t * a.C + c;
      if (!IsFinite(a.f[e])) *a.nonfinite = 1;
      a.f[e] = 0.0f;
      uint8_t* dst = a.out_vals + ((t * a.heads + h) * a.per_head + i) * eb;
      for (uint32_t b = 0; b < eb; ++b) dst[b] = in[e * eb + b];
    }
  }
};

// Thread t (decoder): puts token t's kept elements back over what the rows wrote there.
struct KeyOutlierRestoreOp {
  QuantArgs a;
  STRATA_HD void operator()(uint64_t t) const {
    const uint32_t eb = ElementBytes(a.dtype);
    uint8_t* out = static_cast<uint8_t*>(a.out);
    for (uint32_t i = 0; i < a.nout; ++i) {
      const uint64_t e = t * a.C + a.out_idx[i];
      const uint8_t* src = a.out_vals + (t * a.nout + i) * eb;
      for (uint32_t b = 0; b < eb; ++b) out[e * eb + b] = src[b];
    }
  }
};

// Thread c: the channel's sum over the tokens (from 0.0f, in token order), finiteness, centre
// mu = fp16(sum / T); keys also min/max over the tokens and the channel's step.
struct QuantChannelOp {
  QuantArgs a;
  STRATA_HD void operator()(uint64_t c) const {
    float sum = 0.0f;
    float lo = a.f[c], hi = lo;
    bool finite = true;
    for (uint32_t t = 0; t < a.T; ++t) {
      const float x = a.f[uint64_t{t} * a.C + c];
      finite = finite && IsFinite(x);
      sum = Add(sum, x);
      lo = Min(lo, x);
      hi = Max(hi, x);
    }
    if (!finite) *a.nonfinite = 1;
    const uint16_t m16 = FloatToHalfBits(Div(sum, static_cast<float>(a.T)));
    a.mu16[c] = m16;
    a.mu[c] = HalfBitsToFloat(m16);
    if (a.key_axis) a.steps16[c] = StepToHalf(Sub(hi, lo), (1 << a.bits) - 1);
  }
};

// Thread t * groups + g (values): the range of token t's channel group g and its step.
struct QuantGroupStepOp {
  QuantArgs a;
  STRATA_HD void operator()(uint64_t k) const {
    const uint64_t t = k / a.groups(), g = k % a.groups();
    const uint64_t c0 = g * a.group, c1 = c0 + a.group < a.C ? c0 + a.group : a.C;
    const float* row = a.f + t * a.C;
    float lo = row[c0], hi = lo;
    for (uint64_t c = c0 + 1; c < c1; ++c) {
      lo = Min(lo, row[c]);
      hi = Max(hi, row[c]);
    }
    a.steps16[k] = StepToHalf(Sub(hi, lo), (1 << a.bits) - 1);
  }
};

// Thread c: the predictor weight a = rho * var / (var + step^2 / 12), rounded to 1/16 in [0, 1]
// (AR(1) statistics over the tokens in order; values use the mean over the tokens of their
// group's step^2). 0 without token delta or with one token.
struct QuantPredictorOp {
  QuantArgs a;
  STRATA_HD void operator()(uint64_t c) const {
    a.a16[c] = 0;
    a.a[c] = 0.0f;
    if (!a.token_delta || a.T <= 1) return;
    const float m = a.mu[c];
    float num = 0.0f, den = 0.0f;
    for (uint32_t t = 1; t < a.T; ++t) {
      const float y0 = Sub(a.f[uint64_t{t - 1} * a.C + c], m);
      const float y1 = Sub(a.f[uint64_t{t} * a.C + c], m);
      num = Add(num, Mul(y0, y1));
      den = Add(den, Mul(y0, y0));
    }
    float d2;
    if (a.key_axis) {
      const float st = HalfBitsToFloat(a.steps16[c]);
      d2 = Mul(st, st);
    } else {
      d2 = 0.0f;
      const uint32_t g = static_cast<uint32_t>(c / a.group);
      for (uint32_t t = 0; t < a.T; ++t) {
        const float st = HalfBitsToFloat(a.steps16[t * a.groups() + g]);
        d2 = Add(d2, Div(Mul(st, st), static_cast<float>(a.T)));
      }
    }
    if (den <= 0) return;
    const float rho = Div(num, den);
    const float var = Div(den, static_cast<float>(a.T - 1));
    const float w = Div(Mul(rho, var), Add(var, Div(d2, 12.0f)));
    const long q = RoundAway(Mul(Clamp(w, 0.0f, 1.0f), 16.0f));
    a.a16[c] = static_cast<uint8_t>(q);
    a.a[c] = Div(static_cast<float>(q), 16.0f);
  }
};

// One element of the closed loop (the CPU's QuantRow lane): the prediction from the previous
// reconstruction xh, the symbol (*sym), and the new reconstruction (returned).
STRATA_HD float QuantElement(float x, float m, float w, float xh, float st, float inv, float qlo,
                             float qhi, int32_t off, uint16_t* sym) {
  const float p = Add(m, Mul(w, Sub(xh, m)));
  float q = RoundEven(Mul(Sub(x, p), inv));
  q = Min(Max(q, qlo), qhi);
  *sym = static_cast<uint16_t>(static_cast<int32_t>(q) + off);
  return Add(p, Mul(q, st));
}

// Thread c (keys): the closed loop over the tokens; writes the symbols of channel c.
struct QuantClosedLoopOp {
  QuantArgs a;
  STRATA_HD void operator()(uint64_t c) const {
    const int32_t off = a.offset();
    const float qlo = static_cast<float>(-off);
    const float qhi = static_cast<float>(static_cast<int32_t>((4u << a.bits) - 1) - off);
    const float m = a.mu[c], w = a.a[c];
    float xh = m;
    for (uint32_t t = 0; t < a.T; ++t) {
      const float st = HalfBitsToFloat(a.steps16[a.step_index(t, static_cast<uint32_t>(c))]);
      const float inv = Div(1.0f, st);
      const uint64_t i = uint64_t{t} * a.C + c;
      xh = QuantElement(a.f[i], m, w, xh, st, inv, qlo, qhi, off, &a.syms[i]);
    }
  }
};

// Thread g (values): the closed loop of channel group g over the tokens. Before quantising a
// token, its group's step grows where a residual against the prediction would be clipped
// (codec/quant.cc WidenValueSteps: the same operations in the same order), so the step is a
// property of the whole group and one thread owns it. The reconstruction overwrites the input
// in f as it goes (f[t-1] is the previous reconstruction).
struct QuantValueLoopOp {
  QuantArgs a;
  STRATA_HD void operator()(uint64_t g) const {
    const int32_t off = a.offset();
    const float qlo = static_cast<float>(-off);
    const float qhi = static_cast<float>(static_cast<int32_t>((4u << a.bits) - 1) - off);
    const float room = Sub(static_cast<float>(off), 1.0f);
    const uint64_t c0 = g * a.group, c1 = c0 + a.group < a.C ? c0 + a.group : a.C;
    for (uint32_t t = 0; t < a.T; ++t) {
      const uint64_t row = uint64_t{t} * a.C;
      float worst = 0.0f;
      for (uint64_t c = c0; c < c1; ++c) {
        const float m = a.mu[c];
        const float xh = t == 0 ? m : a.f[row - a.C + c];
        const float p = Add(m, Mul(a.a[c], Sub(xh, m)));
        const float r = Sub(a.f[row + c], p);
        worst = Max(worst, r < 0.0f ? -r : r);
      }
      uint16_t* step16 = &a.steps16[uint64_t{t} * a.groups() + g];
      const float need = Div(worst, Sub(room, 0.5f));
      if (need > HalfBitsToFloat(*step16)) {
        uint16_t h = FloatToHalfBits(Min(need, kMaxStep));
        while (HalfBitsToFloat(h) < need && HalfBitsToFloat(h) < kMaxStep) ++h;
        *step16 = h;
      }
      const float st = HalfBitsToFloat(*step16);
      const float inv = Div(1.0f, st);
      for (uint64_t c = c0; c < c1; ++c) {
        const float m = a.mu[c];
        const float xh = t == 0 ? m : a.f[row - a.C + c];
        a.f[row + c] =
            QuantElement(a.f[row + c], m, a.a[c], xh, st, inv, qlo, qhi, off, &a.syms[row + c]);
      }
    }
  }
};

// Thread c (decoder): the same loop from the symbols; writes the reconstruction to f.
struct QuantDequantOp {
  QuantArgs a;
  STRATA_HD void operator()(uint64_t c) const {
    const int32_t off = a.offset();
    const float m = HalfBitsToFloat(a.mu16[c]);
    const float w = a.token_delta ? Div(static_cast<float>(a.a16[c]), 16.0f) : 0.0f;
    float xh = m;
    for (uint32_t t = 0; t < a.T; ++t) {
      const float st = HalfBitsToFloat(a.steps16[a.step_index(t, static_cast<uint32_t>(c))]);
      const uint64_t i = uint64_t{t} * a.C + c;
      const float p = Add(m, Mul(w, Sub(xh, m)));
      const float q = static_cast<float>(static_cast<int32_t>(a.syms[i]) - off);
      xh = Add(p, Mul(q, st));
      a.f[i] = xh;
    }
  }
};

template <class Exec>
void QuantEncodePlan(Exec& ex, const QuantArgs& a) {
  const uint64_t n = uint64_t{a.T} * a.C;
  ex.ForEach(n, ToFloatOp{a.in, a.dtype, a.f});
  if (a.outliers && a.key_axis) {
    ex.ForEach(a.C, KeyMeanSquareOp{a});
    ex.ForEach(a.heads, KeyOutlierSelectOp{a});
    ex.ForEach(uint64_t{a.T} * a.heads, KeyOutlierTakeOp{a});
  }
  if (a.hadamard) ex.Hadamard(a.f, uint64_t{a.T} * a.heads, a.head_dim, a.hadamard_scale);
  ex.ForEach(a.C, QuantChannelOp{a});
  if (!a.key_axis) ex.ForEach(a.steps(), QuantGroupStepOp{a});
  ex.ForEach(a.C, QuantPredictorOp{a});
  if (a.key_axis)
    ex.ForEach(a.C, QuantClosedLoopOp{a});
  else
    ex.ForEach(a.groups(), QuantValueLoopOp{a});
}

// Host side, after QuantEncodePlan: its outlier picks (per-head slots: out_count, out_idx,
// out_vals) laid out as the section's payload lays them out, the kept channels ascending in
// idx (heads in order, each ascending) and their elements token by token in vals ([T][nout]).
// idx holds heads * per_head entries, vals T * heads * per_head elements. Returns nout.
inline uint32_t GatherOutliers(const QuantArgs& a, const uint16_t* out_count,
                               const uint16_t* out_idx, const uint8_t* out_vals, uint16_t* idx,
                               uint8_t* vals) {
  const uint32_t eb = ElementBytes(a.dtype);
  uint32_t nout = 0;
  for (uint32_t h = 0; h < a.heads; ++h)
    for (uint32_t i = 0; i < out_count[h]; ++i) idx[nout++] = out_idx[h * a.per_head + i];
  uint8_t* dst = vals;
  for (uint32_t t = 0; t < a.T; ++t)
    for (uint32_t h = 0; h < a.heads; ++h)
      for (uint32_t i = 0; i < out_count[h]; ++i) {
        const uint64_t slot = (uint64_t{t} * a.heads + h) * a.per_head + i;
        std::memcpy(dst, out_vals + slot * eb, eb);
        dst += eb;
      }
  return nout;
}

template <class Exec>
void QuantDecodePlan(Exec& ex, const QuantArgs& a) {
  const uint64_t n = uint64_t{a.T} * a.C;
  ex.ForEach(a.C, QuantDequantOp{a});
  if (a.hadamard) ex.Hadamard(a.f, uint64_t{a.T} * a.heads, a.head_dim, a.hadamard_scale);
  ex.ForEach(n, FromFloatOp{a.f, a.dtype, a.out});
  if (a.nout > 0) ex.ForEach(a.T, KeyOutlierRestoreOp{a});
}

}  // namespace strata::codec::cuda::math
