// KV events: the encoder byte for byte against vLLM 0.32's own encoding, then a real stratad
// publishing what a client publishes and evicts to a real ZMQ subscriber, and replaying it.
#include <gtest/gtest.h>

#include <msgpack.hpp>
#include <zmq.hpp>

#include <chrono>
#include <map>
#include <thread>

#include "absl/strings/escaping.h"
#include "daemon/events/kv_event_encoder.h"
#include "daemon/events/replay_request.h"
#include "strata/client.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/test_data.h"

namespace strata {
namespace {

using daemon::KvEvent;

BlockId IdEndingIn(uint64_t v) {
  BlockId id;
  for (int i = 0; i < 8; ++i) id.bytes[31 - i] = static_cast<uint8_t>(v >> (8 * i));
  return id;
}

TEST(KvEventEncoder, MatchesTheBytesVllmWrites) {
  // vLLM 0.32.0's msgspec encoding of KVEventBatch(ts=1.5, events=[BlockStored(block_hashes=
  // [1, 2], parent_block_hash=None, token_ids=[1, 2, 3], block_size=32, lora_id=None,
  // medium='CPU', lora_name=None), BlockRemoved(block_hashes=[1], medium='CPU'),
  // AllBlocksCleared()]).
  const std::string vllm = absl::HexStringToBytes(
      "93cb3ff80000000000009388a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573920102"
      "b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69647393010203aa626c6f636b5f73697a6520"
      "a76c6f72615f6964c0a66d656469756da3435055a96c6f72615f6e616d65c083a474797065ac426c6f636b5265"
      "6d6f766564ac626c6f636b5f6861736865739101a66d656469756da343505581a474797065b0416c6c426c6f63"
      "6b73436c6561726564c0");
  std::vector<KvEvent> events = {
      {KvEvent::kBlockStored, {IdEndingIn(1), IdEndingIn(2)}, std::nullopt, {1, 2, 3}, 32, "CPU"},
      {KvEvent::kBlockRemoved, {IdEndingIn(1)}, std::nullopt, {}, 0, "CPU"},
      {KvEvent::kAllBlocksCleared, {}, std::nullopt, {}, 0, ""}};
  EXPECT_EQ(absl::BytesToHexString(daemon::EncodeKvEventBatch(1.5, events, true)),
            absl::BytesToHexString(vllm));
}

TEST(KvEventEncoder, HashesAreTheIdsLastEightBytesOrTheWholeId) {
  BlockId id = IdEndingIn(0xfedcba9876543210ull);
  id.bytes[0] = 0x77;
  EXPECT_EQ(daemon::IntBlockHash(id), 0xfedcba9876543210ull);
  std::vector<KvEvent> one = {{KvEvent::kBlockRemoved, {id}, std::nullopt, {}, 0, "CPU"}};
  std::string as_int = daemon::EncodeKvEventBatch(0, one, true);
  EXPECT_NE(as_int.find("\xcf\xfe\xdc\xba\x98\x76\x54\x32\x10"), std::string::npos);
  std::string as_bin = daemon::EncodeKvEventBatch(0, one, false);
  EXPECT_NE(as_bin.find(std::string("\xc4\x20", 2) + std::string(id.AsBytes())), std::string::npos);
}

// One decoded batch: topic, sequence number, and its events as (type, hashes, parent) tuples.
struct Batch {
  std::string topic;
  int64_t seq = 0;
  double ts = 0;
  struct Event {
    std::string type;
    std::vector<uint64_t> hashes;
    std::optional<uint64_t> parent;
    uint32_t block_size = 0;
    std::string medium;
  };
  std::vector<Event> events;
};

int64_t SeqOf(const zmq::message_t& m) {
  uint64_t v = 0;
  for (size_t i = 0; i < m.size(); ++i) v = (v << 8) | static_cast<const uint8_t*>(m.data())[i];
  return static_cast<int64_t>(v);
}

Batch Decode(const std::string& topic, int64_t seq, const zmq::message_t& payload) {
  Batch b;
  b.topic = topic;
  b.seq = seq;
  msgpack::object_handle oh =
      msgpack::unpack(static_cast<const char*>(payload.data()), payload.size());
  auto top = oh.get().as<std::vector<msgpack::object>>();
  EXPECT_EQ(top.size(), 3u);
  b.ts = top[0].as<double>();
  for (const msgpack::object& e : top[1].as<std::vector<msgpack::object>>()) {
    auto fields = e.as<std::map<std::string, msgpack::object>>();
    Batch::Event ev;
    ev.type = fields.at("type").as<std::string>();
    if (fields.count("block_hashes")) ev.hashes = fields["block_hashes"].as<std::vector<uint64_t>>();
    if (fields.count("parent_block_hash") && !fields["parent_block_hash"].is_nil())
      ev.parent = fields["parent_block_hash"].as<uint64_t>();
    if (fields.count("block_size")) ev.block_size = fields["block_size"].as<uint32_t>();
    if (fields.count("medium")) ev.medium = fields["medium"].as<std::string>();
    b.events.push_back(std::move(ev));
  }
  EXPECT_TRUE(top[2].is_nil());
  return b;
}

// Receives batches until `want` events arrived or the deadline passes.
std::vector<Batch> ReceiveEvents(zmq::socket_t& sub, size_t want, std::chrono::seconds limit) {
  std::vector<Batch> out;
  size_t events = 0;
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (events < want && std::chrono::steady_clock::now() < deadline) {
    zmq::message_t topic, seq, payload;
    if (!sub.recv(topic, zmq::recv_flags::none)) continue;  // rcvtimeo expired
    EXPECT_TRUE(sub.recv(seq) && sub.recv(payload));
    out.push_back(Decode(topic.to_string(), SeqOf(seq), payload));
    events += out.back().events.size();
  }
  return out;
}

class KvEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<testing::DaemonProcess>(
        "host_tier:\n  capacity: 64MiB\nevents:\n  endpoint: tcp://127.0.0.1:*\n"
        "  replay_endpoint: tcp://127.0.0.1:*\n");
    ASSERT_TRUE(daemon_->ok()) << daemon_->log();
    events_ = daemon_->ReadyField("events_endpoint");
    replay_ = daemon_->ReadyField("events_replay_endpoint");
    ASSERT_EQ(events_.rfind("tcp://127.0.0.1:", 0), 0u) << events_;
    ASSERT_FALSE(replay_.empty());
    ClientOptions o;
    o.endpoint = daemon_->endpoint();
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }

