// A stand-in for a daemon's data plane, in the test's process: its own UCX context and worker,
// an arena, a progress thread and, as asked, the push-fetch and lookup active messages of
// common/am_wire.h. What talks to it (a DataMover, a ControlChannel's fast path) runs unmodified.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/data_mover.h"
#include "common/am_wire.h"
#include "strata/v1/cache.pb.h"
#include "transport/ucx.h"

namespace strata::client {

inline std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

// What a daemon offers a client's data mover: an arena behind a worker.
class FakeDaemon {
 public:
  // kAllocated: UCX allocates the arena, so a same-node peer can map it (posix/sysv). kRegistered:
  // plain heap memory, only registered, which no transport maps: bytes then move by RMA or push.
  enum class ArenaKind { kAllocated, kRegistered };
  // What the daemon does with a push-fetch request.
  enum class OnFetch { kPush, kIgnore, kRefuse };
  // What it does with a lookup request: echo (reply "pong" + the request's data, for a plain
  // exchange), answer as stratad does (every block cached here, in the host tier), or nothing.
  enum class OnLookup { kEcho, kAnswer, kIgnore };

  FakeDaemon(ArenaKind kind, size_t bytes, bool progress = true) {
    auto ctx = transport::Context::Create(/*wakeup=*/true);
    EXPECT_TRUE(ctx.ok()) << ctx.status();
    ctx_ = *ctx;
    auto worker = transport::Worker::Create(ctx_);
    EXPECT_TRUE(worker.ok()) << worker.status();
    worker_ = std::move(*worker);
    if (kind == ArenaKind::kAllocated) {
      auto region = ctx_->Allocate(bytes);
      EXPECT_TRUE(region.ok()) << region.status();
      arena_ = std::move(*region);
    } else {
      heap_.assign(bytes, 0);
      auto region = ctx_->Register(heap_.data(), heap_.size());
      EXPECT_TRUE(region.ok()) << region.status();
      arena_ = std::move(*region);
    }
    EXPECT_TRUE(worker_
                    ->SetAmHandler(am_wire::kFetchRequestAm,
                                   [this](const transport::AmMessage& m) { HandleFetch(m); })
                    .ok());
    EXPECT_TRUE(worker_
                    ->SetAmHandler(am_wire::kLookupRequestAm,
                                   [this](const transport::AmMessage& m) { HandleLookup(m); })
                    .ok());
    EXPECT_TRUE(worker_
                    ->SetAmHandler(am_wire::kAcquirePushRequestAm,
                                   [this](const transport::AmMessage& m) { HandleAcquirePush(m); })
                    .ok());
    EXPECT_TRUE(worker_
                    ->SetAmHandler(am_wire::kAcquirePushAnsweredRequestAm,
                                   [this](const transport::AmMessage& m) {
                                     HandleAcquirePush(m, /*answer_in_block=*/true);
                                   })
                    .ok());
    EXPECT_TRUE(worker_
                    ->SetAmHandler(am_wire::kAcquirePushPiecesRequestAm,
                                   [this](const transport::AmMessage& m) {
                                     const auto p = am_wire::DecodePiecesRequest(m.data);
                                     if (p) HandleAcquirePush(m, true, p->piece_bytes);
                                   })
                    .ok());
    EXPECT_TRUE(worker_
                    ->SetAmHandler(am_wire::kPublishPieceAm,
                                   [this](const transport::AmMessage& m) { HandlePublishPiece(m); })
                    .ok());
    EXPECT_TRUE(worker_
                    ->SetAmHandler(am_wire::kPublishBlockAm,
                                   [this](const transport::AmMessage& m) { HandlePublish(m); })
                    .ok());
    if (progress) progress_ = std::make_unique<transport::ProgressThread>(worker_.get());
  }

  ~FakeDaemon() { progress_.reset(); }

  void StartProgress() {
    if (!progress_) progress_ = std::make_unique<transport::ProgressThread>(worker_.get());
  }

