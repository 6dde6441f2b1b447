// Raw low bits of the split quant coder (section coder kCoderSplit, see quant.cc): n values of r
// bits each (1 <= r <= 7), every value a byte < 2^r, packed little-endian: value i occupies bits
// [i * r, (i + 1) * r) of the packed string, whose last byte is padded with zero bits. Groups of
// 8 values are r whole bytes, packed with one PEXT (unpacked with one PDEP) where the CPU has
// BMI2, by shifts otherwise; both write the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::codec::internal {

inline size_t LowBitsBytes(size_t n, int r) { return (n * static_cast<size_t>(r) + 7) / 8; }

// Writes LowBitsBytes(n, r) bytes; `out` must have room for 8 more (stores are 8 bytes wide).
void PackLowBits(const uint8_t* lo, size_t n, int r, uint8_t* out);
// Reads exactly LowBitsBytes(n, r) bytes of `in` (never past them); `out` must have room for
// n + 8 bytes. Returns false when the padding bits of the last byte are not zero.
bool UnpackLowBits(const uint8_t* in, size_t n, int r, uint8_t* out);

// One token row of the low bits when some channels store none (the outlier channels of `ol`
// sections): out[c] = the next value of `in` for channels whose bit is set in `keep` (bit c % 64
// of keep[c / 64]), 0 for the others; returns the number of values read. `in` must be readable
// 64 bytes past the values it holds, `out` writable to C rounded up to 64. AVX-512 VBMI2
// (vpexpandb, 64 channels per step) where available, copies of the kept runs otherwise.
size_t ExpandLowBitsRow(const uint8_t* in, const uint64_t* keep, size_t C, uint8_t* out);

// The inverse, in place over T rows of C values: keeps the values of channels whose bit is set
// in `keep` (no bits at or past C), in order, at the front of `lo`; returns how many. VBMI2
// (vpcompressb, 64 channels per step) where available, moves of the kept runs otherwise.
size_t CompactLowBits(uint8_t* lo, size_t T, size_t C, const uint64_t* keep);

// Tests: use the shift-based packer and unpacker (and the run-copy expansion and compaction)
// even where BMI2 (VBMI2) is available.
void ForceScalarLowBitsForTesting(bool on);

}  // namespace strata::codec::internal
