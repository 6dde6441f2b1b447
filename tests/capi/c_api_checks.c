/* The C ABI exercised from C: compiled as C11, so strata/c.h must stay C. Each check returns 0
 * or writes what went wrong into `failure`. */
#include "c_api_checks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata/c.h"

#define FAIL(...)                             \
  do {                                        \
    snprintf(failure, failure_size, __VA_ARGS__); \
    goto done;                                \
  } while (0)

enum { kTokensPerBlock = 16, kBlocks = 3 };

static strata_ns_spec_t* SmallSpec(const char* scheme, char** err) {
  strata_ns_spec_t* spec = strata_ns_spec_create();
  strata_ns_spec_set_model(spec, "c-abi/model", "r1");
  if (strata_ns_spec_set_layout(spec, 2, 1, 64, "bf16", kTokensPerBlock, 0, err) != 0 ||
      strata_ns_spec_set_id_scheme(spec, scheme, err) != 0) {
    strata_ns_spec_destroy(spec);
    return NULL;
  }
  return spec;
}

int CheckRoundTrip(const char* endpoint, char* failure, size_t failure_size) {
  int ok = 1;
  char* err = NULL;
  strata_client_t* client = NULL;
  strata_ns_spec_t* spec = NULL;
  uint8_t* blocks[kBlocks] = {0};
  uint8_t* out[kBlocks] = {0};
  strata_options_t* options = strata_options_create();
  strata_options_set_endpoint(options, endpoint);
  strata_options_set_client_name(options, "c-abi-test");
  strata_options_set_rpc_timeout_ms(options, 5000);
  /* Fetched bytes through the caches here; every C++ test fetches around them. */
  strata_options_set_fetch_bypasses_cache(options, 0);
  client = strata_connect(options, &err);
  strata_options_destroy(options);
  if (client == NULL) FAIL("connect: %s", err);
  if (strata_node_id(client)[0] == '\0') FAIL("empty node id");

  spec = SmallSpec("strata", &err);
  if (spec == NULL) FAIL("spec: %s", err);
  const size_t block_bytes = (size_t)strata_ns_spec_block_bytes(spec);
  if (block_bytes != 2u * 2 * 1 * 64 * 2 * kTokensPerBlock) FAIL("block bytes %zu", block_bytes);
  strata_id_t ns;
  if (strata_open_namespace(client, spec, "tenant-c", 0, &ns, &err) != 0) FAIL("open: %s", err);

  uint32_t tokens[kBlocks * kTokensPerBlock + 5];
  for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; ++i) tokens[i] = (uint32_t)(7 * i + 1);
  const size_t n_tokens = sizeof tokens / sizeof tokens[0];
  const void* sources[kBlocks];
  size_t sizes[kBlocks];
  for (int b = 0; b < kBlocks; ++b) {
    blocks[b] = malloc(block_bytes);
    for (size_t i = 0; i < block_bytes; ++i) blocks[b][i] = (uint8_t)(i * 13 + b);
    sources[b] = blocks[b];
    sizes[b] = block_bytes;
  }
  /* Publish two of the three blocks, then all three: the first two deduplicate. */
  uint8_t status[kBlocks];
  size_t stored = 0;
  if (strata_publish(client, &ns, tokens, n_tokens, sources, sizes, 2, status, &stored, &err) != 0)
    FAIL("publish: %s", err);
  if (stored != 2 || status[0] != strata_block_status_ok) FAIL("publish stored %zu", stored);
  if (strata_publish(client, &ns, tokens, n_tokens, sources, sizes, kBlocks, status, &stored,
                     &err) != 0)
    FAIL("publish again: %s", err);
  if (stored != 1 || status[0] != strata_block_status_exists || status[2] != strata_block_status_ok)
    FAIL("second publish: stored %zu, status %s/%s", stored, strata_block_status_name(status[0]),
         strata_block_status_name(status[2]));

  size_t prefix = 0;
  if (strata_lookup(client, &ns, tokens, n_tokens, &prefix, &err) != 0) FAIL("lookup: %s", err);
  if (prefix != kBlocks) FAIL("lookup prefix %zu", prefix);

  strata_id_t ids[kBlocks + 1];
  size_t n_ids = 0;
  if (strata_block_ids(client, &ns, tokens, n_tokens, ids, kBlocks + 1, &n_ids, &err) != 0)
    FAIL("block ids: %s", err);
  if (n_ids != kBlocks) FAIL("%zu ids", n_ids);
  /* A capacity too small is an error, not an overflow. */
  if (strata_block_ids(client, &ns, tokens, n_tokens, ids, 1, &n_ids, &err) == 0)
    FAIL("block ids into a 1-id array succeeded");

  void* dst[kBlocks];
  size_t capacities[kBlocks];
  uint64_t got[kBlocks];
  size_t fetched = 0;
  for (int b = 0; b < kBlocks; ++b) {
    out[b] = calloc(1, block_bytes);
    dst[b] = out[b];
    capacities[b] = block_bytes;
  }
  if (strata_register_buffer(client, out[0], block_bytes, &err) != 0) FAIL("register: %s", err);
  if (strata_fetch(client, &ns, ids, kBlocks, dst, capacities, status, got, &fetched, &err) != 0)
    FAIL("fetch: %s", err);
  if (fetched != kBlocks) FAIL("fetched %zu", fetched);
  for (int b = 0; b < kBlocks; ++b)
    if (got[b] != block_bytes || memcmp(out[b], blocks[b], block_bytes) != 0)
      FAIL("block %d differs after fetch", b);
  if (strata_unregister_buffer(client, out[0], &err) != 0) FAIL("unregister: %s", err);
  /* A buffer with no address but room for the block is refused (3), nothing written. */
  {
    void* none[1] = {NULL};
    uint8_t st = 0xee;
    int rc = strata_fetch(client, &ns, ids, 1, none, capacities, &st, got, &fetched, &err);
    if (rc != 3) FAIL("fetch into a NULL buffer: rc %d", rc);
    strata_free(err);
    err = NULL;
  }

  /* Pin protects from eviction; unpin and evict with cascade remove the chain. */
  if (strata_pin(client, &ns, ids, 1, 60000, status, &err) != 0) FAIL("pin: %s", err);
  if (status[0] != strata_block_status_ok) FAIL("pin: %s", strata_block_status_name(status[0]));
  if (strata_evict(client, &ns, ids, 1, 0, status, &err) != 0) FAIL("evict pinned: %s", err);
  if (status[0] != strata_block_status_pinned)
    FAIL("evicting a pinned block: %s", strata_block_status_name(status[0]));
  if (strata_unpin(client, &ns, ids, 1, status, &err) != 0) FAIL("unpin: %s", err);
  if (strata_evict(client, &ns, ids, 1, 1, status, &err) != 0) FAIL("evict: %s", err);
  if (strata_lookup_ids(client, &ns, ids, kBlocks, &prefix, &err) != 0) FAIL("lookup ids: %s", err);
  if (prefix != 0) FAIL("after a cascading evict the prefix is %zu", prefix);

  /* A fetch of what is gone reports it per block. */
  if (strata_fetch(client, &ns, ids, kBlocks, dst, capacities, status, got, &fetched, &err) != 0)
    FAIL("fetch after evict: %s", err);
  if (fetched != 0 || status[1] != strata_block_status_not_found)
    FAIL("fetch after evict: %zu fetched, status %s", fetched, strata_block_status_name(status[1]));
  ok = 0;
