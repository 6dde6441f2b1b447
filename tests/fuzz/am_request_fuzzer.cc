// The daemon's active-message request decoders (common/am_wire.h): the lookup fast path (and the
// acquire fast path, whose request is a lookup request's), the fetch-by-push request, the peer
// locate request and a block published by message, as CacheService::HandleAmLookup,
// HandleAmAcquire, HandleAmFetch, Locator::HandleAmLocate and CacheService::HandleAmPublish
// read them.
//
// And the zone socket's request header (common/zone_wire.h, ZoneServer::Serve), and a block
// published through a staging window (CacheService::HandleAmPublishStaged).
//
// And the data of a publish in one request (CacheService::HandleAmPublishInOne), several
// staged blocks in one message (CacheService::HandleAmPublishStagedMany), and the data of an
// acquire-and-push in pieces (CacheService::HandleAmAcquirePushPieces), and a published piece
// (CacheService::HandleAmPublishPiece).
//
// Input: u8 kind (0 lookup, 1 fetch, 2 locate, 3 publish, 4 release, 5 zone request, 6 staged
// publish, 7 publish in one, 8 staged many, 9 acquire-and-push in pieces, 10 published piece) |
// u64
// arena bytes (fetch, publish) | u16-sized header | the rest as the message data.
#include <cstdint>
#include <string>
#include <string_view>

#include "common/am_wire.h"
#include "common/packed_ids.h"
#include "common/zone_wire.h"
#include "tests/fuzz/fuzz_input.h"

namespace w = strata::am_wire;
using strata::fuzz::Fail;

