/* libstrata's C ABI: for engines and bindings that cannot take C++ types (Python via ctypes or
 * cffi, Rust, Go). It wraps strata/client.h one to one.
 *
 * Conventions:
 * - Handles are opaque and owned by the caller: every *_create / strata_connect has a matching
 *   *_destroy / strata_close.
 * - A call that can fail takes `char** errptr` last. On failure it returns non-zero (an
 *   absl::StatusCode number: 3 invalid argument, 4 deadline exceeded, 5 not found, 9 failed
 *   precondition, 14 unavailable, ...) and stores a malloc'd message in *errptr, freeing the
 *   message that was there; release it with strata_free. On success it returns 0 and leaves
 *   *errptr alone.
 * - Per-block outcomes land in caller-owned `uint8_t status[]` arrays (strata_block_status_*):
 *   a miss or a corrupt block never fails the whole call.
 * - Ids are 32-byte values (strata_id_t), passed as arrays.
 * - A client is thread-safe; option and spec handles are not. */
#ifndef STRATA_C_H_
#define STRATA_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define STRATA_C_EXPORT __attribute__((visibility("default")))
#else
#define STRATA_C_EXPORT
#endif

typedef struct strata_client_t strata_client_t;
typedef struct strata_options_t strata_options_t;
typedef struct strata_ns_spec_t strata_ns_spec_t;

typedef struct {
  uint8_t bytes[32];
} strata_id_t;

/* Per-block outcomes; the numbers match strata::BlockStatus. */
enum {
  strata_block_status_ok = 0,
  strata_block_status_not_found = 1,
  strata_block_status_exists = 2,
  strata_block_status_in_progress = 3,
  strata_block_status_no_space = 4,
  strata_block_status_crc_mismatch = 5,
  strata_block_status_pinned = 6,
  strata_block_status_invalid = 7,
  strata_block_status_expired = 8,
  strata_block_status_unknown_calibration = 9
};

STRATA_C_EXPORT void strata_free(void* ptr);
/* "ok", "not_found", ... (static storage; "unknown" for any other number). */
STRATA_C_EXPORT const char* strata_block_status_name(uint8_t status);

/* Client options; every setter mirrors a strata::ClientOptions field. */
STRATA_C_EXPORT strata_options_t* strata_options_create(void);
STRATA_C_EXPORT void strata_options_destroy(strata_options_t* options);
STRATA_C_EXPORT void strata_options_set_endpoint(strata_options_t* options, const char* endpoint);
STRATA_C_EXPORT void strata_options_set_client_name(strata_options_t* options, const char* name);
/* Bearer token for a daemon with authentication (ClientOptions::auth_token); NULL or "": none. */
STRATA_C_EXPORT void strata_options_set_auth_token(strata_options_t* options, const char* token);
/* TLS (ClientOptions::tls): PEM files of the CA that signs the daemons' certificates (NULL or "":
 * plaintext), and optionally a client certificate and its key (NULL or "": none). Read at
 * strata_client_connect, which fails naming the file's field if one is missing or malformed. */
STRATA_C_EXPORT void strata_options_set_tls(strata_options_t* options, const char* ca_file,
                                            const char* cert_file, const char* key_file);
/* The name the daemon's certificate must carry instead of the endpoint's host; NULL or "": the
 * endpoint's host. */
STRATA_C_EXPORT void strata_options_set_tls_server_name(strata_options_t* options,
                                                        const char* name);
STRATA_C_EXPORT void strata_options_set_rpc_timeout_ms(strata_options_t* options, uint32_t ms);
STRATA_C_EXPORT void strata_options_set_transfer_timeout_ms(strata_options_t* options, uint32_t ms);
STRATA_C_EXPORT void strata_options_set_verify_crc(strata_options_t* options, int on);
STRATA_C_EXPORT void strata_options_set_remote_fetch(strata_options_t* options, int on);
STRATA_C_EXPORT void strata_options_set_lookup_fast_path(strata_options_t* options, int on);
STRATA_C_EXPORT void strata_options_set_same_node(strata_options_t* options, int on);
/* "auto", "rma" or "push". */
STRATA_C_EXPORT void strata_options_set_fetch_transfer(strata_options_t* options, const char* how);
/* 0: fetched blocks land in the CPU caches (default 1: written around them, see
 * ClientOptions::fetch_bypasses_cache). */
STRATA_C_EXPORT void strata_options_set_fetch_bypasses_cache(strata_options_t* options, int on);
/* The engine's PYTHONHASHSEED, for namespaces with a vLLM id scheme (default: this process's
 * PYTHONHASHSEED, else vLLM's fixed default). */
STRATA_C_EXPORT void strata_options_set_vllm_hash_seed(strata_options_t* options,
                                                       const char* seed);
/* Silences the library's diagnostics (otherwise warnings go to stderr). */
STRATA_C_EXPORT void strata_options_set_quiet(strata_options_t* options, int on);

/* A namespace: what must match for two blocks to be interchangeable. */
STRATA_C_EXPORT strata_ns_spec_t* strata_ns_spec_create(void);
STRATA_C_EXPORT void strata_ns_spec_destroy(strata_ns_spec_t* spec);
STRATA_C_EXPORT void strata_ns_spec_set_model(strata_ns_spec_t* spec, const char* model_id,
                                              const char* revision);
