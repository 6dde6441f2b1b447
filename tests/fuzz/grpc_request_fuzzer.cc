// gRPC request validation of the Cache, Admin and Peer services: random bytes parsed as one of
// their request messages (as gRPC would), then the handler's own checks (daemon/request_checks.h,
// and for OpenNamespace the spec check the namespace registry runs before it opens anything).
//
// Input: u8 message kind | u8 namespace filter (bit 0: "open here" answers OK) | the rest as the
// serialized message.
#include <cstdint>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "daemon/request_checks.h"
#include "proto/convert.h"
#include "strata/block_id.h"
#include "tests/fuzz/fuzz_input.h"

namespace d = strata::daemon;
namespace v1 = strata::v1;
using strata::fuzz::Fail;

namespace {

template <typename Message>
bool Parse(std::string_view bytes, Message* m) {
  return m->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
}

// Every id list that passes has a size the request's packed bytes account for.
void CheckIds(const std::vector<strata::BlockId>& ids, const std::string& packed, size_t max) {
  if (ids.size() * 32 != packed.size() || ids.size() > max) Fail("ids do not match their bytes");
}

template <typename Request>
void Scoped(std::string_view bytes, d::NamespaceCheck is_open) {
  Request req;
  if (!Parse(bytes, &req)) return;
  auto s = d::CheckScoped(req.namespace_id(), req.ids(), is_open);
  if (s.ok()) CheckIds(s->ids, req.ids(), d::kMaxIdsPerCall);
}

}  // namespace

// Parse failures are expected here; protobuf's log line for each would drown the fuzzer's output.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::fuzz::Input in(data, size);
  const uint8_t kind = in.U8();
  const bool open = in.U8() & 1;
  const std::string_view bytes = in.Rest();
  auto is_open = [open](const strata::NamespaceId&) {
    return open ? absl::OkStatus() : absl::FailedPreconditionError("namespace not open");
  };
  switch (kind % 14) {
    case 0: Scoped<v1::LookupRequest>(bytes, is_open); break;
    case 1: Scoped<v1::AcquireRequest>(bytes, is_open); break;
    case 2: Scoped<v1::EvictRequest>(bytes, is_open); break;
    case 3: Scoped<v1::UnpinRequest>(bytes, is_open); break;
    case 4: Scoped<v1::LocateRequest>(bytes, is_open); break;
    case 5: Scoped<v1::RepositionRequest>(bytes, is_open); break;
    case 6: {
      v1::ReserveRequest req;
      if (!Parse(bytes, &req)) break;
      auto s = d::CheckScoped(req.namespace_id(), req.ids(), is_open);
      if (!s.ok()) break;
      auto parents = d::CheckReserveParents(req, s->ids.size());
      // CacheService::DoReserve indexes sizes and parents by the id's position.
      if (parents.ok() && (static_cast<size_t>(req.sizes_size()) != s->ids.size() ||
                           (!parents->empty() && parents->size() != s->ids.size())))
        Fail("Reserve accepted with sizes or parents that do not match its ids");
      break;
    }
    case 7: {
      v1::PinRequest req;
      if (!Parse(bytes, &req)) break;
      auto s = d::CheckScoped(req.namespace_id(), req.ids(), is_open);
      if (s.ok() && d::CheckPin(req).ok() && req.ttl_ms() == 0) Fail("Pin accepted without ttl");
      break;
    }
    case 8: {
      v1::OpenNamespaceRequest req;
      if (!Parse(bytes, &req)) break;
      // NamespaceRegistry::Open: the spec must validate before an id is derived from it.
      strata::NamespaceSpec spec = strata::FromProto(req.spec());
      if (spec.Validate().ok())
        (void)strata::ComputeNamespaceId(spec, strata::ComputeTenantSalt("fuzz", req.tenant()));
      break;
    }
    case 9: {
      v1::ListBlocksRequest req;
      if (!Parse(bytes, &req)) break;
      auto q = d::CheckListBlocks(req, is_open);
      if (q.ok() && (q->page == 0 || q->page > d::kMaxListPage)) Fail("ListBlocks page size");
      break;
    }
    case 10: {
      v1::InspectBlocksRequest req;
      if (!Parse(bytes, &req)) break;
      auto ids = d::CheckInspectBlocks(req);
      if (ids.ok()) CheckIds(*ids, req.ids(), d::kMaxListPage);
      break;
    }
    case 11: {
      v1::AnnounceRequest req;
      if (!Parse(bytes, &req)) break;
      auto ids = d::CheckAnnounce(req);
      if (ids.ok()) CheckIds(*ids, req.ids(), d::kMaxIdsPerCall);
      break;
    }
    case 12: {
      v1::PeerLocateRequest req;
      if (!Parse(bytes, &req)) break;
      auto ids = d::CheckPeerLocate(req);
      if (ids.ok()) CheckIds(*ids, req.ids(), d::kMaxIdsPerCall);
      break;
    }
    case 13: {
      v1::PullRequest req;
      if (!Parse(bytes, &req)) break;
      auto order = d::CheckPull(req);
      if (!order.ok()) break;
      CheckIds(order->ids, req.ids(), d::kMaxIdsPerCall);
      if (!order->parents.empty() && order->parents.size() != order->ids.size())
        Fail("Pull accepted with parents that do not match its ids");
      if (!order->spec.Validate().ok()) Fail("Pull accepted with an invalid spec");
      break;
    }
  }
  return 0;
}