  ArenaEndpoint endpoint() const {
    auto rkey = arena_->PackRkey();
    EXPECT_TRUE(rkey.ok());
    ArenaEndpoint e;
    e.worker_address = worker_->address();
    e.rkey = rkey.value_or("");
    e.base = reinterpret_cast<uint64_t>(arena_->data());
    e.bytes = arena_->size();
    e.push_in_pieces = offer_pieces.load();
    e.publish_in_pieces = offer_pieces.load();
    return e;
  }
  uint8_t* arena() { return arena_->data(); }
  // Orders the progress thread's accesses to the arena (UCX's software puts and gets run
  // there) with the test's own: it stops and joins the thread, then starts a new one, so what
  // the old thread wrote happens before the caller's next reads and what the caller wrote
  // before this happens before the new thread's reads. In a real deployment the arena is in
  // another process; here the test touches it directly, and the ordering UCX's shared-memory
  // queues provide is invisible to ThreadSanitizer.
  void SettleArena() {
    if (!progress_) return;
    progress_.reset();
    progress_ = std::make_unique<transport::ProgressThread>(worker_.get());
  }

  std::atomic<OnFetch> on_fetch{OnFetch::kPush};
  std::atomic<OnLookup> on_lookup{OnLookup::kEcho};
  std::atomic<int> lookups{0};
  std::atomic<uint64_t> last_lease{0};
  std::atomic<int> pushed{0};
  // Pieces (am_wire::kFetchPieceAm) of the blocks larger than a fetch request's piece size: sent
  // in order, last first, or with the first one twice. The endpoint offers them unless told not.
  enum class Pieces { kInOrder, kReversed, kFirstTwice };
  std::atomic<Pieces> pieces{Pieces::kInOrder};
  std::atomic<bool> offer_pieces{true};
  std::atomic<int> pieces_sent{0};
  std::atomic<uint32_t> last_piece_bytes{0};  // what the last fetch request asked for
  std::atomic<int> published_pieces{0};  // published pieces written into the arena
  // Published blocks (eager ones only) written into the arena; with hold_publish_acks their
  // acknowledgements wait for the next lookup request, which also records how many had been
  // written when it came.
  std::atomic<int> published{0};
  std::atomic<bool> hold_publish_acks{false};
  std::atomic<int> published_before_lookup{-1};
  // An acquire-and-push is answered with lease 99 over `leased` (by id position: arena offset,
  // size and CRC; size 0, not held), whose blocks are then pushed; with grant_lease false the
  // answer is incomplete and nothing is pushed. Set `leased` between two SettleArena calls,
  // which order it after the progress thread's earlier reads and before its next ones.
  struct Leased {
    uint64_t offset = 0, size = 0;
    uint32_t crc = 0;
  };
  std::vector<Leased> leased;
  std::atomic<bool> grant_lease{true};
  // Answers in the first block cut short: a malformed answered block.
  std::atomic<bool> garble_answered{false};

 private:
  static std::string BlockHeader(uint64_t request_id, uint32_t index, absl::StatusCode code) {
    return am_wire::EncodeFetchBlockHeader({request_id, index, static_cast<uint32_t>(code)});
  }

  void HandleFetch(const transport::AmMessage& m) {
    if (m.reply_ep == nullptr || m.header.size() != am_wire::kFetchRequestHeaderBytes) return;
    const uint64_t request_id = am_wire::GetU64(m.header.data());
    last_lease = am_wire::GetU64(m.header.data() + 8);
    const uint32_t count = am_wire::GetU32(m.header.data() + 16);
    switch (on_fetch.load()) {
      case OnFetch::kIgnore: return;
      case OnFetch::kRefuse:
        worker_->AmReply(
            m.reply_ep, am_wire::kFetchBlockAm,
            BlockHeader(request_id, am_wire::kFetchRefused, absl::StatusCode::kFailedPrecondition),
            "lease expired");
        return;
      case OnFetch::kPush: break;
    }
    const uint32_t asked = am_wire::GetU32(m.header.data() + 20);
    last_piece_bytes = asked;
    for (uint32_t i = 0; i < count; ++i) {
      const uint64_t offset = am_wire::GetU64(m.data.data() + 16 * i);
      const uint64_t size = am_wire::GetU64(m.data.data() + 16 * i + 8);
      // Counted before the send: the client may finish its fetch before this thread goes on.
      ++pushed;
      if (const uint64_t piece = am_wire::PushPieceBytes(size, asked); piece < size) {
        SendPieces(m.reply_ep, request_id, i, offset, size, piece);
        continue;
      }
      worker_->AmSendZeroCopy(m.reply_ep, am_wire::kFetchBlockAm,
                              BlockHeader(request_id, i, absl::StatusCode::kOk),
                              arena_->data() + offset, size, arena_->handle(),
                              /*eager=*/size <= (256 << 10));
    }
  }

