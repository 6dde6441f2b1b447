#include "common/am_wire.h"

#include <algorithm>

#include "absl/status/status.h"

namespace strata::am_wire {

std::optional<LookupRequestHeader> DecodeLookupRequestHeader(std::string_view in) {
  if (in.size() != kRequestHeaderBytes && in.size() != kRequestHeaderBytes + kTicketBytes)
    return std::nullopt;
  return LookupRequestHeader{GetU64(in.data()), in.substr(8, 32), in.substr(kRequestHeaderBytes)};
}

std::optional<ReleaseHeader> DecodeReleaseHeader(std::string_view in) {
  if (in.size() != kReleaseHeaderBytes && in.size() != kReleaseHeaderBytes + kTicketBytes)
    return std::nullopt;
  return ReleaseHeader{GetU64(in.data()), in.substr(kReleaseHeaderBytes)};
}

std::optional<ReplyHeader> DecodeDefinitiveLookupReply(std::string_view header,
                                                       std::string_view data, size_t asked) {
  ReplyHeader h;
  if (!DecodeReplyHeader(header, &h) || h.code != 0 || !h.complete || h.prefix > asked ||
      data.size() != h.prefix)
    return std::nullopt;
  return h;
}

std::optional<uint64_t> DecodeLocateRequestHeader(std::string_view in) {
  if (in.size() != 8) return std::nullopt;
  return GetU64(in.data());
}

std::optional<LocateReplyHeader> DecodeLocateReplyHeader(std::string_view in) {
  if (in.size() != kReplyHeaderBytes) return std::nullopt;
  return LocateReplyHeader{GetU64(in.data()), GetU32(in.data() + 8), GetU32(in.data() + 12)};
}

std::optional<FetchRequestHeader> DecodeFetchRequestHeader(std::string_view in) {
  if (in.size() != kFetchRequestHeaderBytes) return std::nullopt;
  return FetchRequestHeader{GetU64(in.data()), GetU64(in.data() + 8), GetU32(in.data() + 16),
                            GetU32(in.data() + 20)};
}

absl::StatusOr<std::vector<FetchExtent>> DecodeFetchExtents(std::string_view data, uint32_t count,
                                                            uint64_t arena_bytes) {
  if (data.size() != size_t{count} * 16)
    return absl::InvalidArgumentError("malformed fetch request");
  std::vector<FetchExtent> extents(count);
  uint64_t total = 0;
  for (uint32_t i = 0; i < count; ++i) {
    extents[i] = {GetU64(data.data() + 16 * i), GetU64(data.data() + 16 * i + 8)};
    if (extents[i].size > arena_bytes || extents[i].offset > arena_bytes - extents[i].size)
      return absl::InvalidArgumentError("an extent lies outside the arena");
    // Each term is at most arena_bytes and the sum is checked after each one, so it never wraps.
    total += extents[i].size;
    if (total > arena_bytes)
      return absl::InvalidArgumentError("the extents add up to more than the arena");
  }
  return extents;
}

std::string EncodeFetchBlockHeader(const FetchBlockHeader& h) {
  std::string out(kFetchBlockHeaderBytes, '\0');
  PutU64(out.data(), h.request_id);
  PutU32(out.data() + 8, h.index);
  PutU32(out.data() + 12, h.code);
  return out;
}

std::optional<FetchBlockHeader> DecodeFetchBlockHeader(std::string_view in) {
  if (in.size() != kFetchBlockHeaderBytes) return std::nullopt;
  return FetchBlockHeader{GetU64(in.data()), GetU32(in.data() + 8), GetU32(in.data() + 12)};
}

uint64_t PushPieceBytes(uint64_t block_bytes, uint32_t asked) {
  if (asked == 0 || block_bytes <= asked) return block_bytes;
  // Counted in whole cache lines, so that rounding each piece up stays within `asked`.
  const uint64_t most = std::max<uint64_t>(64, asked & ~uint32_t{63});
  const uint64_t pieces = block_bytes / most + (block_bytes % most != 0);
  const uint64_t even = block_bytes / pieces + (block_bytes % pieces != 0);
  return (even + 63) & ~uint64_t{63};
}

uint64_t PushMessages(uint64_t block_bytes, uint32_t asked) {
  const uint64_t piece = PushPieceBytes(block_bytes, asked);
  if (piece >= block_bytes) return 1;
  return block_bytes / piece + (block_bytes % piece != 0);
}

std::string EncodeFetchPieceHeader(const FetchPieceHeader& h) {
  std::string out = EncodeFetchBlockHeader(h.block);
  out.resize(kFetchPieceHeaderBytes);
  PutU64(out.data() + kFetchBlockHeaderBytes, h.offset);
  return out;
}

std::optional<FetchPieceHeader> DecodeFetchPieceHeader(std::string_view in) {
  if (in.size() != kFetchPieceHeaderBytes) return std::nullopt;
  const auto block = DecodeFetchBlockHeader(in.substr(0, kFetchBlockHeaderBytes));
  if (!block || block->index == kFetchRefused) return std::nullopt;
  return FetchPieceHeader{*block, GetU64(in.data() + kFetchBlockHeaderBytes)};
}

namespace {

// A block's or a piece's header (`head`), then the answer's reply header and the answer.
std::string Answered(std::string head, const ReplyHeader& reply, std::string_view answer) {
  head += EncodeReplyHeader(reply);
  head.append(answer.data(), answer.size());
  return head;
}

// Splits what Answered made, `head_bytes` long up front; `valid_head` checks that part.
template <typename ValidHead>
std::optional<AnsweredBlockHeader> SplitAnswered(std::string_view in, size_t head_bytes,
                                                 ValidHead valid_head) {
  const size_t fixed = head_bytes + kReplyHeaderBytes;
  if (in.size() < fixed || in.size() > fixed + kMaxAnswerInBlockBytes) return std::nullopt;
  if (!valid_head(in.substr(0, head_bytes))) return std::nullopt;
  return AnsweredBlockHeader{in.substr(0, head_bytes), in.substr(head_bytes, kReplyHeaderBytes),
                             in.substr(fixed)};
}

}  // namespace

std::string EncodeAnsweredPieceHeader(const FetchPieceHeader& piece, const ReplyHeader& reply,
                                      std::string_view answer) {
  return Answered(EncodeFetchPieceHeader(piece), reply, answer);
}

std::optional<AnsweredBlockHeader> DecodeAnsweredPieceHeader(std::string_view in) {
  return SplitAnswered(in, kFetchPieceHeaderBytes, [](std::string_view head) {
    return DecodeFetchPieceHeader(head).has_value();
  });
}

std::string EncodePiecesRequestPrefix(uint32_t piece_bytes) {
  std::string out(kPiecesRequestPrefixBytes, '\0');
  PutU32(out.data(), piece_bytes);
  return out;
}

std::optional<PiecesRequest> DecodePiecesRequest(std::string_view data) {
  if (data.size() < kPiecesRequestPrefixBytes || GetU32(data.data() + 4) != 0) return std::nullopt;
  const uint32_t piece_bytes = GetU32(data.data());
  if (piece_bytes == 0 || !ValidPushPieceBytes(piece_bytes)) return std::nullopt;
  return PiecesRequest{piece_bytes, data.substr(kPiecesRequestPrefixBytes)};
}

std::string EncodeAnsweredBlockHeader(const FetchBlockHeader& block, const ReplyHeader& reply,
                                      std::string_view answer) {
  return Answered(EncodeFetchBlockHeader(block), reply, answer);
}

std::optional<AnsweredBlockHeader> DecodeAnsweredBlockHeader(std::string_view in) {
  return SplitAnswered(in, kFetchBlockHeaderBytes, [](std::string_view head) {
    const auto block = DecodeFetchBlockHeader(head);
    return block && block->index != kFetchRefused;
  });
}

std::string EncodePublishBlockHeader(const PublishBlockHeader& h) {
  std::string out(kPublishBlockHeaderBytes, '\0');
  PutU64(out.data(), h.request_id);
  PutU64(out.data() + 8, h.reservation_id);
  PutU64(out.data() + 16, h.offset);
  PutU64(out.data() + 24, h.size);
  PutU32(out.data() + 32, h.index);
  return out;
}

std::optional<PublishBlockHeader> DecodePublishBlockHeader(std::string_view in) {
  // The reserved word must be zero, so that it can carry meaning later.
  if (in.size() != kPublishBlockHeaderBytes || GetU32(in.data() + 36) != 0) return std::nullopt;
  return PublishBlockHeader{GetU64(in.data()), GetU64(in.data() + 8), GetU64(in.data() + 16),
                            GetU64(in.data() + 24), GetU32(in.data() + 32)};
}

absl::Status CheckPublishBlock(const PublishBlockHeader& h, uint64_t payload_bytes,
                               uint64_t arena_bytes) {
  if (h.size != payload_bytes)
    return absl::InvalidArgumentError("a published block's payload is not the size it names");
  if (h.size > arena_bytes || h.offset > arena_bytes - h.size)
    return absl::InvalidArgumentError("a published block's extent lies outside the arena");
  return absl::OkStatus();
}

std::string EncodePublishPieceHeader(const PublishPieceHeader& h) {
  std::string out = EncodePublishBlockHeader(h.block);
  out.resize(kPublishPieceHeaderBytes, '\0');
  PutU64(out.data() + kPublishBlockHeaderBytes, h.offset);
  return out;
}

std::optional<PublishPieceHeader> DecodePublishPieceHeader(std::string_view in) {
  if (in.size() != kPublishPieceHeaderBytes) return std::nullopt;
  const auto block = DecodePublishBlockHeader(in.substr(0, kPublishBlockHeaderBytes));
  if (!block) return std::nullopt;
  return PublishPieceHeader{*block, GetU64(in.data() + kPublishBlockHeaderBytes)};
}

absl::Status CheckPublishPiece(const PublishPieceHeader& h, uint64_t payload_bytes,
                               uint64_t arena_bytes) {
  const PublishBlockHeader& b = h.block;
  if (b.size > arena_bytes || b.offset > arena_bytes - b.size)
    return absl::InvalidArgumentError("a published block's extent lies outside the arena");
  if (payload_bytes == 0 || h.offset >= b.size || payload_bytes > b.size - h.offset)
    return absl::InvalidArgumentError("a published piece is empty or lies outside its block");
  return absl::OkStatus();
}

std::string EncodePublishStagedHeader(const PublishStagedHeader& h) {
  std::string out = EncodePublishBlockHeader(h.block);
  out.resize(kPublishStagedHeaderBytes, '\0');
  PutU64(out.data() + kPublishBlockHeaderBytes, h.staging_id);
  PutU64(out.data() + kPublishBlockHeaderBytes + 8, h.staging_offset);
  PutU32(out.data() + kPublishBlockHeaderBytes + 16, h.crc32c);
  PutU32(out.data() + kPublishBlockHeaderBytes + 20, h.flags);
  return out;
}

std::optional<PublishStagedHeader> DecodePublishStagedHeader(std::string_view in) {
  if (in.size() != kPublishStagedHeaderBytes ||
      (GetU32(in.data() + kPublishStagedHeaderBytes - 4) & ~kStagedCrcByDaemon) != 0)
    return std::nullopt;
  auto block = DecodePublishBlockHeader(in.substr(0, kPublishBlockHeaderBytes));
  if (!block) return std::nullopt;
  const char* tail = in.data() + kPublishBlockHeaderBytes;
  return PublishStagedHeader{*block, GetU64(tail), GetU64(tail + 8), GetU32(tail + 16),
                             GetU32(tail + 20)};
}

std::string EncodePublishStagedManyHeader(uint64_t request_id, uint64_t reservation_id,
                                          uint32_t count) {
  std::string out(8 + 8 + 4 + 4, '\0');
  PutU64(out.data(), request_id);
  PutU64(out.data() + 8, reservation_id);
  PutU32(out.data() + 16, count);
  return out;
}

std::optional<PublishStagedMany> DecodePublishStagedMany(std::string_view header,
                                                         std::string_view data) {
  if (header.size() != 8 + 8 + 4 + 4 || GetU32(header.data() + 20) != 0) return std::nullopt;
  PublishStagedMany out{GetU64(header.data()), GetU64(header.data() + 8), {}};
  const uint32_t count = GetU32(header.data() + 16);
  if (count == 0 || count > kMaxStagedPerMessage ||
      data.size() != static_cast<size_t>(count) * kPublishStagedHeaderBytes)
    return std::nullopt;
  out.blocks.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    auto block = DecodePublishStagedHeader(
        data.substr(static_cast<size_t>(i) * kPublishStagedHeaderBytes, kPublishStagedHeaderBytes));
    if (!block || block->block.request_id != out.request_id ||
        block->block.reservation_id != out.reservation_id)
      return std::nullopt;
    out.blocks.push_back(*block);
  }
  return out;
}

