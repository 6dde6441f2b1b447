// Wire formats of the UCX active messages that ride beside RMA on the data-plane endpoints.
//
// Lookup fast path: a Lookup sent as an active message on the data-plane endpoint a
// client already has, answered by the daemon's progress thread. It skips the gRPC stack, which
// costs more than the lookup itself on small machines. The gRPC Lookup stays the reference:
// a client falls back to it whenever the fast path cannot give a definitive answer.
//
// Request  (AM id kLookupRequestAm): header = u64 request id | namespace id[32];
//                                    data   = N x 32-byte block ids.
// Reply    (AM id kLookupReplyAm):   header = u64 request id | u32 status code (absl) |
//                                             u32 prefix blocks | u8 complete | 3 x u8 zero;
//                                    data   = one tier byte (strata.v1.Tier) per prefix block,
//                                             or the error message when status != 0.
// `complete` = 0 means the answer covers this node only and the caller must ask the gRPC
// Lookup (the rest of the prompt may sit on other nodes). All integers little-endian.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::am_wire {

inline constexpr uint16_t kLookupRequestAm = 1;
inline constexpr uint16_t kLookupReplyAm = 2;
// Daemon to daemon: the directory entries an owner holds for a batch of ids (Peer.Locate's fast
// path). Request: header = u64 request id; data = N x 32-byte ids.
// Reply: header = u64 request id | u32 status code | u32 node count | 4 x u8 zero;
//        data = node count x (u16 length, id bytes), then per id: u8 holder count, then per
//        holder u16 node index and u8 tier (strata.v1.Tier).
inline constexpr uint16_t kPeerLocateAm = 3;
inline constexpr uint16_t kPeerLocateReplyAm = 4;
// Fetch by push (transports whose RMA UCX emulates in software, e.g. tcp): after Acquire, the
// client asks the daemon to send the leased extents; the daemon sends each block as one active
// message from its arena (zero copy; rendezvous for large ones, which the client receives
// straight into the engine's buffer).
// Request: header = u64 request id | u64 lease id | u32 count | u32 piece bytes (0: whole
//          blocks; see kFetchPieceAm: daemons before pieces read it as zero and send whole
//          blocks, which the client takes as well);
//          data = count x (u64 arena offset, u64 size).
// Block:   header = u64 request id | u32 index (0xffffffff: the request was refused) |
//          u32 status code; data = the block's bytes.
inline constexpr uint16_t kFetchRequestAm = 5;
inline constexpr uint16_t kFetchBlockAm = 6;
// Publish by message (where the daemon hands out no remote key, or RMA is emulated): the
// client sends each reserved block as one active message; the daemon writes it into that
// reservation's extent (receiving a rendezvous payload straight there) and acknowledges it.
// Block: header = u64 request id | u64 reservation id | u64 arena offset | u64 size |
//                 u32 index | u32 zero; data = the block's bytes (size of them).
// Ack:   header = u64 request id | u32 index | u32 status code; data = error message or empty.
inline constexpr uint16_t kPublishBlockAm = 7;
inline constexpr uint16_t kPublishAckAm = 8;
// Acquire fast path (authentication off): the lease of a fetch in one active-message round trip
// instead of a gRPC call. Request: header and data as a lookup request's. Reply: a lookup
// reply's header (`prefix` = the number of ids) with data = the serialized
// strata.v1.AcquireResponse, or the error message when status != 0. `complete` = 0 (some block
// is not in host memory, or missing) sends the caller to the gRPC Acquire, which may stage
// blocks up from NVMe: the progress thread that answers here never waits for a disk.
inline constexpr uint16_t kAcquireRequestAm = 9;
inline constexpr uint16_t kAcquireReplyAm = 10;
// Release of a lease taken by message, one way (no reply): header = u64 lease id; no data. A
// lost one costs only the lease's timeout.
inline constexpr uint16_t kReleaseAm = 11;
// Reserve and Commit as active messages (ConnectResponse.control_by_message): a small publish
// then costs no gRPC round trip. Request: a lookup request's header (for Commit the namespace
// is 32 zero bytes: the reservation names it); data = the serialized strata.v1.ReserveRequest
// or CommitRequest. Reply: a lookup reply's header with data = the serialized response, or the
// error message when status != 0. `complete` = 0 means nothing was done and the caller must make
// the gRPC call: a Commit whose blocks must be announced to other nodes or replicated before it
// returns (network waits the progress thread never takes), or a request too large for a message.
inline constexpr uint16_t kReserveRequestAm = 12;
inline constexpr uint16_t kReserveReplyAm = 13;
inline constexpr uint16_t kCommitRequestAm = 14;
inline constexpr uint16_t kCommitReplyAm = 15;
// Acquire and push in one request (ConnectResponse.acquire_and_push): the request and the reply
// are an acquire's (kAcquireReplyAm). After a complete, successful reply the daemon pushes every
// block the lease holds (status 0) as kFetchBlockAm: header request id = this request's, index
// = the block's position among the request's ids. A fetch then takes one round trip plus the
// bytes; the client releases the lease as after a push fetch.
inline constexpr uint16_t kAcquirePushRequestAm = 16;
// Abort of a reservation, one way (no reply): header as a release's (u64 reservation id, then
// the ticket with authentication); no data. A lost one costs only the reservation's timeout.
// Daemons that offer acquire_and_push take it.
inline constexpr uint16_t kAbortAm = 17;
// Publish through a staging window (common/zone_wire.h: several tenants, read-only zones): the
// client has copied the block into its staging window and names where; the daemon copies it
// from there into the reservation's extent, which must lie in the window's tenant zone, taking
// the CRC32C as it copies, and acknowledges it as kPublishAckAm (kDataLoss when the CRC is not
// the one the client took: the bytes changed while they were copied).
// Header = a kPublishBlockAm header (its reserved word zero) | u64 staging window id |
//          u64 offset in the window | u32 CRC32C | u32 zero; no data.
inline constexpr uint16_t kPublishStagedAm = 18;
// A small publish in one request (ConnectResponse.publish_in_one): its Reserve, its blocks and
// its Commit as one message, answered once. Request: a reserve request's header; data =
// u32 reserve length R | u32 block count N | the serialized strata.v1.ReserveRequest (R bytes) |
// N x u32 CRC32C | the N blocks back to back, in request order, sizes as in the request. The
// daemon reserves, copies each block it reserved into its extent (taking the CRC as it copies:
// a block whose CRC is not the client's is refused with CRC_MISMATCH) and commits; blocks it
// already holds are skipped. Reply: a lookup reply's header with data = the serialized
// strata.v1.PublishInOneResponse, or the error message. `complete` = 0, or an error: nothing
// was stored and the caller publishes the usual way (a cluster whose other nodes must learn of
// the blocks first, a namespace the daemon forgot, ...). At most kMaxPublishInOneBytes of
// blocks: the request must stay an eager message.
inline constexpr uint16_t kPublishInOneAm = 19;
inline constexpr uint16_t kPublishInOneReplyAm = 20;
inline constexpr size_t kMaxPublishInOneBytes = 256 << 10;
// A small fetch in one request (ConnectResponse.fetch_in_one): the blocks come back inside the
// answer, so no lease outlives the call and no Release follows. Request: a lookup request
// (header and ids). Reply: a lookup reply's header; data = u32 length L | a serialized
// strata.v1.AcquireResponse (L bytes; lease_id 0, offsets empty) | the bytes of each block whose
// status is OK, back to back in request order, sizes as in the response. `complete` = 0:
// nothing was sent (a block not in host memory, another tenant's, or more than
// kMaxFetchInOneBytes of them) and the caller fetches the usual way.
inline constexpr uint16_t kFetchInOneAm = 21;
inline constexpr uint16_t kFetchInOneReplyAm = 22;
inline constexpr size_t kMaxFetchInOneBytes = 256 << 10;
// Several staged blocks of one reservation in one message (a daemon whose zone socket answers
// with zone_wire::kStagedMany). Header: u64 request id | u64 reservation id | u32 count N |
// u32 zero. Data: N kPublishStagedAm headers, each naming this request and reservation, N at
// most kMaxStagedPerMessage. The daemon checks and copies each block as for kPublishStagedAm
// (several on two threads); a refused block is acknowledged alone as kPublishAckAm, and the
// stored ones together as kPublishAcksAm: header u64 request id | u32 count M | u32 zero; data
// M x (u32 index | u32 CRC32C stratad took).
inline constexpr uint16_t kPublishStagedManyAm = 23;
inline constexpr uint16_t kPublishAcksAm = 24;
inline constexpr size_t kMaxStagedPerMessage = 128;
// A fetch into a buffer a same-node engine lent (ConnectResponse.device_fetch_by_message):
// header = a lookup request's (request id | namespace id | ticket); data = a serialized
// strata.v1.FetchToDeviceRequest of at most kMaxControlIds blocks, without `decode`. Reply: a
// lookup reply's header; data = the serialized strata.v1.FetchToDeviceResponse, or the error
// message. Served on the daemon's progress thread only when every block is in the GPU tier
// already and they come to at most kMaxDeviceFetchByMessageBytes (device-to-device copies, a
// bounded wait); otherwise `complete` = 0, nothing was copied, and the caller asks DeviceCopies.
inline constexpr uint16_t kDeviceFetchAm = 25;
inline constexpr uint16_t kDeviceFetchReplyAm = 26;
inline constexpr uint64_t kMaxDeviceFetchByMessageBytes = uint64_t{1} << 30;
// Acquire and push with the answer in the first block (ConnectResponse.answer_in_first_block):
// the request is an acquire-and-push's. When the answer is a complete lease of at least one
// block and at most kMaxAnswerInBlockBytes long, it rides in the header of the first pushed
// block, sent as kFetchBlockAnsweredAm: header = a kFetchBlockAm header | the reply header |
// the serialized strata.v1.AcquireResponse; data = the block's bytes. The other blocks follow
// as kFetchBlockAm. Any other answer travels alone as kAcquireReplyAm, as for
// kAcquirePushRequestAm. Over tcp this saves a message, a system call on each side, per fetch.
inline constexpr uint16_t kAcquirePushAnsweredRequestAm = 27;
inline constexpr uint16_t kFetchBlockAnsweredAm = 28;
// Pushed blocks in pieces (ConnectResponse.push_in_pieces), for a client whose endpoint
// carries messages over tcp: a block larger than the piece bytes the client asked for goes as
// PushPieceBytes-sized eager messages, each fitting one of UCX's tcp receive segments, so the
// client copies and checks every piece out of the segment it arrived in, as it arrives. As one
// rendezvous, a block is received into place at once but lands only when the holder's
// acknowledgement comes, queued behind every block sent after it: the checks of a whole batch
// then start at its end. Blocks up to the piece bytes still come whole (kFetchBlockAm).
// Request: an acquire-and-push's header; data = u32 piece bytes (kMinPushPieceBytes ..
//          kMaxPushPieceBytes) | u32 zero | the ids. Answered as kAcquirePushAnsweredRequestAm,
//          the answer in the header of the first message: the first block's when it comes
//          whole, else its first piece's (kFetchPieceAnsweredAm). A 64 KiB block then goes as
//          two pieces, the first with the answer, rather than as one message of 64 KiB and
//          headers, which UCX cuts into two fragments and copies together again on arrival.
// Piece:   header = a kFetchBlockAm header (never a refusal) | u64 offset of the piece in its
//          block; data = the piece's bytes.
inline constexpr uint16_t kAcquirePushPiecesRequestAm = 29;
inline constexpr uint16_t kFetchPieceAm = 30;
// Header = a kFetchPieceAm header | the reply header | the serialized strata.v1.AcquireResponse
// (as kFetchBlockAnsweredAm's); data = the piece's bytes.
inline constexpr uint16_t kFetchPieceAnsweredAm = 32;
inline constexpr uint32_t kMinPushPieceBytes = 4 << 10;
inline constexpr uint32_t kMaxPushPieceBytes = 16 << 20;
inline constexpr size_t kFetchPieceHeaderBytes = 8 + 4 + 4 + 8;
inline constexpr size_t kPiecesRequestPrefixBytes = 4 + 4;
// Published blocks in pieces (ConnectResponse.publish_in_pieces), the same way round: over tcp
// a client sends a block larger than its piece size as PushPieceBytes-sized eager messages, in
// order, and stratad copies each into the reserved extent taking the CRC as it copies (Commit
// then need not read the block again); it acknowledges the block once, after its last piece,
// as kPublishAckAm. Every message being eager, a Commit may follow right behind the pieces.
// Piece: header = a kPublishBlockHeader naming the whole block (its offset and size) | u64
//        offset of the piece in the block; data = the piece's bytes. A piece that does not
//        continue its block where the last one ended is refused (kInvalidArgument).
inline constexpr uint16_t kPublishPieceAm = 31;
// Well under what any UCX transport takes as an active message's header.
inline constexpr size_t kMaxAnswerInBlockBytes = 1024;
// Blocks one Reserve or Commit by message may carry (its request stays an eager message).
inline constexpr size_t kMaxControlIds = 256;
// With authentication, lookup, acquire and release requests end in the caller's ticket: 16
// random bytes its authenticated Connect returned (ConnectResponse.am_ticket), which the daemon
// maps back to the caller's tenant and role. Without one they are refused.
inline constexpr size_t kTicketBytes = 16;
inline constexpr size_t kReleaseHeaderBytes = 8;
inline constexpr size_t kPublishBlockHeaderBytes = 8 + 8 + 8 + 8 + 4 + 4;
inline constexpr size_t kPublishAckHeaderBytes = 8 + 4 + 4;
inline constexpr size_t kPublishPieceHeaderBytes = kPublishBlockHeaderBytes + 8;
inline constexpr size_t kPublishAckWithCrcBytes = kPublishAckHeaderBytes + 4;
inline constexpr size_t kPublishStagedHeaderBytes = kPublishBlockHeaderBytes + 8 + 8 + 4 + 4;
inline constexpr size_t kFetchRequestHeaderBytes = 8 + 8 + 4 + 4;
inline constexpr size_t kFetchBlockHeaderBytes = 8 + 4 + 4;
inline constexpr uint32_t kFetchRefused = 0xffffffffu;
inline constexpr size_t kRequestHeaderBytes = 8 + 32;
inline constexpr size_t kReplyHeaderBytes = 8 + 4 + 4 + 4;
// Eager sends only: keep requests well under UCX's rendezvous threshold on every transport.
inline constexpr size_t kMaxIds = 1024;