namespace {

void CheckExtents(std::string_view data, uint32_t count, uint64_t arena) {
  auto extents = w::DecodeFetchExtents(data, count, arena);
  if (!extents.ok()) return;
  if (extents->size() != count) Fail("fetch extents: count");
  uint64_t total = 0;
  for (const w::FetchExtent& e : *extents) {
    // What HandleAmFetch then sends from: arena + offset, size bytes.
    if (e.size > arena || e.offset > arena || e.offset + e.size > arena)
      Fail("fetch extent outside the arena");
    total += e.size;
    if (total > arena) Fail("fetch extents add up to more than the arena");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  strata::fuzz::Input in(bytes, size);
  const uint8_t kind = in.U8() % 11;
  const uint64_t arena = in.U64();
  const std::string_view header = in.Sized();
  const std::string_view data = in.Rest();
  switch (kind) {
    case 0: {
      auto h = w::DecodeLookupRequestHeader(header);
      if (h && h->ns.size() != 32) Fail("lookup namespace is not 32 bytes");
      if (h && !h->ticket.empty() && h->ticket.size() != w::kTicketBytes)
        Fail("lookup ticket is neither absent nor kTicketBytes");
      auto ids = strata::UnpackIds(data, "ids", w::kMaxIds);
      if (ids.ok() && (ids->size() > w::kMaxIds || strata::PackIds(*ids) != data))
        Fail("lookup ids do not round-trip");
      break;
    }
    case 1: {
      auto h = w::DecodeFetchRequestHeader(header);
      if (h) CheckExtents(data, h->count, arena);
      // Also with a count that matches the data, so mutations reach the extent checks.
      CheckExtents(data, static_cast<uint32_t>(data.size() / 16), arena);
      break;
    }
    case 2: {
      (void)w::DecodeLocateRequestHeader(header);
      // Locator::HandleAmLocate reads as many ids as the (eager) message holds.
      auto ids = strata::UnpackIds(data, "ids", SIZE_MAX);
      if (ids.ok() && strata::PackIds(*ids) != data) Fail("locate ids do not round-trip");
      break;
    }
    case 3: {
      // What HandleAmPublish then writes: payload bytes at arena + offset.
      auto b = w::DecodePublishBlockHeader(header);
      if (!b || !w::CheckPublishBlock(*b, data.size(), arena).ok()) break;
      if (b->size != data.size()) Fail("published block: size is not the payload's");
      if (b->size > arena || b->offset > arena || b->offset + b->size > arena)
        Fail("published block outside the arena");
      if (w::EncodePublishBlockHeader(*b) != header) Fail("publish header does not round-trip");
      break;
    }
    case 4: {
      // What HandleAmRelease then looks up: the ticket (empty or kTicketBytes) and the lease.
      auto r = w::DecodeReleaseHeader(header);
      if (!r) break;
      if (!r->ticket.empty() && r->ticket.size() != w::kTicketBytes) Fail("release ticket size");
      if (r->lease_id != w::GetU64(header.data())) Fail("release lease id");
      break;
    }
    case 5: {
      // ZoneServer::Serve then reads this many ticket bytes into a string of that size.
      auto n = strata::zone_wire::DecodeRequestHeader(header);
      if (n && n->ticket_bytes > strata::zone_wire::kMaxTicketBytes)
        Fail("zone request ticket length");
      if (n && strata::zone_wire::EncodeRequest(std::string(n->ticket_bytes, 't'), n->kind)
                       .substr(0, strata::zone_wire::kRequestHeaderBytes) != header)
        Fail("zone request header does not round-trip");
      break;
    }
    case 6: {
      // What HandleAmPublishStaged then copies: size bytes from the window into arena + offset.
      auto st = w::DecodePublishStagedHeader(header);
      if (!st) break;
      if (w::EncodePublishStagedHeader(*st) != header) Fail("staged header does not round-trip");
      if (!w::CheckPublishBlock(st->block, st->block.size, arena).ok()) break;
      if (st->block.size > arena || st->block.offset > arena - st->block.size)
        Fail("staged block outside the arena");
      break;
    }
    case 7: {
      // The daemon then parses `reserve` and copies `blocks` by the request's sizes.
      auto d = w::DecodePublishInOneData(data);
      if (!d) break;
      if (d->crc32c.empty() || d->crc32c.size() > w::kMaxControlIds)
        Fail("publish in one: block count");
      if (d->blocks.size() > w::kMaxPublishInOneBytes) Fail("publish in one: too many bytes");
      if (w::EncodePublishInOnePrefix(d->reserve, d->crc32c) + std::string(d->blocks) != data)
        Fail("publish in one does not round-trip");
      break;
    }
    case 10: {
      // HandleAmPublishPiece then copies data.size() bytes to arena + block offset + offset.
      auto p = w::DecodePublishPieceHeader(header);
      if (!p) break;
      if (w::EncodePublishPieceHeader(*p) != header) Fail("published piece header round trip");
      if (!w::CheckPublishPiece(*p, data.size(), arena).ok()) break;
      const uint64_t end = p->block.offset + p->offset + data.size();
      if (data.empty() || p->offset >= p->block.size || end > arena ||
          end < p->block.offset || p->offset + data.size() > p->block.size)
        Fail("a published piece accepted outside its block or the arena");
      break;
    }
    case 9: {
      // The daemon then reads the ids as an acquire's and cuts blocks into pieces of this size.
      auto p = w::DecodePiecesRequest(data);
      if (!p) break;
      if (p->piece_bytes < w::kMinPushPieceBytes || p->piece_bytes > w::kMaxPushPieceBytes)
        Fail("pieces request: piece size out of range");
      if (w::EncodePiecesRequestPrefix(p->piece_bytes) + std::string(p->ids) != data)
        Fail("pieces request does not round-trip");
      for (uint64_t block : {uint64_t{1}, arena, arena + 1}) {
        const uint64_t piece = w::PushPieceBytes(block, p->piece_bytes);
        if (block > p->piece_bytes && (piece == 0 || piece > p->piece_bytes || piece % 64 != 0))
          Fail("a piece size that is not whole cache lines within what was asked");
      }
      break;
    }
    case 8: {
      // The daemon then checks and copies each block as a kPublishStagedAm one.
      auto many = w::DecodePublishStagedMany(header, data);
      if (!many) break;
      if (many->blocks.empty() || many->blocks.size() > w::kMaxStagedPerMessage)
        Fail("staged many: block count");
      std::string again;
      for (const w::PublishStagedHeader& b : many->blocks) {
        if (b.block.request_id != many->request_id ||
            b.block.reservation_id != many->reservation_id)
          Fail("staged many: a block of another request or reservation");
        again += w::EncodePublishStagedHeader(b);
      }
      if (again != data ||
          w::EncodePublishStagedManyHeader(many->request_id, many->reservation_id,
                                           static_cast<uint32_t>(many->blocks.size())) != header)
        Fail("staged many does not round-trip");
      break;
    }
  }
  return 0;
}
