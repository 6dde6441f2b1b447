// Builds the data of a publish in one request (am_wire::kPublishInOneAm) for tests that send it
// from a raw UCX peer, with the CRCs the test chooses.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "common/am_wire.h"
#include "common/crc32c.h"
#include "strata/client.h"
#include "strata/v1/cache.pb.h"

namespace strata::testing {

// `crcs` empty: each block's own CRC32C. `sizes` empty: each block's own size (a test may lie).
inline std::string PublishInOneData(const NamespaceId& ns, std::span<const BlockId> ids,
                                    const std::vector<std::string>& blocks,
                                    std::vector<uint32_t> crcs = {},
                                    std::vector<uint64_t> sizes = {}) {
  v1::ReserveRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  std::string packed, bytes;
  for (const BlockId& id : ids) packed += std::string(id.AsBytes());
  req.set_ids(packed);
  for (size_t i = 0; i < blocks.size(); ++i) {
    req.add_sizes(sizes.empty() ? blocks[i].size() : sizes[i]);
    if (crcs.size() < blocks.size()) crcs.push_back(Crc32c(blocks[i].data(), blocks[i].size()));
    bytes += blocks[i];
  }
  return am_wire::EncodePublishInOnePrefix(req.SerializeAsString(), crcs) + bytes;
}

// A request header: request id, the namespace, and the ticket (empty without authentication).
inline std::string PublishInOneHeader(uint64_t request_id, const NamespaceId& ns,
                                      const std::string& ticket = "") {
  std::string h(am_wire::kRequestHeaderBytes, '\0');
  am_wire::PutU64(h.data(), request_id);
  std::memcpy(h.data() + 8, ns.bytes.data(), 32);
  return h + ticket;
}

}  // namespace strata::testing
