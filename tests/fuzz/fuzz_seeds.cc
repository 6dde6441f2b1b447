// Writes a few valid inputs per fuzzer into DIR/<name>/ (the committed seed corpus of
// tests/fuzz/corpus was made by this program; run it again when a wire format changes).
// Each input follows the layout its fuzzer's header comment documents.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/am_wire.h"
#include "common/packed_ids.h"
#include "config/daemon_config.h"
#include "storage/catalog_record.h"
#ifdef STRATA_FUZZ_SEEDS_DAEMON
#include "daemon/cluster/locate_wire.h"
#include "strata/v1/admin.pb.h"
#include "strata/v1/cache.pb.h"
#include "strata/v1/peer.pb.h"
#endif

namespace {

namespace w = strata::am_wire;
std::string g_dir;

void Write(const std::string& fuzzer, const std::string& name, const std::string& bytes) {
  const std::string dir = g_dir + "/" + fuzzer;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
}

std::string U8(uint8_t v) { return std::string(1, static_cast<char>(v)); }
std::string U16(uint16_t v) { return {static_cast<char>(v & 0xff), static_cast<char>(v >> 8)}; }
std::string U32(uint32_t v) {
  std::string s(4, '\0');
  w::PutU32(s.data(), v);
  return s;
}
std::string U64(uint64_t v) {
  std::string s(8, '\0');
  w::PutU64(s.data(), v);
  return s;
}
std::string Sized(const std::string& s) { return U16(static_cast<uint16_t>(s.size())) + s; }

std::vector<strata::BlockId> Ids(int n) {
  std::vector<strata::BlockId> ids(n);
  for (int i = 0; i < n; ++i) ids[i].bytes.fill(static_cast<uint8_t>(0x10 + i));
  return ids;
}

void AmRequests() {
  std::string lookup = U64(42) + std::string(32, '\x5a');
  Write("am_request", "lookup", U8(0) + U64(0) + Sized(lookup) + strata::PackIds(Ids(3)));
  std::string fetch = U64(7) + U64(99) + U32(2) + U32(0);
  std::string extents = U64(0) + U64(4096) + U64(8192) + U64(512);
  Write("am_request", "fetch", U8(1) + U64(1 << 20) + Sized(fetch) + extents);
  Write("am_request", "fetch_outside", U8(1) + U64(4096) + Sized(fetch) + extents);
  Write("am_request", "locate", U8(2) + U64(0) + Sized(U64(5)) + strata::PackIds(Ids(2)));
  const std::string ticket(w::kTicketBytes, 't');
  Write("am_request", "lookup_ticketed",
        U8(0) + U64(0) + Sized(lookup + ticket) + strata::PackIds(Ids(3)));
  Write("am_request", "acquire_push_pieces",
        U8(9) + U64(1 << 20) + Sized(lookup) + w::EncodePiecesRequestPrefix(65280) +
            strata::PackIds(Ids(2)));
  Write("am_request", "publish_piece",
        U8(10) + U64(1 << 20) +
            Sized(w::EncodePublishPieceHeader({{7, 11, 4096, 200000, 0}, 65536})) +
            std::string(65536, 'p'));
  Write("am_request", "release", U8(4) + U64(0) + Sized(U64(9)));
  Write("am_request", "release_ticketed", U8(4) + U64(0) + Sized(U64(9) + ticket));
  // A publish in one of two blocks (3 and 5 bytes); the reserve request's bytes are opaque here.
  const uint32_t crcs[] = {0x11111111u, 0x22222222u};
  Write("am_request", "publish_in_one",
        U8(7) + U64(0) + Sized(lookup) +
            w::EncodePublishInOnePrefix(std::string("\x0a\x20") + std::string(32, 'n'), crcs) +
            "abcdefgh");
  // Two staged blocks of request 7, reservation 11: one the client took the CRC of, one from a
  // publish buffer.
  const std::string staged =
      w::EncodePublishStagedHeader({{7, 11, 4096, 65536, 0}, 99, 0, 0x12345678u, 0}) +
      w::EncodePublishStagedHeader({{7, 11, 69632, 65536, 1}, 99, 65536, 0, w::kStagedCrcByDaemon});
  Write("am_request", "staged_many",
        U8(8) + U64(1 << 20) + Sized(w::EncodePublishStagedManyHeader(7, 11, 2)) + staged);
}

void AmReplies() {
  w::ReplyHeader h{42, 0, 2, true};
  Write("am_reply", "lookup", U8(0) + U16(4) + Sized(w::EncodeReplyHeader(h)) + "\x02\x03");
  h.code = 5;
  h.prefix = 0;
  Write("am_reply", "lookup_error", U8(0) + U16(4) + Sized(w::EncodeReplyHeader(h)) + "nope");
  // Two blocks of 16 and 32 bytes: block 0 eager, block 1 by rendezvous.
  std::string push = U8(1) + U64(9) + U8(2) + U16(16) + U16(32);
  push += U8(0) + Sized(w::EncodeFetchBlockHeader({9, 0, 0})) + Sized(std::string(16, 'a'));
  push += U8(1) + Sized(w::EncodeFetchBlockHeader({9, 1, 0})) + Sized("") + U16(32);
  Write("am_reply", "pushed", push);
  std::string refused = U8(1) + U64(9) + U8(1) + U16(16) + U8(0) +
                        Sized(w::EncodeFetchBlockHeader({9, w::kFetchRefused, 9})) +
                        Sized("lease expired");
  Write("am_reply", "pushed_refused", refused);
  Write("am_reply", "locate_header", U8(2) + U64(3) + U32(0) + U32(2) + U32(0));
  Write("am_reply", "fetch_in_one",
        U8(5) + w::EncodeFetchInOnePrefix("\x10\x00\x1a\x02\x80\x20") + std::string(8, 'k'));
  const w::StagedAck acks[] = {{0, 0x12345678u}, {1, 0x9abcdef0u}};
  Write("am_reply", "publish_acks",
        U8(6) + Sized(w::EncodePublishAcksHeader(7, 2)) + w::EncodeStagedAcks(acks));
  // Block 0 of 10,000 bytes in three pieces of at most 4 KiB, in order; block 1 (100) whole.
  std::string pieces = U8(8) + U64(9) + U16(4096) + U8(2) + U16(10000) + U16(100);
  for (uint64_t at : {0, 3392, 6784})
    pieces += Sized(w::EncodeFetchPieceHeader({{9, 0, 0}, at})) +
              Sized(std::string(at == 6784 ? 3216 : 3392, 'p'));
  Write("am_reply", "pieces", pieces);
  Write("am_reply", "answered_piece",
        U8(9) + w::EncodeAnsweredPieceHeader({{11, 0, 0}, 0}, {11, 0, 1, true}, "\x08\x63"));
  w::ReplyHeader answered{11, 0, 1, true};
  Write("am_reply", "answered_block",
        U8(7) + w::EncodeAnsweredBlockHeader({11, 0, 0}, answered, "\x08\x63\x10\x01"));
}

void CatalogRecords() {
  strata::CatalogEntry e;
  e.ns.bytes.fill(0x33);
  e.parent.bytes.fill(0x44);
  e.tier = 2;
  e.codec_id = 3;
  e.file_index = 1;
  e.offset = 1 << 20;
  e.size = 65536;
  e.crc32c = 0xdeadbeef;
  e.last_access_us = 1700000000000000;
  e.pin_until_us = 0;
  uint8_t value[strata::kCatalogValueBytes];
  strata::EncodeCatalogEntry(e, value);
  const std::string v(reinterpret_cast<const char*>(value), sizeof(value));
  Write("catalog_record", "nvme", U8(0) + v);
  Write("catalog_record", "nvme_fix_crc", U8(1) + v);
}

void Configs() {
  Write("config", "default", std::string(strata::DefaultConfigYaml()));
  Write("config", "small",
        "listen: 127.0.0.1:7070\n"
        "host_tier:\n  capacity: 64MiB\n  low_watermark: 0.8\n  high_watermark: 0.9\n"
        "nvme_tier:\n  enabled: false\n"
        "events:\n  endpoint: tcp://127.0.0.1:5557\n");
}

#ifdef STRATA_FUZZ_SEEDS_DAEMON
void LocateReplies() {
  strata::daemon::Holders holders(3);
  holders[0] = {{"node-a", strata::placement::LocationTier::kHost},
                {"node-b", strata::placement::LocationTier::kNvme}};
  holders[2] = {{"node-b", strata::placement::LocationTier::kHost}};
  uint32_t nodes = 0;
  std::string data = strata::daemon::EncodeLocateReply(holders, &nodes);
  Write("locate_reply", "three_ids", U32(nodes) + U16(3) + data);
}

void ReplayRequests() {
  const std::string seq("\0\0\0\0\0\0\0\x05", 8);
  const std::string id("\0\x6b\x8b\x45\x67", 5);  // a ROUTER's generated routing id
  Write("replay_request", "start5", U8(3) + Sized(id) + Sized("") + Sized(seq));
  Write("replay_request", "from0", U8(3) + Sized(id) + Sized("") + Sized(std::string(8, '\0')));
  Write("replay_request", "junk", U8(2) + Sized(id) + Sized("junk"));
  Write("replay_request", "extra_frames",
        U8(9) + Sized(id) + Sized("") + Sized(seq) + Sized("x"));
}

void GrpcRequests() {
  namespace v1 = strata::v1;
  const std::string ns(32, '\x5a');
  const std::string ids = strata::PackIds(Ids(2));
  auto put = [](const std::string& name, uint8_t kind, const google::protobuf::Message& m) {
    Write("grpc_request", name, U8(kind) + U8(1) + m.SerializeAsString());
  };
  v1::LookupRequest lookup;
  lookup.set_namespace_id(ns);
  lookup.set_ids(ids);
  put("lookup", 0, lookup);
  v1::ReserveRequest reserve;
  reserve.set_namespace_id(ns);
  reserve.set_ids(ids);
  reserve.set_parent_ids(strata::PackIds(Ids(2)));
  reserve.add_sizes(4096);
  reserve.add_sizes(4096);
  put("reserve", 6, reserve);
  v1::PinRequest pin;
  pin.set_namespace_id(ns);
  pin.set_ids(ids);
  pin.set_ttl_ms(1000);
  put("pin", 7, pin);
  v1::NamespaceSpecProto spec;
  spec.set_model_id("llama");
  spec.set_tp_size(1);
  spec.set_codec_policy("raw");
  auto* layout = spec.mutable_layout();
  layout->set_num_layers(2);
  layout->set_num_kv_heads(2);
  layout->set_head_dim(64);
  layout->set_tokens_per_block(16);
  v1::OpenNamespaceRequest open;
  *open.mutable_spec() = spec;
  open.set_tenant("t1");
  put("open_namespace", 8, open);
  v1::ListBlocksRequest list;
  list.set_namespace_id(ns);
  list.set_page_size(50);
  put("list_blocks", 9, list);
  v1::InspectBlocksRequest inspect;
  inspect.set_ids(ids);
  put("inspect_blocks", 10, inspect);
  v1::AnnounceRequest announce;
  announce.set_node_id("node-a");
  announce.set_ids(ids);
  announce.add_tiers(v1::TIER_HOST);
  put("announce", 11, announce);
  v1::PeerLocateRequest locate;
  locate.set_ids(ids);
  put("peer_locate", 12, locate);
  v1::PullRequest pull;
  *pull.mutable_spec() = spec;
  pull.set_tenant("t1");
  pull.set_ids(ids);
  pull.set_source_address("10.0.0.2:7070");
  put("pull", 13, pull);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 1;
  }
  g_dir = argv[1];
  AmRequests();
  AmReplies();
  CatalogRecords();
  Configs();
#ifdef STRATA_FUZZ_SEEDS_DAEMON
  LocateReplies();
  GrpcRequests();
  ReplayRequests();
#endif
  return 0;
}