  // `answer` (a reply header and the serialized answer), when not empty, rides in the header of
  // the first piece sent.
  void SendPieces(ucp_ep_h ep, uint64_t request_id, uint32_t index, uint64_t offset,
                  uint64_t size, uint64_t piece, const std::string& answer = {}) {
    std::vector<uint64_t> at;
    for (uint64_t o = 0; o < size; o += piece) at.push_back(o);
    if (pieces.load() == Pieces::kReversed) std::reverse(at.begin(), at.end());
    if (pieces.load() == Pieces::kFirstTwice) at.insert(at.begin() + 1, at[0]);
    for (size_t k = 0; k < at.size(); ++k) {
      const uint64_t o = at[k];
      std::string header = am_wire::EncodeFetchPieceHeader({{request_id, index, 0}, o});
      const bool answered = k == 0 && !answer.empty();
      if (answered) header += answer;
      ++pieces_sent;  // before the send, as `pushed`
      worker_->AmSendZeroCopy(
          ep, answered ? am_wire::kFetchPieceAnsweredAm : am_wire::kFetchPieceAm,
          std::move(header), arena_->data() + offset + o, std::min(piece, size - o),
          arena_->handle(), /*eager=*/true);
    }
  }

  // With `answer_in_block`, a granted answer rides in the first pushed block's header.
  // `piece_bytes`: blocks larger go in pieces, and the answer alone when the first one does.
  void HandleAcquirePush(const transport::AmMessage& m, bool answer_in_block = false,
                         uint32_t piece_bytes = 0) {
    if (m.reply_ep == nullptr || m.header.size() < 8) return;
    const uint64_t request_id = am_wire::GetU64(m.header.data());
    v1::AcquireResponse resp;
    resp.set_lease_id(99);
    resp.set_expires_in_ms(30000);
    for (const Leased& l : leased) {
      resp.add_status(l.size > 0 ? v1::BLOCK_OK : v1::BLOCK_NOT_FOUND);
      resp.add_offsets(l.offset);
      resp.add_sizes(l.size);
      resp.add_crc32c(l.crc);
    }
    am_wire::ReplyHeader h;
    h.request_id = request_id;
    h.prefix = static_cast<uint32_t>(leased.size());
    h.complete = grant_lease.load();
    answer_in_block = answer_in_block && h.complete;
    if (!answer_in_block)
      worker_->AmReply(m.reply_ep, am_wire::kAcquireReplyAm, am_wire::EncodeReplyHeader(h),
                       h.complete ? resp.SerializeAsString() : "");
    if (!h.complete) return;
    for (uint32_t i = 0; i < leased.size(); ++i) {
      if (leased[i].size == 0) continue;
      if (const uint64_t piece = am_wire::PushPieceBytes(leased[i].size, piece_bytes);
          piece < leased[i].size) {
        // The answer, when it rides along, in the first piece's header.
        SendPieces(m.reply_ep, request_id, i, leased[i].offset, leased[i].size, piece,
                   answer_in_block ? am_wire::EncodeReplyHeader(h) + resp.SerializeAsString()
                                   : std::string());
        answer_in_block = false;
        ++pushed;
        continue;
      }
      std::string header = BlockHeader(request_id, i, absl::StatusCode::kOk);
      const bool answered = answer_in_block;
      if (answered) {
        header = am_wire::EncodeAnsweredBlockHeader({request_id, i, 0}, h,
                                                    resp.SerializeAsString());
        if (garble_answered.load()) header.resize(am_wire::kFetchBlockHeaderBytes + 3);
        answer_in_block = false;
      }
      worker_->AmSendZeroCopy(m.reply_ep,
                              answered ? am_wire::kFetchBlockAnsweredAm : am_wire::kFetchBlockAm,
                              std::move(header), arena_->data() + leased[i].offset,
                              leased[i].size, arena_->handle(),
                              /*eager=*/leased[i].size <= (256 << 10));
      ++pushed;
    }
  }

