"""vLLM (v1) KV connector backed by a local stratad.

Load it with::

    from vllm.config import KVTransferConfig
    KVTransferConfig(kv_connector="StrataConnector", kv_connector_module_path="strata.vllm",
                     kv_role="kv_both", kv_load_failure_policy="recompute",
                     kv_connector_extra_config={"strata.endpoint": "127.0.0.1:7420"})

``kv_load_failure_policy="recompute"`` matters: blocks that cannot be loaded (daemon down, block
evicted between lookup and fetch, CRC mismatch) are reported through
``get_block_ids_with_load_errors()`` and vLLM recomputes them. With vLLM's default "fail" those
requests would end with an error.

Extra config keys (``kv_connector_extra_config``):

``strata.endpoint``        stratad address; default ``$STRATA_ENDPOINT`` or ``127.0.0.1:7420``.
``strata.tenant``          tenant of the namespace; default ``"default"``.
``strata.rpc_timeout``     seconds for each call to stratad (lookup, fetch, publish); default 1.0.
``strata.retry_after``     seconds; after a failed call the connector treats stratad as down and
                           reports misses / drops saves without calling it until this has passed;
                           default 10.
``strata.model_id``        model id of the namespace; default vLLM's model name (``--model``).
``strata.staging_mib``     MiB of host staging memory on each worker, split in half between loads
                           and saves (at least 2 blocks each); default 64.
``strata.max_inflight_saves``  publish calls in flight per worker; a step's saves are dropped
                           (counted as ``save_blocks_dropped``) rather than waited for when this
                           many are pending or no staging slot is free; default 4.
``strata.device_loads``    ``"auto"`` (default): when the KV caches are CUDA tensors and stratad
                           has a GPU tier, the worker lends stratad a device buffer of load slots
                           and hits are copied into it device to device (counted as
                           ``device_blocks_loaded``), then scattered on the device; otherwise
                           through host staging. ``"off"``; ``"stand-in"``: host memory standing
                           in for that buffer, for daemons whose GPU tier is a stand-in.
``strata.device_saves``    the same choice for saves: with a GPU tier, the worker lends stratad a
                           device buffer of save slots, gathers a step's blocks into it on the
                           device and stratad publishes them out of it (encoding them on the
                           device under a codec; counted as ``device_blocks_saved``), so no save
                           crosses to the engine's host memory. Default ``"auto"``.

What it does. A Strata block is one vLLM KV block of every attention layer: the bytes of
``kv_layer[block_id]`` for each layer, concatenated in layer order (on CPU a layer tensor is
``[num_blocks, kv_heads, block_size, 2*head_dim]``: whole blocks are copied, never per-token
slices). Block ids are vLLM's own ``request.block_hashes`` (32-byte sha256 / sha256_cbor chain
hashes); the namespace is opened with ``id_scheme="vllm"`` (prefix_caching_hash_algo "sha256") or
``"vllm_cbor"`` ("sha256_cbor"; falls back to "vllm" when this stratad refuses that name).
xxhash algorithms seed their hashes per process, so nothing could be shared: the connector then
stays off (every lookup is a miss).

Scheduler side: ``get_num_new_matched_tokens`` asks stratad (``lookup_ids``) how many of the
request's prompt blocks past the local prefix-cache hit it holds and reports them for a
synchronous load (never the block holding the last prompt token: vLLM must compute at least one
token). ``build_connector_meta`` emits the loads (vLLM block id + hash) and the saves: the prompt's
full blocks that become computed by the end of the step (chunked prefill is followed through
``num_computed_tokens`` + scheduled tokens), that this request computed itself and that stratad
did not already report.

Worker side: ``start_load_kv`` runs before the forward pass (the loads are synchronous), fetches
all of the step's blocks with one ``fetch`` per staging-full batch and scatters each OK block into
every layer; ``wait_for_layer_load`` therefore has nothing left to wait for. ``wait_for_save``
runs after the forward, when every layer's KV of the step is written: it copies the blocks to
save into staging slots and publishes them with ``publish_ids_async`` from there, so vLLM may
reuse its blocks at once; the slots go back to the free list only when that publish completes.

Failure handling: no call into this connector raises into vLLM. A stratad error marks it down for
``retry_after`` seconds (logged once per outage); meanwhile lookups report 0 tokens, loads are
reported as load errors and saves are dropped, all without calling stratad. Each call is bounded
by ``rpc_timeout``, so a dead or stopped daemon costs a request at most about that once.

Tensor parallelism: each worker stores its own heads in the namespace of its ``tp_rank``; the
scheduler looks blocks up in rank 0's namespace (all ranks save the same blocks).

Counters: ``strata.vllm.COUNTERS`` (a dict, process-wide; ``counters()`` copies it) and
``LOADED_TOKENS_BY_REQUEST`` (tokens loaded per vLLM request id, the last 4096 requests);
each worker logs them as one JSON line (``strata-connector stats {...}``) at shutdown.
``strata.vllm.wait_for_saves(timeout)`` waits until this process's publishes have completed.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field

try:  # vLLM is optional: `import strata` never needs it, this module only defines a stub then.
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                                   KVConnectorMetadata,
                                                                   KVConnectorRole)
    _VLLM_IMPORT_ERROR = None
except Exception as e:  # pragma: no cover - exercised only without vLLM
    KVConnectorBase_V1 = object
    KVConnectorMetadata = object
    KVConnectorRole = None
    _VLLM_IMPORT_ERROR = e

# Under vLLM's "vllm" logger so vLLM's handler prints it.
logger = logging.getLogger("vllm.strata_connector")

ZERO_ID = bytes(32)
_COUNTER_NAMES = (
    "lookups", "lookup_errors", "misses", "hits", "hit_tokens",
    "load_blocks_requested", "blocks_loaded", "tokens_loaded", "load_errors",
    "device_blocks_loaded", "device_blocks_saved",
    "save_blocks_requested", "blocks_saved", "save_blocks_dropped", "save_errors",
    "publish_calls", "outages",
)
COUNTERS: dict = {name: 0 for name in _COUNTER_NAMES}
LOADED_TOKENS_BY_REQUEST: dict = {}
_counter_lock = threading.Lock()
_workers: "weakref.WeakSet" = weakref.WeakSet()


def _count(**deltas) -> None:
    with _counter_lock:
        for k, v in deltas.items():
            COUNTERS[k] = COUNTERS.get(k, 0) + v


def _note_loaded(req_id, tokens) -> None:
    with _counter_lock:
        if req_id not in LOADED_TOKENS_BY_REQUEST and len(LOADED_TOKENS_BY_REQUEST) >= 4096:
            LOADED_TOKENS_BY_REQUEST.pop(next(iter(LOADED_TOKENS_BY_REQUEST)))  # oldest
        LOADED_TOKENS_BY_REQUEST[req_id] = LOADED_TOKENS_BY_REQUEST.get(req_id, 0) + tokens


def counters() -> dict:
    with _counter_lock:
        return dict(COUNTERS)


def reset_counters() -> None:
    with _counter_lock:
        for k in list(COUNTERS):
            COUNTERS[k] = 0
        LOADED_TOKENS_BY_REQUEST.clear()


def wait_for_saves(timeout: float = 30.0) -> bool:
    """Waits until the publishes of every worker connector in this process have completed."""
    deadline = time.monotonic() + timeout
    for w in list(_workers):
        if not w._wait_saves(max(0.0, deadline - time.monotonic())):
            return False
    return True


_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}


@dataclass
class _Layout:
    model_id: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    block_size: int
    tp_rank: int
    tp_size: int
    id_scheme: str


class _Link:
    """A client and namespace that may be down; reconnects after retry_after."""

    def __init__(self, endpoint, tenant, rpc_timeout, retry_after, layout, role, on_connect=None):
        self.endpoint, self.tenant = endpoint, tenant
        self.rpc_timeout, self.retry_after = rpc_timeout, retry_after
        self.layout = layout
        self.role = role
        self.on_connect = on_connect
        self.client = None
        self.ns = None
        self.down_until = 0.0
        self.in_outage = False
        self._lock = threading.Lock()

    def get(self):
        """(client, ns) when stratad is usable now, else None (without calling it while down)."""
        client, ns = self.client, self.ns
        if self.layout is None:
            return None
        if client is not None and ns is not None:
            return client, ns
        if time.monotonic() < self.down_until:
            return None
        try:
            import strata
            if self.client is None:
                self.client = strata.Client(self.endpoint, rpc_timeout=self.rpc_timeout,
                                            transfer_timeout=self.rpc_timeout, quiet=True,
                                            client_name="strata-vllm")
                if self.on_connect is not None:
                    self.on_connect(self.client)
            lay = self.layout
            kw = dict(tp_rank=lay.tp_rank, tp_size=lay.tp_size)
            try:
                ns = self.client.open_namespace(lay.model_id, lay.num_layers, lay.num_kv_heads,
                                                lay.head_dim, lay.dtype, lay.block_size,
                                                self.tenant, id_scheme=lay.id_scheme, **kw)
            except strata.errors.InvalidArgumentError:
                if lay.id_scheme != "vllm_cbor":
                    raise
                logger.warning("Strata: stratad does not know id_scheme 'vllm_cbor'; the namespace "
                               "uses 'vllm' (ids come from vLLM, so only Strata-side id derivation "
                               "differs)")
                lay.id_scheme = "vllm"
                ns = self.client.open_namespace(lay.model_id, lay.num_layers, lay.num_kv_heads,
                                                lay.head_dim, lay.dtype, lay.block_size,
                                                self.tenant, id_scheme="vllm", **kw)
            self.ns = ns
            if self.in_outage:
                logger.warning("Strata (%s): stratad at %s is back", self.role, self.endpoint)
            self.in_outage = False
            return self.client, ns
        except Exception as e:  # noqa: BLE001 - never raise into vLLM
            self.fail(e, "connect")
            return None

    def fail(self, exc, what: str) -> None:
        with self._lock:
            self.ns = None  # re-open (cheap) after the outage: the daemon may have restarted
            self.down_until = time.monotonic() + self.retry_after
            first = not self.in_outage
            self.in_outage = True
        if first:
            _count(outages=1)
            logger.warning("Strata (%s): %s failed (%s: %s); treating stratad at %s as down for "
                           "%.0f s (misses, no saves)", self.role, what, type(exc).__name__, exc,
                           self.endpoint, self.retry_after)


def _layout(vllm_config, kv_cache_config, tp_rank, model_id):
    """The namespace layout, or None (with a warning) when this connector cannot serve it."""
    algo = getattr(vllm_config.cache_config, "prefix_caching_hash_algo", "sha256")
    scheme = {"sha256": "vllm", "sha256_cbor": "vllm_cbor"}.get(algo)
    if scheme is None:
        logger.warning("Strata: prefix_caching_hash_algo=%s is seeded per process; the connector "
                       "stays off (use sha256 or sha256_cbor)", algo)
        return None
    groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
    if len(groups) != 1:
        logger.warning("Strata: %d KV cache groups; only one full-attention group is supported, "
                       "the connector stays off", len(groups))
        return None
    spec = groups[0].kv_cache_spec
    heads, head, dtype = (getattr(spec, "num_kv_heads", None), getattr(spec, "head_size", None),
                          _DTYPES.get(str(getattr(spec, "dtype", ""))))
    head_v = getattr(spec, "head_size_v", head) or head
    if heads is None or head is None or dtype is None or head_v != head:
        logger.warning("Strata: unsupported KV cache spec %s; the connector stays off", spec)
        return None
    tp_size = vllm_config.parallel_config.tensor_parallel_size
    return _Layout(model_id=model_id, num_layers=len(groups[0].layer_names), num_kv_heads=heads,
                   head_dim=head, dtype=dtype, block_size=spec.block_size, tp_rank=tp_rank,
                   tp_size=tp_size, id_scheme=scheme)


@dataclass
class StrataConnectorMetadata(KVConnectorMetadata):
    # (req_id, [vLLM block ids], [block hashes]) per request
    loads: list = field(default_factory=list)
    # (req_id, [vLLM block ids], [block hashes], [parent hashes]) per request
    saves: list = field(default_factory=list)


class _ReqState:
    __slots__ = ("request", "lookup_start", "strata_end", "block_ids", "save_next")

    def __init__(self, request):
        self.request = request
        self.lookup_start = 0   # first block index asked about (the local hit, in blocks)
        self.strata_end = 0     # blocks [lookup_start, strata_end) are known to be in Strata
        self.block_ids: list = []
        self.save_next = 0      # next prompt block index to consider saving


class StrataConnector(KVConnectorBase_V1):
    """See the module docstring."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        if _VLLM_IMPORT_ERROR is not None:
            raise ImportError(f"strata.vllm needs vLLM: {_VLLM_IMPORT_ERROR}")
        super().__init__(vllm_config, role, kv_cache_config)
        cfg = self._kv_transfer_config
        get = cfg.get_from_extra_config
        self._endpoint = str(get("strata.endpoint",
                                 os.environ.get("STRATA_ENDPOINT", "127.0.0.1:7420")))
        self._tenant = str(get("strata.tenant", "default"))
        self._rpc_timeout = float(get("strata.rpc_timeout", 1.0))
        self._retry_after = float(get("strata.retry_after", 10.0))
        model_id = str(get("strata.model_id", vllm_config.model_config.model))
        self._staging_mib = float(get("strata.staging_mib", 64))
        self._max_inflight = int(get("strata.max_inflight_saves", 4))
        # Loads straight into device memory when stratad has a GPU tier: "auto" (when the KV
        # caches are CUDA tensors), "off", or "stand-in" (host memory standing in for the
        # device, for daemons whose GPU tier is a stand-in: tests and development).
        self._device_loads = str(get("strata.device_loads", "auto"))
        self._device_saves = str(get("strata.device_saves", "auto"))
        self._is_worker = role == KVConnectorRole.WORKER
        tp_rank = 0
        if self._is_worker:
            try:
                from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
                tp_rank = get_tensor_model_parallel_rank()
            except Exception:  # noqa: BLE001 - not initialised (single process, tests)
                tp_rank = 0
        self._bs = vllm_config.cache_config.block_size
        layout = _layout(vllm_config, kv_cache_config, tp_rank, model_id)
        self._link = _Link(self._endpoint, self._tenant, self._rpc_timeout, self._retry_after,
                           layout, "worker" if self._is_worker else "scheduler",
                           on_connect=self._on_connect if self._is_worker else None)
        # scheduler state
        self._reqs: dict = {}
        self._pending_loads: list = []
        # worker state
        self._parts: list = []       # per layer part: (flat uint8 [num_blocks, w] view, offset, w)
        self._block_bytes = 0
        self._staging = None
        self._load_slots = 0
        self._free_save_slots: list = []
        self._inflight = 0
        self._save_lock = threading.Condition()
        self._load_errors: set = set()
        self._device = None  # (client, loan, uint8 [load slots, block bytes] tensor) when lent
        self._device_save = None  # (client, loan, uint8 [save slots, block bytes] tensor)
        self._stopped = False
        if self._is_worker:
            _workers.add(self)

    # ------------------------------------------------------------------ scheduler side

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        try:
            return self._matched(request, num_computed_tokens)
        except Exception as e:  # noqa: BLE001
            logger.exception("Strata: lookup bookkeeping failed: %s", e)
            return 0, False

    def _matched(self, request, num_computed_tokens):
        bs = self._bs
        st = self._reqs.get(request.request_id)
        if st is None:
            st = self._reqs[request.request_id] = _ReqState(request)
        st.request = request
        hashes = request.block_hashes
        prompt_blocks = min(len(hashes), request.num_prompt_tokens // bs)
        start = num_computed_tokens // bs
        st.lookup_start = st.strata_end = start
        if start >= prompt_blocks:
            return 0, False
        link = self._link.get()
        if link is None:
            _count(misses=1)
            return 0, False
        try:
            prefix = link[0].lookup_ids(link[1], list(hashes[start:prompt_blocks]))
        except Exception as e:  # noqa: BLE001
            self._link.fail(e, "lookup")
            _count(lookup_errors=1, misses=1)
            return 0, False
        _count(lookups=1)
        st.strata_end = start + prefix
        # vLLM computes at least the last prompt token: never load the block that holds it.
        hit = min(st.strata_end * bs, ((request.num_tokens - 1) // bs) * bs)
        ext = max(0, hit - num_computed_tokens)
        if ext:
            _count(hits=1, hit_tokens=ext)
        else:
            _count(misses=1)
        return ext, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens <= 0:
            return
        st = self._reqs.get(request.request_id)
        if st is None:
            return
        block_ids = blocks.get_block_ids()[0]
        first, n = st.lookup_start, num_external_tokens // self._bs
        ids = list(block_ids[first:first + n])
        hashes = list(request.block_hashes[first:first + n])
        if len(ids) == n and len(hashes) == n:
            self._pending_loads.append((request.request_id, ids, hashes))

    def build_connector_meta(self, scheduler_output):
        meta = StrataConnectorMetadata()
        meta.loads, self._pending_loads = self._pending_loads, []
        try:
            num_sched = scheduler_output.num_scheduled_tokens
            for nr in scheduler_output.scheduled_new_reqs:
                st = self._reqs.get(nr.req_id)
                if st is None:
                    continue
                st.block_ids = list(nr.block_ids[0]) if nr.block_ids else []
                # Blocks computed before this request (local hits, loads) are not its to save.
                st.save_next = max(st.save_next, nr.num_computed_tokens // self._bs, st.strata_end)
                self._plan_save(nr.req_id, st, nr.num_computed_tokens + num_sched.get(nr.req_id, 0),
                                meta)
            cached = scheduler_output.scheduled_cached_reqs
            resumed = getattr(cached, "resumed_req_ids", None) or set()
            for i, req_id in enumerate(cached.req_ids):
                st = self._reqs.get(req_id)
                if st is None:
                    continue
                new_ids = cached.new_block_ids[i]
                if req_id in resumed:
                    st.block_ids = list(new_ids[0]) if new_ids else []
                    st.save_next = max(st.save_next, st.strata_end)
                elif new_ids:
                    st.block_ids.extend(new_ids[0])
                nc = cached.num_computed_tokens[i]
                self._plan_save(req_id, st, nc + num_sched.get(req_id, 0), meta)
        except Exception as e:  # noqa: BLE001
            logger.exception("Strata: save planning failed: %s", e)
        return meta

    def _plan_save(self, req_id, st, computed_end, meta):
        req = st.request
        hashes = req.block_hashes
        end = min(req.num_prompt_tokens // self._bs, len(hashes), computed_end // self._bs,
                  len(st.block_ids))
        if end <= st.save_next:
            return
        idx = range(st.save_next, end)
        st.save_next = end
        meta.saves.append((req_id, [st.block_ids[i] for i in idx], [hashes[i] for i in idx],
                           [hashes[i - 1] if i else ZERO_ID for i in idx]))

    def request_finished(self, request, block_ids):
        # Saves were copied out in wait_for_save of the step that computed them.
        self._reqs.pop(request.request_id, None)
        return False, None

    @property
    def requires_kv_delivery(self) -> bool:
        return False

    # ------------------------------------------------------------------ worker side

    def register_kv_caches(self, kv_caches):
        import torch
        try:
            parts, offset = [], 0
            for name, t in kv_caches.items():
                num_blocks = self._kv_cache_config.num_blocks if self._kv_cache_config else t.shape[0]
                if t.shape[0] == num_blocks:
                    views = [t]
                elif t.dim() > 1 and t.shape[0] == 2 and t.shape[1] == num_blocks:
                    views = [t[0], t[1]]  # [2, num_blocks, ...] layouts (K then V)
                else:
                    raise ValueError(f"layer {name}: no block dimension in shape {tuple(t.shape)}")
                for v in views:
                    flat = v.view(torch.uint8).view(v.shape[0], -1)
                    parts.append((flat, offset, flat.shape[1]))
                    offset += flat.shape[1]
            self._parts, self._block_bytes = parts, offset
            slots = max(4, int(self._staging_mib * 2**20) // max(1, offset))
            self._load_slots = slots // 2
            self._staging = torch.empty((slots, offset), dtype=torch.uint8)
            self._free_save_slots = list(range(self._load_slots, slots))
            lay = self._link.layout
            if lay is not None:
                want = 2 * lay.num_layers * lay.num_kv_heads * lay.head_dim * lay.block_size * \
                    {"bf16": 2, "fp16": 2, "fp32": 4}[lay.dtype]
                if want != offset:
                    logger.warning("Strata: a block is %d bytes, the layout says %d; the connector "
                                   "stays off", offset, want)
                    self._link.layout = None
            logger.info("Strata: %d layers, %d bytes per block, %d staging slots (%d load), "
                        "endpoint %s", len(kv_caches), offset, slots, self._load_slots,
                        self._endpoint)
        except Exception as e:  # noqa: BLE001
            logger.warning("Strata: cannot use these KV caches (%s); the connector stays off", e)
            self._link.layout = None

    def _on_connect(self, client):
        if self._staging is not None:
            client.register_buffer(self._staging)
            self._lend_device_staging(client)
            self._lend_device_save_slots(client)

    def _lend_device(self, client, held, mode, rows, what):
        """A device buffer of `rows` slots lent to stratad: (client, loan, tensor), or None where
        the KV caches or the daemon do not allow it (host staging then). `held`: the previous
        loan to this client, given back first."""
        import torch
        import strata
        if held is not None and held[0] is client:
            try:  # a loan the daemon still holds (a failed call): give it back first
                client.return_device_buffer(held[1])
            except Exception:  # noqa: BLE001 - closed or idled out already
                pass
        kv_device = self._parts[0][0].device if self._parts else None
        if mode == "off" or kv_device is None or (mode == "auto" and kv_device.type != "cuda"):
            return None
        try:
            shape = (rows, self._block_bytes)
            if mode == "stand-in":
                lent = strata.StandInDeviceBuffer(shape[0] * shape[1])
                tensor = torch.frombuffer(lent, dtype=torch.uint8).view(shape)
            else:
                tensor = lent = torch.empty(shape, dtype=torch.uint8, device=kv_device)
            loan = client.lend_device_buffer(lent)
        except Exception as e:  # noqa: BLE001 - host staging still works
            logger.info("Strata: %s go through host memory (%s: %s)", what, type(e).__name__, e)
            return None
        logger.info("Strata: %s go straight through device memory (%d slots)", what, rows)
        return (client, loan, tensor)

    def _lend_device_staging(self, client):
        """Lends stratad a device buffer of load slots, so that hits are copied into device
        memory by the daemon (from its GPU tier) instead of through host staging."""
        self._device = self._lend_device(client, self._device, self._device_loads,
                                         self._load_slots, "loads")

    def _lend_device_save_slots(self, client):
        """Lends stratad a device buffer of save slots, which it publishes blocks out of."""
        self._device_save = self._lend_device(client, self._device_save, self._device_saves,
                                              self._staging.shape[0] - self._load_slots, "saves")

    def start_load_kv(self, forward_context, **kwargs):
        try:
            meta = self._get_connector_metadata()
        except Exception:  # noqa: BLE001
            return
        if not isinstance(meta, StrataConnectorMetadata) or not meta.loads:
            return
        items = [(rid, b, h) for rid, ids, hashes in meta.loads for b, h in zip(ids, hashes)]
        _count(load_blocks_requested=len(items))
        try:
            self._load(items)
        except Exception as e:  # noqa: BLE001 - a bug here must not kill the engine
            logger.exception("Strata: load failed: %s", e)
            self._load_errors.update(b for _, b, _ in items)

    def _load(self, items):
        import strata
        import torch
        link = self._link.get() if self._staging is not None else None
        if link is None:
            self._load_errors.update(b for _, b, _ in items)
            _count(load_errors=len(items))
            return
        n_slots = self._load_slots
        for pos in range(0, len(items), n_slots):
            chunk = items[pos:pos + n_slots]
            hashes = [h for _, _, h in chunk]
            staging, res = self._staging, None
            dev = self._device
            if dev is not None and dev[0] is link[0]:
                try:
                    offsets = [i * self._block_bytes for i in range(len(chunk))]
                    res = link[0].fetch_to_device(link[1], dev[1], hashes, offsets)
                    staging = dev[2]
                except Exception as e:  # noqa: BLE001 - e.g. the loan idled out: lend again
                    logger.info("Strata: device load failed (%s: %s); lending again",
                                type(e).__name__, e)
                    self._lend_device_staging(link[0])
                    res = None
            try:
                if res is None:
                    staging = self._staging
                    res = link[0].fetch(link[1], hashes, [staging[i] for i in range(len(chunk))])
            except Exception as e:  # noqa: BLE001
                self._link.fail(e, "fetch")
                rest = items[pos:]
                self._load_errors.update(b for _, b, _ in rest)
                _count(load_errors=len(rest))
                return
            ok_slots, ok_blocks = [], []
            for i, (rid, b, _) in enumerate(chunk):
                if res.status[i] == strata.BlockStatus.OK and res.sizes[i] == self._block_bytes:
                    ok_slots.append(i)
                    ok_blocks.append(b)
                    _note_loaded(rid, self._bs)
                else:
                    self._load_errors.add(b)
            if ok_blocks:
                slot_idx = torch.tensor(ok_slots, dtype=torch.long, device=staging.device)
                for flat, off, w in self._parts:
                    src = staging[:, off:off + w].index_select(0, slot_idx)
                    idx = torch.tensor(ok_blocks, dtype=torch.long, device=flat.device)
                    flat.index_copy_(0, idx, src.to(flat.device, non_blocking=False))
                if staging is not self._staging:
                    _count(device_blocks_loaded=len(ok_blocks))
            bad = len(chunk) - len(ok_blocks)
            _count(blocks_loaded=len(ok_blocks), tokens_loaded=len(ok_blocks) * self._bs,
                   load_errors=bad)

    def wait_for_layer_load(self, layer_name):
        # Loads are synchronous: start_load_kv ran before the forward and already scattered every
        # layer, so there is nothing to wait for.
        return

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        # Saves are gathered in wait_for_save, once per step, when all layers are written.
        return

    def wait_for_save(self):
        try:
            meta = self._get_connector_metadata()
        except Exception:  # noqa: BLE001
            return
        if not isinstance(meta, StrataConnectorMetadata) or not meta.saves:
            return
        ids, hashes, parents = [], [], []
        for _, b, h, p in meta.saves:
            ids += b
            hashes += h
            parents += p
        _count(save_blocks_requested=len(ids))
        try:
            self._save(ids, hashes, parents)
        except Exception as e:  # noqa: BLE001
            logger.exception("Strata: save failed: %s", e)

    def _save(self, ids, hashes, parents):
        import torch
        link = None if (self._staging is None or self._stopped) else self._link.get()
        if link is None:
            _count(save_blocks_dropped=len(ids))
            return
        with self._save_lock:
            if self._inflight >= self._max_inflight:
                take = []
            else:
                k = min(len(ids), len(self._free_save_slots))
                take, self._free_save_slots = self._free_save_slots[:k], self._free_save_slots[k:]
                if take:
                    self._inflight += 1
        if len(take) < len(ids):
            _count(save_blocks_dropped=len(ids) - len(take))
        if not take:
            return
        n = len(take)
        ids, hashes, parents = ids[:n], hashes[:n], parents[:n]
        dev = self._device_save
        on_device = dev is not None and dev[0] is link[0]
        try:
            if on_device:  # gathered on the device; stratad publishes out of the lent slots
                rows = [s - self._load_slots for s in take]
                row_idx = torch.tensor(rows, dtype=torch.long, device=dev[2].device)
                for flat, off, w in self._parts:
                    idx = torch.tensor(ids, dtype=torch.long, device=flat.device)
                    dev[2][row_idx, off:off + w] = flat.index_select(0, idx).to(dev[2].device)
                if dev[2].device.type == "cuda":
                    torch.cuda.synchronize(dev[2].device)  # the daemon reads it next
                bb = self._block_bytes
                fut = link[0].publish_from_device_async(link[1], dev[1], hashes,
                                                        [r * bb for r in rows], [bb] * n, parents)
            else:
                slot_idx = torch.tensor(take, dtype=torch.long)
                for flat, off, w in self._parts:
                    idx = torch.tensor(ids, dtype=torch.long, device=flat.device)
                    self._staging[slot_idx, off:off + w] = flat.index_select(0, idx).to("cpu")
                fut = link[0].publish_ids_async(link[1], hashes,
                                                [self._staging[s] for s in take], parents)
        except Exception as e:  # noqa: BLE001
            self._save_done(None, take, e, on_device)
            return
        _count(publish_calls=1)
        fut.add_done_callback(lambda f: self._save_done(f, take, None, on_device))

    def _save_done(self, fut, slots, exc, on_device=False):
        n = len(slots)
        try:
            res = fut.result() if exc is None else None
        except Exception as e:  # noqa: BLE001
            exc = e
        if exc is not None:
            if on_device and self._device_save is not None:
                # e.g. the loan idled out: saves go through host staging until it is lent again
                logger.info("Strata: device save failed (%s: %s); lending again",
                            type(exc).__name__, exc)
                held, self._device_save = self._device_save, None
                self._device_save = self._lend_device(held[0], held, self._device_saves,
                                                      held[2].shape[0], "saves")
            else:
                self._link.fail(exc, "publish")
            _count(save_errors=n)
        else:
            import strata
            ok = sum(1 for s in res.status if s == strata.BlockStatus.OK)
            _count(blocks_saved=ok, save_errors=n - ok)
            if on_device:
                _count(device_blocks_saved=ok)
        with self._save_lock:
            self._free_save_slots.extend(slots)  # only now may the slots be overwritten
            self._inflight -= 1
            self._save_lock.notify_all()

    def _wait_saves(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._save_lock:
            while self._inflight > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._save_lock.wait(left)
        return True

    def get_block_ids_with_load_errors(self):
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self):
        if self._stopped:
            return
        self._stopped = True
        if self._is_worker:
            self._wait_saves(max(5.0, 2 * self._rpc_timeout))
            logger.info("strata-connector stats %s", json.dumps(counters(), sort_keys=True))
        client, self._link.client, self._link.ns = self._link.client, None, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass
