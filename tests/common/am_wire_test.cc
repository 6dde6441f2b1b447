// The staged-publish header's flags, several staged blocks in one message, the publish
// acknowledgements with stratad's CRC, a pushed block that carries its fetch's answer and blocks
// pushed in pieces: what a client and a daemon of different versions must agree on.
#include "common/am_wire.h"

#include <gtest/gtest.h>

namespace strata::am_wire {
namespace {

PublishStagedHeader Staged(uint32_t flags) {
  return PublishStagedHeader{{7, 11, 4096, 1 << 20, 3}, 99, 8192, flags ? 0u : 0xDEADBEEFu, flags};
}

TEST(AmWireTest, StagedHeaderCarriesTheCrcByDaemonFlagAndRefusesOthers) {
  for (uint32_t flags : {0u, kStagedCrcByDaemon}) {
    const std::string h = EncodePublishStagedHeader(Staged(flags));
    ASSERT_EQ(h.size(), kPublishStagedHeaderBytes);
    auto d = DecodePublishStagedHeader(h);
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(d->flags, flags);
    EXPECT_EQ(d->crc32c, Staged(flags).crc32c);
    EXPECT_EQ(d->staging_offset, 8192u);
    EXPECT_EQ(EncodePublishStagedHeader(*d), h);
  }
  std::string unknown = EncodePublishStagedHeader(Staged(0));
  unknown[kPublishStagedHeaderBytes - 4] = 2;  // a flag this version does not know
  EXPECT_FALSE(DecodePublishStagedHeader(unknown).has_value());
  unknown[kPublishStagedHeaderBytes - 4] = 0;
  unknown[kPublishStagedHeaderBytes - 1] = 1;
  EXPECT_FALSE(DecodePublishStagedHeader(unknown).has_value());
}

TEST(AmWireTest, PublishAckCarriesACrcOnlyWhenItHasOne) {
  const std::string plain = EncodePublishAck({5, 2, 0, std::nullopt});
  EXPECT_EQ(plain.size(), kPublishAckHeaderBytes) << "older clients read exactly this";
  auto p = DecodePublishAck(plain);
  ASSERT_TRUE(p.has_value());
  EXPECT_FALSE(p->crc32c.has_value());
  const std::string with = EncodePublishAck({5, 2, 0, 0xCAFEF00Du});
  EXPECT_EQ(with.size(), kPublishAckWithCrcBytes);
  auto w = DecodePublishAck(with);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->crc32c, 0xCAFEF00Du);
  EXPECT_EQ(w->index, 2u);
  EXPECT_FALSE(DecodePublishAck(with.substr(0, 18)).has_value());
  EXPECT_FALSE(DecodePublishAck(with + "x").has_value());
}

TEST(AmWireTest, StagedManyNamesOneRequestAndReservationAndRefusesWhatDoesNotAddUp) {
  std::string data;
  for (uint32_t i = 0; i < 3; ++i) {
    PublishStagedHeader h = Staged(i == 1 ? kStagedCrcByDaemon : 0);
    h.block.index = i;
    h.staging_offset = 4096u * i;
    data += EncodePublishStagedHeader(h);
  }
  const std::string header = EncodePublishStagedManyHeader(7, 11, 3);
  auto many = DecodePublishStagedMany(header, data);
  ASSERT_TRUE(many.has_value());
  EXPECT_EQ(many->request_id, 7u);
  EXPECT_EQ(many->reservation_id, 11u);
  ASSERT_EQ(many->blocks.size(), 3u);
  EXPECT_EQ(many->blocks[1].flags, kStagedCrcByDaemon);
  EXPECT_EQ(many->blocks[2].staging_offset, 8192u);
  // A count that is not the data's, none, too many; a reserved word set; an entry of another
  // request or reservation; a short entry.
  EXPECT_FALSE(DecodePublishStagedMany(EncodePublishStagedManyHeader(7, 11, 2), data));
  EXPECT_FALSE(DecodePublishStagedMany(EncodePublishStagedManyHeader(7, 11, 0), ""));
  EXPECT_FALSE(DecodePublishStagedMany(
      EncodePublishStagedManyHeader(7, 11, kMaxStagedPerMessage + 1),
      std::string((kMaxStagedPerMessage + 1) * kPublishStagedHeaderBytes, '\0')));
  std::string reserved = header;
  reserved[23] = 1;
  EXPECT_FALSE(DecodePublishStagedMany(reserved, data));
  EXPECT_FALSE(DecodePublishStagedMany(EncodePublishStagedManyHeader(8, 11, 3), data));
  EXPECT_FALSE(DecodePublishStagedMany(EncodePublishStagedManyHeader(7, 12, 3), data));
  EXPECT_FALSE(DecodePublishStagedMany(header, data.substr(0, data.size() - 1)));
  EXPECT_FALSE(DecodePublishStagedMany(header.substr(0, 20), data));
}

TEST(AmWireTest, PublishAcksRoundTripAndRefuseWhatDoesNotAddUp) {
  const std::vector<StagedAck> acks = {{0, 0xAAAAAAAAu}, {5, 1}, {127, 0}};
  const std::string header = EncodePublishAcksHeader(42, 3);
  const std::string data = EncodeStagedAcks(acks);
  auto d = DecodePublishAcks(header, data);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->request_id, 42u);
  ASSERT_EQ(d->acks.size(), 3u);
  EXPECT_EQ(d->acks[0].crc32c, 0xAAAAAAAAu);
  EXPECT_EQ(d->acks[2].index, 127u);
  EXPECT_FALSE(DecodePublishAcks(EncodePublishAcksHeader(42, 2), data));
  EXPECT_FALSE(DecodePublishAcks(header, data + "x"));
  EXPECT_FALSE(DecodePublishAcks(header.substr(0, 12), data));
  std::string reserved = header;
  reserved[15] = 1;
  EXPECT_FALSE(DecodePublishAcks(reserved, data));
  EXPECT_FALSE(DecodePublishAcks(EncodePublishAcksHeader(42, kMaxStagedPerMessage + 1),
                                 std::string((kMaxStagedPerMessage + 1) * 8, '\0')));
}

