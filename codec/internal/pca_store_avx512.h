// The pca decoders' store pass on AVX-512 (the AMX tiles', the token lanes' and VNNI's): a group
// of 16 tokens' sums, [c][16], become token rows (mean + scale * sum), rotated (RoPE) and
// converted to the block's type in one pass; with the helpers the decoders share. Header-only:
// each decoder's file inlines it under its own target.
#ifndef STRATA_CODEC_INTERNAL_PCA_STORE_AVX512_H_
#define STRATA_CODEC_INTERNAL_PCA_STORE_AVX512_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "codec/internal/pca_amx.h"

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define STRATA_PCA_AVX512 1
// GCC 12's AVX-512 headers start conversions from _mm512_undefined_*(), which it then reports.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#define STRATA_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))

namespace strata::codec::internal::avx512 {

// Word i of the result: word i / 2 of the low half for even i, of the high half for odd i.
STRATA_AVX512_TARGET inline __m512i PairIndex() {
  alignas(64) uint16_t idx[32];
  for (int i = 0; i < 32; ++i) idx[i] = static_cast<uint16_t>((i & 1) ? 16 + i / 2 : i / 2);
  return _mm512_load_si512(idx);
}

// x rounded to bf16 (nearest even, as FloatToBF16 for finite x), as a float.
STRATA_AVX512_TARGET inline __m512 RoundToBf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd));
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(-65536)));
}

// r[i] <- column i of the 16 x 16 block r.
STRATA_AVX512_TARGET inline void Transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
  }
}

// Columns c0 .. c0 + 15 of a group's token rows: r[t] = mean + scale * sums[c][t].
STRATA_AVX512_TARGET inline void LoadRows(const float* sums, __m512 scale, const float* mean,
                                          size_t c0, __m512 r[16]) {
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(sums + (c0 + i) * 16);
  Transpose16(r);
  const __m512 m = _mm512_loadu_ps(mean + c0);
  for (int t = 0; t < 16; ++t) r[t] = _mm512_fmadd_ps(r[t], scale, m);
}

// 16 values at element `at` of out's data; kStream: past the caches (the address aligned to
// the store's width).
template <PcaRows::Type kType, bool kStream = false>
STRATA_AVX512_TARGET inline void PutAt(void* data, size_t at, __m512 v) {
  if constexpr (kType == PcaRows::Type::kFloat32) {
    float* p = static_cast<float*>(data) + at;
    if constexpr (kStream) {
      _mm512_stream_ps(p, v);
    } else {
      _mm512_storeu_ps(p, v);
    }
    return;
  }
  __m256i half;
  if constexpr (kType == PcaRows::Type::kFloat16) {
    // Values past fp16's largest finite one saturate to it, as FloatToHalf's do (codec/half.h):
    // infinities too; NaN passes (min and max return their second operand where one is NaN).
    v = _mm512_max_ps(_mm512_set1_ps(-65504.0f), _mm512_min_ps(_mm512_set1_ps(65504.0f), v));
    half = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {  // FloatToBF16's rounding (vcvtneps2bf16 would flush subnormals)
    half = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(RoundToBf16(v)), 16));
  }
  __m256i* p = reinterpret_cast<__m256i*>(static_cast<uint16_t*>(data) + at);
  if constexpr (kStream) {
    _mm256_stream_si256(p, half);
  } else {
    _mm256_storeu_si256(p, half);
  }
}

// 16 values of row t at column c.
template <PcaRows::Type kType>
STRATA_AVX512_TARGET inline void Put(const PcaRows& out, size_t t, size_t c, __m512 v) {
  PutAt<kType>(out.data, t * out.stride + c, v);
}

