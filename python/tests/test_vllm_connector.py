"""strata.vllm.StrataConnector against a real stratad, without an engine: both roles are built on
stand-in configs, the worker side on fake KV tensors of vLLM-CPU's layout
([num_blocks, kv_heads, block_size, 2*head_dim] per layer). tests/engines/ runs it in vLLM."""
import hashlib
import time
from types import SimpleNamespace

import pytest

vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402

import strata.vllm as sv  # noqa: E402
from conftest import Daemon  # noqa: E402

BS, LAYERS, HEADS, HEAD_DIM, NUM_BLOCKS = 16, 2, 1, 64, 32
LAYER_NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]


def h(i: int) -> bytes:
    return hashlib.sha256(b"block-%d" % i).digest()


def make(role, endpoint, **extra):
    cfg = {"strata.endpoint": endpoint, "strata.rpc_timeout": 1.0, "strata.retry_after": 5.0,
           "strata.staging_mib": 1, **extra}
    vllm_config = SimpleNamespace(
        kv_transfer_config=KVTransferConfig(kv_connector="StrataConnector",
                                            kv_connector_module_path="strata.vllm",
                                            kv_role="kv_both", kv_connector_extra_config=cfg),
        cache_config=SimpleNamespace(block_size=BS, prefix_caching_hash_algo="sha256"),
        model_config=SimpleNamespace(model="test/tiny"),
        parallel_config=SimpleNamespace(tensor_parallel_size=1))
    spec = SimpleNamespace(block_size=BS, num_kv_heads=HEADS, head_size=HEAD_DIM,
                           head_size_v=HEAD_DIM, dtype=torch.bfloat16)
    kv_cache_config = SimpleNamespace(
        num_blocks=NUM_BLOCKS,
        kv_cache_groups=[SimpleNamespace(layer_names=LAYER_NAMES, kv_cache_spec=spec)])
    return sv.StrataConnector(vllm_config, role, kv_cache_config)


def worker(endpoint, fill=None, **extra):
    w = make(KVConnectorRole.WORKER, endpoint, **extra)
    # One storage, layer dimension outermost, as vLLM-CPU allocates it.
    whole = torch.zeros((LAYERS, NUM_BLOCKS, HEADS, BS, 2 * HEAD_DIM), dtype=torch.bfloat16)
    if fill == "random":
        whole.normal_()
    kv = {name: whole[i] for i, name in enumerate(LAYER_NAMES)}
    w.register_kv_caches(kv)
    return w, kv


def step(w, loads=(), saves=()):
    meta = sv.StrataConnectorMetadata(loads=list(loads), saves=list(saves))
    w.bind_connector_metadata(meta)
    w.start_load_kv(None)
    for name in LAYER_NAMES:
        w.wait_for_layer_load(name)
    w.wait_for_save()
    errors = w.get_block_ids_with_load_errors()
    w.clear_connector_metadata()
    return errors


def chain_save(req, block_ids, first=0):
    ids = [h(first + i) for i in range(len(block_ids))]
    parents = [h(first + i - 1) if first + i else sv.ZERO_ID for i in range(len(block_ids))]
    return (req, list(block_ids), ids, parents)


def fake_request(req_id, num_blocks_hashed, num_tokens):
    return SimpleNamespace(request_id=req_id, block_hashes=[h(i) for i in range(num_blocks_hashed)],
                           num_tokens=num_tokens, num_prompt_tokens=num_tokens)


def test_save_then_load_round_trip(daemon):
    sv.reset_counters()
    src, src_kv = worker(daemon.endpoint, fill="random")
    assert step(src, saves=[chain_save("a", [3, 5, 7])]) == set()
    assert sv.wait_for_saves(10)
    assert sv.counters()["blocks_saved"] == 3

    # The scheduler side sees them: 3 blocks of a 4-block-plus prompt, none computed locally.
    sched = make(KVConnectorRole.SCHEDULER, daemon.endpoint)
    req = fake_request("r", 4, 4 * BS + 1)
    assert sched.get_num_new_matched_tokens(req, 0) == (3 * BS, False)
    # A local hit of one block: two more to load.
    assert sched.get_num_new_matched_tokens(req, BS) == (2 * BS, False)
    # Never the block holding the last token: a prompt of exactly 3 blocks loads 2.
    assert sched.get_num_new_matched_tokens(fake_request("x", 3, 3 * BS), 0) == (2 * BS, False)

    dst, dst_kv = worker(daemon.endpoint)
    errors = step(dst, loads=[("r", [2, 4, 6], [h(0), h(1), h(2)])])
    assert errors == set()
    for name in LAYER_NAMES:
        for s, d in ((3, 2), (5, 4), (7, 6)):
            assert torch.equal(dst_kv[name][d], src_kv[name][s])
        assert not dst_kv[name][3].any()  # nothing else written
    c = sv.counters()
    assert c["blocks_loaded"] == 3 and c["tokens_loaded"] == 3 * BS and c["load_errors"] == 0
    assert sv.LOADED_TOKENS_BY_REQUEST["r"] == 3 * BS
    src.shutdown()
    dst.shutdown()
    sched.shutdown()