TEST(AmWireTest, PublishInOneDataRoundTripsAndRefusesWhatDoesNotAddUp) {
  const std::string reserve = "serialized reserve request";
  const uint32_t crcs[] = {1, 2, 3};
  const std::string blocks = "aaaabbbbbbcc";
  const std::string data = EncodePublishInOnePrefix(reserve, crcs) + blocks;
  auto d = DecodePublishInOneData(data);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->reserve, reserve);
  EXPECT_EQ(d->crc32c, std::vector<uint32_t>({1, 2, 3}));
  EXPECT_EQ(d->blocks, blocks);
  // Truncated inside the prefix; lengths that run past the end; no blocks at all; too many.
  for (size_t cut = 0; cut < 8 + reserve.size() + 12; ++cut)
    EXPECT_FALSE(DecodePublishInOneData(data.substr(0, cut)).has_value()) << cut;
  EXPECT_FALSE(DecodePublishInOneData(EncodePublishInOnePrefix(reserve, {})).has_value());
  std::vector<uint32_t> many(kMaxControlIds + 1, 0);
  EXPECT_FALSE(DecodePublishInOneData(EncodePublishInOnePrefix(reserve, many)).has_value());
  EXPECT_FALSE(DecodePublishInOneData(EncodePublishInOnePrefix(reserve, crcs) +
                                      std::string(kMaxPublishInOneBytes + 1, 'x'))
                   .has_value());
  std::string lying = data;
  PutU32(lying.data(), 0xfffffff0u);
  EXPECT_FALSE(DecodePublishInOneData(lying).has_value());
}

