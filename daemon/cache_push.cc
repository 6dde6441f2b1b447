// The push side of the Cache service's fetches, on the data-plane worker: a client's push
// fetch of leased extents (am_wire kFetchRequestAm), acquire-and-push in one request
// (kAcquirePushRequestAm and its variants), and the sends themselves, whole blocks or pieces
// (kFetchBlockAm, kFetchBlockAnsweredAm, kFetchPieceAm).
#include <algorithm>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/am_wire.h"
#include "daemon/cache_service.h"

namespace strata::daemon {

void CacheService::HandleAmAcquirePush(const transport::AmMessage& m, transport::Worker* worker) {
  AcquireAndPush(m, worker, am_wire::kAcquirePushRequestAm, /*answer_in_block=*/false);
}

void CacheService::HandleAmAcquirePushAnswered(const transport::AmMessage& m,
                                               transport::Worker* worker) {
  AcquireAndPush(m, worker, am_wire::kAcquirePushAnsweredRequestAm, /*answer_in_block=*/true);
}

void CacheService::HandleAmAcquirePushPieces(const transport::AmMessage& m,
                                             transport::Worker* worker) {
  const auto pieces = am_wire::DecodePiecesRequest(m.data);
  if (!pieces) {
    // Without a reply endpoint or a valid header: dropped (and noted) there.
    const auto request = OpenAmRequest(m, {am_wire::kAcquirePushPiecesRequestAm,
                                           am_wire::kAcquireReplyAm, RpcMetrics::kAcquire,
                                           "acquire-and-push in pieces"});
    if (!request) return;
    std::string why = absl::StrCat("acquire-and-push in pieces whose piece size is not ",
                                   am_wire::kMinPushPieceBytes, "..", am_wire::kMaxPushPieceBytes,
                                   " bytes, or whose data is malformed");
    DropAm(am_wire::kAcquirePushPiecesRequestAm, m, why);
    am_wire::ReplyHeader h;
    h.request_id = request->request_id;
    h.code = static_cast<uint32_t>(absl::StatusCode::kInvalidArgument);
    worker->AmReply(m.reply_ep, am_wire::kAcquireReplyAm, am_wire::EncodeReplyHeader(h),
                    std::move(why));
    return;
  }
  transport::AmMessage ids = m;
  ids.data = pieces->ids;
  AcquireAndPush(ids, worker, am_wire::kAcquirePushPiecesRequestAm, /*answer_in_block=*/true,
                 pieces->piece_bytes);
}

void CacheService::AcquireAndPush(const transport::AmMessage& m, transport::Worker* worker,
                                  uint16_t request_am, bool answer_in_block,
                                  uint32_t piece_bytes) {
  v1::AcquireResponse resp;
  std::optional<HeldAnswer> held;
  if (m.reply_ep == nullptr ||
      !ServeAmAcquire(m, worker, request_am, &resp, answer_in_block ? &held : nullptr))
    return;
  const uint64_t request_id = am_wire::GetU64(m.header.data());
  std::vector<ArenaExtent> extents;
  std::vector<uint32_t> indices;
  for (int i = 0; i < resp.status_size(); ++i) {
    if (resp.status(i) != v1::BLOCK_OK) continue;
    extents.push_back({resp.offsets(i), resp.sizes(i)});
    indices.push_back(static_cast<uint32_t>(i));
  }
  // Cannot fail: the extents are the lease's own, just granted. Were it to, the client's wait
  // for the blocks ends at its deadline.
  const HeldAnswer* answer = held ? &*held : nullptr;
  if (PushExtents(worker, m.reply_ep, request_id, resp.lease_id(), extents, indices, answer,
                  piece_bytes)) {
    acquires_with_push_.fetch_add(1, std::memory_order_relaxed);
    if (held) answers_in_block_.fetch_add(1, std::memory_order_relaxed);
  } else if (held) {  // nothing was sent: the answer goes alone, the client waits as before
    worker->AmReply(m.reply_ep, am_wire::kAcquireReplyAm, am_wire::EncodeReplyHeader(held->header),
                    std::move(held->data));
  }
  // Each send holds its extent until UCX is done with it: the lease is needed no longer, and
  // ending it here spares the client a Release message (ConnectResponse.push_releases).
  EndLease(resp.lease_id()).IgnoreError();
}

void CacheService::HandleAmFetch(const transport::AmMessage& m, transport::Worker* worker) {
  namespace w = am_wire;
  const auto request = w::DecodeFetchRequestHeader(m.header);
  if (m.reply_ep == nullptr || !request)
    return DropAm(w::kFetchRequestAm, m, "fetch request without a reply endpoint or with a "
                                         "header that is not 24 bytes");
  const uint64_t request_id = request->request_id;
  const uint64_t lease_id = request->lease_id;
  const uint32_t count = request->count;
  const uint32_t piece_bytes = request->piece_bytes;
  auto block_header = [&](uint32_t index, absl::StatusCode code) {
    return w::EncodeFetchBlockHeader({request_id, index, static_cast<uint32_t>(code)});
  };
  auto refuse = [&](absl::StatusCode code, std::string why) {
    if (code == absl::StatusCode::kInvalidArgument) DropAm(w::kFetchRequestAm, m, why);
    worker->AmReply(m.reply_ep, w::kFetchBlockAm, block_header(w::kFetchRefused, code),
                    std::move(why));
  };
  CallScope call(this);
  if (!call.admitted()) return refuse(absl::StatusCode::kUnavailable, "stratad is shutting down");
  // The lease id is the credential: 64 random bits that only the Acquire of an authenticated
  // caller, of a namespace of its own tenant, returned.
  uint8_t* const arena = store_->arena_base();
  if (arena == nullptr) return refuse(absl::StatusCode::kInvalidArgument, "malformed fetch request");
  // Every extent must be one its lease holds: the lease keeps it from being freed or
  // overwritten until the client releases it after the last byte arrived.
  auto wire_extents = w::DecodeFetchExtents(m.data, count, store_->arena_bytes());
  if (!wire_extents.ok())
    return refuse(wire_extents.status().code(), std::string(wire_extents.status().message()));
  std::vector<ArenaExtent> extents;
  std::vector<uint32_t> indices;
  extents.reserve(count);
  for (const w::FetchExtent& e : *wire_extents) {
    indices.push_back(static_cast<uint32_t>(extents.size()));
    extents.push_back({e.offset, e.size});
  }
  if (!am_wire::ValidPushPieceBytes(piece_bytes))
    return refuse(absl::StatusCode::kInvalidArgument,
                  absl::StrCat("fetch request's piece size ", piece_bytes, " is not 0 or ",
                               w::kMinPushPieceBytes, "..", w::kMaxPushPieceBytes, " bytes"));
  if (!PushExtents(worker, m.reply_ep, request_id, lease_id, extents, indices, nullptr,
                   piece_bytes))
    return refuse(absl::StatusCode::kFailedPrecondition,
                  "an extent is not held by that lease (expired or released?)");
}

bool CacheService::PushExtents(transport::Worker* worker, ucp_ep_h reply_ep, uint64_t request_id,
                               uint64_t lease_id, std::span<const ArenaExtent> extents,
                               std::span<const uint32_t> indices, const HeldAnswer* answer,
                               uint32_t piece_bytes) {
  // One read hold per send: the extents stay this lease's until UCX no longer reads them, even
  // when the lease ends first (a client that stops receiving cannot make the daemon send bytes
  // of whatever block or tenant the extent would go to next). Checked in one pass: one check per
  // extent cost a set of the whole lease each, quadratic in the blocks of a fetch.
  uint64_t sends = 0;
  for (const ArenaExtent& e : extents) sends += am_wire::PushMessages(e.size, piece_bytes);
  // At most the arena over kMinPushPieceBytes, plus one per extent: the extents add up to at
  // most the arena (DecodeFetchExtents, ServeAmAcquire).
  if (sends > std::numeric_limits<uint32_t>::max()) return false;
  if (!store_->BeginLeaseRead(lease_id, extents, static_cast<uint32_t>(sends))) return false;
  uint8_t* const arena = store_->arena_base();
  BlockStore* store = store_;
  uint64_t pieces_sent = 0;
  for (size_t i = 0; i < extents.size(); ++i) {
    const uint64_t piece = am_wire::PushPieceBytes(extents[i].size, piece_bytes);
    if (piece < extents[i].size) {
      // Each piece fits one of the client's receive segments: eager, zero copy from the arena.
      // The answer, when held, rides in the first one.
      for (uint64_t at = 0; at < extents[i].size; at += piece) {
        const am_wire::FetchPieceHeader header{
            {request_id, indices[i], static_cast<uint32_t>(absl::StatusCode::kOk)}, at};
        const bool answered = answer != nullptr && i == 0 && at == 0;
        worker->AmSendZeroCopy(
            reply_ep, answered ? am_wire::kFetchPieceAnsweredAm : am_wire::kFetchPieceAm,
            answered
                ? am_wire::EncodeAnsweredPieceHeader(header, answer->header, answer->data)
                : am_wire::EncodeFetchPieceHeader(header),
            arena + extents[i].offset + at, std::min(piece, extents[i].size - at),
            data_plane_.arena_memh, /*eager=*/true,
            [store, lease_id](bool) { store->EndLeaseRead(lease_id); });
        ++pieces_sent;
      }
      continue;
    }
    const bool eager = extents[i].size <= kEagerPushBytes;
    // Where clients get no key, a rendezvous does not name the arena's registration: its
    // request would carry the arena's remote key, which opens the whole arena to the receiver.
    // UCX then registers just the block. An eager send carries bytes, never a key.
    ucp_mem_h memh = !data_plane_.clients_map_arena && !eager ? nullptr : data_plane_.arena_memh;
    const am_wire::FetchBlockHeader block{request_id, indices[i],
                                          static_cast<uint32_t>(absl::StatusCode::kOk)};
    const bool answered = answer != nullptr && i == 0;
    worker->AmSendZeroCopy(
        reply_ep, answered ? am_wire::kFetchBlockAnsweredAm : am_wire::kFetchBlockAm,
        answered ? am_wire::EncodeAnsweredBlockHeader(block, answer->header, answer->data)
                 : am_wire::EncodeFetchBlockHeader(block),
        arena + extents[i].offset, extents[i].size, memh, eager,
        [store, lease_id](bool) { store->EndLeaseRead(lease_id); });
  }
  pushed_blocks_.fetch_add(extents.size(), std::memory_order_relaxed);
  if (pieces_sent != 0) pushed_pieces_.fetch_add(pieces_sent, std::memory_order_relaxed);
  return true;
}

}  // namespace strata::daemon