def test_missing_blocks_are_reported_as_load_errors(daemon):
    sv.reset_counters()
    src, src_kv = worker(daemon.endpoint, fill="random")
    step(src, saves=[chain_save("a", [1, 2])])
    assert sv.wait_for_saves(10)
    dst, dst_kv = worker(daemon.endpoint)
    errors = step(dst, loads=[("r", [10, 11, 12], [h(0), h(1), h(99)])])
    assert errors == {12}
    assert torch.equal(dst_kv[LAYER_NAMES[1]][11], src_kv[LAYER_NAMES[1]][2])
    # Reported once: the next step starts clean.
    assert dst.get_block_ids_with_load_errors() == set()
    assert sv.counters()["load_errors"] == 1


def test_scheduler_plans_loads_and_chunked_saves(daemon):
    sched = make(KVConnectorRole.SCHEDULER, daemon.endpoint)
    req = fake_request("c", 4, 4 * BS + 3)  # nothing in Strata yet
    assert sched.get_num_new_matched_tokens(req, 0) == (0, False)
    sched.update_state_after_alloc(req, SimpleNamespace(get_block_ids=lambda: ([9, 8],)), 0)
    # Step 1: chunked prefill schedules 40 tokens: blocks 0 and 1 become full.
    out = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="c", block_ids=([9, 8, 7],),
                                            num_computed_tokens=0)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[],
                                              num_computed_tokens=[], resumed_req_ids=set()),
        num_scheduled_tokens={"c": 40})
    meta = sched.build_connector_meta(out)
    assert meta.loads == []
    assert meta.saves == [("c", [9, 8], [h(0), h(1)], [sv.ZERO_ID, h(0)])]
    # Step 2: the rest of the prompt (27 tokens) with two new blocks: blocks 2 and 3.
    out = SimpleNamespace(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=SimpleNamespace(req_ids=["c"], new_block_ids=[([6, 5],)],
                                              num_computed_tokens=[40], resumed_req_ids=set()),
        num_scheduled_tokens={"c": 27})
    meta = sched.build_connector_meta(out)
    assert meta.saves == [("c", [7, 6], [h(2), h(3)], [h(1), h(2)])]
    # Step 3 (decode): nothing more to save.
    out.scheduled_cached_reqs.new_block_ids = [None]
    out.scheduled_cached_reqs.num_computed_tokens = [67]
    out.num_scheduled_tokens = {"c": 1}
    assert sched.build_connector_meta(out).saves == []
    assert sched.request_finished(req, [9, 8, 7, 6, 5]) == (False, None)


def test_loaded_blocks_are_not_saved_again(daemon):
    src, _ = worker(daemon.endpoint, fill="random")
    step(src, saves=[chain_save("a", [1, 2])])
    assert sv.wait_for_saves(10)
    sched = make(KVConnectorRole.SCHEDULER, daemon.endpoint)
    req = fake_request("l", 4, 4 * BS + 3)
    assert sched.get_num_new_matched_tokens(req, 0) == (2 * BS, False)
    sched.update_state_after_alloc(req, SimpleNamespace(get_block_ids=lambda: ([4, 5, 6, 7, 8],)),
                                   2 * BS)
    out = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="l", block_ids=([4, 5, 6, 7, 8],),
                                            num_computed_tokens=2 * BS)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[],
                                              num_computed_tokens=[], resumed_req_ids=set()),
        num_scheduled_tokens={"l": 2 * BS + 3})
    meta = sched.build_connector_meta(out)
    assert meta.loads == [("l", [4, 5], [h(0), h(1)])]
    assert meta.saves == [("l", [6, 7], [h(2), h(3)], [h(1), h(2)])]


def test_dead_endpoint_gives_misses_quickly():
    d = Daemon("host_tier:\n  capacity: 64MiB\n")
    endpoint = d.endpoint
    d.stop()  # nothing listens there now
    sv.reset_counters()
    sched = make(KVConnectorRole.SCHEDULER, endpoint)
    req = fake_request("d", 4, 4 * BS + 1)
    t0 = time.monotonic()
    assert sched.get_num_new_matched_tokens(req, 0) == (0, False)
    assert time.monotonic() - t0 < 1.5
    # Marked down: the next calls do not try again until retry_after.
    t0 = time.monotonic()
    for _ in range(100):
        assert sched.get_num_new_matched_tokens(req, 0) == (0, False)
    assert time.monotonic() - t0 < 0.1
    w, _ = worker(endpoint)
    t0 = time.monotonic()
    assert step(w, loads=[("d", [1, 2], [h(0), h(1)])], saves=[chain_save("d", [3])]) == {1, 2}
    assert time.monotonic() - t0 < 1.5
    c = sv.counters()
    assert c["misses"] == 101 and c["lookups"] == 0
    assert c["load_errors"] == 2 and c["save_blocks_dropped"] == 1 and c["outages"] == 2


