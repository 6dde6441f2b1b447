"""strata.sglang.StrataStorage against SGLang's own HiCacheStorage, backend factory and CPU host
pools, and a real stratad."""
import logging
import time

import pytest

pytest.importorskip("sglang")
torch = pytest.importorskip("torch")

from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage,  # noqa: E402
                                                  HiCacheStorageConfig,
                                                  HiCacheStorageExtraInfo)
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage import StorageBackendFactory  # noqa: E402

from conftest import Daemon  # noqa: E402

PAGE, HEADS, HEAD_DIM, LAYERS = 32, 1, 64, 2


@pytest.fixture(scope="module")
def device_pool():
    return MHATokenToKVPool(1024, PAGE, torch.bfloat16, HEADS, HEAD_DIM, LAYERS, "cpu", False,
                            start_layer=0, end_layer=LAYERS)


def make_host(device_pool, layout="page_first"):
    info = device_pool.get_device_pool_infos()[0].buffer_info
    host = MHATokenToKVPoolHost(info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=device_pool.size, start_layer=0,
                                end_layer=LAYERS)
    torch.manual_seed(0)
    host.kv_buffer.view(-1).normal_()
    return host


def make_backend(host, endpoint, model="tiny", tp_rank=0, tp_size=1, **extra):
    cfg = HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=True,
        is_page_first_layout=host.layout.startswith("page_first"), model_name=model,
        extra_config={"backend_name": "strata", "module_path": "strata.sglang",
                      "class_name": "StrataStorage", "interface_v1": 1, "endpoint": endpoint,
                      "tenant": "pytest", "rpc_timeout": 1.0, "transfer_timeout": 1.0, **extra})
    backend = StorageBackendFactory.create_backend("dynamic", cfg, host)
    backend.register_mem_pool_host(host)  # what HiCacheController does next
    return backend


def pages(host, n):
    idx = host.alloc(n * PAGE)
    assert idx is not None
    return idx


def page_data(host, idx, i):
    return host.get_data_page(int(idx[i * PAGE])).clone()


LAYOUTS = ["page_first", "layer_first", "page_first_direct", "page_head"]


def test_factory_builds_a_hicache_storage(daemon, device_pool):
    from strata.sglang import StrataStorage
    host = make_host(device_pool)
    backend = make_backend(host, daemon.endpoint)
    assert isinstance(backend, HiCacheStorage) and isinstance(backend, StrataStorage)
    assert backend.counters()["connected"]
    assert backend._parts == 2  # K and V of a page_first page
    backend.close()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_v1_round_trip_prefix_and_gap(daemon, device_pool, layout):
    host = make_host(device_pool, layout)
    backend = make_backend(host, daemon.endpoint)
    src = pages(host, 4)
    before = [page_data(host, src, i) for i in range(4)]
    keys = ["k0", "k1", "k2", "k3"]
    # k2 is never stored: a gap in the middle.
    assert backend.batch_set_v1(keys[:2], src[:2 * PAGE]) == [True, True]
    assert backend.batch_set_v1(["k3"], src[3 * PAGE:],
                                HiCacheStorageExtraInfo(prefix_keys=keys[:3])) == [True]
    assert backend.batch_exists(keys) == 2
    assert backend.batch_exists(["k3"]) == 1
    assert backend.batch_exists(["k2", "k3"]) == 0
    assert backend.exists("k0") and not backend.exists("k2")

    dst = pages(host, 4)
    for i in range(4):
        host.get_data_page(int(dst[i * PAGE]), flat=False).zero_()
    # k3 is stored, but SGLang uses pages only up to the first miss.
    assert backend.batch_get_v1(keys, dst) == [True, True, False, False]
    for i in range(2):
        assert torch.equal(page_data(host, dst, i), before[i])
    assert backend.batch_get_v1(["k3"], dst[:PAGE]) == [True]
    assert torch.equal(page_data(host, dst, 0), before[3])
    # Storing again is a dedup, still a success.
    assert backend.batch_set_v1(keys[:2], src[:2 * PAGE]) == [True, True]
    stats = backend.get_stats()
    assert stats.prefetch_pgs and stats.backup_pgs and backend.get_stats().prefetch_pgs == []
    backend.close()


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_tensor_copy_path(daemon, device_pool, layout):
    host = make_host(device_pool, layout)
    backend = make_backend(host, daemon.endpoint)
    src = pages(host, 3)
    data = [page_data(host, src, i) for i in range(3)]
    assert backend.set("s0", data[0])
    assert backend.batch_set(["s1", "s2"], [data[1], data[2]])
    assert backend.get("missing") is None and not backend.exists("missing")

    out = backend.get("s0")  # no target: a fresh flat page
    assert out is not None and torch.equal(out, data[0])
    targets = [host.get_dummy_flat_data_page() for _ in range(4)]
    got = backend.batch_get(["s1", "missing", "s2", "s0"], targets)
    assert got[0] is targets[0] and torch.equal(got[0], data[1])
    assert got[1] is None  # per-page result: a miss in the middle
    assert torch.equal(got[2], data[2]) and torch.equal(got[3], data[0])
    assert backend.batch_exists(["s0", "s1", "s2", "missing"]) == 3

    # Both paths name the same Strata blocks: a page set as a tensor loads zero copy.
    dst = pages(host, 1)
    assert backend.batch_get_v1(["s2"], dst) == [True]
    assert torch.equal(page_data(host, dst, 0), data[2])
    # A value of the wrong size is refused, not stored.
    assert not backend.set("bad", torch.zeros(7, dtype=torch.bfloat16))
    backend.close()