struct ReplyHeader {
  uint64_t request_id = 0;
  uint32_t code = 0;
  uint32_t prefix = 0;
  bool complete = false;
};

inline void PutU64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
inline void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
inline uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
inline uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

inline std::string EncodeReplyHeader(const ReplyHeader& h) {
  std::string out(kReplyHeaderBytes, '\0');
  PutU64(out.data(), h.request_id);
  PutU32(out.data() + 8, h.code);
  PutU32(out.data() + 12, h.prefix);
  out[16] = h.complete ? 1 : 0;
  return out;
}

inline bool DecodeReplyHeader(std::string_view in, ReplyHeader* h) {
  if (in.size() != kReplyHeaderBytes) return false;
  h->request_id = GetU64(in.data());
  h->code = GetU32(in.data() + 8);
  h->prefix = GetU32(in.data() + 12);
  h->complete = in[16] != 0;
  return true;
}

// The decoders below are the only readers of these messages' bytes in the daemon and the
// client, so tests/fuzz exercises exactly what production runs on a peer's input.

// Lookup (and acquire) request header; nullopt unless it is exactly kRequestHeaderBytes, or
// that and a ticket. `ns` and `ticket` view `in`.
struct LookupRequestHeader {
  uint64_t request_id = 0;
  std::string_view ns;      // 32 raw bytes, not yet checked against the open namespaces
  std::string_view ticket;  // empty, or kTicketBytes raw bytes
};
std::optional<LookupRequestHeader> DecodeLookupRequestHeader(std::string_view in);

