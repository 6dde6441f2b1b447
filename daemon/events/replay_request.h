// The request a KV-event subscriber sends to the daemon's replay ROUTER socket
// (kv_event_publisher.h), as the socket hands it over: [client routing id, empty delimiter,
// start seq (8 bytes, big-endian)]. Apart from the publisher, and free of ZMQ, so the fuzzer
// (tests/fuzz/replay_request_fuzzer.cc) reads requests exactly as the daemon does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace strata::daemon {

struct ReplayRequest {
  std::string client;  // the ROUTER's routing id of the requester: where the replies go
  uint64_t start_seq = 0;
};

// ZMQ routing ids are 1 to 255 bytes; a request never has a frame longer than that.
inline constexpr size_t kMaxReplayFrameBytes = 255;
// The publisher keeps at most this many frames of one message (and counts the rest): a peer
// sending a million-frame message costs the daemon no memory beyond ZMQ's own.
inline constexpr size_t kMaxReplayFrames = 4;

// `frames` are the first (at most kMaxReplayFrames) frames of one message, `frame_count` how
// many it had. nullopt: not a replay request (the publisher ignores it and logs).
std::optional<ReplayRequest> ParseReplayRequest(std::span<const std::string_view> frames,
                                                size_t frame_count);

}  // namespace strata::daemon
