// The client's active-message reply decoders: the lookup fast path's reply
// (ControlChannel::LookupByActiveMessage), the pushed blocks of a fetch by push
// (DataMover::OnPushedBlock, replayed here as a whole fetch: each accepted eager block is copied
// into a buffer of exactly the size the request asked for, so ASan sees any overrun), and the
// peer locate reply header the daemon's Locator reads.
//
// And the zone socket's reply (common/zone_wire.h), as OpenZoneWindow reads it, the data of
// a fetch in one answer (ControlChannel::FetchInOne) and the acknowledgement of several staged
// blocks (DataMover::OnPublishAcks), and the header of a block that carries its fetch's answer
// (DataMover::OnAnsweredBlock).
//
// And the pieces of pushed blocks (DataMover::OnPushedPiece), replayed as a whole fetch as the
// pushed blocks are.
//
// Input: u8 kind (0 lookup reply, 1 pushed blocks, 2 locate reply header, 3 publish ack,
//   4 zone reply, 5 fetch in one data, 6 publish acks, 7 answered block header, 8 pieces,
//   9 answered piece header), then
//   0: u16 ids asked | u16-sized header | the rest as data;
//   1: u64 request id | u8 blocks | per block u16 length | messages until the input ends, each
//      u8 flags (bit 0: rendezvous) | u16-sized header | u16-sized data;
//   2, 3, 4, 5, 7, 9: the rest as the header (4: the whole reply, 5: the answer's data);
//   6: u16-sized header | the rest as data;
//   8: u64 request id | u16 piece bytes asked | u8 blocks | per block u16 length | messages
//      until the input ends, each u16-sized header | u16-sized data.
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "client/internal/pushed_block.h"
#include "common/am_wire.h"
#include "common/crc32c.h"
#include "common/zone_wire.h"
#include "tests/fuzz/fuzz_input.h"

namespace w = strata::am_wire;
using strata::client::PushedBlock;
using strata::fuzz::Fail;

