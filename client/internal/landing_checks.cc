#include "client/internal/landing_checks.h"

#include "common/crc32c.h"

namespace strata::client {

void LandingChecks::Expect(std::span<const BlockMove> blocks) {
  blocks_ = blocks;
  good_.assign(blocks.size(), verify_ ? 0 : 1);
  if (!verify_) return;
  pieces_ = SplitIntoCrcPieces(
      blocks.size(), [&](size_t i) { return blocks[i].length; }, kPieceBytes);
  first_piece_.assign(blocks.size() + 1, pieces_.size());
  pieces_left_.assign(blocks.size(), 0);
  for (size_t p = pieces_.size(); p-- > 0;) {
    first_piece_[pieces_[p].block] = p;
    ++pieces_left_[pieces_[p].block];
  }
  // A block without pieces (empty) starts where the next one does.
  for (size_t k = blocks.size(); k-- > 0;)
    if (pieces_left_[k] == 0) first_piece_[k] = first_piece_[k + 1];
  piece_crcs_.assign(pieces_.size(), 0);
}

void LandingChecks::Copied(size_t k, uint32_t crc) {
  std::lock_guard<std::mutex> lock(mu_);
  ++landed_;
  good_[k] = crc == blocks_[k].crc32c;
}

void LandingChecks::Landed(size_t k) {
  if (!verify_) return;
  const BlockMove& b = blocks_[k];
  if (b.length <= kInlineCheckBytes) {
    const uint8_t ok = Crc32c(b.local, b.length) == b.crc32c;
    std::lock_guard<std::mutex> lock(mu_);
    ++landed_;
    good_[k] = ok;
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t p = first_piece_[k]; p < first_piece_[k + 1]; ++p) queued_.push_back(p);
  // The last block is left to Finish, which comes next: no wake-up for it alone.
  if (++landed_ == blocks_.size() || helper_draining_) return;
  helper_draining_ = true;
  ++helper_jobs_;
  helper_.Post([this] { Drain(/*helper=*/true); });
}

void LandingChecks::Drain(bool helper) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!queued_.empty()) {
    const size_t p = queued_.front();
    queued_.pop_front();
    ++checking_;
    lock.unlock();
    const CrcPiece& piece = pieces_[p];
    const uint32_t crc =
        Crc32c(static_cast<const uint8_t*>(blocks_[piece.block].local) + piece.offset, piece.len);
    lock.lock();
    --checking_;
    piece_crcs_[p] = crc;
    if (--pieces_left_[piece.block] == 0) {
      const size_t first = first_piece_[piece.block], end = first_piece_[piece.block + 1];
      uint32_t whole = piece_crcs_[first];
      for (size_t q = first + 1; q < end; ++q)
        whole = Crc32cCombine(whole, piece_crcs_[q], pieces_[q].len);
      good_[piece.block] = whole == blocks_[piece.block].crc32c;
    }
  }
  if (helper) {
    helper_draining_ = false;
    --helper_jobs_;
  }
  cv_.notify_all();
}

std::vector<uint8_t> LandingChecks::Finish() {
  if (verify_) Drain(/*helper=*/false);
  Wait();
  return std::move(good_);
}

void LandingChecks::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return helper_jobs_ == 0 && checking_ == 0; });
}

}  // namespace strata::client
