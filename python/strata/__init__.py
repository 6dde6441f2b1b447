"""Strata: a distributed KV-cache store for LLM serving.

    import strata, numpy as np
    client = strata.Client("127.0.0.1:7420")
    ns = client.open_namespace("my/model", num_layers=2, num_kv_heads=1, head_dim=64,
                               dtype="bf16", tokens_per_block=32, tenant="team-a")
    client.publish(ns, tokens, [block0, block1])   # numpy arrays, torch tensors, bytearrays
    hit = client.lookup(ns, tokens)                # hit.prefix_blocks, hit.ids
    client.fetch(ns, hit.ids[:hit.prefix_blocks], [out0, out1])

On a GPU node whose stratad has a GPU tier, blocks go straight into the engine's device memory:
    loan = client.lend_device_buffer(kv_tensor)      # a contiguous CUDA tensor, lent once
    client.fetch_to_device(ns, loan, ids, offsets)   # offsets in bytes into the tensor
    client.publish_from_device(ns, loan, ids, offsets, sizes)  # and back out (encoded there)

Blocks go to another node, or into a node's GPU tier (device to device over NCCL from another
node's GPU tier), ahead of a request:
    client.reposition(ns, ids, target_node="decode-0", target_tier="gpu")

Every call releases the GIL while it waits; the *_async variants return
concurrent.futures.Future objects (asyncio: `await asyncio.wrap_future(f)`).
"""

from concurrent.futures import Future, ThreadPoolExecutor

from . import errors
from ._strata import (BlockStatus, DeviceFetchResult, DeviceLoan, DevicePublishResult,
                      FetchResult, LookupResult, PublishResult, StandInDeviceBuffer,
                      vllm_block_hashes)
from ._strata import Client as _NativeClient
from .errors import StrataError

__all__ = ["Client", "BlockStatus", "PublishResult", "LookupResult", "FetchResult",
           "DeviceLoan", "DeviceFetchResult", "DevicePublishResult", "StandInDeviceBuffer", "StrataError", "errors",
           "vllm_block_hashes"]


class Client(_NativeClient):
    """A connection to the local stratad (thread-safe).

    Keyword arguments: endpoint, client_name, auth_token (the bearer token of a daemon with
    authentication: it decides the tenant), tls_ca_file (PEM CA of a daemon with TLS: turns
    TLS on), tls_cert_file and tls_key_file (a client certificate, which the daemon may map to a
    tenant instead of a token), tls_server_name (the name the daemon's certificate must carry,
    default the endpoint's host), rpc_timeout and transfer_timeout (seconds),
    verify_crc, remote_fetch, lookup_fast_path, fetch_transfer ("auto", "rma", "push"),
    fetch_bypasses_cache (False: fetched blocks land in the CPU caches), same_node,
    vllm_hash_seed, quiet, calibration_cache_bytes (memory for parsed pca/xl calibrations; the
    least recently used beyond it are asked of the daemon again; 0: no bound), and
    async_workers (threads behind the *_async calls).
    """

    def __init__(self, endpoint: str = "127.0.0.1:7420", *, async_workers: int = 4, **options):
        super().__init__(endpoint, **options)
        self._pool = ThreadPoolExecutor(max_workers=async_workers,
                                        thread_name_prefix="strata-async")

    def publish_async(self, ns, tokens, blocks) -> Future:
        return self._pool.submit(self.publish, ns, tokens, blocks)

    def publish_ids_async(self, ns, ids, blocks, parents=None) -> Future:
        return self._pool.submit(self.publish_ids, ns, ids, blocks, parents)

    def publish_from_device_async(self, ns, loan, ids, offsets, sizes, parents=None) -> Future:
        return self._pool.submit(self.publish_from_device, ns, loan, ids, offsets, sizes, parents)

    def lookup_async(self, ns, tokens) -> Future:
        return self._pool.submit(self.lookup, ns, tokens)

    def lookup_ids_async(self, ns, ids) -> Future:
        return self._pool.submit(self.lookup_ids, ns, ids)

    def fetch_async(self, ns, ids, buffers) -> Future:
        return self._pool.submit(self.fetch, ns, ids, buffers)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        super().close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
