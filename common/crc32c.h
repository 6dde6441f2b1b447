// CRC32C (Castagnoli), the checksum of every committed blob. Uses the SSE4.2 crc32 instruction
// over three interleaved streams when the CPU has it, a table otherwise.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata {

// Extends `crc` (0 for a fresh checksum) with `n` bytes at `data`.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

// Copies n bytes from src to dst and returns the CRC32C of them (extending `crc`), reading src
// once: the checksum is computed on the data in registers while it is copied.
uint32_t CopyWithCrc32c(void* dst, const void* src, size_t n, uint32_t crc = 0);

// As CopyWithCrc32c, for bytes nobody reads soon (a block published into the arena, a fetched
// block bound for a GPU copy): where the CPU has AVX-512, dst's whole 64-byte lines are written
// with non-temporal stores, which do not first read them from memory (a cold 1 GiB destination,
// two threads: 1.5x the speed; a cache-hot source, one thread: 2.5x). The bytes are visible to
// other threads when it returns.
uint32_t CopyWithCrc32cStreaming(void* dst, const void* src, size_t n, uint32_t crc = 0);

// The CRC of the concatenation A||B given crc(A), crc(B) and the length of B.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, size_t len_b);

// True when the hardware path is in use (reported by benchmarks and `stratad --version`).
bool Crc32cIsHardwareAccelerated();

}  // namespace strata