// The lookup reply when it is a definitive answer to `asked` ids: status OK, complete, and one
// tier byte per prefix block. nullopt sends the caller to the gRPC Lookup.
std::optional<ReplyHeader> DecodeDefinitiveLookupReply(std::string_view header,
                                                       std::string_view data, size_t asked);

// Release header: the lease id and the ticket (empty when there is none); nullopt unless it is
// exactly kReleaseHeaderBytes, or that and a ticket.
struct ReleaseHeader {
  uint64_t lease_id = 0;
  std::string_view ticket;
};
std::optional<ReleaseHeader> DecodeReleaseHeader(std::string_view in);
// Peer locate request header (the request id); nullopt unless it is exactly 8 bytes.
std::optional<uint64_t> DecodeLocateRequestHeader(std::string_view in);

// Peer locate reply header: the `prefix` slot of the lookup reply carries the node-table size.
struct LocateReplyHeader {
  uint64_t request_id = 0;
  uint32_t code = 0;
  uint32_t nodes = 0;
};
std::optional<LocateReplyHeader> DecodeLocateReplyHeader(std::string_view in);

struct FetchRequestHeader {
  uint64_t request_id = 0;
  uint64_t lease_id = 0;
  uint32_t count = 0;
  uint32_t piece_bytes = 0;  // not checked here (ValidPushPieceBytes)
};
std::optional<FetchRequestHeader> DecodeFetchRequestHeader(std::string_view in);

