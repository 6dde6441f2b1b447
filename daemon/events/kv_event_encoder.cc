#include "daemon/events/kv_event_encoder.h"

#include <bit>
#include <cstring>

namespace strata::daemon {
namespace {

// The msgpack subset the events use, each value in its shortest form (as msgspec writes it).
class Writer {
 public:
  void Nil() { Byte(0xc0); }
  void Float64(double v) {
    Byte(0xcb);
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    Be(bits, 8);
  }
  void Uint(uint64_t v) {
    if (v < 128) {
      Byte(static_cast<uint8_t>(v));
    } else if (v <= 0xff) {
      Byte(0xcc);
      Be(v, 1);
    } else if (v <= 0xffff) {
      Byte(0xcd);
      Be(v, 2);
    } else if (v <= 0xffffffff) {
      Byte(0xce);
      Be(v, 4);
    } else {
      Byte(0xcf);
      Be(v, 8);
    }
  }
  void Str(std::string_view s) {
    if (s.size() < 32) {
      Byte(static_cast<uint8_t>(0xa0 | s.size()));
    } else if (s.size() <= 0xff) {
      Byte(0xd9);
      Be(s.size(), 1);
    } else if (s.size() <= 0xffff) {
      Byte(0xda);
      Be(s.size(), 2);
    } else {
      Byte(0xdb);
      Be(s.size(), 4);
    }
    out_.append(s);
  }
  void Bin(std::string_view b) {
    Byte(0xc4);  // every id is 32 bytes: bin 8 suffices
    Be(b.size(), 1);
    out_.append(b);
  }
  void Array(size_t n) { Container(n, 0x90, 0xdc, 0xdd); }
  void Map(size_t n) { Container(n, 0x80, 0xde, 0xdf); }
  std::string Take() { return std::move(out_); }

 private:
  void Container(size_t n, uint8_t fix, uint8_t c16, uint8_t c32) {
    if (n < 16) {
      Byte(static_cast<uint8_t>(fix | n));
    } else if (n <= 0xffff) {
      Byte(c16);
      Be(n, 2);
    } else {
      Byte(c32);
      Be(n, 4);
    }
  }
  void Byte(uint8_t b) { out_.push_back(static_cast<char>(b)); }
  void Be(uint64_t v, int n) {
    for (int i = n - 1; i >= 0; --i) Byte(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::string out_;
};

void Hash(Writer& w, const BlockId& id, bool int_hashes) {
  if (int_hashes)
    w.Uint(IntBlockHash(id));
  else
    w.Bin(id.AsBytes());
}

void Hashes(Writer& w, const std::vector<BlockId>& ids, bool int_hashes) {
  w.Array(ids.size());
  for (const BlockId& id : ids) Hash(w, id, int_hashes);
}

void Medium(Writer& w, const std::string& medium) {
  if (medium.empty())
    w.Nil();
  else
    w.Str(medium);
}

}  // namespace

uint64_t IntBlockHash(const BlockId& id) {
  uint64_t v = 0;
  for (size_t i = id.bytes.size() - 8; i < id.bytes.size(); ++i) v = (v << 8) | id.bytes[i];
  return v;
}

std::string EncodeKvEventBatch(double ts, std::span<const KvEvent> events, bool int_hashes) {
  Writer w;
  w.Array(3);
  w.Float64(ts);
  w.Array(events.size());
  for (const KvEvent& e : events) {
    switch (e.kind) {
      case KvEvent::kBlockStored:
        w.Map(8);
        w.Str("type");
        w.Str("BlockStored");
        w.Str("block_hashes");
        Hashes(w, e.block_hashes, int_hashes);
        w.Str("parent_block_hash");
        if (e.parent)
          Hash(w, *e.parent, int_hashes);
        else
          w.Nil();
        w.Str("token_ids");
        w.Array(e.token_ids.size());
        for (uint32_t t : e.token_ids) w.Uint(t);
        w.Str("block_size");
        w.Uint(e.block_size);
        w.Str("lora_id");
        w.Nil();
        w.Str("medium");
        Medium(w, e.medium);
        w.Str("lora_name");
        w.Nil();
        break;
      case KvEvent::kBlockRemoved:
        w.Map(3);
        w.Str("type");
        w.Str("BlockRemoved");
        w.Str("block_hashes");
        Hashes(w, e.block_hashes, int_hashes);
        w.Str("medium");
        Medium(w, e.medium);
        break;
      case KvEvent::kAllBlocksCleared:
        w.Map(1);
        w.Str("type");
        w.Str("AllBlocksCleared");
        break;
    }
  }
  w.Nil();  // data_parallel_rank: a daemon serves every rank
  return w.Take();
}

}  // namespace strata::daemon