// A group's token rows (out's rows first_token ...) from its sums [c][16]: mean[c] +
// scale * sums[c][t], then, with `rope`, rotated as RopeRows does (same operations, same bits).
template <PcaRows::Type kType>
STRATA_AVX512_TARGET inline void StoreRows(const float* sums, size_t dim, float scale,
                                    const float* mean, size_t rows, const PcaRope* rope,
                                    size_t first_token, const PcaRows& out) {
  const __m512 sc = _mm512_set1_ps(scale);
  __m512 a[16], b[16];
  if (!rope) {
    for (size_t c0 = 0; c0 < dim; c0 += 16) {
      LoadRows(sums, sc, mean, c0, a);
      for (size_t t = 0; t < rows; ++t) Put<kType>(out, first_token + t, c0, a[t]);
    }
    return;
  }
  const size_t half = dim / 2;
  for (size_t c0 = 0; c0 < half; c0 += 16) {
    LoadRows(sums, sc, mean, c0, a);
    LoadRows(sums, sc, mean, c0 + half, b);
    for (size_t t = 0; t < rows; ++t) {
      const size_t at = (first_token + t) * half + c0;
      const __m512 c = _mm512_loadu_ps(rope->cos + at), s = _mm512_loadu_ps(rope->sin + at);
      Put<kType>(out, first_token + t, c0,
                 _mm512_sub_ps(_mm512_mul_ps(a[t], c), _mm512_mul_ps(b[t], s)));
      Put<kType>(out, first_token + t, c0 + half,
                 _mm512_add_ps(_mm512_mul_ps(b[t], c), _mm512_mul_ps(a[t], s)));
    }
  }
}

// The same rows from sums already in token order, [t][dim] (the VNNI decoder's column lanes):
// the same operations as StoreRows without its transposes, so the same bits. kStream: with
// streaming stores (StreamsRows), and the caller fences once they are all issued.
template <PcaRows::Type kType, bool kStream>
STRATA_AVX512_TARGET inline void StoreTokenRows(const float* sums, size_t dim, float scale,
                                                const float* mean, size_t rows,
                                                const PcaRope* rope, size_t first_token,
                                                const PcaRows& out) {
  const __m512 sc = _mm512_set1_ps(scale);
  const size_t half = dim / 2;
  // Held in locals: the compiler cannot tell the stores from out's and rope's fields.
  void* const data = out.data;
  const size_t stride = out.stride;
  const float* const cos = rope ? rope->cos : nullptr;
  const float* const sin = rope ? rope->sin : nullptr;
  for (size_t t = 0; t < rows; ++t) {
    const float* r = sums + t * dim;
    const size_t token = first_token + t, row = token * stride;
    if (!rope) {
      for (size_t c0 = 0; c0 < dim; c0 += 16)
        PutAt<kType, kStream>(
            data, row + c0,
            _mm512_fmadd_ps(_mm512_loadu_ps(r + c0), sc, _mm512_loadu_ps(mean + c0)));
      continue;
    }
    const float* const tc = cos + token * half;
    const float* const ts = sin + token * half;
    for (size_t c0 = 0; c0 < half; c0 += 16) {
      const __m512 a = _mm512_fmadd_ps(_mm512_loadu_ps(r + c0), sc, _mm512_loadu_ps(mean + c0));
      const __m512 b = _mm512_fmadd_ps(_mm512_loadu_ps(r + c0 + half), sc,
                                       _mm512_loadu_ps(mean + c0 + half));
      const __m512 c = _mm512_loadu_ps(tc + c0), s = _mm512_loadu_ps(ts + c0);
      PutAt<kType, kStream>(data, row + c0,
                            _mm512_sub_ps(_mm512_mul_ps(a, c), _mm512_mul_ps(b, s)));
      PutAt<kType, kStream>(data, row + c0 + half,
                            _mm512_add_ps(_mm512_mul_ps(b, c), _mm512_mul_ps(a, s)));
    }
  }
}

// Whether StoreTokenRows may stream into out: every row's every 16 values aligned to the
// store's width. A block decodes once into memory it does not read back soon, so its stores
// need not fetch each line into the cache first (measured: decode 1.1-1.2x on real KV).
inline bool StreamsRows(const PcaRows& out) {
  const size_t width = out.type == PcaRows::Type::kFloat32 ? 64 : 32;
  const size_t elem = out.type == PcaRows::Type::kFloat32 ? 4 : 2;
  return reinterpret_cast<uintptr_t>(out.data) % width == 0 && out.stride * elem % width == 0;
}