// One extent a fetch request asks the daemon to push: [offset, offset + size) of its arena.
struct FetchExtent {
  uint64_t offset = 0, size = 0;
};
// The `count` extents of a fetch request, each inside an arena of `arena_bytes` and adding up
// to at most the arena (many copies of one leased extent would otherwise queue unbounded sends
// from one small message). InvalidArgument otherwise.
absl::StatusOr<std::vector<FetchExtent>> DecodeFetchExtents(std::string_view data, uint32_t count,
                                                            uint64_t arena_bytes);

struct FetchBlockHeader {
  uint64_t request_id = 0;
  uint32_t index = 0;  // kFetchRefused: the request was refused and `code` says why
  uint32_t code = 0;
};
std::string EncodeFetchBlockHeader(const FetchBlockHeader& h);
std::optional<FetchBlockHeader> DecodeFetchBlockHeader(std::string_view in);

// The header of a kFetchBlockAnsweredAm message, viewing the input; nullopt unless it holds a
// block header (not a refusal), a reply header and at most kMaxAnswerInBlockBytes of answer.
struct AnsweredBlockHeader {
  std::string_view block;  // a kFetchBlockAm header
  std::string_view reply;  // a reply header (kReplyHeaderBytes)
  std::string_view answer;
};
std::string EncodeAnsweredBlockHeader(const FetchBlockHeader& block, const ReplyHeader& reply,
                                      std::string_view answer);
