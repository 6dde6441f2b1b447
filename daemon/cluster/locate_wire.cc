#include "daemon/cluster/locate_wire.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "placement/directory.h"

namespace strata::daemon {
namespace {

void PutU16(std::string& out, size_t v) {
  out.push_back(static_cast<char>(v & 0xff));
  out.push_back(static_cast<char>((v >> 8) & 0xff));
}

size_t GetU16(std::string_view in, size_t pos) {
  return static_cast<uint8_t>(in[pos]) | (static_cast<uint8_t>(in[pos + 1]) << 8);
}

}  // namespace

std::string EncodeLocateReply(const Holders& holders, uint32_t* nodes) {
  absl::flat_hash_map<std::string, uint16_t> index;
  std::string table, per_id;
  for (const auto& hs : holders) {
    const size_t count = std::min<size_t>(hs.size(), 255);
    per_id.push_back(static_cast<char>(count));
    for (size_t k = 0; k < count; ++k) {
      auto [it, fresh] = index.try_emplace(hs[k].node, static_cast<uint16_t>(index.size()));
      if (fresh) {
        const size_t len = std::min<size_t>(hs[k].node.size(), 65535);
        PutU16(table, len);
        table.append(hs[k].node, 0, len);
      }
      PutU16(per_id, it->second);
      per_id.push_back(static_cast<char>(hs[k].tier));
    }
  }
  *nodes = static_cast<uint32_t>(index.size());
  return table + per_id;
}

bool VisitLocateReply(std::string_view data, uint32_t nodes, size_t ids,
                      const HolderVisitor& visit) {
  // The node table, as views into `data`; at most a few entries per cluster view. `nodes` comes
  // from the peer: each entry takes at least its 2-byte length, so a count the data cannot hold
  // is refused before it sizes an allocation (4G entries would throw out of the AM handler).
  if (nodes > data.size() / 2) return false;
  std::vector<std::string_view> names;
  names.reserve(nodes);
  size_t pos = 0;
  for (uint32_t n = 0; n < nodes; ++n) {
    if (pos + 2 > data.size()) return false;
    const size_t len = GetU16(data, pos);
    pos += 2;
    if (pos + len > data.size()) return false;
    names.push_back(data.substr(pos, len));
    pos += len;
  }
  // Check the whole reply before visiting, so a malformed one contributes nothing.
  const size_t holders_at = pos;
  for (size_t k = 0; k < ids; ++k) {
    if (pos >= data.size()) return false;
    pos += 1 + 3 * static_cast<size_t>(static_cast<uint8_t>(data[pos]));
    if (pos > data.size()) return false;
  }
  pos = holders_at;
  for (size_t k = 0; k < ids; ++k) {
    const size_t count = static_cast<uint8_t>(data[pos++]);
    for (size_t h = 0; h < count; ++h, pos += 3) {
      const size_t node = GetU16(data, pos);
      if (node < names.size()) visit(k, names[node], static_cast<uint8_t>(data[pos + 2]));
    }
  }
  return true;
}

std::optional<Holders> DecodeLocateReply(std::string_view data, uint32_t nodes, size_t ids) {
  Holders out(ids);
  const bool ok =
      VisitLocateReply(data, nodes, ids, [&](size_t k, std::string_view node, int tier) {
        out[k].push_back({std::string(node), LocationTierOf(tier)});
      });
  if (!ok) return std::nullopt;
  return out;
}

}  // namespace strata::daemon