  void HandlePublish(const transport::AmMessage& m) {
    const auto h = am_wire::DecodePublishBlockHeader(m.header);
    if (m.reply_ep == nullptr || !h || m.rendezvous || h->offset + m.data.size() > arena_->size())
      return;
    std::memcpy(arena_->data() + h->offset, m.data.data(), m.data.size());
    ++published;
    std::string ack = am_wire::EncodePublishAck({h->request_id, h->index, 0, std::nullopt});
    if (hold_publish_acks.load())
      held_acks_.emplace_back(m.reply_ep, std::move(ack));
    else
      worker_->AmReply(m.reply_ep, am_wire::kPublishAckAm, std::move(ack), "");
  }

  // A published piece lands in the arena; its block is acknowledged (and counted as published)
  // after its last byte, as stratad does.
  void HandlePublishPiece(const transport::AmMessage& m) {
    const auto p = am_wire::DecodePublishPieceHeader(m.header);
    if (m.reply_ep == nullptr || !p ||
        !am_wire::CheckPublishPiece(*p, m.data.size(), arena_->size()).ok())
      return;
    std::memcpy(arena_->data() + p->block.offset + p->offset, m.data.data(), m.data.size());
    ++published_pieces;
    if (p->offset + m.data.size() < p->block.size) return;
    ++published;
    std::string ack =
        am_wire::EncodePublishAck({p->block.request_id, p->block.index, 0, std::nullopt});
    if (hold_publish_acks.load())
      held_acks_.emplace_back(m.reply_ep, std::move(ack));
    else
      worker_->AmReply(m.reply_ep, am_wire::kPublishAckAm, std::move(ack), "");
  }

  void HandleLookup(const transport::AmMessage& m) {
    ++lookups;
    published_before_lookup = published.load();
    for (auto& [ep, ack] : held_acks_)
      worker_->AmReply(ep, am_wire::kPublishAckAm, std::move(ack), "");
    held_acks_.clear();
    if (m.reply_ep == nullptr || m.header.size() < 8) return;
    switch (on_lookup.load()) {
      case OnLookup::kIgnore: return;
      case OnLookup::kEcho:
        worker_->AmReply(m.reply_ep, am_wire::kLookupReplyAm, std::string(m.header.substr(0, 8)),
                         "pong" + std::string(m.data));
        return;
      case OnLookup::kAnswer: {
        am_wire::ReplyHeader h;
        h.request_id = am_wire::GetU64(m.header.data());
        h.prefix = static_cast<uint32_t>(m.data.size() / 32);
        h.complete = true;
        worker_->AmReply(m.reply_ep, am_wire::kLookupReplyAm, am_wire::EncodeReplyHeader(h),
                         std::string(h.prefix, static_cast<char>(v1::TIER_HOST)));
        return;
      }
    }
  }

  std::shared_ptr<transport::Context> ctx_;
  std::unique_ptr<transport::Worker> worker_;
  std::vector<uint8_t> heap_;
  std::unique_ptr<transport::MemoryRegion> arena_;
  std::unique_ptr<transport::ProgressThread> progress_;
  std::vector<std::pair<ucp_ep_h, std::string>> held_acks_;  // progress thread only
};

}  // namespace strata::client