std::string EncodePublishAcksHeader(uint64_t request_id, uint32_t count) {
  std::string out(8 + 4 + 4, '\0');
  PutU64(out.data(), request_id);
  PutU32(out.data() + 8, count);
  return out;
}

std::string EncodeStagedAcks(std::span<const StagedAck> acks) {
  std::string out(acks.size() * 8, '\0');
  for (size_t i = 0; i < acks.size(); ++i) {
    PutU32(out.data() + 8 * i, acks[i].index);
    PutU32(out.data() + 8 * i + 4, acks[i].crc32c);
  }
  return out;
}

std::optional<PublishAcks> DecodePublishAcks(std::string_view header, std::string_view data) {
  if (header.size() != 8 + 4 + 4 || GetU32(header.data() + 12) != 0) return std::nullopt;
  const uint32_t count = GetU32(header.data() + 8);
  if (count > kMaxStagedPerMessage || data.size() != static_cast<size_t>(count) * 8)
    return std::nullopt;
  PublishAcks out{GetU64(header.data()), {}};
  out.acks.reserve(count);
  for (uint32_t i = 0; i < count; ++i)
    out.acks.push_back({GetU32(data.data() + 8 * i), GetU32(data.data() + 8 * i + 4)});
  return out;
}

std::string EncodePublishAck(const PublishAck& h) {
  std::string out(h.crc32c ? kPublishAckWithCrcBytes : kPublishAckHeaderBytes, '\0');
  PutU64(out.data(), h.request_id);
  PutU32(out.data() + 8, h.index);
  PutU32(out.data() + 12, h.code);
  if (h.crc32c) PutU32(out.data() + 16, *h.crc32c);
  return out;
}
std::optional<PublishAck> DecodePublishAck(std::string_view in) {
  if (in.size() != kPublishAckHeaderBytes && in.size() != kPublishAckWithCrcBytes)
    return std::nullopt;
  PublishAck a{GetU64(in.data()), GetU32(in.data() + 8), GetU32(in.data() + 12), std::nullopt};
  if (in.size() == kPublishAckWithCrcBytes) a.crc32c = GetU32(in.data() + 16);
  return a;
}

