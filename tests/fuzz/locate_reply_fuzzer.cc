// The peer locate reply (daemon/cluster/locate_wire.h) a daemon's Locator reads from a
// directory owner: a node table, then the holders of each asked id.
//
// Input: u32 node-table size (from the reply header) | u16 ids asked | the rest as data.
// Whatever decodes must encode and decode again to the same holders.
#include <cstdint>
#include <string>

#include "daemon/cluster/locate_wire.h"
#include "tests/fuzz/fuzz_input.h"

using strata::fuzz::Fail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  strata::fuzz::Input in(bytes, size);
  const uint32_t nodes = in.U32();
  const size_t ids = in.U16();
  const std::string_view data = in.Rest();
  auto holders = strata::daemon::DecodeLocateReply(data, nodes, ids);
  if (!holders) return 0;
  if (holders->size() != ids) Fail("locate reply: one holder list per asked id");
  uint32_t again_nodes = 0;
  const std::string again = strata::daemon::EncodeLocateReply(*holders, &again_nodes);
  auto decoded = strata::daemon::DecodeLocateReply(again, again_nodes, ids);
  if (!decoded) Fail("locate reply: an encoded reply does not decode");
  if (decoded->size() != holders->size()) Fail("locate reply: round trip changed the id count");
  for (size_t k = 0; k < ids; ++k) {
    const auto& a = (*holders)[k];
    const auto& b = (*decoded)[k];
    if (a.size() != b.size()) Fail("locate reply: round trip changed a holder count");
    for (size_t h = 0; h < a.size(); ++h)
      if (a[h].node != b[h].node || a[h].tier != b[h].tier)
        Fail("locate reply: round trip changed a holder");
  }
  return 0;
}
