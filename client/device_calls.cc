#include "client/device_calls.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/am_wire.h"
#include "common/packed_ids.h"
#include "common/status_macros.h"
#include "proto/convert.h"

namespace strata::client {

absl::StatusOr<uint64_t> LendDeviceBuffer(v1::DeviceCopies::Stub& stub, const CallRunner& run,
                                          const DeviceBufferHandle& buffer) {
  v1::LendDeviceBufferRequest req;
  req.set_kind(buffer.kind);
  req.set_handle(buffer.handle);
  req.set_offset(buffer.offset);
  req.set_bytes(buffer.bytes);
  v1::LendDeviceBufferResponse resp;
  STRATA_RETURN_IF_ERROR(
      run("DeviceCopies.Lend", [&](grpc::ClientContext* c) { return stub.Lend(c, req, &resp); }));
  if (resp.loan_id() == 0) return absl::InternalError("the daemon lent under loan id 0");
  return resp.loan_id();
}

absl::StatusOr<DeviceFetchResult> FetchToDevice(v1::DeviceCopies::Stub& stub,
                                                const CallRunner& run, const NamespaceId& ns,
                                                uint64_t loan, std::span<const BlockId> ids,
                                                std::span<const uint64_t> offsets,
                                                DeviceFetchOptions options,
                                                const DeviceFetchByMessage& by_message) {
  if (offsets.size() != ids.size())
    return absl::InvalidArgumentError(
        absl::StrCat(ids.size(), " ids but ", offsets.size(), " offsets"));
  v1::FetchToDeviceRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_loan_id(loan);
  req.set_ids(PackIds(ids));
  req.mutable_offsets()->Add(offsets.begin(), offsets.end());
  req.set_no_promote(!options.promote);
  req.set_decode(options.decode);
  v1::FetchToDeviceResponse resp;
  bool answered = false;
  if (by_message && !options.decode && !ids.empty() && ids.size() <= am_wire::kMaxControlIds) {
    std::optional<std::string> answer = by_message(req.SerializeAsString());
    answered = answer && resp.ParseFromString(*answer);
    if (!answered) resp.Clear();
  }
  if (!answered)
    STRATA_RETURN_IF_ERROR(run("DeviceCopies.FetchToDevice", [&](grpc::ClientContext* c) {
      return stub.FetchToDevice(c, req, &resp);
    }));
  STRATA_RETURN_IF_ERROR(CheckStatusCount("FetchToDevice", resp.status_size(), ids.size()));
  const auto n = static_cast<int>(ids.size());
  if (resp.sizes_size() != n || resp.crc32c_size() != n || resp.source_size() != n)
    return absl::InternalError("FetchToDevice answered per-block fields of the wrong count");
  DeviceFetchResult out;
  out.status = BlockStatuses(resp.status());
  for (int i = 0; i < n; ++i) {
    out.sizes.push_back(resp.sizes(i));
    out.crcs.push_back(resp.crc32c(i));
    out.sources.push_back(resp.source(i) == v1::TIER_GPU    ? "gpu"
                          : resp.source(i) == v1::TIER_HOST ? "host"
                                                            : "");
    if (out.status[i] == BlockStatus::kOk) ++out.fetched;
  }
  out.bytes = resp.bytes_copied();
  out.daemon_micros = resp.daemon_micros();
  return out;
}

absl::StatusOr<DevicePublishResult> PublishFromDevice(
    v1::DeviceCopies::Stub& stub, const CallRunner& run, const NamespaceId& ns, uint64_t loan,
    std::span<const BlockId> ids, std::span<const BlockId> parents,
    std::span<const uint64_t> offsets, std::span<const uint64_t> sizes) {
  if (offsets.size() != ids.size() || sizes.size() != ids.size() ||
      (!parents.empty() && parents.size() != ids.size()))
    return absl::InvalidArgumentError(absl::StrCat(ids.size(), " ids, ", parents.size(),
                                                   " parents, ", offsets.size(), " offsets and ",
                                                   sizes.size(), " sizes"));
  v1::PublishFromDeviceRequest req;
  req.set_namespace_id(std::string(ns.AsBytes()));
  req.set_loan_id(loan);
  req.set_ids(PackIds(ids));
  if (!parents.empty()) req.set_parents(PackIds(parents));
  req.mutable_offsets()->Add(offsets.begin(), offsets.end());
  req.mutable_sizes()->Add(sizes.begin(), sizes.end());
  v1::PublishFromDeviceResponse resp;
  STRATA_RETURN_IF_ERROR(run("DeviceCopies.PublishFromDevice", [&](grpc::ClientContext* c) {
    return stub.PublishFromDevice(c, req, &resp);
  }));
  STRATA_RETURN_IF_ERROR(CheckStatusCount("PublishFromDevice", resp.status_size(), ids.size()));
  if (static_cast<size_t>(resp.stored_bytes_size()) != ids.size())
    return absl::InternalError("PublishFromDevice answered per-block sizes of the wrong count");
  DevicePublishResult out;
  out.status = BlockStatuses(resp.status());
  out.stored_bytes.assign(resp.stored_bytes().begin(), resp.stored_bytes().end());
  for (BlockStatus s : out.status)
    if (s == BlockStatus::kOk) ++out.stored;
  out.bytes_read = resp.bytes_read();
  out.encoded_on_device = resp.encoded_on_device();
  return out;
}

absl::Status ReturnDeviceBuffer(v1::DeviceCopies::Stub& stub, const CallRunner& run,
                                uint64_t loan) {
  v1::ReturnDeviceBufferRequest req;
  req.set_loan_id(loan);
  v1::ReturnDeviceBufferResponse resp;
  return run("DeviceCopies.Return",
             [&](grpc::ClientContext* c) { return stub.Return(c, req, &resp); });
}

}  // namespace strata::client
