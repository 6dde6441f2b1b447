// Per-section encoders and decoders of each mode (one section = one layer's K or V tensor).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "codec/codec.h"
#include "codec/internal/aligned.h"
#include "codec/internal/pca_amx.h"
#include "codec/rans.h"

namespace strata::codec {
class Calibration;
}

namespace strata::codec::internal {

struct TensorShape {
  uint32_t tokens = 0;
  uint32_t heads = 0;
  uint32_t head_dim = 0;
  DType dtype = DType::kFloat16;
  bool is_key = true;
  size_t channels() const { return size_t{heads} * head_dim; }
  size_t values() const { return size_t{tokens} * channels(); }
  size_t bytes() const { return values() * DTypeBytes(dtype); }
};

// A float array that starts `phase` bytes past a 4 KiB boundary. The row kernels read mu, a and
// step and write xh in one pass; arrays at equal addresses modulo 4 KiB (what the allocator gives
// 4 KiB vectors allocated one after another) make a load wait on an unrelated earlier store
// (4K aliasing). Staggering the arrays by a quarter page each keeps them apart.
class RowArray {
 public:
  explicit RowArray(size_t phase) : phase_(phase) {}
  void resize(size_t n) {
    if (n + kSlack > buf_.size()) buf_.resize(n + kSlack);
    const auto addr = reinterpret_cast<uintptr_t>(buf_.data());
    begin_ = buf_.data() + ((phase_ - addr % 4096) % 4096) / sizeof(float);
    n_ = n;
  }
  void assign(size_t n, float v) {
    resize(n);
    std::fill(begin_, begin_ + n, v);
  }
  void assign(const float* b, const float* e) {
    resize(static_cast<size_t>(e - b));
    std::copy(b, e, begin_);
  }
  float* data() { return begin_; }
  const float* data() const { return begin_; }
  float& operator[](size_t i) { return begin_[i]; }
  const float* begin() const { return begin_; }
  const float* end() const { return begin_ + n_; }
  size_t size() const { return n_; }

