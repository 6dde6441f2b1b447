// strata/c.h over strata/client.h: handles wrap the C++ objects, errors become malloc'd strings
// plus the absl::StatusCode number, per-block outcomes are copied into caller arrays.
#include "strata/c.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "strata/client.h"

struct strata_options_t {
  strata::ClientOptions options;
};

struct strata_ns_spec_t {
  strata::NamespaceSpec spec;
};

struct strata_client_t {
  std::unique_ptr<strata::Client> client;
};

namespace {

using strata::BlockId;

// Returns the status code (0 when ok) and, on failure, replaces *errptr's message.
int SaveError(const absl::Status& status, char** errptr) {
  if (status.ok()) return 0;
  if (errptr != nullptr) {
    std::free(*errptr);
    std::string text(status.message());
    if (text.empty()) text = absl::StatusCodeToString(status.code());
    *errptr = static_cast<char*>(std::malloc(text.size() + 1));
    if (*errptr != nullptr) std::memcpy(*errptr, text.c_str(), text.size() + 1);
  }
  return static_cast<int>(status.code());
}

int NullArgument(const char* what, char** errptr) {
  return SaveError(absl::InvalidArgumentError(std::string(what) + " must not be NULL"), errptr);
}

// strata_id_t and strata::Digest are both 32 plain bytes; the copy keeps the ABI independent of
// the C++ type's layout.
std::vector<BlockId> ToIds(const strata_id_t* ids, size_t n) {
  std::vector<BlockId> out(n);
  for (size_t i = 0; i < n; ++i) std::memcpy(out[i].bytes.data(), ids[i].bytes, 32);
  return out;
}

BlockId ToId(const strata_id_t* id) { return ToIds(id, 1)[0]; }

void FromId(const BlockId& id, strata_id_t* out) { std::memcpy(out->bytes, id.bytes.data(), 32); }

void CopyStatus(const std::vector<strata::BlockStatus>& from, uint8_t* to) {
  if (to == nullptr) return;
  for (size_t i = 0; i < from.size(); ++i) to[i] = static_cast<uint8_t>(from[i]);
}

std::string OrEmpty(const char* s) { return s == nullptr ? std::string() : std::string(s); }

}  // namespace

