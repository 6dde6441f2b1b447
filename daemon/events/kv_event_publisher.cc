#include "daemon/events/kv_event_publisher.h"

#include <spdlog/spdlog.h>

#include <zmq.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/events/kv_event_encoder.h"
#include "daemon/events/replay_request.h"

namespace strata::daemon {
namespace {

// Events waiting for the publisher thread; beyond this a burst is dropped (and counted) rather
// than letting a stalled thread grow the daemon without bound.
constexpr size_t kMaxPendingEvents = 1 << 20;
constexpr int kReplaysPerRound = 8;  // replay requests served between two publishing rounds

std::string SeqBytes(int64_t seq) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<uint64_t>(seq) >> (56 - 8 * i));
  return out;
}

}  // namespace

struct KvEventPublisher::Sockets {
  zmq::context_t context{1};
  zmq::socket_t pub{context, zmq::socket_type::pub};
  zmq::socket_t replay{context, zmq::socket_type::router};
  bool has_replay = false;
};

KvEventPublisher::KvEventPublisher(Options options, const NamespaceRegistry& namespaces)
    : options_(std::move(options)), namespaces_(namespaces), sockets_(new Sockets) {}

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Start(
    Options options, const NamespaceRegistry& namespaces) {
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher(std::move(options), namespaces));
  const EventsConfig& c = p->options_.config;
  Sockets& s = *p->sockets_;
  try {
    s.pub.set(zmq::sockopt::sndhwm, 100000);
    s.pub.set(zmq::sockopt::linger, 0);
    s.pub.bind(c.endpoint);
    p->endpoint_ = s.pub.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat("config field 'events.endpoint': cannot bind ", c.endpoint, ": ", e.what()));
  }
  if (!c.replay_endpoint.empty()) {
    try {
      s.replay.set(zmq::sockopt::linger, 0);
      // Requests are a few bytes a frame: a peer that sends a larger frame is disconnected by
      // ZMQ before the daemon buffers it.
      s.replay.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kMaxReplayFrameBytes));
      s.replay.bind(c.replay_endpoint);
      p->replay_endpoint_ = s.replay.get(zmq::sockopt::last_endpoint);
      s.has_replay = true;
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError(absl::StrCat("config field 'events.replay_endpoint': cannot bind ",
                                                 c.replay_endpoint, ": ", e.what()));
    }
  }
  p->thread_ = std::thread([raw = p.get()] { raw->Run(); });
  spdlog::info("KV events on {}{}", p->endpoint_,
               p->replay_endpoint_.empty() ? "" : absl::StrCat(", replay on ", p->replay_endpoint_));
  return p;
}

KvEventPublisher::~KvEventPublisher() { Stop(); }

void KvEventPublisher::Stop() {
  if (stop_.exchange(true)) return;
  if (thread_.joinable()) thread_.join();
}

void KvEventPublisher::OnBlockEvent(const BlockEvent& event) {
  absl::MutexLock lock(&mu_);
  if (pending_.size() >= kMaxPendingEvents) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  pending_.push_back(event);
}

void KvEventPublisher::Run() {
  while (!stop_.load(std::memory_order_acquire)) {
    ServeReplays();  // waits up to 20 ms for a request: the events' batching interval
    PublishPending();
  }
  PublishPending();
}