 private:
  static constexpr size_t kSlack = 4096 / sizeof(float);
  size_t phase_;
  std::vector<float> buf_;
  float* begin_ = nullptr;
  size_t n_ = 0;
};

// pca: RoPE cosines and sines of a block's tokens, per (token, pair).
struct RopeTable {
  size_t tokens = 0, dim = 0;
  uint64_t first_position = 0;
  float theta = 0;
  CacheAlignedVector<float> cos, sin;  // [token][pair]; each 64-byte load within one line
  // The blocks' common part, for (tokens, dim, theta): the pairs' frequencies and the angles
  // of the offsets t * freq[pair] (cos, sin; [token][pair]), so that a block pays one sincos
  // per pair, not per (token, pair).
  size_t offsets_tokens = 0, offsets_dim = 0;
  float offsets_theta = 0;
  std::vector<double> freq, offset_cos, offset_sin;
};

struct SectionScratch {
  std::vector<float> f;    // tensor as floats
  std::vector<float> row;  // one row of floats
  RowArray mu{0}, a{1024}, step{2048}, inv_step{3072}, xh{512};
  std::vector<float> mn, mx;
  std::vector<uint16_t> steps16;
  std::vector<uint16_t> syms;
  std::vector<uint16_t> mu16, out_idx;  // DecodeQuantHandoff: aligned copies of payload fields
  CacheAlignedVector<uint8_t> syms8;  // symbols of alphabets <= 256 (pca: 16-symbol runs)
  std::vector<uint8_t> lo, hi;
  std::vector<uint8_t> lo_row;  // split coder with outliers: the low bits spread over channels
  std::vector<uint32_t> counts, hcounts;  // split coder: histograms
  std::vector<int32_t> pq;                // pca encoder: quantised coordinates
  std::vector<double> pd;                 // pca encoder: per-token squared norms and errors
  std::vector<int32_t> pm;                // pca encoder: per-token largest |q|
  std::vector<float> ps;                  // pca encoder: one head's scaled steps, inverses
  std::vector<float> pg;                  // pca encoder (float kernels): one head's gains
  RopeTable rope;                         // pca: the block's RoPE angles
  PcaAmxScratch amx;                      // pca decoder on AMX tiles
  std::vector<uint32_t> vnni;             // pca encoder with VNNI: a pass's token pairs
  // Encoders: bytes to prefetch while quantising (the next section's input), or null.
  const uint8_t* prefetch = nullptr;
  size_t prefetch_bytes = 0;
  rans::Scratch rans;
};

// Channel-group contexts for the rANS tables: 16 consecutive channels of a head share one.
inline uint32_t NumChannelContexts(const TensorShape& s) {
  return s.head_dim % 32 == 0 ? s.head_dim / 32 : 1;
}

// SectionEntry::coder of entropy-coded sections: 1 = rANS with 32 interleaved states (blobs
// written before the 64-state coder), 2 = rANS with 64 states (what the encoder writes now).
inline constexpr uint8_t kCoderRans32 = 1;
inline constexpr uint8_t kCoderRans64 = 2;
inline constexpr uint8_t kCoderRans128 = 4;
// Byte-plane lossless (bf16) and quant sections of more than 6 bits: 64 states (their 16-bit
// symbols gain nothing from more chains, and the 128-state encoder is slower on them).
inline constexpr uint8_t kCoderWritten = kCoderRans64;
// The rANS coder id the encoder writes: kCoderWritten, or what a test set.
uint8_t CoderWritten();
// The coder of a quant section of `bits`: kCoderShared for byte symbols (bits <= 6), kCoderSplit
// for 7-8 bits; or what a test set.
uint8_t QuantCoder(uint8_t bits);
// The split coder's high part without a shared stream (direct EncodeQuant calls in tests): 128
// states from this many symbols, 64 below.
inline constexpr size_t kMinValuesFor128 = 32768;
// Tests: make the encoder write rANS sections with this coder id (1, 2 or 4; 0 = default), to
// check that blobs of earlier coders still decode.
void SetCoderWrittenForTesting(uint8_t coder);
// Lossless fp16 sections written since the exponent-plane layout (see lossless.cc): per group of
// 32 values a bit-packed exponent offset, raw sign and mantissa bits; no rANS. bf16 sections
// still use the byte-plane layout with kCoderWritten.
inline constexpr uint8_t kCoderExpPlanes = 3;
// Quant sections of 7-8 bits (since the split coder): each symbol's high part (sym >> r, minus
// a base) rANS-coded as bytes, its low r bits stored raw and bit-packed (low_bits.h); r is chosen
// per section from the data (see quant.cc). Where no r keeps the coded size within
// kSplitMaxLoss of the symbols' entropy, the section is written with kCoderWritten instead.
inline constexpr uint8_t kCoderSplit = 5;
inline constexpr double kSplitMaxLoss = 0.005;
// Quant sections of <= 6 bits since the shared stream: the section holds its rANS tables, its
// symbols are coded in the blob's one 128-state stream (rans::SharedEncoder), which is the
// blob's last section (SectionType::kStream). Sections written before it (coder 1, 2, 4: a
// stream per section, whose 128 final states cost 2-5% of a small model's 49k-value section, and
// 32 states, which cost the decoder its parallelism) still decode.
// The split coder's high part is coded the same way (its high-part coder byte is then 6).
inline constexpr uint8_t kCoderShared = 6;
// Tests: make the split coder use this r where its high part fits bytes (0 = choose from the
// data), to exercise every r.
void SetSplitLowBitsForTesting(int r);
// Lanes of a section's rANS streams, or 0 for an unknown coder.
inline int RansLanes(uint8_t coder) {
  return coder == kCoderRans32 ? 32 : coder == kCoderRans64 ? 64 : coder == kCoderRans128 ? 128 : 0;
}

// Converts n values of `dtype` to float / back.
void ToFloat(const uint8_t* in, DType dtype, float* out, size_t n);
void FromFloat(const float* in, DType dtype, uint8_t* out, size_t n);
// Orthonormal fast Walsh-Hadamard transform of each n-vector (n a power of two); self-inverse.
void HadamardRows(float* x, size_t rows, size_t n);

// *coder: in, the coder QuantCoder chose; out, the coder the section was written with (the split
// coder falls back to kCoderWritten where it does not pay).
// `shared`: the blob's stream, for kCoderShared sections (the encoder takes sections first to
// last, the decoder last to first).
absl::Status EncodeQuant(const uint8_t* in, const TensorShape& s, uint8_t bits,
                         const CodecParams& p, SectionScratch* sc, std::vector<uint8_t>* out,
                         rans::CoderStats* stats, std::vector<uint16_t>* symbol_sink,
                         uint8_t* coder, rans::SharedEncoder* shared);
// The same section from a device encoder's quantiser output (checked first; InvalidArgument
// when it does not fit the section). Takes arrays.syms and arrays.steps16 (swapped with the
// scratch's).
absl::Status EncodeQuantArrays(SectionArrays& arrays, const TensorShape& s, uint8_t bits,
                               const CodecParams& p, SectionScratch* sc,
                               std::vector<uint8_t>* out, rans::CoderStats* stats,
                               std::vector<uint16_t>* symbol_sink, uint8_t* coder,
                               rans::SharedEncoder* shared);
// The quantiser alone, to the arrays a device encoder hands over (rate control caches them
// between its trial encodes).
absl::Status QuantiseToArrays(const uint8_t* in, const TensorShape& s, uint8_t bits,
                              const CodecParams& p, SectionScratch* sc, SectionArrays* out);
absl::Status DecodeQuant(std::span<const uint8_t> payload, const TensorShape& s, uint8_t bits,
                         uint8_t coder, SectionScratch* sc, uint8_t* out,
                         rans::SharedDecoder* shared);
// The same section up to its symbols, handed over as arrays (a device decoder's input); the
// spans point into `payload` and `sc`.
absl::Status DecodeQuantHandoff(std::span<const uint8_t> payload, const TensorShape& s,
                                uint8_t bits, uint8_t coder, SectionScratch* sc,
                                rans::SharedDecoder* shared, SectionHandoff* out);

absl::Status EncodeLossless(const uint8_t* in, const TensorShape& s, SectionScratch* sc,
                            std::vector<uint8_t>* out, rans::CoderStats* stats);
absl::Status DecodeLossless(std::span<const uint8_t> payload, const TensorShape& s, uint8_t coder,
                            SectionScratch* sc, uint8_t* out);
// The exponent-plane layout (coder kCoderExpPlanes, fp16 only).
absl::Status EncodeLosslessPlanes(const uint8_t* in, const TensorShape& s, SectionScratch* sc,
                                  std::vector<uint8_t>* out, rans::CoderStats* stats);
absl::Status DecodeLosslessPlanes(std::span<const uint8_t> payload, const TensorShape& s,
                                  SectionScratch* sc, uint8_t* out);
// Tests: run the scalar exponent-plane coder even where AVX-512 is available.
void ForceScalarPlanesForTesting(bool on);
// Tests: write fp16 lossless sections in the byte-plane layout (kCoderWritten), as before the
// exponent-plane layout, to check that such blobs still decode.
void WriteBytePlanesForTesting(bool on);
bool WriteBytePlanes();

absl::Status EncodeGroupwise(const uint8_t* in, const TensorShape& s, uint8_t bits, uint16_t group,
                             SectionScratch* sc, std::vector<uint8_t>* out,
                             rans::CoderStats* stats);
absl::Status DecodeGroupwise(std::span<const uint8_t> payload, const TensorShape& s, uint8_t bits,
                             SectionScratch* sc, uint8_t* out);
// True when every fp16 scale and zero of a groupwise payload (2 * groups words from `scales`) is
// finite: an encoder writes a NaN scale for a group whose input was not (the device encoder's
// way of saying so), and a decoder must not turn one into a block of NaNs.
bool GroupwiseParamsFinite(const uint8_t* scales, size_t groups);

// RoPE on T x H head vectors of dimension D (rotate-half pairs j, j + D/2; token t at position
// first_position + t, angle position * theta^(-2j/D)), or its inverse.
// `table`: a cache reused while the block's geometry and position stay the same (or null).
void RotateRope(float* x, size_t T, size_t H, size_t D, uint64_t first_position, float theta,
                bool inverse, RopeTable* table = nullptr);

// Calibrated transform sections (pca.cc): `cal` must match the layout (the caller checks).
// `first_position`: where the block's first token sits in its sequence; the encoder undoes RoPE
// at it (when the calibration does) and, at 0, keeps that token exact.
// A pca section's coordinates before quantisation, which do not depend on the steps: per head
// [k][t] from y[ybase[h]] (tokens padded to 16), and per token the squared norm and the
// centred energy (pd: norm2[tp], then energy[tp]). A bit budget's trial encodes of one block
// project each section once.
struct PcaProjection {
  CacheAlignedVector<float> y;  // the tiles store their rows here
  std::vector<size_t> ybase;
  std::vector<double> pd;
};
absl::Status ProjectPca(const uint8_t* in, const TensorShape& s, const Calibration& cal,
                        uint32_t layer, uint32_t tensor, uint64_t first_position,
                        SectionScratch* sc, PcaProjection* out);
// A bit budget's size model (internal/size_model.h): every coded coordinate of the section's
// projection over its `tokens` tokens (less the first where `skip_first`: the sequence's, kept
// exact), a symbol per token.
void AddPcaSpreads(const Calibration& cal, uint32_t layer, uint32_t tensor, size_t tokens,
                   bool skip_first, const PcaProjection& projected, std::vector<double>* spreads);
// The section of `in`, projected as `projected`; `step_scale` multiplies every step of the
// calibration (PcaStepScale of the section's code).
absl::Status EncodePca(const uint8_t* in, const TensorShape& s, const Calibration& cal,
                       uint32_t layer, uint32_t tensor, uint64_t first_position, float step_scale,
                       const PcaProjection& projected, SectionScratch* sc,
                       std::vector<uint8_t>* out, rans::CoderStats* stats,
                       rans::SharedEncoder* shared);
absl::Status DecodePca(std::span<const uint8_t> payload, const TensorShape& s,
                       const Calibration& cal, uint32_t layer, uint32_t tensor,
                       uint64_t first_position, float step_scale, SectionScratch* sc, uint8_t* out,
                       rans::SharedDecoder* shared);
// A pca section's step scale from its code (the section entry's `bits`): 2^((code - 128) / 32),
// code 0 (blobs from before step scales) meaning 1. The same float on every machine.
float PcaStepScale(uint8_t code);

}  // namespace strata::codec::internal