  std::unique_ptr<testing::DaemonProcess> daemon_;
  std::string events_, replay_;
  std::unique_ptr<Client> client_;
  zmq::context_t zmq_;
};

TEST_F(KvEventsTest, SubscriberSeesPublishesAndEvictionsAndReplayRepeatsThem) {
  zmq::socket_t sub(zmq_, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "kv@");
  sub.set(zmq::sockopt::rcvtimeo, 200);
  sub.connect(events_);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the subscription propagates

  NamespaceSpec spec = testing::SmallSpec("events/model");
  auto ns = client_->OpenNamespace(spec, "tenant-a");
  ASSERT_TRUE(ns.ok()) << ns.status();
  std::vector<uint32_t> tokens = testing::Tokens(3 * 16, 5);
  std::vector<std::vector<uint8_t>> blocks(3, std::vector<uint8_t>(spec.layout.BlockBytes(), 9));
  std::vector<ConstBuffer> bufs;
  for (auto& b : blocks) bufs.push_back({b.data(), b.size()});
  auto published = client_->Publish(*ns, tokens, bufs);
  ASSERT_TRUE(published.ok()) << published.status();
  const std::vector<BlockId>& ids = published->ids;
  ASSERT_EQ(ids.size(), 3u);

  // AllBlocksCleared opens the namespace's topic, then one BlockStored for the whole chain.
  std::vector<Batch> got = ReceiveEvents(sub, 2, std::chrono::seconds(10));
  ASSERT_FALSE(got.empty());
  const std::string topic = got[0].topic;
  EXPECT_EQ(topic.rfind("kv@", 0), 0u);
  EXPECT_NE(topic.find("@events/model@" + ns->ToHex().substr(0, 16)), std::string::npos) << topic;
  std::vector<Batch::Event> all;
  for (const Batch& b : got) all.insert(all.end(), b.events.begin(), b.events.end());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].type, "AllBlocksCleared");
  EXPECT_EQ(all[1].type, "BlockStored");
  EXPECT_EQ(all[1].hashes, (std::vector<uint64_t>{daemon::IntBlockHash(ids[0]),
                                                  daemon::IntBlockHash(ids[1]),
                                                  daemon::IntBlockHash(ids[2])}));
  EXPECT_FALSE(all[1].parent.has_value());
  EXPECT_EQ(all[1].block_size, 16u);
  EXPECT_EQ(all[1].medium, "CPU");

  // Evicting the chain's second block with cascade removes it and the third.
  auto evicted = client_->Evict(*ns, std::span(ids).subspan(1, 1), /*cascade=*/true);
  ASSERT_TRUE(evicted.ok()) << evicted.status();
  std::vector<Batch> removed = ReceiveEvents(sub, 1, std::chrono::seconds(10));
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0].topic, topic);
  EXPECT_EQ(removed[0].seq, got.back().seq + 1);
  ASSERT_EQ(removed[0].events.size(), 1u);
  EXPECT_EQ(removed[0].events[0].type, "BlockRemoved");
  std::vector<uint64_t> gone = removed[0].events[0].hashes;
  std::sort(gone.begin(), gone.end());
  std::vector<uint64_t> want = {daemon::IntBlockHash(ids[1]), daemon::IntBlockHash(ids[2])};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(gone, want);

  // A subscriber that reconnects asks for everything since sequence 0 (DEALER: [empty, seq]).
  zmq::socket_t dealer(zmq_, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::rcvtimeo, 5000);
  dealer.connect(replay_);
  std::string start(8, '\0');
  dealer.send(zmq::message_t(), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(start), zmq::send_flags::none);
  std::vector<Batch> replayed;
  while (true) {
    zmq::message_t empty, t, seq, payload;
    ASSERT_TRUE(dealer.recv(empty)) << "replay timed out";
    ASSERT_TRUE(dealer.recv(t) && dealer.recv(seq) && dealer.recv(payload));
    if (SeqOf(seq) == -1) {
      EXPECT_EQ(t.size(), 0u);
      break;
    }
    replayed.push_back(Decode(t.to_string(), SeqOf(seq), payload));
  }
  ASSERT_EQ(replayed.size(), got.size() + removed.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(replayed[i].seq, got[i].seq);
    EXPECT_EQ(replayed[i].events.size(), got[i].events.size());
  }
  EXPECT_EQ(replayed.back().events[0].type, "BlockRemoved");

  // Malformed replay requests are ignored (one with many frames, one whose delimiter is not
  // empty, one of one frame); the publisher keeps serving.
  for (int i = 0; i < 100; ++i) dealer.send(zmq::message_t(), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(start), zmq::send_flags::none);
  dealer.send(zmq::buffer(std::string("x")), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(start), zmq::send_flags::none);
  dealer.send(zmq::buffer(std::string("junk")), zmq::send_flags::none);
  auto more = client_->Publish(*ns, testing::Tokens(16, 99), {bufs.data(), 1});
  ASSERT_TRUE(more.ok());
  EXPECT_EQ(ReceiveEvents(sub, 1, std::chrono::seconds(10)).size(), 1u);
}

