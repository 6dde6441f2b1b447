// The exchange by which a same-node client of a tenant gets the memory of its tenant's zone
// (storage/zoned_arena.h) from stratad: over a unix socket, since a file descriptor can travel
// only that way. The client proves who it is with the ticket its authenticated Connect returned
// (ConnectResponse.am_ticket); the daemon answers with the zone's place in the arena and, on
// success, the zone's sealed file as SCM_RIGHTS, which the client maps read-only.
//
// Request: u32 kMagic | u32 ticket bytes (at most kMaxTicketBytes) | ticket.
// Reply:   u32 kMagic | u32 status code (absl) | u64 zone begin (arena offset) |
//          u64 zone bytes | u32 flags (kWritable) | u32 message bytes (at most
//          kMaxMessageBytes) | message.
// All integers little-endian. One request per connection.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace strata::zone_wire {

inline constexpr uint32_t kMagic = 0x315a5453;  // "STZ1"
inline constexpr uint32_t kMaxTicketBytes = 256;
inline constexpr uint32_t kMaxMessageBytes = 512;
inline constexpr size_t kReplyHeaderBytes = 32;
// The zone's file may be mapped writable (auth.tenant_zones_writable); else read-only.
inline constexpr uint32_t kWritable = 1;

struct Reply {
  uint32_t code = 0;
  uint64_t begin = 0, bytes = 0;
  uint32_t flags = 0;
  std::string message;
};

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

inline std::string EncodeRequest(std::string_view ticket) {
  std::string out;
  PutU32(out, kMagic);
  PutU32(out, static_cast<uint32_t>(ticket.size()));
  out.append(ticket);
  return out;
}

inline constexpr size_t kRequestHeaderBytes = 8;
// The ticket length a request's first kRequestHeaderBytes announce; nullopt when they are not a
// zone request or announce more than kMaxTicketBytes.
inline std::optional<uint32_t> DecodeRequestHeader(std::string_view head) {
  if (head.size() != kRequestHeaderBytes || U32At(head, 0) != kMagic) return std::nullopt;
  const uint32_t n = U32At(head, 4);
  if (n > kMaxTicketBytes) return std::nullopt;
  return n;
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
  out.append(msg);
  return out;
}

// Nullopt unless `in` is exactly one well-formed reply.
inline std::optional<Reply> DecodeReply(std::string_view in) {
  if (in.size() < kReplyHeaderBytes || U32At(in, 0) != kMagic) return std::nullopt;
  Reply r{U32At(in, 4), U64At(in, 8), U64At(in, 16), U32At(in, 24), {}};
  const uint32_t n = U32At(in, 28);
  if (n > kMaxMessageBytes || in.size() != kReplyHeaderBytes + n) return std::nullopt;
  r.message.assign(in.substr(kReplyHeaderBytes));
  return r;
}

}  // namespace strata::zone_wire
