// How the client reads one pushed block (am_wire::kFetchBlockAm), or one piece of a block
// (am_wire::kFetchPieceAm), against the fetch waiting for it. Pure, so
// tests/fuzz/am_reply_fuzzer runs exactly what DataMover::OnPushedBlock and OnPushedPiece run.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/internal/wire_status.h"
#include "common/am_wire.h"
#include "common/crc32c.h"

namespace strata::client {

struct PushedBlock {
  enum Kind {
    kNotOurs,   // malformed header or another request's (a late block of a fetch that gave up)
    kRefused,   // the daemon refused the whole request: `error` says why
    kMismatch,  // not a block the request asked for, or asked for once already: `error`
    kAccepted,  // block `index`: its bytes are in `data` (eager) or still at the daemon
  };
  Kind kind = kNotOurs;
  uint32_t index = 0;
  absl::Status error;
};

// `length` and `rendezvous` are the message's; `length_of(i)` is the size the request asked
// for block i (i < blocks); `arrived[i]` says whether block i came already.
inline PushedBlock ReadPushedBlock(std::string_view header, std::string_view data, size_t length,
                                   bool rendezvous, uint64_t request_id, size_t blocks,
                                   absl::FunctionRef<uint64_t(size_t)> length_of,
                                   std::span<const uint8_t> arrived) {
  const auto h = am_wire::DecodeFetchBlockHeader(header);
  if (!h || h->request_id != request_id) return {};
  if (h->index == am_wire::kFetchRefused) {
    return {PushedBlock::kRefused, h->index,
            absl::Status(
                IsOkOnWire(h->code) ? absl::StatusCode::kInternal : StatusCodeFromWire(h->code),
                absl::StrCat("daemon refused the fetch: ", std::string(data)))};
  }
  // Counted once per block: a duplicate would count a block that never came as landed.
  if (h->index >= blocks || h->index >= arrived.size() || length != length_of(h->index) ||
      arrived[h->index] || (!rendezvous && data.size() != length)) {
    return {PushedBlock::kMismatch, h->index,
            absl::InternalError("daemon sent a block that does not match the request")};
  }
  return {PushedBlock::kAccepted, h->index, absl::OkStatus()};
}

// The pieces of a fetch's blocks (am_wire::kFetchPieceAm): which came, and each block's CRC32C
// taken as its pieces were copied in, while they come in order. UCX delivers one endpoint's
// messages in order over tcp; should pieces ever come otherwise, the block is checked from
// memory once whole instead. Memory: a byte per piece, the fetch's bytes over at least
// am_wire::kMinPushPieceBytes.
class PushedPieces {
 public:
  enum Kind { kNotOurs, kMismatch, kTake };
  struct Piece {
    Kind kind = kNotOurs;
    uint32_t index = 0;
    uint64_t offset = 0;
    absl::Status error;
  };

  // The fetch asked for pieces of at most `asked` bytes (0: none may come) of `blocks` blocks.
  PushedPieces(uint32_t asked, size_t blocks) : asked_(asked), blocks_(blocks) {}

  // Reads a piece message (`data_bytes` of data); kTake: copy the data to `offset` of block
  // `index`, then call Took. A piece that does not fit the request (unasked, a block that comes
  // whole, a wrong offset or size, one that came already, a block already whole) is a mismatch.
  Piece Read(std::string_view header, size_t data_bytes, uint64_t request_id,
             absl::FunctionRef<uint64_t(size_t)> length_of, std::span<const uint8_t> arrived) {
    const auto h = am_wire::DecodeFetchPieceHeader(header);
    if (!h || h->block.request_id != request_id) return {};
    const uint32_t index = h->block.index;
    auto mismatch = [&](const char* why) {
      return Piece{kMismatch, index, h->offset,
                   absl::InternalError(absl::StrCat("daemon sent a piece of block ", index,
                                                    " that does not match the request: ", why))};
    };
    if (asked_ == 0) return mismatch("no pieces were asked for");
    if (index >= blocks_ || index >= arrived.size()) return mismatch("no such block");
    if (arrived[index]) return mismatch("the block is whole already");
    const uint64_t length = length_of(index);
    const uint64_t piece = am_wire::PushPieceBytes(length, asked_);
    if (piece >= length) return mismatch("the block comes whole");
    if (h->offset % piece != 0 || h->offset >= length ||
        data_bytes != std::min(piece, length - h->offset))
      return mismatch("wrong offset or size");
    if (first_.empty()) Plan(length_of);
    uint8_t& seen = seen_[first_[index] + h->offset / piece];
    if (seen) return mismatch("the piece came twice");
    seen = 1;
    return {kTake, index, h->offset, absl::OkStatus()};
  }

  // The piece Read accepted is in place, `crc` its bytes' CRC32C. True when its block is whole:
  // then `*crc_of_block` is the block's CRC, or nullopt where pieces came out of order.
  bool Took(uint32_t index, uint64_t offset, uint64_t bytes, uint32_t crc,
            std::optional<uint32_t>* crc_of_block) {
    if (offset == taken_in_order_[index] && in_order_[index]) {
      crcs_[index] = offset == 0 ? crc : Crc32cCombine(crcs_[index], crc, bytes);
      taken_in_order_[index] += bytes;
    } else {
      in_order_[index] = 0;
    }
    if (--left_[index] != 0) return false;
    *crc_of_block = in_order_[index] ? std::optional<uint32_t>(crcs_[index]) : std::nullopt;
    return true;
  }

 private:
  void Plan(absl::FunctionRef<uint64_t(size_t)> length_of) {
    first_.resize(blocks_ + 1);
    left_.resize(blocks_);
    size_t pieces = 0;
    for (size_t b = 0; b < blocks_; ++b) {
      first_[b] = pieces;
      const uint64_t length = length_of(b);
      const bool pieced = am_wire::PushPieceBytes(length, asked_) < length;
      // Lengths are the lease's, inside the arena (DataMover::CheckExtents): counts fit.
      left_[b] = pieced ? static_cast<uint32_t>(am_wire::PushMessages(length, asked_)) : 0;
      pieces += left_[b];
    }
    first_[blocks_] = pieces;
    seen_.assign(pieces, 0);
    taken_in_order_.assign(blocks_, 0);
    crcs_.assign(blocks_, 0);
    in_order_.assign(blocks_, 1);
  }

  const uint32_t asked_;
  const size_t blocks_;
  std::vector<size_t> first_;  // per block: its first piece's slot in seen_ (planned lazily)
  std::vector<uint8_t> seen_;
  std::vector<uint32_t> left_;
  std::vector<uint64_t> taken_in_order_;
  std::vector<uint32_t> crcs_;
  std::vector<uint8_t> in_order_;
};

}  // namespace strata::client