def test_daemon_killed_or_stopped_mid_run():
    d = Daemon("host_tier:\n  capacity: 64MiB\n")
    try:
        sv.reset_counters()
        src, _ = worker(d.endpoint, fill="random", **{"strata.retry_after": 0.5})
        step(src, saves=[chain_save("a", [1, 2, 3])])
        assert sv.wait_for_saves(10)
        sched = make(KVConnectorRole.SCHEDULER, d.endpoint, **{"strata.retry_after": 0.5})
        req = fake_request("k", 4, 4 * BS + 1)
        assert sched.get_num_new_matched_tokens(req, 0) == (3 * BS, False)
        dst, _ = worker(d.endpoint, **{"strata.retry_after": 0.5})
        assert step(dst, loads=[("k", [5], [h(0)])]) == set()

        # A stopped daemon: calls time out after rpc_timeout. Lookups and fetches may still be
        # answered from the client's same-node fast paths (the daemon's shared memory), so either
        # outcome is right; what matters is that nothing hangs or raises.
        d.pause()
        t0 = time.monotonic()
        assert sched.get_num_new_matched_tokens(req, 0) in ((0, False), (3 * BS, False))
        assert step(dst, loads=[("k", [6], [h(1)])]) in (set(), {6})
        assert time.monotonic() - t0 < 4.0
        d.resume()
        time.sleep(0.6)  # past retry_after: it is used again
        assert sched.get_num_new_matched_tokens(req, 0) == (3 * BS, False)
        assert step(dst, loads=[("k", [6], [h(1)])]) == set()

        d.kill()  # a dead daemon
        time.sleep(0.6)
        t0 = time.monotonic()
        assert sched.get_num_new_matched_tokens(req, 0) in ((0, False), (3 * BS, False))
        assert step(dst, loads=[("k", [7], [h(2)])], saves=[chain_save("k", [8], 3)]) in (set(), {7})
        assert time.monotonic() - t0 < 3.0
        src.shutdown()
        dst.shutdown()
    finally:
        d.stop()


def test_loads_go_straight_into_device_memory_from_a_gpu_tier():
    # stratad with a GPU tier of host memory standing in for the device, and the connector's
    # device load slots standing in the same way: the path a GPU node takes with CUDA IPC.
    d = Daemon("host_tier:\n  capacity: 64MiB\n"
               "gpu:\n  capacity: 4MiB\n  memory: host-stand-in\n")
    try:
        sv.reset_counters()
        src, src_kv = worker(d.endpoint, fill="random")
        assert step(src, saves=[chain_save("a", [3, 5, 7])]) == set()
        assert sv.wait_for_saves(10)
        dst, dst_kv = worker(d.endpoint, **{"strata.device_loads": "stand-in",
                                            "strata.device_saves": "off"})
        assert step(dst, loads=[("r", [2, 4, 6], [h(0), h(1), h(2)])]) == set()
        for name in LAYER_NAMES:
            for s, t in ((3, 2), (5, 4), (7, 6)):
                assert torch.equal(dst_kv[name][t], src_kv[name][s])
            assert not dst_kv[name][3].any()
        c = sv.counters()
        assert c["device_blocks_loaded"] == 3 and c["blocks_loaded"] == 3
        # The default ("auto") with KV caches in host memory: through host staging.
        sv.reset_counters()
        plain, plain_kv = worker(d.endpoint)
        assert step(plain, loads=[("r", [1], [h(0)])]) == set()
        assert sv.counters()["device_blocks_loaded"] == 0
        assert torch.equal(plain_kv[LAYER_NAMES[0]][1], src_kv[LAYER_NAMES[0]][3])
        for w in (src, dst, plain):
            w.shutdown()
    finally:
        d.stop()


def test_saves_go_straight_out_of_device_memory_with_a_gpu_tier():
    # The worker gathers a step's blocks into lent device save slots (standing in here) and
    # stratad publishes them out of there; a plain worker loads them back through host memory.
    d = Daemon("host_tier:\n  capacity: 64MiB\n"
               "gpu:\n  capacity: 4MiB\n  memory: host-stand-in\n")
    try:
        sv.reset_counters()
        src, src_kv = worker(d.endpoint, fill="random", **{"strata.device_saves": "stand-in"})
        assert step(src, saves=[chain_save("a", [3, 5, 7])]) == set()
        assert sv.wait_for_saves(10)
        c = sv.counters()
        assert c["device_blocks_saved"] == 3 and c["blocks_saved"] == 3
        # The slots are reused by the next step's saves.
        assert step(src, saves=[chain_save("b", [1, 2], 3)]) == set()
        assert sv.wait_for_saves(10)
        assert sv.counters()["device_blocks_saved"] == 5
        dst, dst_kv = worker(d.endpoint)
        assert step(dst, loads=[("r", [2, 4, 6, 8, 9], [h(i) for i in range(5)])]) == set()
        for name in LAYER_NAMES:
            for s, t in ((3, 2), (5, 4), (7, 6), (1, 8), (2, 9)):
                assert torch.equal(dst_kv[name][t], src_kv[name][s])
        assert sv.counters()["device_blocks_loaded"] == 0
        for w in (src, dst):
            w.shutdown()
    finally:
        d.stop()
