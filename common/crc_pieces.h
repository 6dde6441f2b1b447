// Copying or checking many blocks on more than one thread: each block is cut into pieces that
// threads take in any order, and a block's CRC32C is combined from its pieces' CRCs afterwards
// (the client's mapped copies, the host tier's commit check, stratad's staged copies).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/crc32c.h"

namespace strata {

// `len` bytes at `offset` within block `block`.
struct CrcPiece {
  size_t block;
  uint64_t offset, len;
};

// Pieces of at most `piece_bytes` of blocks 0..n-1, whose lengths `length_of(i)` gives, in block
// order.
template <typename LengthOf>
std::vector<CrcPiece> SplitIntoCrcPieces(size_t n, LengthOf length_of, uint64_t piece_bytes) {
  std::vector<CrcPiece> pieces;
  for (size_t b = 0; b < n; ++b) {
    const uint64_t length = length_of(b);
    for (uint64_t off = 0; off < length; off += piece_bytes)
      pieces.push_back({b, off, std::min(piece_bytes, length - off)});
  }
  return pieces;
}

// Each block's CRC from its pieces' CRCs (pieces in block order, as split); 0 for an empty block.
inline std::vector<uint32_t> CombineCrcPieces(std::span<const CrcPiece> pieces,
                                              std::span<const uint32_t> crcs, size_t blocks) {
  std::vector<uint32_t> out(blocks, 0);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const CrcPiece& p = pieces[i];
    out[p.block] = p.offset == 0 ? crcs[i] : Crc32cCombine(out[p.block], crcs[i], p.len);
  }
  return out;
}

}  // namespace strata
