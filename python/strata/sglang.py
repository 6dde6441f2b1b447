"""Strata as an SGLang HiCache (L3) storage backend.

Launch SGLang with

    --enable-hierarchical-cache --hicache-storage-backend dynamic \
    --hicache-storage-backend-extra-config '{"backend_name": "strata",
        "module_path": "strata.sglang", "class_name": "StrataStorage",
        "interface_v1": 1, "endpoint": "127.0.0.1:7420", "tenant": "team-a"}'

SGLang's factory calls ``StrataStorage(storage_config, kwargs)`` and then
``register_mem_pool_host(host_pool)``. Until the host pool is registered every call misses.

Mapping (see docs/engines-sglang.md):
- one Strata namespace per (model, tp rank/size, pp/cp rank when > 1, host-pool shape); one
  SGLang page (page_size tokens) of the host pool is stored as the parts that the pool's
  ``get_page_buffer_meta`` names for it: K and V (page_first, page_first_direct, page_head),
  K and V of every layer (layer_first), or one latent part (MLA). Each part is one Strata
  block, so a page moves straight between the host pool and the daemon (zero copy), with no
  gather into a staging buffer.
- part id = sha256("strata-sglang/v1" | namespace id | host layout | key | part index): 32
  bytes, deterministic, different for every model / tp rank / layout.
- the parts of a batch are published as one chain (each part's parent is the part before it,
  the first one's is the last part of ``extra_info.prefix_keys[-1]`` when SGLang passes it),
  so Strata's prefix-aware eviction drops a chain from its tail and a prefix lookup stays a
  prefix.

A dead or slow daemon never raises into SGLang: a failed call returns misses / False within
about rpc_timeout (plus transfer_timeout for a transfer in flight), the connection is dropped,
further calls miss at once, and a reconnect is tried at most every ``retry_interval`` seconds.
One warning is logged per outage, and one line when it ends.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from typing import Any, List, Optional

import torch

from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage, HiCacheStorageConfig,
                                                  HiCacheStorageExtraInfo)

import strata
from strata.errors import InvalidArgumentError

logger = logging.getLogger(__name__)

_ZERO_ID = bytes(32)
_DTYPES = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
}
if hasattr(torch, "float8_e4m3fn"):
    _DTYPES[torch.float8_e4m3fn] = "fp8_e4m3"

_OK = (strata.BlockStatus.OK, strata.BlockStatus.EXISTS)


def _page_buffer(pool) -> Optional[torch.Tensor]:
    """The host pool's one big tensor (what to register for zero-copy transfers)."""
    for name in ("kv_buffer", "k_buffer"):
        t = getattr(pool, name, None)
        if isinstance(t, torch.Tensor):
            return t
    return None


