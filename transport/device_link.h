// Point-to-point links between two daemons' GPU tiers: device memory on one node straight into
// device memory on another (NCCL send/recv on a GPU node). UCX stays the path for host and NVMe
// blocks.
//
// A link is one communicator of two ranks. Rank 0 makes a link id (NewLinkId: for NCCL the
// unique id, which names rank 0's bootstrap listener), hands it to the other node over the
// authenticated control plane, and both ends Connect with it. Sends and receives on a link are
// matched in the order they are issued, so the two ends must issue them in the same order; the
// daemon's device transfers serialise every operation of a link at rank 0 for that reason.
//
// Like storage's DeviceMemory, this is a seam: NCCL on a GPU node, and a stand-in over TCP
// between host memory pools on any machine, so that the daemon's link set-up, ordering, failure
// and tear-down run in CI. An address is in the device address space of this process (for the
// stand-in: a host address in the stand-in pool).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata::transport {

struct DeviceRange {
  uint64_t address = 0;
  uint64_t size = 0;
};

class DeviceLink {
 public:
  virtual ~DeviceLink() = default;
  virtual std::string_view kind() const = 0;
  virtual int rank() const = 0;
  // Sends the ranges, in order, to the other end, which receives them with Recv of the same
  // sizes. Returns when every byte left this end, or with an error at `deadline` or on a
  // failure; after an error the link is broken (every later call fails): tear it down.
  virtual absl::Status Send(std::span<const DeviceRange> ranges, absl::Time deadline) = 0;
  virtual absl::Status Recv(std::span<const DeviceRange> ranges, absl::Time deadline) = 0;
  // Breaks the link: a call in progress returns with an error, later ones fail at once.
  virtual void Abort() = 0;
};

class DeviceLinkFactory {
 public:
  virtual ~DeviceLinkFactory() = default;
  // "nccl" or "stand-in".
  virtual std::string_view kind() const = 0;
  // A fresh link id, for rank 0 to hand to rank 1. Ids are single-use and expire if rank 0 does
  // not Connect with them within a minute.
  virtual absl::StatusOr<std::string> NewLinkId() = 0;
  // This end (rank 0 or 1) of the link `link_id` names; returns once both ends joined.
  // DeadlineExceeded when the other end did not join by `deadline`; InvalidArgument for an id
  // this factory did not make (rank 0) or cannot parse (rank 1).
  virtual absl::StatusOr<std::unique_ptr<DeviceLink>> Connect(std::string_view link_id, int rank,
                                                              absl::Time deadline) = 0;
};

// Links over TCP between host memory pools (HostStandInMemory); rank 0 listens on `host` (this
// node's advertised address) on an ephemeral port. The link id carries 128 random bits that
// rank 1 must present: a stranger who reaches the port cannot join.
std::unique_ptr<DeviceLinkFactory> NewStandInLinkFactory(std::string host);

// NCCL links for device memory on CUDA device `device` (libnccl is loaded at run time).
// FailedPrecondition with the reason when this build has no NCCL or the library does not load.
absl::StatusOr<std::unique_ptr<DeviceLinkFactory>> NewNcclLinkFactory(int device);

}  // namespace strata::transport
