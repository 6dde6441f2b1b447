// The DeviceCopies calls (proto/strata/v1/device.proto) a Client makes: lending the local daemon
// a device buffer, fetching blocks into it, returning it.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "client/block_calls.h"
#include "strata/client.h"
#include "strata/device_buffer.h"
#include "strata/v1/device.grpc.pb.h"

namespace strata::client {

absl::StatusOr<uint64_t> LendDeviceBuffer(v1::DeviceCopies::Stub& stub, const CallRunner& run,
                                          const DeviceBufferHandle& buffer);
absl::StatusOr<DeviceFetchResult> FetchToDevice(v1::DeviceCopies::Stub& stub,
                                                const CallRunner& run, const NamespaceId& ns,
                                                uint64_t loan, std::span<const BlockId> ids,
                                                std::span<const uint64_t> offsets,
                                                DeviceFetchOptions options);
absl::StatusOr<DevicePublishResult> PublishFromDevice(
    v1::DeviceCopies::Stub& stub, const CallRunner& run, const NamespaceId& ns, uint64_t loan,
    std::span<const BlockId> ids, std::span<const BlockId> parents,
    std::span<const uint64_t> offsets, std::span<const uint64_t> sizes);
absl::Status ReturnDeviceBuffer(v1::DeviceCopies::Stub& stub, const CallRunner& run,
                                uint64_t loan);

}  // namespace strata::client