// A GPU tier's copies are a medium of their own: a promotion is a BlockStored on "GPU", and an
// eviction removes the block from both media.
TEST(KvEventsGpuTest, DeviceCopiesAreEventsOfTheGpuMedium) {
  testing::DaemonProcess d(
      "host_tier:\n  capacity: 64MiB\ngpu:\n  capacity: 4MiB\n  memory: host-stand-in\n"
      "events:\n  endpoint: tcp://127.0.0.1:*\n");
  ASSERT_TRUE(d.ok()) << d.log();
  zmq::context_t zmq;
  zmq::socket_t sub(zmq, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "kv@");
  sub.set(zmq::sockopt::rcvtimeo, 200);
  sub.connect(d.ReadyField("events_endpoint"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ClientOptions o;
  o.endpoint = d.endpoint();
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  NamespaceSpec spec = testing::SmallSpec("events/gpu");
  auto ns = (*c)->OpenNamespace(spec, "tenant-a");
  ASSERT_TRUE(ns.ok()) << ns.status();
  std::vector<std::vector<uint8_t>> blocks(2, std::vector<uint8_t>(spec.layout.BlockBytes(), 3));
  std::vector<ConstBuffer> bufs;
  for (auto& b : blocks) bufs.push_back({b.data(), b.size()});
  auto published = (*c)->Publish(*ns, testing::Tokens(2 * 16, 8), bufs);
  ASSERT_TRUE(published.ok()) << published.status();
  ASSERT_TRUE((*c)->Reposition(*ns, published->ids, "", false, "gpu").ok());
  ASSERT_TRUE((*c)->Evict(*ns, {published->ids.data(), 1}).ok());
  std::vector<Batch::Event> all;
  for (const Batch& b : ReceiveEvents(sub, 5, std::chrono::seconds(10)))
    all.insert(all.end(), b.events.begin(), b.events.end());
  std::map<std::string, int> seen;  // type@medium -> blocks
  for (const auto& e : all)
    if (e.type != "AllBlocksCleared") seen[e.type + "@" + e.medium] += e.hashes.size();
  EXPECT_EQ(seen["BlockStored@CPU"], 2) << all.size();
  EXPECT_EQ(seen["BlockStored@GPU"], 2);
  EXPECT_EQ(seen["BlockRemoved@CPU"], 1);
  EXPECT_EQ(seen["BlockRemoved@GPU"], 1);
}

// The replay ROUTER's request parser (fuzzed by tests/fuzz/replay_request_fuzzer.cc).
TEST(KvEventsReplayRequest, OnlyTheThreeFrameFormIsARequest) {
  using daemon::ParseReplayRequest;
  const std::string id("\0\x6b\x8b\x45\x67", 5), seq("\0\0\0\0\0\0\x01\x02", 8);
  std::vector<std::string_view> ok = {id, "", seq};
  auto r = ParseReplayRequest(ok, 3);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->client, id);
  EXPECT_EQ(r->start_seq, 0x0102u);
  EXPECT_FALSE(ParseReplayRequest(ok, 4));  // a fourth frame the publisher did not keep
  std::vector<std::string_view> delimiter = {id, "x", seq};
  EXPECT_FALSE(ParseReplayRequest(delimiter, 3));
  std::vector<std::string_view> short_seq = {id, "", seq.substr(0, 7)};
  EXPECT_FALSE(ParseReplayRequest(short_seq, 3));
  std::vector<std::string_view> no_id = {"", "", seq};
  EXPECT_FALSE(ParseReplayRequest(no_id, 3));
  const std::string long_id(256, 'a');
  std::vector<std::string_view> too_long = {long_id, "", seq};
  EXPECT_FALSE(ParseReplayRequest(too_long, 3));
  EXPECT_FALSE(ParseReplayRequest(std::span<const std::string_view>(ok).first(2), 2));
}

TEST(KvEventsConfig, ABadEndpointIsRefusedWithTheField) {
  testing::DaemonProcess d("host_tier:\n  capacity: 64MiB\nevents:\n  endpoint: udp://x\n");
  EXPECT_FALSE(d.ok());
  d.WaitExit(std::chrono::seconds(10));
  EXPECT_NE(d.log().find("events.endpoint"), std::string::npos) << d.log();
}

}  // namespace
}  // namespace strata
