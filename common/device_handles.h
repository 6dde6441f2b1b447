// How an engine names a buffer of its own device memory to the daemon of its node, so that
// stratad copies blocks into it device-to-device (daemon/device/, proto/strata/v1/device.proto).
// A handle is a capability, like the CUDA IPC handle it usually is: whoever holds its bytes can
// open the memory, so it travels only to the node's own daemon, over the engine's authenticated
// connection.
//
//   kCudaIpc:     cudaIpcMemHandle_t of the allocation (kCudaIpcHandleBytes bytes); the lent
//                 range is [offset, offset + bytes) of that allocation.
//   kHostStandIn: the name of a POSIX shared-memory object ("/strata-devbuf-" and 32 lowercase
//                 hex digits: 128 random bits), host memory standing in for device memory on
//                 machines without a GPU, as the GPU tier's stand-in memory does in stratad.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace strata::device_handles {

inline constexpr std::string_view kCudaIpc = "cuda-ipc";
inline constexpr std::string_view kHostStandIn = "host-stand-in";
inline constexpr size_t kCudaIpcHandleBytes = 64;
inline constexpr std::string_view kStandInPrefix = "/strata-devbuf-";
inline constexpr size_t kStandInRandomHexDigits = 32;

// Whether `name` is a stand-in buffer's name as the client library makes them: nothing else is
// ever opened by the daemon (no path, no other process's object by a guessable name).
inline bool IsStandInName(std::string_view name) {
  if (name.size() != kStandInPrefix.size() + kStandInRandomHexDigits) return false;
  if (name.substr(0, kStandInPrefix.size()) != kStandInPrefix) return false;
  for (char c : name.substr(kStandInPrefix.size()))
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace strata::device_handles
