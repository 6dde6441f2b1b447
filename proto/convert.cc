#include "proto/convert.h"

namespace strata {
namespace {

// By name, not by number: a code this version does not know becomes kUnknown.
absl::StatusCode FromGrpcCode(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return absl::StatusCode::kOk;
    case grpc::StatusCode::CANCELLED:
      return absl::StatusCode::kCancelled;
    case grpc::StatusCode::UNKNOWN:
      return absl::StatusCode::kUnknown;
    case grpc::StatusCode::INVALID_ARGUMENT:
      return absl::StatusCode::kInvalidArgument;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::StatusCode::kDeadlineExceeded;
    case grpc::StatusCode::NOT_FOUND:
      return absl::StatusCode::kNotFound;
    case grpc::StatusCode::ALREADY_EXISTS:
      return absl::StatusCode::kAlreadyExists;
    case grpc::StatusCode::PERMISSION_DENIED:
      return absl::StatusCode::kPermissionDenied;
    case grpc::StatusCode::UNAUTHENTICATED:
      return absl::StatusCode::kUnauthenticated;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return absl::StatusCode::kResourceExhausted;
    case grpc::StatusCode::FAILED_PRECONDITION:
      return absl::StatusCode::kFailedPrecondition;
    case grpc::StatusCode::ABORTED:
      return absl::StatusCode::kAborted;
    case grpc::StatusCode::OUT_OF_RANGE:
      return absl::StatusCode::kOutOfRange;
    case grpc::StatusCode::UNIMPLEMENTED:
      return absl::StatusCode::kUnimplemented;
    case grpc::StatusCode::INTERNAL:
      return absl::StatusCode::kInternal;
    case grpc::StatusCode::UNAVAILABLE:
      return absl::StatusCode::kUnavailable;
    case grpc::StatusCode::DATA_LOSS:
      return absl::StatusCode::kDataLoss;
    default:
      return absl::StatusCode::kUnknown;
  }
}
}  // namespace

v1::NamespaceSpecProto ToProto(const NamespaceSpec& s) {
  v1::NamespaceSpecProto p;
  p.set_model_id(s.model_id);
  p.set_model_revision(s.model_revision);
  auto* l = p.mutable_layout();
  l->set_num_layers(s.layout.num_layers);
  l->set_num_kv_heads(s.layout.num_kv_heads);
  l->set_head_dim(s.layout.head_dim);
  l->set_dtype(static_cast<uint32_t>(s.layout.dtype));
  l->set_tokens_per_block(s.layout.tokens_per_block);
  l->set_kind(static_cast<uint32_t>(s.layout.kind));
  p.set_tp_rank(s.tp_rank);
  p.set_tp_size(s.tp_size);
  p.set_lora_id(s.lora_id);
  p.set_codec_policy(s.codec_policy);
  return p;
}

NamespaceSpec FromProto(const v1::NamespaceSpecProto& p) {
  NamespaceSpec s;
  s.model_id = p.model_id();
  s.model_revision = p.model_revision();
  s.layout.num_layers = p.layout().num_layers();
  s.layout.num_kv_heads = p.layout().num_kv_heads();
  s.layout.head_dim = p.layout().head_dim();
  s.layout.dtype = static_cast<DType>(p.layout().dtype());
  s.layout.tokens_per_block = p.layout().tokens_per_block();
  s.layout.kind = static_cast<KvKind>(p.layout().kind());
  s.tp_rank = p.tp_rank();
  s.tp_size = p.tp_size();
  s.lora_id = p.lora_id();
  s.codec_policy = p.codec_policy();
  return s;
}

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(FromGrpcCode(s.error_code()), s.error_message());
}

}  // namespace strata
