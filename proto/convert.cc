#include "proto/convert.h"

#include <algorithm>

namespace strata {
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
  p.set_id_scheme(static_cast<uint32_t>(s.id_scheme));
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
  // An unknown scheme stays unknown (NamespaceSpec::Validate refuses it) rather than wrapping.
  s.id_scheme = static_cast<IdScheme>(std::min<uint32_t>(p.id_scheme(), 255));
  return s;
}

}  // namespace strata
