// Conversions between the wire messages and the vocabulary types of common/.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "strata/block_id.h"
#include "strata/v1/cache.pb.h"

namespace strata {

v1::NamespaceSpecProto ToProto(const NamespaceSpec& spec);
NamespaceSpec FromProto(const v1::NamespaceSpecProto& proto);

// gRPC and Abseil number the canonical status codes alike; these keep code and message.
grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace strata