void KvEventPublisher::Send(const std::string& topic, const std::string& payload) {
  const uint64_t seq = next_seq_++;
  Sockets& s = *sockets_;
  try {
    s.pub.send(zmq::buffer(topic), zmq::send_flags::sndmore);
    s.pub.send(zmq::buffer(SeqBytes(static_cast<int64_t>(seq))), zmq::send_flags::sndmore);
    s.pub.send(zmq::buffer(payload), zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    spdlog::warn("KV events: send failed: {}", e.what());
  }
  batches_.fetch_add(1, std::memory_order_relaxed);
  kept_.push_back({seq, topic, payload});
  while (kept_.size() > options_.config.buffer_steps) kept_.pop_front();
}

void KvEventPublisher::PublishPending() {
  std::vector<BlockEvent> events;
  {
    absl::MutexLock lock(&mu_);
    events.swap(pending_);
  }
  if (events.empty()) return;
  const double ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  // One batch per namespace, in order; consecutive stores of a chain share one BlockStored.
  std::vector<NamespaceId> order;
  absl::flat_hash_map<NamespaceId, std::vector<KvEvent>> batches;
  for (const BlockEvent& e : events) {
    auto [it, fresh] = batches.try_emplace(e.ns);
    if (fresh) order.push_back(e.ns);
    std::vector<KvEvent>& out = it->second;
    const auto kind = e.kind == BlockEvent::kStored ? KvEvent::kBlockStored : KvEvent::kBlockRemoved;
    // Each tier's copies are their own medium: a device copy leaving while host memory keeps
    // the block is a GPU removal only.
    const std::string_view medium = e.tier == Tier::kGpu ? "GPU" : "CPU";
    if (!out.empty() && out.back().kind == kind && out.back().medium == medium &&
        (kind == KvEvent::kBlockRemoved || out.back().block_hashes.back() == e.parent)) {
      out.back().block_hashes.push_back(e.id);
      continue;
    }
    KvEvent k{kind, {e.id}, std::nullopt, {}, 0, std::string(medium)};
    if (kind == KvEvent::kBlockStored && !e.parent.IsZero()) k.parent = e.parent;
    out.push_back(std::move(k));
  }
  for (const NamespaceId& ns : order) {
    std::vector<KvEvent>& out = batches[ns];
    auto topic_it = topics_.find(ns);
    if (topic_it == topics_.end()) {
      auto entry = namespaces_.Find(ns);
      std::string model = entry ? entry->spec.model_id : std::string("unknown");
      topic_it = topics_
                     .emplace(ns, absl::StrCat("kv@", options_.node_id, "@", model, "@",
                                               ns.ToHex().substr(0, 16)))
                     .first;
      out.insert(out.begin(), KvEvent{KvEvent::kAllBlocksCleared, {}, std::nullopt, {}, 0, ""});
    }
    const uint32_t block_size = namespaces_.TokensPerBlock(ns);
    for (KvEvent& k : out) k.block_size = block_size;
    Send(topic_it->second, EncodeKvEventBatch(ts, out, options_.config.int_hashes));
  }
}

void KvEventPublisher::ServeReplays() {
  Sockets& s = *sockets_;
  if (!s.has_replay) {
    absl::SleepFor(absl::Milliseconds(20));
    return;
  }
  zmq::pollitem_t item{s.replay.handle(), 0, ZMQ_POLLIN, 0};
  try {
    if (zmq::poll(&item, 1, std::chrono::milliseconds(20)) <= 0) return;
    // A few requests per round: callers that ask without end (the socket is unauthenticated)
    // must not keep new events from being published, nor a stop from being seen.
    for (int served = 0; served < kReplaysPerRound && !stop_.load(std::memory_order_acquire);
         ++served) {
      // One message: its first frames kept, the rest only counted (ZMQ hands over a multipart
      // message whole, so the rest must still be read off the socket).
      std::vector<zmq::message_t> frames;
      size_t frame_count = 0;
      while (true) {
        zmq::message_t m;
        if (!s.replay.recv(m, zmq::recv_flags::dontwait)) break;
        ++frame_count;
        bool more = m.more();
        if (frames.size() < kMaxReplayFrames) frames.push_back(std::move(m));
        if (!more) break;
      }
      if (frame_count == 0) return;
      std::vector<std::string_view> views;
      for (const zmq::message_t& f : frames)
        views.emplace_back(static_cast<const char*>(f.data()), f.size());
      const std::optional<ReplayRequest> request = ParseReplayRequest(views, frame_count);
      if (!request) {
        spdlog::warn("KV events: ignored a malformed replay request ({} frames)", frame_count);
        continue;
      }
      const uint64_t start = request->start_seq;
      const std::string& client = request->client;
      for (const Kept& k : kept_) {
        if (k.seq < start) continue;
        s.replay.send(zmq::buffer(client), zmq::send_flags::sndmore);
        s.replay.send(zmq::message_t(), zmq::send_flags::sndmore);
        s.replay.send(zmq::buffer(k.topic), zmq::send_flags::sndmore);
        s.replay.send(zmq::buffer(SeqBytes(static_cast<int64_t>(k.seq))), zmq::send_flags::sndmore);
        s.replay.send(zmq::buffer(k.payload), zmq::send_flags::none);
      }
      s.replay.send(zmq::buffer(client), zmq::send_flags::sndmore);
      s.replay.send(zmq::message_t(), zmq::send_flags::sndmore);
      s.replay.send(zmq::message_t(), zmq::send_flags::sndmore);
      s.replay.send(zmq::buffer(SeqBytes(-1)), zmq::send_flags::sndmore);
      s.replay.send(zmq::message_t(), zmq::send_flags::none);
    }
  } catch (const zmq::error_t& e) {
    spdlog::warn("KV events: replay failed: {}", e.what());
  }
}

}  // namespace strata::daemon
