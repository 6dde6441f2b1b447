// absl::Status <-> grpc::Status, code by code: the daemon's logic speaks absl, its gRPC surface
// and its metrics speak gRPC codes.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace strata {

grpc::StatusCode ToGrpcCode(absl::StatusCode code);
absl::StatusCode FromGrpcCode(grpc::StatusCode code);

grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace strata
