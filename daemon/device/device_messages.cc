// FetchToDevice as an active message (common/am_wire.h, kDeviceFetchAm). A gRPC round trip
// costs more than a device-to-device copy of a few hundred MiB, so an engine's fetch of blocks
// the GPU tier holds is answered on the data plane's progress thread instead. Only then: a
// fetch that would wait on host memory or promotions, or decode, goes back to gRPC undone.
#include <optional>
#include <string>

#include "common/am_wire.h"
#include "daemon/device/device_service.h"

namespace strata::daemon {

void DeviceService::HandleAmFetch(const transport::AmMessage& m, transport::Worker* worker) {
  namespace w = am_wire;
  const auto request = w::DecodeLookupRequestHeader(m.header);
  // Nobody to answer (no reply endpoint or request id): dropped, its sender falls back to gRPC.
  if (m.reply_ep == nullptr || !request) return;
  w::ReplyHeader h;
  h.request_id = request->request_id;
  h.complete = true;
  std::string data;
  v1::FetchToDeviceRequest req;
  v1::FetchToDeviceResponse resp;
  bool declined = false;
  std::optional<Caller> caller;
  if (caller_of_ticket_) caller = caller_of_ticket_(request->ticket);
  grpc::Status s;
  if (gpu_ == nullptr || !caller) {
    h.complete = false;  // gRPC says why (no GPU tier, no valid ticket)
  } else if (!req.ParseFromArray(m.data.data(), static_cast<int>(m.data.size()))) {
    s = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     "a device fetch message whose data is not a FetchToDeviceRequest");
  } else if (req.decode() || static_cast<size_t>(req.offsets_size()) > w::kMaxControlIds ||
             req.namespace_id() != request->ns) {
    h.complete = false;
  } else {
    s = FetchFor(*caller, &req, &resp, w::kMaxDeviceFetchByMessageBytes, &declined);
    if (s.ok() && declined) h.complete = false;
  }
  if (!s.ok()) {
    h.code = static_cast<uint32_t>(s.error_code());  // gRPC's codes are absl's numbers
    data = s.error_message();
  } else if (h.complete) {
    data = resp.SerializeAsString();
  }
  worker->AmReply(m.reply_ep, w::kDeviceFetchReplyAm, w::EncodeReplyHeader(h), std::move(data));
}

}  // namespace strata::daemon
