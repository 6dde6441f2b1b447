// NewNcclLinkFactory for builds without CUDA or without nccl.h (see transport/CMakeLists.txt).
#include "transport/device_link.h"

namespace strata::transport {

absl::StatusOr<std::unique_ptr<DeviceLinkFactory>> NewNcclLinkFactory(int) {
  return absl::FailedPreconditionError(
      "NCCL: this stratad was built without NCCL (STRATA_WITH_NCCL, nccl.h)");
}

}  // namespace strata::transport
