// The DeviceCopies calls (proto/strata/v1/device.proto) a Client makes: lending the local daemon
// a device buffer, fetching blocks into it, returning it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "client/block_calls.h"
#include "strata/client.h"
#include "strata/device_buffer.h"
#include "strata/v1/device.grpc.pb.h"

namespace strata::client {

absl::StatusOr<uint64_t> LendDeviceBuffer(v1::DeviceCopies::Stub& stub, const CallRunner& run,
                                          const DeviceBufferHandle& buffer);
// Sends a serialized FetchToDeviceRequest as an active message and returns the serialized
// answer, or nullopt where the call must go through gRPC (ControlChannel::DeviceFetch).
using DeviceFetchByMessage = std::function<std::optional<std::string>(std::string request)>;
// `by_message` (may be null) is tried first for fetches that decode nothing and stay an eager
// message's size; gRPC answers whatever it does not.
absl::StatusOr<DeviceFetchResult> FetchToDevice(v1::DeviceCopies::Stub& stub,
                                                const CallRunner& run, const NamespaceId& ns,
                                                uint64_t loan, std::span<const BlockId> ids,
                                                std::span<const uint64_t> offsets,
                                                DeviceFetchOptions options,
                                                const DeviceFetchByMessage& by_message = nullptr);
absl::StatusOr<DevicePublishResult> PublishFromDevice(
    v1::DeviceCopies::Stub& stub, const CallRunner& run, const NamespaceId& ns, uint64_t loan,
    std::span<const BlockId> ids, std::span<const BlockId> parents,
    std::span<const uint64_t> offsets, std::span<const uint64_t> sizes);
absl::Status ReturnDeviceBuffer(v1::DeviceCopies::Stub& stub, const CallRunner& run,
                                uint64_t loan);

}  // namespace strata::client
