#include "daemon/events/replay_request.h"

namespace strata::daemon {

std::optional<ReplayRequest> ParseReplayRequest(std::span<const std::string_view> frames,
                                                size_t frame_count) {
  if (frame_count != 3 || frames.size() != 3) return std::nullopt;
  const std::string_view client = frames[0], delimiter = frames[1], seq = frames[2];
  // A REQ socket, or a DEALER speaking vLLM's protocol, sends the empty delimiter; anything else
  // in its place is a different protocol whose replies we could not frame correctly.
  if (client.empty() || client.size() > kMaxReplayFrameBytes || !delimiter.empty() ||
      seq.size() != 8)
    return std::nullopt;
  ReplayRequest r;
  r.client.assign(client);
  for (char c : seq) r.start_seq = (r.start_seq << 8) | static_cast<uint8_t>(c);
  return r;
}

}  // namespace strata::daemon