TEST(AmWireTest, AnsweredBlockHeaderSplitsIntoItsPartsAndRefusesWhatDoesNotFit) {
  const ReplyHeader reply{5, 0, 2, true};
  const std::string answer = "serialized acquire response";
  const std::string h = EncodeAnsweredBlockHeader({5, 0, 0}, reply, answer);
  auto d = DecodeAnsweredBlockHeader(h);
  ASSERT_TRUE(d.has_value());
  auto block = DecodeFetchBlockHeader(d->block);
  ASSERT_TRUE(block.has_value());
  EXPECT_EQ(block->request_id, 5u);
  EXPECT_EQ(block->index, 0u);
  ReplyHeader r;
  ASSERT_TRUE(DecodeReplyHeader(d->reply, &r));
  EXPECT_EQ(r.request_id, 5u);
  EXPECT_EQ(r.prefix, 2u);
  EXPECT_TRUE(r.complete);
  EXPECT_EQ(d->answer, answer);
  // An empty answer still splits; a header cut inside its fixed parts, a refusal, or more answer
  // than a block carries does not.
  EXPECT_TRUE(DecodeAnsweredBlockHeader(EncodeAnsweredBlockHeader({5, 1, 0}, reply, "")));
  for (size_t cut = 0; cut < kFetchBlockHeaderBytes + kReplyHeaderBytes; ++cut)
    EXPECT_FALSE(DecodeAnsweredBlockHeader(h.substr(0, cut)).has_value()) << cut;
  EXPECT_FALSE(DecodeAnsweredBlockHeader(EncodeAnsweredBlockHeader({5, kFetchRefused, 9}, reply,
                                                                   answer)));
  EXPECT_TRUE(DecodeAnsweredBlockHeader(
      EncodeAnsweredBlockHeader({5, 0, 0}, reply, std::string(kMaxAnswerInBlockBytes, 'a'))));
  EXPECT_FALSE(DecodeAnsweredBlockHeader(
      EncodeAnsweredBlockHeader({5, 0, 0}, reply, std::string(kMaxAnswerInBlockBytes + 1, 'a'))));
}

// Pieces: equal, a multiple of 64 bytes, never over what was asked, and as few as that allows.
TEST(AmWireTest, PushPiecesAreEqualCacheLinesNoLargerThanAsked) {
  EXPECT_EQ(PushPieceBytes(1 << 20, 0), 1u << 20);       // none asked: whole
  EXPECT_EQ(PushPieceBytes(65280, 65280), 65280u);       // fits: whole
  EXPECT_EQ(PushPieceBytes(0, 65280), 0u);
  EXPECT_EQ(PushPieceBytes(64 << 10, 65280), 32u << 10);  // two halves, not 65,280 and 256
  EXPECT_EQ(PushPieceBytes(1 << 20, 65280), 61696u);      // 17 pieces
  for (uint32_t asked : {4096u, 65280u, 65300u, 100000u, 4097u, kMaxPushPieceBytes}) {
    for (uint64_t block : {uint64_t{1}, uint64_t{4095}, uint64_t{4097}, uint64_t{65537},
                           uint64_t{1} << 20, (uint64_t{3} << 20) / 2 + 17, uint64_t{300000},
                           uint64_t{64} << 20}) {
      const uint64_t piece = PushPieceBytes(block, asked);
      if (block <= asked) {
        EXPECT_EQ(piece, block);
        continue;
      }
      EXPECT_LE(piece, asked) << block << " / " << asked;
      EXPECT_EQ(piece % 64, 0u) << block << " / " << asked;
      const uint64_t lines = asked & ~uint32_t{63};  // whole cache lines of `asked`
      const uint64_t count = (block + piece - 1) / piece;
      EXPECT_EQ(count, (block + lines - 1) / lines) << block << " / " << asked;
      EXPECT_GT(block - (count - 1) * piece, 0u);  // the last piece is not empty
    }
  }
}