std::optional<AnsweredBlockHeader> DecodeAnsweredBlockHeader(std::string_view in);

// The length of each piece (the last may be shorter) of a block of `block_bytes` pushed for a
// request that asked for pieces of at most `asked` bytes: the block cut into equal pieces, each
// rounded up to 64 bytes (as many as pieces of `asked` in whole 64-byte lines need), or
// `block_bytes` where it comes whole (asked 0, or not larger).
// Equal pieces: a 64 KiB block goes as two of 32 KiB, not 65,280 bytes and a sliver.
uint64_t PushPieceBytes(uint64_t block_bytes, uint32_t asked);
// How many messages that block goes in: 1 where it comes whole, else its pieces.
uint64_t PushMessages(uint64_t block_bytes, uint32_t asked);
// Whether a daemon takes `asked` as a piece size: 0 (whole blocks) or within the limits.
inline bool ValidPushPieceBytes(uint32_t asked) {
  return asked == 0 || (asked >= kMinPushPieceBytes && asked <= kMaxPushPieceBytes);
}

struct FetchPieceHeader {
  FetchBlockHeader block;
  uint64_t offset = 0;
};
std::string EncodeFetchPieceHeader(const FetchPieceHeader& h);
// nullopt unless exactly kFetchPieceHeaderBytes and not a refusal.
std::optional<FetchPieceHeader> DecodeFetchPieceHeader(std::string_view in);
// As the answered block header, for kFetchPieceAnsweredAm: `block` views a kFetchPieceAm
// header (never a refusal).
std::string EncodeAnsweredPieceHeader(const FetchPieceHeader& piece, const ReplyHeader& reply,
                                      std::string_view answer);
std::optional<AnsweredBlockHeader> DecodeAnsweredPieceHeader(std::string_view in);

// The data of a kAcquirePushPiecesRequestAm request: the piece size asked for (nullopt unless
// the prefix is whole, its reserved word zero and the size valid and nonzero) and the ids.
struct PiecesRequest {
  uint32_t piece_bytes = 0;
  std::string_view ids;
};
std::string EncodePiecesRequestPrefix(uint32_t piece_bytes);
std::optional<PiecesRequest> DecodePiecesRequest(std::string_view data);

struct PublishBlockHeader {
  uint64_t request_id = 0;
  uint64_t reservation_id = 0;
  uint64_t offset = 0, size = 0;
  uint32_t index = 0;
};
std::string EncodePublishBlockHeader(const PublishBlockHeader& h);
// nullopt unless exactly kPublishBlockHeaderBytes with the reserved word zero; the extent is
// not checked.
std::optional<PublishBlockHeader> DecodePublishBlockHeader(std::string_view in);
// Whether the daemon may act on published block `h` whose `payload_bytes` arrived (or wait at
// the sender): its extent inside an arena of `arena_bytes` and its size the payload's.
// InvalidArgument otherwise.
absl::Status CheckPublishBlock(const PublishBlockHeader& h, uint64_t payload_bytes,
                               uint64_t arena_bytes);