class StrataStorage(HiCacheStorage):
    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self.config = storage_config
        self.endpoint = (extra.get("endpoint") or os.environ.get("STRATA_ENDPOINT")
                         or "127.0.0.1:7420")
        self.tenant = str(extra.get("tenant") or os.environ.get("STRATA_TENANT") or "sglang")
        self.rpc_timeout = float(extra.get("rpc_timeout", 2.0))
        self.transfer_timeout = float(extra.get("transfer_timeout", max(2.0, self.rpc_timeout)))
        self.retry_interval = float(extra.get("retry_interval", 5.0))
        self.max_ids_per_call = max(2, int(extra.get("max_ids_per_call", 512)))
        self.track_limit = int(extra.get("clear_track_limit", 1 << 20))
        self.register_pool = bool(extra.get("register_buffer", True))

        self.is_mla = bool(storage_config.is_mla_model)
        self.is_writer = bool(getattr(storage_config, "is_storage_writer", True))
        model = str(extra.get("model_id") or storage_config.model_name or "unknown-model")
        # The MLA latent is the same on every tp rank: one copy, shared (only the writer rank
        # publishes). Ranks that hold different data are separate namespaces.
        if self.is_mla:
            self.tp_rank, self.tp_size = 0, 1
            if getattr(storage_config, "dcp_size", 1) > 1:
                model += f"#dcp{storage_config.dcp_rank}/{storage_config.dcp_size}"
        else:
            self.tp_rank, self.tp_size = int(storage_config.tp_rank), int(storage_config.tp_size)
        if storage_config.pp_size > 1:
            model += f"#pp{storage_config.pp_rank}/{storage_config.pp_size}"
        if storage_config.attn_cp_size > 1:
            model += f"#cp{storage_config.attn_cp_rank}/{storage_config.attn_cp_size}"
        self.model_id = model

        self.mem_pool_host = None
        self._layout = None         # host pool layout name: part of every id
        self._parts = 0             # Strata blocks per page
        self._part_bytes: List[int] = []
        self._flat_to_part: List[int] = []  # legacy flat page chunk c holds part _flat_to_part[c]
        self._spec = None           # open_namespace arguments
        self._pool_region = None    # (address, nbytes) registered for zero copy

        self._lock = threading.Lock()
        self._client = None
        self._ns = None
        self._seed = b""
        self._next_attempt = 0.0
        self._down = False          # an outage is being reported
        self._written: set = set()  # ids this backend published (for clear)
        self._written_overflow = False
        self._counters = dict(get_hits=0, get_misses=0, set_pages=0, set_failures=0,
                              exists_calls=0, errors=0, reconnects=0)
        self._prefetch_pgs: List[int] = []
        self._backup_pgs: List[int] = []
        self._prefetch_bw: List[float] = []
        self._backup_bw: List[float] = []
        self._metrics = bool(getattr(storage_config, "enable_storage_metrics", False))
        self._meta_warned = False

    # ---- setup ---------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host) -> None:
        super().register_mem_pool_host(mem_pool_host)
        pool = mem_pool_host
        page = int(pool.page_size)
        self._layout = str(getattr(pool, "layout", "unknown"))
        try:
            ptrs, sizes = pool.get_page_buffer_meta(torch.arange(page, dtype=torch.int64))
            self._parts = len(ptrs)
            self._part_bytes = [int(s) for s in sizes]
        except Exception as e:  # a layout without zero-copy metadata: one blob per page
            logger.warning("strata: host pool layout %s has no page buffer meta (%s); "
                           "batch_get_v1/batch_set_v1 will miss", self._layout, e)
            n = pool.get_dummy_flat_data_page().numel() * pool.dtype.itemsize
            self._parts, self._part_bytes = 1, [int(n)]
        layers = int(getattr(pool, "layer_num", 1))
        if self._layout == "layer_first" and self._parts == 2 * layers:
            # meta order is K0 V0 K1 V1 ...; a flat data page is K0 K1 ... V0 V1 ...
            self._flat_to_part = [2 * (c % layers) + c // layers for c in range(self._parts)]
        else:
            self._flat_to_part = list(range(self._parts))
        dtype = _DTYPES.get(pool.dtype)
        if dtype is None:
            raise ValueError(f"strata: unsupported host pool dtype {pool.dtype}")
        self._spec = dict(model_id=self.model_id, num_layers=layers,
                          num_kv_heads=int(getattr(pool, "head_num", 1) or 1),
                          head_dim=int(pool.head_dim), dtype=dtype, tokens_per_block=page,
                          tenant=self.tenant, revision=f"sglang-{self._layout}",
                          kind="mla" if self.is_mla else "kv",
                          tp_rank=self.tp_rank, tp_size=self.tp_size)
        buf = _page_buffer(pool)
        if self.register_pool and buf is not None:
            self._pool_region = (buf.data_ptr(), buf.numel() * buf.element_size())
        with self._lock:
            self._client = None      # reconnect with the new layout on the next call
            self._next_attempt = 0.0
        self._session()              # connect now when the daemon is up; a miss otherwise

    # ---- connection ----------------------------------------------------------------------

    def _session(self):
        """(client, ns, seed), or None while the daemon is unreachable."""
        with self._lock:
            if self._client is not None:
                return self._client, self._ns, self._seed
            if self._spec is None or time.monotonic() < self._next_attempt:
                return None
            try:
                client = strata.Client(self.endpoint, rpc_timeout=self.rpc_timeout,
                                       transfer_timeout=self.transfer_timeout,
                                       client_name=f"sglang-tp{self.tp_rank}", quiet=True)
                ns = client.open_namespace(**self._spec)
                if self._pool_region is not None:
                    client.register_buffer(self._pool_region)
            except Exception as e:
                self._next_attempt = time.monotonic() + self.retry_interval
                self._report_down(e)
                return None
            self._client, self._ns = client, ns
            self._seed = (b"strata-sglang/v1\0" + ns + self._layout.encode() + b"\0")
            if self._down:
                logger.warning("strata: stratad at %s is reachable again", self.endpoint)
                self._counters["reconnects"] += 1
            self._down = False
            return client, ns, self._seed

    def _report_down(self, e: BaseException) -> None:
        self._counters["errors"] += 1
        if not self._down:
            self._down = True
            logger.warning("strata: stratad at %s unavailable (%s: %s); HiCache L3 misses "
                           "until it is back (retry every %.1fs)", self.endpoint,
                           type(e).__name__, e, self.retry_interval)

    def _failed(self, client, e: BaseException) -> None:
        """A call on `client` raised: drop the connection unless it was our own bad argument."""
        if isinstance(e, InvalidArgumentError):
            self._counters["errors"] += 1
            logger.error("strata: rejected call (%s)", e)
            return
        with self._lock:
            if self._client is client:
                # Not closed here: another thread may still be inside a call on it; the last
                # reference going away releases it.
                self._client = None
                self._next_attempt = time.monotonic() + self.retry_interval
            self._report_down(e)

    # ---- ids -----------------------------------------------------------------------------

    def _ids(self, seed: bytes, keys: List[str]) -> List[bytes]:
        out = []
        for key in keys:
            base = seed + key.encode()
            for p in range(self._parts):
                out.append(hashlib.sha256(base + b"\0" + p.to_bytes(2, "little")).digest())
        return out

    def _first_parent(self, seed: bytes, extra_info) -> bytes:
        prefix = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
        if prefix:
            return self._ids(seed, [prefix[-1]])[-1]
        return _ZERO_ID

    # ---- transfers (shared by both paths) ------------------------------------------------

    def _publish(self, keys, extra_info, buffers) -> List[bool]:
        """buffers[i*parts + p] = (address, nbytes) of part p of page i."""
        n = len(keys)
        s = self._session()
        if s is None:
            return [False] * n
        client, ns, seed = s
        ids = self._ids(seed, keys)
        parents = [self._first_parent(seed, extra_info)] + ids[:-1]
        ok = [True] * len(ids)
        step = self.max_ids_per_call - self.max_ids_per_call % self._parts
        for lo in range(0, len(ids), step):
            hi = min(lo + step, len(ids))
            try:
                r = client.publish_ids(ns, ids[lo:hi], buffers[lo:hi], parents[lo:hi])
            except Exception as e:
                self._failed(client, e)
                ok[lo:] = [False] * (len(ids) - lo)
                break
            for j, st in enumerate(r.status):
                ok[lo + j] = st in _OK
        per_key = [all(ok[i * self._parts:(i + 1) * self._parts]) for i in range(n)]
        if not self._written_overflow:
            for i, good in enumerate(per_key):
                if good:
                    self._written.update(ids[i * self._parts:(i + 1) * self._parts])
            if len(self._written) > self.track_limit:
                self._written_overflow = True
                self._written.clear()
                logger.warning("strata: more than %d ids written; clear() will not evict them",
                               self.track_limit)
        good = sum(per_key)
        self._counters["set_pages"] += good
        self._counters["set_failures"] += n - good
        return per_key

    def _fetch(self, keys, buffers) -> List[bool]:
        """Per key: all its parts arrived whole into buffers."""
        n = len(keys)
        s = self._session()
        if s is None:
            return [False] * n
        client, ns, seed = s
        ids = self._ids(seed, keys)
        ok = [False] * len(ids)
        step = self.max_ids_per_call - self.max_ids_per_call % self._parts
        for lo in range(0, len(ids), step):
            hi = min(lo + step, len(ids))
            try:
                r = client.fetch(ns, ids[lo:hi], buffers[lo:hi])
            except Exception as e:
                self._failed(client, e)
                break
            for j, st in enumerate(r.status):
                ok[lo + j] = st == strata.BlockStatus.OK and r.sizes[j] == buffers[lo + j][1]
            if not all(ok[lo:hi]):
                break  # SGLang uses pages only up to the first miss
        return [all(ok[i * self._parts:(i + 1) * self._parts]) for i in range(n)]

    # ---- zero-copy interface (extra_config interface_v1) ---------------------------------

    def _page_meta(self, keys, host_indices):
        """(address, nbytes) of every part of the pages, or None (logged once) if the pool
        cannot say."""
        try:
            ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
            if len(ptrs) != len(keys) * self._parts:
                raise ValueError(f"{len(ptrs)} page parts for {len(keys)} keys "
                                 f"(expected {self._parts} per page)")
        except Exception as e:
            if not self._meta_warned:
                self._meta_warned = True
                logger.error("strata: no zero-copy page addresses from the host pool (%s); "
                             "batch_get_v1/batch_set_v1 miss", e)
            return None
        return list(zip(ptrs, sizes))

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        if not keys:
            return []
        if self.mem_pool_host is None:
            return [False] * len(keys)
        meta = self._page_meta(keys, host_indices)
        if meta is None:
            return [False] * len(keys)
        t0 = time.perf_counter()
        got = self._fetch(keys, meta)
        out, hit = [], True
        for g in got:
            hit = hit and g
            out.append(hit)
        pages = sum(out)
        self._counters["get_hits"] += pages
        self._counters["get_misses"] += len(keys) - pages
        if self._metrics and pages:
            self._prefetch_pgs.append(pages)
            self._prefetch_bw.append(pages * sum(self._part_bytes) / 1e9
                                     / max(time.perf_counter() - t0, 1e-9))
        return out

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        if not keys:
            return []
        if not self.is_writer:
            return [True] * len(keys)  # MLA: one rank writes the shared latent
        if self.mem_pool_host is None:
            return [False] * len(keys)
        meta = self._page_meta(keys, host_indices)
        if meta is None:
            return [False] * len(keys)
        t0 = time.perf_counter()
        out = self._publish(keys, extra_info, meta)
        if self._metrics and any(out):
            self._backup_pgs.append(sum(out))
            self._backup_bw.append(sum(out) * sum(self._part_bytes) / 1e9
                                   / max(time.perf_counter() - t0, 1e-9))
        return out

    # ---- existence -----------------------------------------------------------------------

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """How many keys, from the first, are stored whole."""
        if not keys:
            return 0
        s = self._session()
        if s is None:
            return 0
        client, ns, seed = s
        self._counters["exists_calls"] += 1
        ids = self._ids(seed, keys)
        step = self.max_ids_per_call - self.max_ids_per_call % self._parts
        found = 0
        for lo in range(0, len(ids), step):
            chunk = ids[lo:lo + step]
            try:
                n = client.lookup_ids(ns, chunk)
            except Exception as e:
                self._failed(client, e)
                break
            found += n
            if n < len(chunk):
                break
        return found // self._parts

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ---- tensor-copy interface -----------------------------------------------------------

    def _flat_parts(self, t: torch.Tensor):
        """(address, nbytes) of each part of a flat page tensor, in part order."""
        chunks = [None] * self._parts
        addr = t.data_ptr()
        for c, p in enumerate(self._flat_to_part):
            size = self._part_bytes[p]
            chunks[p] = (addr, size)
            addr += size
        return chunks

    def _page_nbytes(self) -> int:
        return sum(self._part_bytes)

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Optional[torch.Tensor]]:
        if not keys:
            return []
        if self.mem_pool_host is None:
            return [None] * len(keys)
        dsts, copy_back, buffers, usable = [], [], [], []
        for i in range(len(keys)):
            t = target_locations[i] if target_locations is not None else None
            if t is None:
                t = self.mem_pool_host.get_dummy_flat_data_page()
            if t.device.type != "cpu" or t.numel() * t.element_size() != self._page_nbytes():
                usable.append(False)
                dsts.append(t)
                copy_back.append(None)
                buffers.extend([(0, 0)] * self._parts)
                continue
            work = t if t.is_contiguous() else t.contiguous()
            dsts.append(t)
            copy_back.append(work if work is not t else None)
            usable.append(True)
            buffers.extend(self._flat_parts(work))
        # Keys whose target we cannot fill are fetched nowhere (and reported as misses).
        keep = [i for i in range(len(keys)) if usable[i]]
        got = [False] * len(keys)
        if keep:
            sub = self._fetch([keys[i] for i in keep],
                              [b for i in keep for b in buffers[i * self._parts:(i + 1) * self._parts]])
            for i, g in zip(keep, sub):
                got[i] = g
        out = []
        for i, t in enumerate(dsts):
            if got[i]:
                if copy_back[i] is not None:
                    t.copy_(copy_back[i])
                out.append(t)
            else:
                out.append(None)
        hits = sum(got)
        self._counters["get_hits"] += hits
        self._counters["get_misses"] += len(keys) - hits
        return out

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Optional[torch.Tensor]:
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        if not keys:
            return True
        if not self.is_writer:
            return True
        if self.mem_pool_host is None or values is None or len(values) != len(keys):
            return False
        flats, buffers = [], []
        for v in values:
            flat = v.detach().to("cpu").contiguous().reshape(-1)
            if flat.numel() * flat.element_size() != self._page_nbytes():
                logger.error("strata: batch_set value of %d bytes, a page is %d bytes",
                             flat.numel() * flat.element_size(), self._page_nbytes())
                return False
            flats.append(flat)  # keeps the bytes alive through the call
            buffers.extend(self._flat_parts(flat))
        return all(self._publish(keys, None, buffers))

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        if value is None:
            return False
        return self.batch_set([key], [value])

    # ---- housekeeping --------------------------------------------------------------------

    def clear(self) -> None:
        """Evicts the pages this backend object published (up to clear_track_limit ids)."""
        ids = list(self._written)
        self._written.clear()
        self._written_overflow = False
        s = self._session()
        if s is None or not ids:
            return
        client, ns, _ = s
        for lo in range(0, len(ids), self.max_ids_per_call):
            try:
                client.evict(ns, ids[lo:lo + self.max_ids_per_call])
            except Exception as e:
                self._failed(client, e)
                return

    def get_stats(self):
        """SGLang's StorageMetrics (drained on each call); Strata counters: `counters()`."""
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except Exception:
            return None
        m = StorageMetrics()
        m.prefetch_pgs, self._prefetch_pgs = self._prefetch_pgs, []
        m.backup_pgs, self._backup_pgs = self._backup_pgs, []
        m.prefetch_bandwidth, self._prefetch_bw = self._prefetch_bw, []
        m.backup_bandwidth, self._backup_bw = self._backup_bw, []
        return m

    def counters(self) -> dict:
        return dict(self._counters, connected=self._client is not None)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
            self._next_attempt = float("inf")
        if client is not None:
            try:
                client.close()
            except Exception:
                pass