TEST(AmWireTest, PieceHeadersAndPiecesRequestsRefuseWhatDoesNotFit) {
  const std::string h = EncodeFetchPieceHeader({{5, 3, 0}, 61696});
  ASSERT_EQ(h.size(), kFetchPieceHeaderBytes);
  auto d = DecodeFetchPieceHeader(h);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->block.request_id, 5u);
  EXPECT_EQ(d->block.index, 3u);
  EXPECT_EQ(d->offset, 61696u);
  for (size_t cut = 0; cut < h.size(); ++cut)
    EXPECT_FALSE(DecodeFetchPieceHeader(h.substr(0, cut)).has_value()) << cut;
  EXPECT_FALSE(DecodeFetchPieceHeader(h + "x").has_value());
  EXPECT_FALSE(DecodeFetchPieceHeader(EncodeFetchPieceHeader({{5, kFetchRefused, 9}, 0})));

  const std::string ids(64, 'i');
  const std::string request = EncodePiecesRequestPrefix(65280) + ids;
  auto r = DecodePiecesRequest(request);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->piece_bytes, 65280u);
  EXPECT_EQ(r->ids, ids);
  for (uint32_t bad : {0u, kMinPushPieceBytes - 1, kMaxPushPieceBytes + 1})
    EXPECT_FALSE(DecodePiecesRequest(EncodePiecesRequestPrefix(bad) + ids).has_value()) << bad;
  std::string reserved = EncodePiecesRequestPrefix(65280) + ids;
  reserved[5] = 1;
  EXPECT_FALSE(DecodePiecesRequest(reserved).has_value());
  EXPECT_FALSE(DecodePiecesRequest("abc").has_value());
  EXPECT_TRUE(ValidPushPieceBytes(0));
  EXPECT_FALSE(ValidPushPieceBytes(1));

  const ReplyHeader reply{5, 0, 2, true};
  const std::string answered = EncodeAnsweredPieceHeader({{5, 0, 0}, 0}, reply, "answer");
  auto a = DecodeAnsweredPieceHeader(answered);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->block, EncodeFetchPieceHeader({{5, 0, 0}, 0}));
  EXPECT_EQ(a->reply, EncodeReplyHeader(reply));
  EXPECT_EQ(a->answer, "answer");
  for (size_t cut = 0; cut < kFetchPieceHeaderBytes + kReplyHeaderBytes; ++cut)
    EXPECT_FALSE(DecodeAnsweredPieceHeader(answered.substr(0, cut)).has_value()) << cut;
  const std::string too_long(kMaxAnswerInBlockBytes + 1, 'a');
  EXPECT_FALSE(
      DecodeAnsweredPieceHeader(EncodeAnsweredPieceHeader({{5, 0, 0}, 0}, reply, too_long)));
  EXPECT_FALSE(
      DecodeAnsweredPieceHeader(EncodeAnsweredPieceHeader({{5, kFetchRefused, 9}, 0}, reply, "")));
}

TEST(AmWireTest, PublishPiecesStayInsideTheirBlockAndTheArena) {
  const PublishPieceHeader p{{7, 11, 4096, 200000, 3}, 65536};
  const std::string h = EncodePublishPieceHeader(p);
  ASSERT_EQ(h.size(), kPublishPieceHeaderBytes);
  auto d = DecodePublishPieceHeader(h);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->block.reservation_id, 11u);
  EXPECT_EQ(d->block.size, 200000u);
  EXPECT_EQ(d->block.index, 3u);
  EXPECT_EQ(d->offset, 65536u);
  EXPECT_FALSE(DecodePublishPieceHeader(h.substr(0, h.size() - 1)).has_value());
  std::string reserved = h;
  reserved[kPublishBlockHeaderBytes - 1] = 1;  // the block header's zero word
  EXPECT_FALSE(DecodePublishPieceHeader(reserved).has_value());
  const uint64_t arena = 1 << 20;
  EXPECT_TRUE(CheckPublishPiece(p, 65536, arena).ok());
  EXPECT_TRUE(CheckPublishPiece({p.block, 196608}, 200000 - 196608, arena).ok());  // the last
  EXPECT_FALSE(CheckPublishPiece({p.block, 196608}, 200000 - 196608 + 1, arena).ok());
  EXPECT_FALSE(CheckPublishPiece({p.block, 200000}, 1, arena).ok());
  EXPECT_FALSE(CheckPublishPiece(p, 0, arena).ok());
  EXPECT_FALSE(CheckPublishPiece({{7, 11, arena - 100, 200000, 3}, 0}, 1, arena).ok());
  EXPECT_FALSE(CheckPublishPiece({{7, 11, ~0ull - 10, 200000, 3}, 0}, 1, arena).ok());
  EXPECT_FALSE(CheckPublishPiece({{7, 11, 0, ~0ull, 3}, ~0ull - 1}, 1, arena).ok());
}

}  // namespace
}  // namespace strata::am_wire