def test_models_and_tp_ranks_do_not_share_pages(daemon, device_pool):
    host = make_host(device_pool)
    a = make_backend(host, daemon.endpoint, model="model-a", tp_rank=0, tp_size=2)
    b = make_backend(host, daemon.endpoint, model="model-a", tp_rank=1, tp_size=2)
    c = make_backend(host, daemon.endpoint, model="model-b", tp_rank=0, tp_size=2)
    same = make_backend(host, daemon.endpoint, model="model-a", tp_rank=0, tp_size=2)
    src = pages(host, 2)
    assert a.batch_set_v1(["p0", "p1"], src) == [True, True]
    for other in (b, c):
        assert other.batch_exists(["p0", "p1"]) == 0
        assert other.batch_get_v1(["p0", "p1"], pages(host, 2)) == [False, False]
    assert same.batch_exists(["p0", "p1"]) == 2  # another process of the same rank shares them
    for be in (a, b, c, same):
        be.close()


def test_chunked_calls(daemon, device_pool):
    host = make_host(device_pool)
    backend = make_backend(host, daemon.endpoint, max_ids_per_call=4)  # 2 pages per call
    keys = [f"c{i}" for i in range(7)]
    src = pages(host, 7)
    before = [page_data(host, src, i) for i in range(7)]
    assert backend.batch_set_v1(keys, src) == [True] * 7
    assert backend.batch_exists(keys + ["nope"]) == 7
    dst = pages(host, 7)
    assert backend.batch_get_v1(keys, dst) == [True] * 7
    assert all(torch.equal(page_data(host, dst, i), before[i]) for i in range(7))
    backend.close()


def test_clear_evicts_what_it_wrote(daemon, device_pool):
    host = make_host(device_pool)
    backend = make_backend(host, daemon.endpoint)
    assert backend.batch_set_v1(["e0", "e1"], pages(host, 2)) == [True, True]
    assert backend.batch_exists(["e0", "e1"]) == 2
    backend.clear()
    assert backend.batch_exists(["e0", "e1"]) == 0
    backend.close()


def test_dead_daemon_returns_misses_quickly(device_pool, caplog):
    d = Daemon()
    host = make_host(device_pool)
    backend = make_backend(host, d.endpoint)
    src = pages(host, 2)
    assert backend.batch_set_v1(["d0", "d1"], src) == [True, True]
    d.kill()
    caplog.set_level(logging.WARNING, logger="strata.sglang")
    t0 = time.monotonic()
    assert backend.batch_exists(["d0", "d1"]) == 0
    assert backend.batch_get_v1(["d0", "d1"], pages(host, 2)) == [False, False]
    assert backend.batch_set_v1(["d2"], src[:PAGE]) == [False]
    assert backend.get("d0") is None
    assert backend.batch_get(["d0"], [host.get_dummy_flat_data_page()]) == [None]
    assert backend.set("d3", page_data(host, src, 0)) is False
    assert not backend.exists("d0")
    backend.clear()
    elapsed = time.monotonic() - t0
    assert elapsed < 3.0, elapsed
    warnings = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    backend.close()
    d.stop()


def test_daemon_started_late_and_paused(device_pool, caplog):
    """No daemon at start-up: misses; a stopped (SIGSTOP) daemon: misses within the timeouts;
    it comes back: the backend reconnects by itself."""
    d = Daemon()
    endpoint = d.endpoint
    d.kill()
    host = make_host(device_pool)
    t0 = time.monotonic()
    backend = make_backend(host, endpoint, retry_interval=0.2)
    assert backend.batch_exists(["x"]) == 0
    assert time.monotonic() - t0 < 3.0
    d.stop()

    d = Daemon()
    backend.endpoint = d.endpoint  # the same backend object, a daemon at a new port
    time.sleep(0.3)
    src = pages(host, 1)
    assert backend.batch_set_v1(["x"], src) == [True]
    d.pause()
    try:
        t0 = time.monotonic()
        assert backend.batch_exists(["x"]) == 0
        assert backend.batch_get_v1(["x"], pages(host, 1)) == [False]
        assert time.monotonic() - t0 < 5.0
    finally:
        d.resume()
    deadline = time.monotonic() + 10
    while backend.batch_exists(["x"]) != 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert backend.batch_exists(["x"]) == 1
    assert backend.counters()["reconnects"] >= 1
    backend.close()
    d.stop()


def test_pool_without_page_meta_misses_instead_of_raising(daemon, device_pool, monkeypatch):
    host = make_host(device_pool)
    backend = make_backend(host, daemon.endpoint)
    idx = pages(host, 1)
    assert backend.batch_set_v1(["m0"], idx) == [True]

    def no_meta(indices):
        raise ValueError("Unsupported layout")

    monkeypatch.setattr(host, "get_page_buffer_meta", no_meta)
    assert backend.batch_set_v1(["m1"], idx) == [False]
    assert backend.batch_get_v1(["m0"], idx) == [False]
    assert backend.batch_exists(["m0"]) == 1  # the daemon is fine; only this pool's meta is not
    backend.close()
