// The KV-event replay request (daemon/events/replay_request.h) the publisher's ROUTER socket
// reads from any subscriber that connects: [routing id, delimiter, start seq].
//
// Input: u8 frame count (the message's, as the publisher counts it) | then per kept frame
// (at most kMaxReplayFrames) a u16-sized frame. Whatever parses must name a routing id ZMQ
// could have made and a sequence number read from exactly 8 bytes.
#include <cstdint>
#include <string_view>
#include <vector>

#include "daemon/events/replay_request.h"
#include "tests/fuzz/fuzz_input.h"

using strata::fuzz::Fail;
namespace d = strata::daemon;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  strata::fuzz::Input in(bytes, size);
  const size_t frame_count = in.U8();
  std::vector<std::string_view> frames;
  for (size_t i = 0; i < frame_count && i < d::kMaxReplayFrames; ++i) frames.push_back(in.Sized());
  auto r = d::ParseReplayRequest(frames, frame_count);
  if (!r) return 0;
  if (frames.size() != 3) Fail("replay request: parsed without three frames");
  if (r->client.empty() || r->client.size() > d::kMaxReplayFrameBytes)
    Fail("replay request: routing id outside 1-255 bytes");
  if (r->client != frames[0]) Fail("replay request: routing id changed");
  if (!frames[1].empty() || frames[2].size() != 8) Fail("replay request: wrong framing accepted");
  uint64_t seq = 0;
  for (int i = 0; i < 8; ++i) seq = seq << 8 | static_cast<uint8_t>(frames[2][i]);
  if (seq != r->start_seq) Fail("replay request: start seq not big-endian");
  return 0;
}
