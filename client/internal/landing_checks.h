// CRC checks of fetched blocks that land one by one (pushed blocks received in place).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <vector>

#include "client/data_mover.h"
#include "common/crc_pieces.h"
#include "common/helper_thread.h"

namespace strata::client {

// Checks each landed block against its CRC on the helper thread while later blocks still
// arrive, and on the caller's thread too once it waits in Finish: over tcp a rendezvous
// completes only when its sender's acknowledgement comes, behind every block already queued
// after it, so most blocks of a batch land together at the end, and one thread checking them
// all would leave the other core idle (a tail of 4-6 ms in a 64 MiB fetch). Blocks are checked
// in pieces so that even one large block is shared. Every check has ended once Finish returns
// or this is destroyed.
class LandingChecks {
 public:
  // Up to this, a block is checked at once on the landing thread: waking the helper costs two
  // thread switches (tens of microseconds on a VM), more than the CRC of a small block.
  static constexpr size_t kInlineCheckBytes = 16 << 10;
  // The unit of work shared by the helper and the caller.
  static constexpr uint64_t kPieceBytes = 1 << 20;

  // around_caches: blocks copied into place go around the CPU caches (DataMover::Get).
  LandingChecks(HelperThread& helper, bool verify, bool around_caches)
      : helper_(helper), verify_(verify), around_caches_(around_caches) {}
  ~LandingChecks() { Wait(); }
  LandingChecks(const LandingChecks&) = delete;
  LandingChecks& operator=(const LandingChecks&) = delete;

  // Before any block lands.
  void Expect(std::span<const BlockMove> blocks);
  bool verify() const { return verify_; }
  bool around_caches() const { return around_caches_; }
  // Block k was copied into place, its bytes' CRC `crc` taken on the way.
  void Copied(size_t k, uint32_t crc);
  // Block k is whole in its buffer: to be checked.
  void Landed(size_t k);
  // Checks what is left (with the helper), then per block whether it is intact.
  std::vector<uint8_t> Finish();

 private:
  // Checks queued pieces until none is left; `helper` on the helper thread.
  void Drain(bool helper);
  void Wait();

  HelperThread& helper_;
  const bool verify_;
  const bool around_caches_;
  std::span<const BlockMove> blocks_;
  std::vector<CrcPiece> pieces_;
  std::vector<size_t> first_piece_;  // per block, and one past the last
  std::vector<uint32_t> piece_crcs_;
  std::vector<size_t> pieces_left_;  // per block
  std::vector<uint8_t> good_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> queued_;  // pieces landed, not yet taken
  size_t checking_ = 0;        // pieces taken, not yet recorded
  size_t landed_ = 0;          // blocks landed or copied
  bool helper_draining_ = false;
  size_t helper_jobs_ = 0;  // posted to the helper, not yet ended (they use `this`)
};

}  // namespace strata::client