done:
  for (int b = 0; b < kBlocks; ++b) {
    free(blocks[b]);
    free(out[b]);
  }
  strata_ns_spec_destroy(spec);
  strata_close(client);
  strata_free(err);
  return ok;
}

int CheckErrors(const char* endpoint, char* failure, size_t failure_size) {
  int ok = 1;
  char* err = NULL;
  strata_client_t* client = NULL;
  strata_ns_spec_t* spec = strata_ns_spec_create();
  /* A layout with a zero field is refused with a message that names the field. */
  int rc = strata_ns_spec_set_layout(spec, 0, 1, 64, "bf16", 16, 0, &err);
  if (rc != 3 || err == NULL || strstr(err, "num_layers") == NULL)
    FAIL("bad layout: rc %d, %s", rc, err ? err : "(no message)");
  rc = strata_ns_spec_set_layout(spec, 2, 1, 64, "float13", 16, 0, &err);
  if (rc != 3 || strstr(err, "float13") == NULL) FAIL("bad dtype: rc %d, %s", rc, err);
  rc = strata_ns_spec_set_id_scheme(spec, "sglang", &err);
  if (rc != 3 || strstr(err, "sglang") == NULL) FAIL("bad id scheme: rc %d, %s", rc, err);

  /* Nobody listens on port 1: connect fails within the deadline with a message. */
  strata_options_t* options = strata_options_create();
  strata_options_set_endpoint(options, "127.0.0.1:1");
  strata_options_set_rpc_timeout_ms(options, 1000);
  client = strata_connect(options, &err);
  strata_options_destroy(options);
  if (client != NULL || err == NULL || err[0] == '\0') FAIL("connect to a dead port succeeded");

  /* TLS with a CA file that is not there: refused before dialing, naming the field. */
  options = strata_options_create();
  strata_options_set_endpoint(options, endpoint);
  strata_options_set_tls(options, "/nonexistent/strata-ca.pem", NULL, NULL);
  strata_options_set_tls_server_name(options, "localhost");
  client = strata_connect(options, &err);
  strata_options_destroy(options);
  if (client != NULL || err == NULL || strstr(err, "tls.ca_file") == NULL)
    FAIL("TLS with a missing CA file: %s", err ? err : "(connected)");

  options = strata_options_create();
  strata_options_set_endpoint(options, endpoint);
  client = strata_connect(options, &err);
  strata_options_destroy(options);
  if (client == NULL) FAIL("connect: %s", err);
  /* A namespace this client never opened. */
  strata_id_t unknown;
  memset(&unknown, 0xab, sizeof unknown);
  size_t prefix = 0;
  uint32_t tokens[32] = {0};
  rc = strata_lookup(client, &unknown, tokens, 32, &prefix, &err);
  if (rc == 0 || strstr(err, "not opened") == NULL) FAIL("lookup in an unknown namespace: %d %s", rc, err);
  rc = strata_lookup(client, &unknown, tokens, 32, NULL, &err);
  if (rc != 3) FAIL("NULL prefix_blocks: rc %d", rc);
  ok = 0;
done:
  strata_ns_spec_destroy(spec);
  strata_close(client);
  strata_free(err);
  return ok;
}