/* dtype: "fp16", "bf16", "fp32" or "fp8_e4m3"; mla_latent: one tensor per layer. */
STRATA_C_EXPORT int strata_ns_spec_set_layout(strata_ns_spec_t* spec, uint32_t num_layers,
                                              uint32_t num_kv_heads, uint32_t head_dim,
                                              const char* dtype, uint32_t tokens_per_block,
                                              int mla_latent, char** errptr);
STRATA_C_EXPORT void strata_ns_spec_set_parallel(strata_ns_spec_t* spec, uint32_t tp_rank,
                                                 uint32_t tp_size);
STRATA_C_EXPORT void strata_ns_spec_set_lora(strata_ns_spec_t* spec, const char* lora_id);
/* "opaque" (stored as given; the default) or a codec spec such as "int8". */
STRATA_C_EXPORT void strata_ns_spec_set_codec(strata_ns_spec_t* spec, const char* codec_policy);
/* "strata" (the default), "vllm" or "vllm_cbor": block ids are derived as vLLM names its blocks
 * with prefix_caching_hash_algo "sha256" or "sha256_cbor". */
STRATA_C_EXPORT int strata_ns_spec_set_id_scheme(strata_ns_spec_t* spec, const char* scheme,
                                                 char** errptr);
/* Uncompressed bytes of one block of the spec's layout (0 before a layout is set). */
STRATA_C_EXPORT uint64_t strata_ns_spec_block_bytes(const strata_ns_spec_t* spec);

STRATA_C_EXPORT strata_client_t* strata_connect(const strata_options_t* options, char** errptr);
STRATA_C_EXPORT void strata_close(strata_client_t* client);
/* The daemon's node id (owned by the client). */
STRATA_C_EXPORT const char* strata_node_id(const strata_client_t* client);

/* replicas: copies per block across the cluster; 0 takes the daemon's default. */
STRATA_C_EXPORT int strata_open_namespace(strata_client_t* client, const strata_ns_spec_t* spec,
                                          const char* tenant, uint32_t replicas,
                                          strata_id_t* ns_out, char** errptr);

STRATA_C_EXPORT int strata_register_buffer(strata_client_t* client, void* data, size_t size,
                                           char** errptr);
STRATA_C_EXPORT int strata_unregister_buffer(strata_client_t* client, void* data, char** errptr);

/* Ids of the full blocks of `tokens` in namespace `ns` (no daemon call); writes
 * n_tokens / tokens_per_block ids to ids_out, and that count to *n_ids_out. */
STRATA_C_EXPORT int strata_block_ids(strata_client_t* client, const strata_id_t* ns,
                                     const uint32_t* tokens, size_t n_tokens, strata_id_t* ids_out,
                                     size_t ids_capacity, size_t* n_ids_out, char** errptr);

/* Publishes blocks[i] (sizes[i] bytes) as the i-th full block of `tokens`; status[i] is ok
 * (stored now) or exists (already there), or why not. *stored_out may be NULL. */
STRATA_C_EXPORT int strata_publish(strata_client_t* client, const strata_id_t* ns,
                                   const uint32_t* tokens, size_t n_tokens,
                                   const void* const* blocks, const size_t* sizes,
                                   size_t n_blocks, uint8_t* status, size_t* stored_out,
                                   char** errptr);
/* Publishes under known ids; parents[i] is the previous id of the chain (NULL: each id's
 * predecessor in `ids`, the first chained from the namespace). */
STRATA_C_EXPORT int strata_publish_ids(strata_client_t* client, const strata_id_t* ns,
                                       const strata_id_t* ids, const strata_id_t* parents,
                                       const void* const* blocks, const size_t* sizes,
                                       size_t n_blocks, uint8_t* status, size_t* stored_out,
                                       char** errptr);

/* Number of leading blocks of `tokens` that are cached. */
STRATA_C_EXPORT int strata_lookup(strata_client_t* client, const strata_id_t* ns,
                                  const uint32_t* tokens, size_t n_tokens, size_t* prefix_blocks,
                                  char** errptr);
STRATA_C_EXPORT int strata_lookup_ids(strata_client_t* client, const strata_id_t* ns,
                                      const strata_id_t* ids, size_t n_ids, size_t* prefix_blocks,
                                      char** errptr);

/* Fetches ids[i] into buffers[i] (capacities[i] bytes); sizes_out[i] (may be NULL) gets the
 * bytes written. */
STRATA_C_EXPORT int strata_fetch(strata_client_t* client, const strata_id_t* ns,
                                 const strata_id_t* ids, size_t n_ids, void* const* buffers,
                                 const size_t* capacities, uint8_t* status, uint64_t* sizes_out,
                                 size_t* fetched_out, char** errptr);

STRATA_C_EXPORT int strata_evict(strata_client_t* client, const strata_id_t* ns,
                                 const strata_id_t* ids, size_t n_ids, int cascade, uint8_t* status,
                                 char** errptr);
STRATA_C_EXPORT int strata_pin(strata_client_t* client, const strata_id_t* ns,
                               const strata_id_t* ids, size_t n_ids, uint32_t ttl_ms,
                               uint8_t* status, char** errptr);
STRATA_C_EXPORT int strata_unpin(strata_client_t* client, const strata_id_t* ns,
                                 const strata_id_t* ids, size_t n_ids, uint8_t* status,
                                 char** errptr);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_C_H_ */