extern "C" {

void strata_free(void* ptr) { std::free(ptr); }

const char* strata_block_status_name(uint8_t status) {
  // The names are string literals, so their data() is NUL-terminated.
  return strata::BlockStatusName(static_cast<strata::BlockStatus>(status)).data();
}

strata_options_t* strata_options_create(void) { return new strata_options_t; }
void strata_options_destroy(strata_options_t* options) { delete options; }
void strata_options_set_endpoint(strata_options_t* o, const char* endpoint) {
  o->options.endpoint = OrEmpty(endpoint);
}
void strata_options_set_client_name(strata_options_t* o, const char* name) {
  o->options.client_name = OrEmpty(name);
}
void strata_options_set_auth_token(strata_options_t* o, const char* token) {
  o->options.auth_token = OrEmpty(token);
}
void strata_options_set_tls(strata_options_t* o, const char* ca_file, const char* cert_file,
                            const char* key_file) {
  o->options.tls.ca_file = OrEmpty(ca_file);
  o->options.tls.cert_file = OrEmpty(cert_file);
  o->options.tls.key_file = OrEmpty(key_file);
}
void strata_options_set_tls_server_name(strata_options_t* o, const char* name) {
  o->options.tls.server_name = OrEmpty(name);
}
void strata_options_set_rpc_timeout_ms(strata_options_t* o, uint32_t ms) {
  o->options.rpc_timeout = absl::Milliseconds(ms);
}
void strata_options_set_transfer_timeout_ms(strata_options_t* o, uint32_t ms) {
  o->options.transfer_timeout = absl::Milliseconds(ms);
}
void strata_options_set_verify_crc(strata_options_t* o, int on) { o->options.verify_crc = on; }
void strata_options_set_remote_fetch(strata_options_t* o, int on) { o->options.remote_fetch = on; }
void strata_options_set_lookup_fast_path(strata_options_t* o, int on) {
  o->options.lookup_fast_path = on;
}
void strata_options_set_same_node(strata_options_t* o, int on) { o->options.same_node = on; }
void strata_options_set_fetch_transfer(strata_options_t* o, const char* how) {
  o->options.fetch_transfer = OrEmpty(how);
}
void strata_options_set_fetch_bypasses_cache(strata_options_t* o, int on) {
  o->options.fetch_bypasses_cache = on;
}
void strata_options_set_vllm_hash_seed(strata_options_t* o, const char* seed) {
  o->options.vllm_hash_seed = OrEmpty(seed);
}
void strata_options_set_quiet(strata_options_t* o, int on) {
  if (on)
    o->options.log = [](strata::LogLevel, std::string_view) {};
  else
    o->options.log = nullptr;
}

strata_ns_spec_t* strata_ns_spec_create(void) { return new strata_ns_spec_t; }
void strata_ns_spec_destroy(strata_ns_spec_t* spec) { delete spec; }
void strata_ns_spec_set_model(strata_ns_spec_t* s, const char* model_id, const char* revision) {
  s->spec.model_id = OrEmpty(model_id);
  s->spec.model_revision = OrEmpty(revision);
}
int strata_ns_spec_set_layout(strata_ns_spec_t* s, uint32_t num_layers, uint32_t num_kv_heads,
                              uint32_t head_dim, const char* dtype, uint32_t tokens_per_block,
                              int mla_latent, char** errptr) {
  auto parsed = strata::ParseDType(OrEmpty(dtype));
  if (!parsed.ok()) return SaveError(parsed.status(), errptr);
  strata::KvLayout layout{num_layers,
                          num_kv_heads,
                          head_dim,
                          *parsed,
                          tokens_per_block,
                          mla_latent ? strata::KvKind::kMlaLatent : strata::KvKind::kSeparateKV};
  if (int rc = SaveError(layout.Validate(), errptr)) return rc;
  s->spec.layout = layout;
  return 0;
}
void strata_ns_spec_set_parallel(strata_ns_spec_t* s, uint32_t tp_rank, uint32_t tp_size) {
  s->spec.tp_rank = tp_rank;
  s->spec.tp_size = tp_size;
}
void strata_ns_spec_set_lora(strata_ns_spec_t* s, const char* lora_id) {
  s->spec.lora_id = OrEmpty(lora_id);
}
void strata_ns_spec_set_codec(strata_ns_spec_t* s, const char* codec_policy) {
  s->spec.codec_policy = OrEmpty(codec_policy);
}
int strata_ns_spec_set_id_scheme(strata_ns_spec_t* s, const char* scheme, char** errptr) {
  auto parsed = strata::ParseIdScheme(OrEmpty(scheme));
  if (!parsed.ok()) return SaveError(parsed.status(), errptr);
  s->spec.id_scheme = *parsed;
  return 0;
}
uint64_t strata_ns_spec_block_bytes(const strata_ns_spec_t* s) {
  return s->spec.layout.Validate().ok() ? s->spec.layout.BlockBytes() : 0;
}

strata_client_t* strata_connect(const strata_options_t* options, char** errptr) {
  strata::ClientOptions defaults;
  auto client = strata::Client::Connect(options != nullptr ? options->options : defaults);
  if (!client.ok()) {
    SaveError(client.status(), errptr);
    return nullptr;
  }
  return new strata_client_t{std::move(*client)};
}

void strata_close(strata_client_t* client) { delete client; }

const char* strata_node_id(const strata_client_t* client) {
  return client->client->node_id().c_str();
}

int strata_open_namespace(strata_client_t* client, const strata_ns_spec_t* spec,
                          const char* tenant, uint32_t replicas, strata_id_t* ns_out,
                          char** errptr) {
  if (spec == nullptr || ns_out == nullptr) return NullArgument("spec and ns_out", errptr);
  auto ns = client->client->OpenNamespace(spec->spec, OrEmpty(tenant), replicas);
  if (!ns.ok()) return SaveError(ns.status(), errptr);
  FromId(*ns, ns_out);
  return 0;
}

int strata_register_buffer(strata_client_t* client, void* data, size_t size, char** errptr) {
  return SaveError(client->client->RegisterBuffer(data, size), errptr);
}

int strata_unregister_buffer(strata_client_t* client, void* data, char** errptr) {
  return SaveError(client->client->UnregisterBuffer(data), errptr);
}

int strata_block_ids(strata_client_t* client, const strata_id_t* ns, const uint32_t* tokens,
                     size_t n_tokens, strata_id_t* ids_out, size_t ids_capacity,
                     size_t* n_ids_out, char** errptr) {
  if (ns == nullptr || (tokens == nullptr && n_tokens > 0) || n_ids_out == nullptr)
    return NullArgument("ns, tokens and n_ids_out", errptr);
  auto ids = client->client->BlockIds(ToId(ns), {tokens, n_tokens});
  if (!ids.ok()) return SaveError(ids.status(), errptr);
  if (ids->size() > ids_capacity)
    return SaveError(absl::InvalidArgumentError(std::to_string(ids->size()) +
                                                " ids do not fit ids_capacity " +
                                                std::to_string(ids_capacity)),
                     errptr);
  for (size_t i = 0; i < ids->size(); ++i) FromId((*ids)[i], &ids_out[i]);
  *n_ids_out = ids->size();
  return 0;
}

namespace {
std::vector<strata::ConstBuffer> ToConstBuffers(const void* const* blocks, const size_t* sizes,
                                                size_t n) {
  std::vector<strata::ConstBuffer> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = {blocks[i], sizes[i]};
  return out;
}

int FinishPublish(const absl::StatusOr<strata::PublishResult>& r, uint8_t* status,
                  size_t* stored_out, char** errptr) {
  if (!r.ok()) return SaveError(r.status(), errptr);
  CopyStatus(r->status, status);
  if (stored_out != nullptr) *stored_out = r->stored;
  return 0;
}
}  // namespace

int strata_publish(strata_client_t* client, const strata_id_t* ns, const uint32_t* tokens,
                   size_t n_tokens, const void* const* blocks, const size_t* sizes,
                   size_t n_blocks, uint8_t* status, size_t* stored_out, char** errptr) {
  if (ns == nullptr || (n_blocks > 0 && (blocks == nullptr || sizes == nullptr)) ||
      (tokens == nullptr && n_tokens > 0))
    return NullArgument("ns, tokens, blocks and sizes", errptr);
  auto buffers = ToConstBuffers(blocks, sizes, n_blocks);
  return FinishPublish(client->client->Publish(ToId(ns), {tokens, n_tokens}, buffers), status,
                       stored_out, errptr);
}

int strata_publish_ids(strata_client_t* client, const strata_id_t* ns, const strata_id_t* ids,
                       const strata_id_t* parents, const void* const* blocks,
                       const size_t* sizes, size_t n_blocks, uint8_t* status,
                       size_t* stored_out, char** errptr) {
  if (ns == nullptr || (n_blocks > 0 && (ids == nullptr || blocks == nullptr || sizes == nullptr)))
    return NullArgument("ns, ids, blocks and sizes", errptr);
  std::vector<BlockId> id_list = ToIds(ids, n_blocks);
  std::vector<BlockId> parent_list;
  if (parents != nullptr) {
    parent_list = ToIds(parents, n_blocks);
  } else {
    parent_list.resize(n_blocks);
    for (size_t i = 1; i < n_blocks; ++i) parent_list[i] = id_list[i - 1];
  }
  auto buffers = ToConstBuffers(blocks, sizes, n_blocks);
  return FinishPublish(client->client->PublishIds(ToId(ns), id_list, parent_list, buffers),
                       status, stored_out, errptr);
}

int strata_lookup(strata_client_t* client, const strata_id_t* ns, const uint32_t* tokens,
                  size_t n_tokens, size_t* prefix_blocks, char** errptr) {
  if (ns == nullptr || prefix_blocks == nullptr || (tokens == nullptr && n_tokens > 0))
    return NullArgument("ns, tokens and prefix_blocks", errptr);
  auto r = client->client->Lookup(ToId(ns), {tokens, n_tokens});
  if (!r.ok()) return SaveError(r.status(), errptr);
  *prefix_blocks = r->prefix_blocks;
  return 0;
}

int strata_lookup_ids(strata_client_t* client, const strata_id_t* ns, const strata_id_t* ids,
                      size_t n_ids, size_t* prefix_blocks, char** errptr) {
  if (ns == nullptr || prefix_blocks == nullptr || (ids == nullptr && n_ids > 0))
    return NullArgument("ns, ids and prefix_blocks", errptr);
  auto r = client->client->LookupIds(ToId(ns), ToIds(ids, n_ids));
  if (!r.ok()) return SaveError(r.status(), errptr);
  *prefix_blocks = *r;
  return 0;
}

int strata_fetch(strata_client_t* client, const strata_id_t* ns, const strata_id_t* ids,
                 size_t n_ids, void* const* buffers, const size_t* capacities, uint8_t* status,
                 uint64_t* sizes_out, size_t* fetched_out, char** errptr) {
  if (ns == nullptr || (n_ids > 0 && (ids == nullptr || buffers == nullptr || capacities == nullptr)))
    return NullArgument("ns, ids, buffers and capacities", errptr);
  std::vector<strata::MutableBuffer> dst(n_ids);
  for (size_t i = 0; i < n_ids; ++i) dst[i] = {buffers[i], capacities[i]};
  auto r = client->client->Fetch(ToId(ns), ToIds(ids, n_ids), dst);
  if (!r.ok()) return SaveError(r.status(), errptr);
  CopyStatus(r->status, status);
  if (sizes_out != nullptr)
    for (size_t i = 0; i < r->sizes.size(); ++i) sizes_out[i] = r->sizes[i];
  if (fetched_out != nullptr) *fetched_out = r->fetched;
  return 0;
}

int strata_evict(strata_client_t* client, const strata_id_t* ns, const strata_id_t* ids,
                 size_t n_ids, int cascade, uint8_t* status, char** errptr) {
  if (ns == nullptr || (ids == nullptr && n_ids > 0)) return NullArgument("ns and ids", errptr);
  auto r = client->client->Evict(ToId(ns), ToIds(ids, n_ids), cascade != 0);
  if (!r.ok()) return SaveError(r.status(), errptr);
  CopyStatus(r->status, status);
  return 0;
}

int strata_pin(strata_client_t* client, const strata_id_t* ns, const strata_id_t* ids,
               size_t n_ids, uint32_t ttl_ms, uint8_t* status, char** errptr) {
  if (ns == nullptr || (ids == nullptr && n_ids > 0)) return NullArgument("ns and ids", errptr);
  auto r = client->client->Pin(ToId(ns), ToIds(ids, n_ids), absl::Milliseconds(ttl_ms));
  if (!r.ok()) return SaveError(r.status(), errptr);
  CopyStatus(*r, status);
  return 0;
}

int strata_unpin(strata_client_t* client, const strata_id_t* ns, const strata_id_t* ids,
                 size_t n_ids, uint8_t* status, char** errptr) {
  if (ns == nullptr || (ids == nullptr && n_ids > 0)) return NullArgument("ns and ids", errptr);
  auto r = client->client->Unpin(ToId(ns), ToIds(ids, n_ids));
  if (!r.ok()) return SaveError(r.status(), errptr);
  CopyStatus(*r, status);
  return 0;
}

}  // extern "C"