int CheckVllmScheme(const char* endpoint, char* failure, size_t failure_size) {
  int ok = 1;
  char* err = NULL;
  strata_client_t* client = NULL;
  strata_ns_spec_t* spec = NULL;
  strata_options_t* options = strata_options_create();
  strata_options_set_endpoint(options, endpoint);
  strata_options_set_vllm_hash_seed(options, "0");
  client = strata_connect(options, &err);
  strata_options_destroy(options);
  if (client == NULL) FAIL("connect: %s", err);
  spec = SmallSpec("vllm", &err);
  if (spec == NULL) FAIL("spec: %s", err);
  strata_id_t ns, other;
  if (strata_open_namespace(client, spec, "tenant-c", 0, &ns, &err) != 0) FAIL("open: %s", err);
  strata_ns_spec_set_id_scheme(spec, "strata", &err);
  if (strata_open_namespace(client, spec, "tenant-c", 0, &other, &err) != 0) FAIL("open: %s", err);
  if (memcmp(&ns, &other, sizeof ns) == 0) FAIL("the id scheme does not change the namespace");
  uint32_t tokens[2 * kTokensPerBlock];
  for (int i = 0; i < 2 * kTokensPerBlock; ++i) tokens[i] = (uint32_t)(i + 1);
  strata_id_t vllm_ids[2], strata_ids[2];
  size_t n = 0;
  if (strata_block_ids(client, &ns, tokens, 2 * kTokensPerBlock, vllm_ids, 2, &n, &err) != 0)
    FAIL("vllm ids: %s", err);
  if (strata_block_ids(client, &other, tokens, 2 * kTokensPerBlock, strata_ids, 2, &n, &err) != 0)
    FAIL("strata ids: %s", err);
  if (memcmp(vllm_ids, strata_ids, sizeof vllm_ids) == 0) FAIL("the two schemes gave the same ids");
  /* vLLM's ids do not depend on the namespace: two tenants name a prompt alike. */
  strata_id_t tenant_b, ids_b[2];
  strata_ns_spec_set_id_scheme(spec, "vllm", &err);
  if (strata_open_namespace(client, spec, "tenant-d", 0, &tenant_b, &err) != 0) FAIL("open: %s", err);
  if (strata_block_ids(client, &tenant_b, tokens, 2 * kTokensPerBlock, ids_b, 2, &n, &err) != 0)
    FAIL("vllm ids b: %s", err);
  if (memcmp(vllm_ids, ids_b, sizeof ids_b) != 0) FAIL("vllm ids differ between tenants");
  ok = 0;
done:
  strata_ns_spec_destroy(spec);
  strata_close(client);
  strata_free(err);
  return ok;
}
