// How the client reads one pushed block (am_wire::kFetchBlockAm) against the fetch waiting for
// it. Pure, so tests/fuzz/am_reply_fuzzer runs exactly what DataMover::OnPushedBlock runs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/internal/wire_status.h"
#include "common/am_wire.h"

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

}  // namespace strata::client