std::string EncodePublishInOnePrefix(std::string_view reserve, std::span<const uint32_t> crc32c) {
  std::string out(8 + reserve.size() + 4 * crc32c.size(), '\0');
  PutU32(out.data(), static_cast<uint32_t>(reserve.size()));
  PutU32(out.data() + 4, static_cast<uint32_t>(crc32c.size()));
  std::memcpy(out.data() + 8, reserve.data(), reserve.size());
  char* p = out.data() + 8 + reserve.size();
  for (uint32_t crc : crc32c) {
    PutU32(p, crc);
    p += 4;
  }
  return out;
}

std::optional<PublishInOneData> DecodePublishInOneData(std::string_view in) {
  if (in.size() < 8) return std::nullopt;
  const uint64_t reserve_bytes = GetU32(in.data());
  const uint64_t count = GetU32(in.data() + 4);
  if (count == 0 || count > kMaxControlIds) return std::nullopt;
  const uint64_t prefix = 8 + reserve_bytes + 4 * count;
  if (prefix > in.size() || in.size() - prefix > kMaxPublishInOneBytes) return std::nullopt;
  PublishInOneData d;
  d.reserve = in.substr(8, reserve_bytes);
  d.crc32c.resize(count);
  for (uint64_t i = 0; i < count; ++i) d.crc32c[i] = GetU32(in.data() + 8 + reserve_bytes + 4 * i);
  d.blocks = in.substr(prefix);
  return d;
}

std::string EncodeFetchInOnePrefix(std::string_view response) {
  std::string out(4, '\0');
  PutU32(out.data(), static_cast<uint32_t>(response.size()));
  return out.append(response);
}

std::optional<FetchInOneData> DecodeFetchInOneData(std::string_view in) {
  if (in.size() < 4) return std::nullopt;
  const uint64_t response_bytes = GetU32(in.data());
  if (response_bytes > in.size() - 4) return std::nullopt;
  return FetchInOneData{in.substr(4, response_bytes), in.substr(4 + response_bytes)};
}

}  // namespace strata::am_wire
