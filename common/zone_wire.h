// The exchange by which a same-node client of a tenant gets the memory of its tenant's zone
// (storage/zoned_arena.h) from stratad: over a unix socket, since a file descriptor can travel
// only that way. The client proves who it is with the ticket its authenticated Connect returned
// (ConnectResponse.am_ticket); the daemon answers with the zone's place in the arena and, on
// success, the zone's sealed file as SCM_RIGHTS, which the client maps read-only.
//
// Where the zone is read-only, the client may also lend the daemon a staging window: memory of
// its own (a memfd sealed against shrinking) into which it copies the blocks it publishes; the
// daemon maps it read-only and copies each block from there into the reserved extent of the
// tenant's zone (am_wire::kPublishStagedAm). The window lives as long as its connection: the
// client keeps the socket open and the daemon unmaps the window when it closes.
//
// Request: u32 kMagic (a zone) or kStagingMagic (a staging window, whose memfd travels as
//          SCM_RIGHTS with the request) | u32 ticket bytes (at most kMaxTicketBytes) | ticket.
// Reply:   u32 kMagic | u32 status code (absl) | u64 zone begin (arena offset) |
//          u64 zone bytes | u32 flags (kWritable, kStagedMany) | u32 message bytes (at most
//          kMaxMessageBytes) | u64 staging window id (0 for a zone) | message.
// All integers little-endian. One request per connection.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace strata::zone_wire {

inline constexpr uint32_t kMagic = 0x315a5453;         // "STZ1"
inline constexpr uint32_t kStagingMagic = 0x31535453;  // "STS1"
inline constexpr uint32_t kMaxTicketBytes = 256;
inline constexpr uint32_t kMaxMessageBytes = 512;
inline constexpr size_t kReplyHeaderBytes = 40;
// The zone's file may be mapped writable (auth.tenant_zones_writable); else read-only.
inline constexpr uint32_t kWritable = 1;
// The daemon takes several staged blocks in one message (am_wire::kPublishStagedManyAm).
inline constexpr uint32_t kStagedMany = 2;
// The smallest staging window a daemon takes (a client lends at least this much).
inline constexpr uint64_t kMinStagingBytes = 1 << 20;

struct Reply {
  uint32_t code = 0;
  uint64_t begin = 0, bytes = 0;
  uint32_t flags = 0;
  std::string message;
  uint64_t staging_id = 0;
};

enum class RequestKind { kZone, kStaging };
struct RequestHeader {
  RequestKind kind = RequestKind::kZone;
  uint32_t ticket_bytes = 0;
};

// Sends `bytes` on the unix socket `sock` in one sendmsg, with `fd` as SCM_RIGHTS unless it is
// -1; true when all of it went.
inline bool SendWithFd(int sock, std::string_view bytes, int fd, int flags) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  return sendmsg(sock, &msg, flags) == static_cast<ssize_t>(bytes.size());
}

inline void PutU32(std::string& out, uint32_t v) { out.append(reinterpret_cast<char*>(&v), 4); }
inline void PutU64(std::string& out, uint64_t v) { out.append(reinterpret_cast<char*>(&v), 8); }
inline uint32_t U32At(std::string_view in, size_t at) {
  uint32_t v;
  std::memcpy(&v, in.data() + at, 4);
  return v;
}
inline uint64_t U64At(std::string_view in, size_t at) {
  uint64_t v;
  std::memcpy(&v, in.data() + at, 8);
  return v;
}

inline std::string EncodeRequest(std::string_view ticket,
                                 RequestKind kind = RequestKind::kZone) {
  std::string out;
  PutU32(out, kind == RequestKind::kZone ? kMagic : kStagingMagic);
  PutU32(out, static_cast<uint32_t>(ticket.size()));
  out.append(ticket);
  return out;
}

inline constexpr size_t kRequestHeaderBytes = 8;
// What a request's first kRequestHeaderBytes ask for and the ticket length they announce;
// nullopt when they are no request of this protocol or announce more than kMaxTicketBytes.
inline std::optional<RequestHeader> DecodeRequestHeader(std::string_view head) {
  if (head.size() != kRequestHeaderBytes) return std::nullopt;
  const uint32_t magic = U32At(head, 0);
  if (magic != kMagic && magic != kStagingMagic) return std::nullopt;
  const uint32_t n = U32At(head, 4);
  if (n > kMaxTicketBytes) return std::nullopt;
  return RequestHeader{magic == kMagic ? RequestKind::kZone : RequestKind::kStaging, n};
}

inline std::string EncodeReply(const Reply& r) {
  std::string out;
  PutU32(out, kMagic);
  PutU32(out, r.code);
  PutU64(out, r.begin);
  PutU64(out, r.bytes);
  PutU32(out, r.flags);
  const std::string_view msg = std::string_view(r.message).substr(0, kMaxMessageBytes);
  PutU32(out, static_cast<uint32_t>(msg.size()));
  PutU64(out, r.staging_id);
  out.append(msg);
  return out;
}

// Nullopt unless `in` is exactly one well-formed reply.
inline std::optional<Reply> DecodeReply(std::string_view in) {
  if (in.size() < kReplyHeaderBytes || U32At(in, 0) != kMagic) return std::nullopt;
  Reply r{U32At(in, 4), U64At(in, 8), U64At(in, 16), U32At(in, 24), {}, U64At(in, 32)};
  const uint32_t n = U32At(in, 28);
  if (n > kMaxMessageBytes || in.size() != kReplyHeaderBytes + n) return std::nullopt;
  r.message.assign(in.substr(kReplyHeaderBytes));
  return r;
}

}  // namespace strata::zone_wire