namespace {

void LookupReply(strata::fuzz::Input& in) {
  const size_t asked = in.U16();
  const std::string_view header = in.Sized();
  const std::string_view data = in.Rest();
  auto h = w::DecodeDefinitiveLookupReply(header, data, asked);
  if (!h) return;
  if (h->code != 0 || !h->complete || h->prefix > asked || data.size() != h->prefix)
    Fail("lookup reply accepted although it is not definitive");
}

void PushedBlocks(strata::fuzz::Input& in) {
  const uint64_t request_id = in.U64();
  const size_t blocks = in.U8();
  std::vector<uint64_t> lengths(blocks);
  for (auto& l : lengths) l = in.U16();
  std::vector<std::vector<char>> buffers(blocks);
  for (size_t i = 0; i < blocks; ++i) buffers[i].resize(lengths[i]);
  std::vector<uint8_t> arrived(blocks, 0);
  size_t done = 0;
  for (int messages = 0; messages < 64; ++messages) {
    const uint8_t flags = in.U8();
    const std::string_view header = in.Sized();
    const std::string_view data = in.Sized();
    if (header.empty() && data.empty() && flags == 0) break;
    const bool rendezvous = flags & 1;
    // A rendezvous message announces its length without data; an eager one carries it.
    const size_t length = rendezvous ? in.U16() : data.size();
    const PushedBlock got = strata::client::ReadPushedBlock(
        header, rendezvous ? std::string_view() : data, length, rendezvous, request_id, blocks,
        [&](size_t i) { return lengths[i]; }, arrived);
    if (got.kind == PushedBlock::kRefused || got.kind == PushedBlock::kMismatch) {
      if (got.error.ok()) Fail("a refused or mismatched block without an error");
      return;  // the fetch fails as a whole
    }
    if (got.kind != PushedBlock::kAccepted) continue;
    if (got.index >= blocks || arrived[got.index]) Fail("accepted a block twice or out of range");
    arrived[got.index] = 1;
    if (!rendezvous) {
      // What OnPushedBlock does with an eager block.
      std::vector<char>& into = buffers[got.index];
      if (data.size() > into.size()) Fail("an eager block larger than its buffer");
      if (!data.empty()) std::memcpy(into.data(), data.data(), data.size());
    }
    ++done;
  }
  if (done > blocks) Fail("more blocks landed than were asked for");
}

void PushedPieces(strata::fuzz::Input& in) {
  const uint64_t request_id = in.U64();
  const uint32_t asked = in.U16();
  const size_t blocks = in.U8();
  std::vector<uint64_t> lengths(blocks);
  for (auto& l : lengths) l = in.U16();
  std::vector<std::vector<char>> buffers(blocks);
  for (size_t i = 0; i < blocks; ++i) buffers[i].resize(lengths[i]);
  std::vector<uint8_t> arrived(blocks, 0);
  strata::client::PushedPieces pieces(asked, blocks);
  size_t whole = 0;
  for (int messages = 0; messages < 256; ++messages) {
    const std::string_view header = in.Sized();
    const std::string_view data = in.Sized();
    if (header.empty() && data.empty()) break;
    const auto got = pieces.Read(header, data.size(), request_id,
                                 [&](size_t i) { return lengths[i]; }, arrived);
    if (got.kind == strata::client::PushedPieces::kMismatch) {
      if (got.error.ok()) Fail("a mismatched piece without an error");
      return;  // the fetch fails as a whole
    }
    if (got.kind != strata::client::PushedPieces::kTake) continue;
    if (got.index >= blocks || arrived[got.index]) Fail("a piece of a block out of range or whole");
    // What OnPushedPiece does with it.
    std::vector<char>& into = buffers[got.index];
    if (got.offset + data.size() > into.size()) Fail("a piece past its block's end");
    if (!data.empty()) std::memcpy(into.data() + got.offset, data.data(), data.size());
    std::optional<uint32_t> crc;
    if (!pieces.Took(got.index, got.offset, data.size(), strata::Crc32c(data.data(), data.size()),
                     &crc))
      continue;
    arrived[got.index] = 1;
    ++whole;
    // In order, every byte came once: the block's CRC is its buffer's.
    if (crc && *crc != strata::Crc32c(into.data(), into.size()))
      Fail("a block's CRC from its pieces is not its bytes' CRC");
  }
  if (whole > blocks) Fail("more blocks whole than were asked for");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  strata::fuzz::Input in(bytes, size);
  switch (in.U8() % 10) {
    case 0: LookupReply(in); break;
    case 1: PushedBlocks(in); break;
    case 2: (void)w::DecodeLocateReplyHeader(in.Rest()); break;
    case 3: {  // DataMover::OnPublishAck then bounds the index by the blocks it sent
      const std::string_view header = in.Rest();
      auto ack = w::DecodePublishAck(header);
      if (ack && w::EncodePublishAck(*ack) != header) Fail("publish ack does not round-trip");
      break;
    }
    case 4: {  // OpenZoneWindow then maps [begin, begin + bytes) of the file only if in the arena
      const std::string_view bytes = in.Rest();
      auto r = strata::zone_wire::DecodeReply(bytes);
      if (!r) break;
      if (r->message.size() > strata::zone_wire::kMaxMessageBytes) Fail("zone reply message");
      if (strata::zone_wire::EncodeReply(*r) != bytes) Fail("zone reply does not round-trip");
      break;
    }
    case 5: {  // FetchInOne then parses `response` and copies blocks by its sizes
      const std::string_view data = in.Rest();
      auto d = w::DecodeFetchInOneData(data);
      if (!d) break;
      if (d->response.size() + d->blocks.size() + 4 != data.size())
        Fail("fetch in one data: the parts are not the whole");
      if (w::EncodeFetchInOnePrefix(d->response) + std::string(d->blocks) != data)
        Fail("fetch in one data does not round-trip");
      break;
    }
    case 6: {  // DataMover::OnPublishAcks then bounds each index by the blocks it sent
      const std::string_view header = in.Sized();
      const std::string_view data = in.Rest();
      auto acks = w::DecodePublishAcks(header, data);
      if (!acks) break;
      if (acks->acks.size() > w::kMaxStagedPerMessage) Fail("publish acks: count");
      if (w::EncodePublishAcksHeader(acks->request_id, static_cast<uint32_t>(acks->acks.size())) !=
              header ||
          w::EncodeStagedAcks(acks->acks) != data)
        Fail("publish acks do not round-trip");
      break;
    }
    case 8: PushedPieces(in); break;
    case 9: {  // DataMover::OnAnsweredPiece then reads the parts as a reply and a piece header
      const std::string_view header = in.Rest();
      auto h = w::DecodeAnsweredPieceHeader(header);
      if (!h) break;
      if (h->block.size() != w::kFetchPieceHeaderBytes || h->reply.size() != w::kReplyHeaderBytes ||
          h->answer.size() > w::kMaxAnswerInBlockBytes || !w::DecodeFetchPieceHeader(h->block))
        Fail("answered piece header: part sizes");
      if (std::string(h->block) + std::string(h->reply) + std::string(h->answer) != header)
        Fail("answered piece header: the parts are not the whole");
      break;
    }
    case 7: {  // DataMover::OnAnsweredBlock then reads the parts as a reply and a block header
      const std::string_view header = in.Rest();
      auto h = w::DecodeAnsweredBlockHeader(header);
      if (!h) break;
      if (h->block.size() != w::kFetchBlockHeaderBytes || h->reply.size() != w::kReplyHeaderBytes ||
          h->answer.size() > w::kMaxAnswerInBlockBytes)
        Fail("answered block header: part sizes");
      if (std::string(h->block) + std::string(h->reply) + std::string(h->answer) != header)
        Fail("answered block header: the parts are not the whole");
      break;
    }
  }
  return 0;
}
