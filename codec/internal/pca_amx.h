// The pca decoder's reconstruction on Intel AMX tiles (codec/pca_amx.cc): the same sum as
// PcaReconstruct, as a bf16 matrix product with float accumulation, for cores that have AMX
// (Sapphire Rapids and later). The coordinates are integers (symbol - maxq: exact in bf16 up to
// 256, the rare larger ones split in two exact parts) and each axis times its step is split
// into two bf16 halves (hi + lo, 16 significant bits), so the result differs from the float
// kernels by float rounding only (|error| <= 2^-16 of the sum of the terms' magnitudes), not by
// the bf16 rounding of either operand. Where the block's finest step is coarse (at least 2^-6
// of the head's spread, the encoder's rule below) the lo halves are left out: one product
// instead of two, each term then off by at most 2^-9 of itself. Summed over a head's columns
// that adds at most 1/(16 n) of the quantisation's own error energy (n coded coordinates; the
// roundings' errors, <= 2^-18/3 of the centred energy on average, against >= n steps^2/12), so
// the decoded values may differ from the float kernels' in their last bits, by far less than
// the codec's own error.
#ifndef STRATA_CODEC_INTERNAL_PCA_AMX_H_
#define STRATA_CODEC_INTERNAL_PCA_AMX_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "codec/internal/aligned.h"