STRATA_AVX512_TARGET inline void StoreTokenGroup(const float* sums, size_t dim, float scale,
                                                 const float* mean, size_t rows,
                                                 const PcaRope* rope, size_t first_token,
                                                 const PcaRows& out, bool stream) {
  WithRowsKind(out.type, stream, [&](auto type, auto streaming) {
    StoreTokenRows<decltype(type)::value, decltype(streaming)::value>(sums, dim, scale, mean,
                                                                      rows, rope, first_token,
                                                                      out);
  });
}

// A group's rows from its sums [c][16]; with `stream` (StreamsRows, and dim <= 256), transposed
// into token rows first and streamed as StoreTokenRows does (a row at a time: a streaming store
// of a part of a line that stays part is slow, and StoreRows's order leaves 16 rows' lines
// half-written at once); the caller fences once the group's rows are all issued.
STRATA_AVX512_TARGET inline void StoreGroup(const float* sums, size_t dim, float scale,
                                     const float* mean, size_t tokens, const PcaRope* rope,
                                     size_t g, const PcaRows& out, bool stream = false) {
  const size_t rows = std::min<size_t>(16, tokens - g * 16);
  if (stream && dim <= 256) {
    alignas(64) float token_rows[16 * 256];
    __m512 r[16];
    for (size_t c0 = 0; c0 < dim; c0 += 16) {
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(sums + (c0 + i) * 16);
      Transpose16(r);
      for (int t = 0; t < 16; ++t) _mm512_store_ps(token_rows + t * dim + c0, r[t]);
    }
    return StoreTokenGroup(token_rows, dim, scale, mean, rows, rope, g * 16, out, true);
  }
  switch (out.type) {
    case PcaRows::Type::kFloat32:
      return StoreRows<PcaRows::Type::kFloat32>(sums, dim, scale, mean, rows, rope, g * 16, out);
    case PcaRows::Type::kFloat16:
      return StoreRows<PcaRows::Type::kFloat16>(sums, dim, scale, mean, rows, rope, g * 16, out);
    case PcaRows::Type::kBFloat16:
      return StoreRows<PcaRows::Type::kBFloat16>(sums, dim, scale, mean, rows, rope, g * 16,
                                                 out);
  }
}

// Token t's head vector as floats in xrow, RoPE undone where `rope` (as RopeRows undoes it,
// the same float operations).
STRATA_AVX512_TARGET inline void LoadRow(const PcaInput& in, size_t t, size_t dim,
                                        const PcaRope* rope, float* xrow) {
  const size_t at = t * in.stride;
  switch (in.type) {
    case PcaRows::Type::kFloat32:
      std::memcpy(xrow, static_cast<const float*>(in.data) + at, dim * sizeof(float));
      break;
    case PcaRows::Type::kFloat16:
      for (size_t d = 0; d < dim; d += 16) {
        const auto* h = static_cast<const uint16_t*>(in.data) + at + d;
        _mm512_storeu_ps(xrow + d,
                         _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h))));
      }
      break;
    case PcaRows::Type::kBFloat16:
      for (size_t d = 0; d < dim; d += 16) {
        const auto* h = static_cast<const uint16_t*>(in.data) + at + d;
        const __m512i w =
            _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
        _mm512_storeu_ps(xrow + d, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
      }
      break;
  }
  if (!rope) return;
  const size_t half = dim / 2;
  const float* cos = rope->cos + t * half;
  const float* sin = rope->sin + t * half;
  for (size_t j = 0; j < half; j += 16) {
    const __m512 a = _mm512_loadu_ps(xrow + j), b = _mm512_loadu_ps(xrow + j + half);
    const __m512 c = _mm512_loadu_ps(cos + j), s = _mm512_loadu_ps(sin + j);
    _mm512_storeu_ps(xrow + j, _mm512_add_ps(_mm512_mul_ps(a, c), _mm512_mul_ps(b, s)));
    _mm512_storeu_ps(xrow + j + half, _mm512_sub_ps(_mm512_mul_ps(b, c), _mm512_mul_ps(a, s)));
  }
}

}  // namespace strata::codec::internal::avx512

#endif
#endif  // STRATA_CODEC_INTERNAL_PCA_STORE_AVX512_H_