struct PublishPieceHeader {
  PublishBlockHeader block;
  uint64_t offset = 0;  // of the piece, in the block
};
std::string EncodePublishPieceHeader(const PublishPieceHeader& h);
// nullopt unless exactly kPublishPieceHeaderBytes around a valid block header.
std::optional<PublishPieceHeader> DecodePublishPieceHeader(std::string_view in);
// Whether the daemon may act on piece `h` whose `payload_bytes` arrived: its block's extent
// inside the arena, the piece not empty and inside its block. InvalidArgument otherwise.
absl::Status CheckPublishPiece(const PublishPieceHeader& h, uint64_t payload_bytes,
                               uint64_t arena_bytes);

// PublishStagedHeader::flags: the client took no CRC (crc32c is 0); stratad takes it as it
// copies and returns it in the acknowledgement (a block the engine wrote into a publish buffer,
// which the client itself never reads).
inline constexpr uint32_t kStagedCrcByDaemon = 1;
struct PublishStagedHeader {
  PublishBlockHeader block;
  uint64_t staging_id = 0;
  uint64_t staging_offset = 0;
  uint32_t crc32c = 0;
  uint32_t flags = 0;
};
std::string EncodePublishStagedHeader(const PublishStagedHeader& h);
// nullopt unless exactly kPublishStagedHeaderBytes with the block header's reserved word zero
// and no flag but kStagedCrcByDaemon; neither the extent nor the place in the window is checked.
std::optional<PublishStagedHeader> DecodePublishStagedHeader(std::string_view in);

struct PublishStagedMany {
  uint64_t request_id = 0, reservation_id = 0;
  std::vector<PublishStagedHeader> blocks;
};
std::string EncodePublishStagedManyHeader(uint64_t request_id, uint64_t reservation_id,
                                          uint32_t count);
// nullopt unless laid out as kPublishStagedManyAm says, with 1..kMaxStagedPerMessage blocks
// that each decode as a kPublishStagedAm header of this request and reservation; neither the
// extents nor the places in the windows are checked.
std::optional<PublishStagedMany> DecodePublishStagedMany(std::string_view header,
                                                         std::string_view data);

// One stored block of a kPublishAcksAm answer.
struct StagedAck {
  uint32_t index = 0;
  uint32_t crc32c = 0;
};
std::string EncodePublishAcksHeader(uint64_t request_id, uint32_t count);
std::string EncodeStagedAcks(std::span<const StagedAck> acks);
// nullopt unless the header is 16 bytes, its reserved word zero, and the data holds its count
// of acknowledgements exactly.
struct PublishAcks {
  uint64_t request_id = 0;
  std::vector<StagedAck> acks;
};
std::optional<PublishAcks> DecodePublishAcks(std::string_view header, std::string_view data);

struct PublishAck {
  uint64_t request_id = 0;
  uint32_t index = 0;
  uint32_t code = 0;  // absl status code
  // The CRC32C stratad took of the block, for a staged block sent with kStagedCrcByDaemon
  // (the acknowledgement is then kPublishAckWithCrcBytes long).
  std::optional<uint32_t> crc32c;
};
std::string EncodePublishAck(const PublishAck& h);
std::optional<PublishAck> DecodePublishAck(std::string_view in);

// The data of a kPublishInOneAm request, viewing the input; nullopt unless it is laid out as
// described there with at most kMaxControlIds blocks and kMaxPublishInOneBytes of them (that the
// blocks add up to the request's sizes is the daemon's check, after parsing `reserve`).
struct PublishInOneData {
  std::string_view reserve;  // the serialized ReserveRequest
  std::vector<uint32_t> crc32c;
  std::string_view blocks;
};
std::string EncodePublishInOnePrefix(std::string_view reserve, std::span<const uint32_t> crc32c);
std::optional<PublishInOneData> DecodePublishInOneData(std::string_view in);

// The data of a kFetchInOneReplyAm answer, viewing the input; nullopt unless the length prefix
// fits (that the blocks add up to the response's sizes is the client's check, after parsing).
struct FetchInOneData {
  std::string_view response;  // the serialized AcquireResponse
  std::string_view blocks;
};
std::string EncodeFetchInOnePrefix(std::string_view response);
std::optional<FetchInOneData> DecodeFetchInOneData(std::string_view in);

}  // namespace strata::am_wire