namespace strata::codec::internal {

// The encoder's projection on the tiles as well (PcaEncodeHeadAmx): y = basis rows . x. Where
// the head's finest step is at least 2^-6 of its vectors' spread (the rms of their distance to
// the mean), both operands are rounded to bf16 and one product taken: a coordinate is then off
// by at most 2^-8 of sum |a x| (<= 2^-8 |x|, the rows being unit vectors), typically far less
// as the roundings' errors mostly cancel, i.e. a small fraction of a step. Elsewhere (fine
// steps, high rates) both are split into bf16 hi + lo halves and three of the four products
// taken (hi.hi, hi.lo, lo.hi): off by at most ~2^-16 of sum |a x|. Either way a symbol differs
// from the float kernels' only for a coordinate that close to a rounding boundary, by one step.
// The bit stream is then not the float kernels' bit for bit; either decodes on every machine.
// (On real KV at 1.5 bits per value the single product makes encoding 1.2-1.35x faster, with
// bits per value and rel_mse printing the same to three digits.)
//
// Supported: the CPU has AMX-BF16 and AVX512-BF16, the kernel granted this process the tile
// state, and the environment does not say STRATA_CODEC_AMX=0 (checked once). Available: the
// kernels below may run (supported, and no test switched them off).
bool PcaAmxSupported();
bool PcaAmxAvailable();
// Tests: run the float kernels even where AMX is available (false), or AMX again (true); the
// encoder's projection has its own switch (the reference tests define the bit stream with the
// float kernels).
void SetPcaAmxEnabledForTest(bool enabled);
void SetPcaAmxEncodeEnabledForTest(bool enabled);
bool PcaAmxEncodeAvailable();
// Heads this process has reconstructed on the tiles (of them, with one product), and projected
// with one bf16 product (tests: the paths were taken).
uint64_t PcaAmxHeadsDecoded();
uint64_t PcaAmxHeadsDecodedInBf16();
uint64_t PcaAmxHeadsProjectedInBf16();

// Whether a head whose finest step is `finest_step_to_spread` of its vectors' spread (the rms
// of their distance to the mean) needs the split operands, in the encoder's projection and the
// decoder's sum alike: below 2^-6 (see above).
inline bool NeedsSplitOperands(double finest_step_to_spread) {
  return finest_step_to_spread < 0x1p-6;
}

// A head's axes times their steps, bf16 hi and lo halves, in the tiles' pair rows: [kpad / 2]
// [dim][2] (coordinate k's axis at column c in word (k / 2 * dim + c) * 2 + k % 2, k in the
// decoder's slot order; k >= n zero). Empty when the shape does not fit the tiles (dim not a
// multiple of 32).
struct PcaAmxAxes {
  CacheAlignedVector<uint16_t> hi, lo;
  size_t kpad = 0;
};
void BuildPcaAmxAxes(const float* basis, const uint32_t* coords, const float* steps, size_t n,
                     size_t dim, PcaAmxAxes* axes);

// A head's axes for the encoder: basis rows coords[k] (k < n; rows n .. kpad - 1 zero, kpad = n
// rounded up to 16) as bf16, [kpad][dim], and with `split` their lo halves too (else lo stays
// empty: one product). Empty when the shape does not fit the tiles (dim not a multiple of 32).
struct PcaAmxBasis {
  CacheAlignedVector<uint16_t> hi, lo;
  size_t kpad = 0;
};
void BuildPcaAmxBasis(const float* basis, const uint32_t* coords, size_t n, size_t dim,
                      bool split, PcaAmxBasis* out);

// The encoder's work on one head, from the section's rows (x[t * stride + c], t < tokens, RoPE
// already undone): per token, norm2[t] += sum x^2 and err2[t] += sum (x - mean)^2 (as
// PcaCenterT, summed in another order), and y[k * tp + t] = sum over c of basis(k, c) *
// (x[t][c] - mean[c]) for k < kpad and t < tp (tokens rounded up to 16; rows n .. kpad - 1 and
// tokens past the end zero): PcaProjectT's coordinates. `y` holds kpad * tp.
void PcaEncodeHeadAmx(const float* x, size_t stride, size_t tokens, size_t dim, const float* mean,
                      const PcaAmxBasis& basis, size_t tp, double* norm2, double* err2, float* y,
                      std::vector<uint16_t>* scratch);

// The tiles' configuration (palette 1) as _tile_loadconfig reads it; both AMX users fill it.
struct AmxTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Where a section's symbols are: token t of slot j at sym[(t / 16) * 16 * nslots + j * 16 +
// t % 16] for the whole groups of 16, and the last `T % 16` tokens at sym[full * 16 * nslots + j *
// rest + i].
struct PcaSymbols {
  const void* sym;
  bool wide;  // uint16_t symbols, else uint8_t
  size_t nslots, tokens;
  int32_t maxq;  // < 2^16
};

struct PcaAmxScratch {
  std::vector<uint16_t> coords;  // token groups' coordinates, in pairs and in token rows
  std::vector<float> sums;       // two token groups' sums, [group][t % 16][c]
};

// RoPE angles' cosines and sines, [token][dim / 2] (RopeTable).
struct PcaRope {
  const float* cos;
  const float* sin;
};

// Where the rows go: `stride` values apart, as floats or converted (round to nearest even, as
// FromFloat does for finite values).
struct PcaRows {
  enum class Type : uint8_t { kFloat32, kFloat16, kBFloat16 };
  void* data;
  Type type;
  size_t stride;
};

// Calls f(std::integral_constant<PcaRows::Type, type>{}, std::bool_constant<stream>{}): the
// store passes' loops per row type and store kind, each a compile-time constant.
template <typename F>
inline void WithRowsKind(PcaRows::Type type, bool stream, F&& f) {
  using T = PcaRows::Type;
  auto with = [&](auto kind) {
    if (stream) {
      f(kind, std::true_type{});
    } else {
      f(kind, std::false_type{});
    }
  };
  switch (type) {
    case T::kFloat32: return with(std::integral_constant<T, T::kFloat32>{});
    case T::kFloat16: return with(std::integral_constant<T, T::kFloat16>{});
    case T::kBFloat16: return with(std::integral_constant<T, T::kBFloat16>{});
  }
}

// Where the encoder's rows come from: token t's head vector at element t * stride of `data`,
// of the block's type.
struct PcaInput {
  const void* data;
  PcaRows::Type type;
  size_t stride;
};

// PcaEncodeHeadAmx from the rows as they are in the block (fp32, fp16 or bf16): each token's
// row converted to float and, with `rope` (else null), rotated back as RopeRows(..., inverse)
// rotates it, in the same pass, so the section is not written out as floats first. The same
// norm2, err2 and y, bit for bit, as PcaEncodeHeadAmx on the converted, rotated rows. False,
// with the head half done, where a value (after the rotation) is not finite.
bool PcaEncodeHeadAmxRows(const PcaInput& in, const PcaRope* rope, size_t tokens, size_t dim,
                          const float* mean, const PcaAmxBasis& basis, size_t tp, double* norm2,
                          double* err2, float* y, std::vector<uint16_t>* scratch);

struct PcaVnniAxes;  // internal/pca_avx512.h

// With AMX-INT8 as well (PcaAmxInt8Available: the CPU has it and AVX512-VBMI, the tiles are
// supported, STRATA_CODEC_AMX_INT8=0 does not turn it off and no test switched it off), heads
// whose VNNI axes are int8 throughout (axes.pairs == 0, axes.quads > 0: the coordinates the VNNI
// decoder's rule admits, internal/pca_avx512.h) are summed on the tiles as that decoder sums
// them: the raw byte symbols (unsigned) times the int8 terms (signed), 64 coordinates per product
// where bf16 takes 32, the exact int32 sums less maxq times each column's sum of terms, times the
// column's unit, then the same store pass. The rows are bit for bit PcaReconstructVnni's with the
// same axes.
bool PcaAmxInt8Supported();
bool PcaAmxInt8Available();
void SetPcaAmxInt8EnabledForTest(bool enabled);
// False, writing nothing, where the head does not qualify (wide symbols, int16 coordinates, no
// int8 ones, dim not a multiple of 32) or the tiles are not supported.
bool PcaReconstructAmxInt8(const PcaSymbols& s, const uint32_t* slot, size_t n,
                           const PcaVnniAxes& axes, size_t dim, float scale, const float* mean,
                           const PcaRope* rope, const PcaRows& out, PcaAmxScratch* scratch);
// Heads this process has summed with AMX-INT8 (tests: the path was taken).
uint64_t PcaAmxInt8HeadsDecoded();

// row t = mean[c] + scale * sum over k < n of (sym(t, slot[k]) - maxq) * axes(c, k), t <
// tokens (one fused multiply-add: at scale 1 exactly the sum plus the mean); then, with `rope`
// (else null), each row rotated as RopeRows rotates it. `split`: the axes' hi and lo halves
// both (else hi alone, the one product above).
void PcaReconstructAmx(const PcaSymbols& s, const uint32_t* slot, size_t n,
                       const PcaAmxAxes& axes, bool split, size_t dim, float scale,
                       const float* mean, const PcaRope* rope, const PcaRows& out,
                       PcaAmxScratch* scratch);

}  // namespace strata::codec::internal

#endif  // STRATA_CODEC_INTERNAL_PCA_AMX_H_
