"""The Python client against a real stratad: buffers, zero copy, errors, GIL, futures."""
import threading
import time

import numpy as np
import pytest

import strata
from strata import errors
from conftest import SMALL, SMALL_BLOCK_BYTES, Daemon


def blocks_of(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, SMALL_BLOCK_BYTES, dtype=np.uint8) for _ in range(n)]


def tokens_of(n_blocks, extra=5, start=1):
    return list(range(start, start + n_blocks * SMALL["tokens_per_block"] + extra))


class DlpackOnly:
    """Offers a numpy array through __dlpack__ alone, as a torch tensor does."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, *args, **kwargs):
        return self.array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_quick_start_round_trip(client):
    ns = client.open_namespace("py/model", tenant="team-a", **SMALL)
    assert isinstance(ns, bytes) and len(ns) == 32
    tokens = tokens_of(3)
    src = blocks_of(3)
    first = client.publish(ns, tokens, src[:2])
    assert first.stored == 2 and first.status == [strata.BlockStatus.OK] * 2
    again = client.publish(ns, tokens, src)
    assert again.stored == 1 and again.deduplicated == 2
    assert again.status[0] == strata.BlockStatus.EXISTS

    hit = client.lookup(ns, tokens)
    assert hit.prefix_blocks == 3 and hit.prefix_tokens == 48 and len(hit.ids) == 3
    assert client.lookup_ids(ns, hit.ids) == 3
    assert hit.ids == client.block_ids(ns, tokens)

    out = [np.zeros(SMALL_BLOCK_BYTES, dtype=np.uint8) for _ in range(3)]
    got = client.fetch(ns, hit.ids, out)
    assert got.fetched == 3 and got.sizes == [SMALL_BLOCK_BYTES] * 3
    for a, b in zip(src, out):
        assert np.array_equal(a, b)


def test_every_kind_of_buffer_is_used_in_place(client):
    ns = client.open_namespace("py/model", tenant="team-a", **SMALL)
    tokens = tokens_of(3, start=500)
    # bytes as a source, a DLPack-only object and a bytearray too.
    src = blocks_of(3, seed=7)
    sources = [src[0].tobytes(), DlpackOnly(src[1]), bytearray(src[2].tobytes())]
    assert client.publish(ns, tokens, sources).stored == 3
    ids = client.block_ids(ns, tokens)

    dl_out = np.zeros(SMALL_BLOCK_BYTES, dtype=np.uint8)
    raw_out = np.zeros(SMALL_BLOCK_BYTES, dtype=np.uint8)
    ba_out = bytearray(SMALL_BLOCK_BYTES)
    raw = (raw_out.ctypes.data, raw_out.nbytes)
    got = client.fetch(ns, ids, [DlpackOnly(dl_out), raw, memoryview(ba_out)])
    assert got.fetched == 3
    assert np.array_equal(dl_out, src[0])
    assert np.array_equal(raw_out, src[1])
    assert bytes(ba_out) == src[2].tobytes()


def test_registered_buffer_receives_fetches(client):
    ns = client.open_namespace("py/model", tenant="team-a", **SMALL)
    tokens = tokens_of(2, start=900)
    src = blocks_of(2, seed=3)
    client.publish(ns, tokens, src)
    arena = np.zeros(2 * SMALL_BLOCK_BYTES, dtype=np.uint8)
    client.register_buffer(arena)
    views = [arena[:SMALL_BLOCK_BYTES], arena[SMALL_BLOCK_BYTES:]]
    assert client.fetch(ns, client.block_ids(ns, tokens), views).fetched == 2
    assert np.array_equal(views[0], src[0]) and np.array_equal(views[1], src[1])
    client.unregister_buffer(arena)


def test_per_block_outcomes_stay_per_block(client):
    ns = client.open_namespace("py/model", tenant="team-a", **SMALL)
    tokens = tokens_of(3, start=1300)
    src = blocks_of(3, seed=5)
    client.publish(ns, tokens, src[:1])
    ids = client.block_ids(ns, tokens)
    out = [np.zeros(SMALL_BLOCK_BYTES, dtype=np.uint8) for _ in range(3)]
    got = client.fetch(ns, ids, out)
    assert got.status == [strata.BlockStatus.OK, strata.BlockStatus.NOT_FOUND,
                          strata.BlockStatus.NOT_FOUND]
    assert got.fetched == 1 and np.array_equal(out[0], src[0])
    small = [np.zeros(10, dtype=np.uint8)]
    assert client.fetch(ns, ids[:1], small).status == [strata.BlockStatus.INVALID]
    assert client.pin(ns, ids[:1], ttl_seconds=60) == [strata.BlockStatus.OK]
    assert client.evict(ns, ids[:1]) == [strata.BlockStatus.PINNED]
    assert client.unpin(ns, ids[:1]) == [strata.BlockStatus.OK]
    assert client.evict(ns, ids[:1], cascade=True) == [strata.BlockStatus.OK]
    assert client.lookup_ids(ns, ids) == 0


def test_errors_are_exceptions_with_the_message(client, daemon):
    with pytest.raises(errors.InvalidArgumentError, match="float13"):
        client.open_namespace("py/model", tenant="t", **{**SMALL, "dtype": "float13"})
    with pytest.raises(errors.InvalidArgumentError, match="num_layers"):
        client.open_namespace("py/model", tenant="t", **{**SMALL, "num_layers": 0})
    # A cold codec (transcoding instead of eviction) needs a codec namespace and a lossy spec.
    with pytest.raises(errors.FailedPreconditionError, match="opaque"):
        client.open_namespace("py/model", tenant="t", cold_codec="quant:k2v2", **SMALL)
    with pytest.raises(errors.InvalidArgumentError, match="cold_codec"):
        client.open_namespace("py/model", tenant="t", codec="quant:k8v8", cold_codec="k2",
                              **SMALL)
    assert len(client.open_namespace("py/model", tenant="t", codec="quant:k8v8",
                                     cold_codec="quant:k2v2", **SMALL)) == 32
    with pytest.raises(errors.FailedPreconditionError, match="not opened"):
        client.lookup(b"\x01" * 32, [1] * 32)
    with pytest.raises(errors.InvalidArgumentError, match="32 bytes"):
        client.lookup_ids(b"short", [])
    ns = client.open_namespace("py/model", tenant="team-a", **SMALL)
    tokens = tokens_of(1, start=2000)
    client.publish(ns, tokens, blocks_of(1))
    with pytest.raises(errors.InvalidArgumentError, match="writable"):
        client.fetch(ns, client.block_ids(ns, tokens), [bytes(SMALL_BLOCK_BYTES)])
    with pytest.raises(errors.InvalidArgumentError, match="buffer"):
        client.publish(ns, tokens, [object()])
    with pytest.raises(errors.InvalidArgumentError):
        client.lookup(ns, [-1] * 16)
    assert isinstance(client.stats()["host_capacity_bytes"], int)


def test_a_closed_client_raises_and_a_close_during_a_call_is_safe(daemon):
    # In a child process: a call on a closed client used to kill the interpreter (it raised
    # without the GIL), which must fail this test rather than the test run.
    import subprocess
    import sys
    import textwrap
    script = textwrap.dedent(f"""
        import numpy as np, strata
        from strata import errors
        c = strata.Client({daemon.endpoint!r}, rpc_timeout=5.0)
        ns = c.open_namespace("py/closed", tenant="t", num_layers=2, num_kv_heads=1,
                              head_dim=64, dtype="bf16", tokens_per_block=16)
        c.close()
        for call in (lambda: c.lookup(ns, list(range(16))),
                     lambda: c.fetch(ns, [b"\\x01" * 32], [np.zeros(16, np.uint8)]),
                     lambda: c.publish(ns, list(range(16)), [np.zeros(16, np.uint8)]),
                     lambda: c.stats()):
            try:
                call()
                raise SystemExit("a closed client answered")
            except errors.FailedPreconditionError as e:
                assert "closed" in str(e), e
        c.close()
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]

    # One thread fetches while another closes the client: each call succeeds or raises.
    c = strata.Client(daemon.endpoint, rpc_timeout=5.0)
    ns = c.open_namespace("py/closing", tenant="t", **SMALL)
    tokens = tokens_of(2, start=7000)
    c.publish(ns, tokens, blocks_of(2))
    ids = c.block_ids(ns, tokens)
    outcomes = []

    def fetch_until_closed():
        out = [np.zeros(SMALL_BLOCK_BYTES, dtype=np.uint8) for _ in ids]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                outcomes.append(c.fetch(ns, ids, out).fetched)
            except errors.FailedPreconditionError:
                outcomes.append("closed")
                return
            except errors.StrataError as e:
                outcomes.append(repr(e))

    t = threading.Thread(target=fetch_until_closed)
    t.start()
    time.sleep(0.05)
    c.close()
    t.join(timeout=30)
    assert not t.is_alive()
    assert outcomes and outcomes[-1] == "closed", outcomes[-5:]
    assert all(o in (2, "closed") for o in outcomes), outcomes[-5:]


def test_a_dead_endpoint_fails_within_the_deadline():
    start = time.monotonic()
    with pytest.raises(errors.StrataError):
        strata.Client("127.0.0.1:1", rpc_timeout=1.0)
    assert time.monotonic() - start < 5


def test_tls_files_are_checked_at_connect(daemon):
    # TLS options reach libstrata: a CA file that is not there fails before dialing, naming it.
    with pytest.raises(errors.StrataError, match="tls.ca_file"):
        strata.Client(daemon.endpoint, tls_ca_file="/nonexistent/strata-ca.pem",
                      tls_server_name="localhost", quiet=True)
    with pytest.raises(errors.StrataError, match="tls.key_file"):
        strata.Client(daemon.endpoint, tls_ca_file=__file__, tls_cert_file=__file__, quiet=True)


def test_the_gil_is_released_while_a_call_waits(daemon):
    c = strata.Client(daemon.endpoint, rpc_timeout=1.5, lookup_fast_path=False, quiet=True)
    ns = c.open_namespace("py/model", tenant="team-a", **SMALL)
    ticks = 0
    done = threading.Event()
    failure = []

    def lookup():
        try:
            c.lookup(ns, tokens_of(1))
        except errors.StrataError as e:
            failure.append(e)
        done.set()

    daemon.pause()  # the daemon stops answering: the lookup waits out its deadline
    try:
        t = threading.Thread(target=lookup)
        t.start()
        while not done.is_set():
            ticks += 1  # runs only while the lookup thread does not hold the GIL
        t.join()
    finally:
        daemon.resume()
    assert failure and isinstance(failure[0], errors.DeadlineExceededError), failure
    assert ticks > 10000
    c.close()


def test_async_variants_return_futures(client):
    ns = client.open_namespace("py/model", tenant="team-a", **SMALL)
    tokens = tokens_of(2, start=3000)
    src = blocks_of(2, seed=11)
    assert client.publish_async(ns, tokens, src).result(timeout=10).stored == 2
    hit = client.lookup_async(ns, tokens).result(timeout=10)
    out = [np.zeros(SMALL_BLOCK_BYTES, dtype=np.uint8) for _ in range(2)]
    futures = [client.fetch_async(ns, [hit.ids[i]], [out[i]]) for i in range(2)]
    assert [f.result(timeout=10).fetched for f in futures] == [1, 1]
    assert np.array_equal(out[0], src[0]) and np.array_equal(out[1], src[1])


def test_a_calibrated_namespace_round_trip(client):
    # KV with the structure calibration exploits: head vectors near a low-dimensional subspace.
    layout = {**SMALL, "dtype": "fp16"}
    ns = client.open_namespace("py/pca-model", tenant="team-a", codec="pca:b3", **layout)
    rng = np.random.default_rng(7)
    basis = rng.normal(size=(8, SMALL["head_dim"]))
    values_per_block = SMALL_BLOCK_BYTES // 2

    def kv_blocks(n):
        rows = rng.normal(size=(n * values_per_block // SMALL["head_dim"], 8)) @ basis
        rows += 0.01 * rng.normal(size=rows.shape)
        return [b.astype(np.float16) for b in np.split(rows.reshape(-1), n)]

    with pytest.raises(errors.StrataError, match="calibrate"):
        client.publish(ns, tokens_of(1), kv_blocks(1))
    info = client.calibrate(ns, kv_blocks(32))
    assert info["version"] == 1 and info["current"] and info["target_bits"] == 3.0
    assert [c["id"] for c in client.list_calibrations(ns)] == [info["id"]]
    with pytest.raises(errors.StrataError, match="importances"):
        client.calibrate(ns, kv_blocks(32), importance=[1.0, 2.0, 3.0])
    importance = [2.0] + [1.0] * (2 * SMALL["num_layers"] - 1)  # per (layer, tensor)
    steered = client.calibrate(ns, kv_blocks(32), importance=importance)
    assert steered["version"] == 2 and steered["current"] and steered["id"] != info["id"]

    src = kv_blocks(3)
    assert client.publish(ns, tokens_of(3), src).stored == 3
    out = [np.zeros(values_per_block, dtype=np.float16) for _ in range(3)]
    got = client.fetch(ns, client.block_ids(ns, tokens_of(3)), out)
    assert got.status == [strata.BlockStatus.OK] * 3
    for a, b in zip(src, out):
        a, b = a.astype(np.float64), b.astype(np.float64)
        assert np.sum((a - b) ** 2) < 0.01 * np.sum(a ** 2)


def test_a_cross_layer_namespace_round_trip(client, daemon):
    # Codec mode xl: every layer predicted from the decoded layer below, the residual coded with
    # one transform per layer. KV whose layers share a state that each layer nudges.
    layout = {**SMALL, "dtype": "fp16"}
    ns = client.open_namespace("py/xl-model", tenant="team-a", codec="xl:s0.3", **layout)
    rng = np.random.default_rng(11)
    layers, heads, dim = SMALL["num_layers"], SMALL["num_kv_heads"], SMALL["head_dim"]
    tokens = SMALL["tokens_per_block"]
    weights = rng.normal(size=(layers, 2, 8, heads * dim))

    def kv_blocks(n):
        out = []
        for _ in range(n):
            state = rng.normal(size=(tokens, 8))
            block = []
            for layer in range(layers):
                state = state + 0.3 * rng.normal(size=state.shape)
                for tensor in range(2):
                    block.append(state @ weights[layer, tensor]
                                 + 0.01 * rng.normal(size=(tokens, heads * dim)))
            out.append(np.concatenate([b.reshape(-1) for b in block]).astype(np.float16))
        return out

    with pytest.raises(errors.StrataError, match="calibrate"):
        client.publish(ns, tokens_of(1), kv_blocks(1))
    info = client.calibrate(ns, kv_blocks(32))
    assert info["version"] == 1 and info["current"] and info["mode"] == "xl"
    assert info["step"] == pytest.approx(0.3) and info["target_bits"] == 0
    assert 0 < info["sample_bits"] < 16
    old_src = kv_blocks(2)
    old_tokens = [t + 1000 for t in tokens_of(2)]
    assert client.publish(ns, old_tokens, old_src).stored == 2
    finer = client.calibrate(ns, kv_blocks(32), step=0.2)
    assert finer["version"] == 2 and finer["step"] == pytest.approx(0.2)
    assert finer["sample_bits"] > info["sample_bits"]

    src = kv_blocks(3)
    assert client.publish(ns, tokens_of(3), src).stored == 3
    ids = client.block_ids(ns, old_tokens) + client.block_ids(ns, tokens_of(3))
    # The client above, and one that keeps a single parsed calibration at a time: blobs of both
    # versions in one fetch still decode.
    with strata.Client(daemon.endpoint, calibration_cache_bytes=1) as tight:
        tight.open_namespace("py/xl-model", tenant="team-a", codec="xl:s0.3", **layout)
        for c in (client, tight, tight):
            out = [np.zeros_like(b) for b in old_src + src]
            got = c.fetch(ns, ids, out)
            assert got.status == [strata.BlockStatus.OK] * 5
            for a, b in zip(old_src + src, out):
                a, b = a.astype(np.float64), b.astype(np.float64)
                assert np.sum((a - b) ** 2) < 0.01 * np.sum(a ** 2)
        # Both versions in use by one fetch: the budget is exceeded rather than one dropped, and
        # nothing was asked for again after (only a new version would push them out).
        stats = tight.calibration_cache_stats()
        assert stats["budget_bytes"] == 1 and stats["bytes"] > 1
        assert stats["calibrations"] == 2 and stats["fetches"] == 2 and stats["evictions"] == 0
    held = client.calibration_cache_stats()
    assert held["calibrations"] >= 2 and held["evictions"] == 0 and held["bytes"] > 0


def test_publish_buffers_are_published_without_the_clients_copy(tmp_path):
    # Two tenants on this node: each client's zone of the arena is read-only to it, and blocks
    # the engine writes into a publish buffer are copied by stratad straight into the zone.
    token_a = "tenant-a-token-0123456789"
    (tmp_path / "tokens").write_text(
        f"{token_a} a tenant\ntenant-b-token-0123456789 b tenant\n")
    d = Daemon(f"host_tier:\n  capacity: 64MiB\nauth:\n  tokens_file: {tmp_path / 'tokens'}\n")
    try:
        with strata.Client(d.endpoint, auth_token=token_a, quiet=True) as c:
            ns = c.open_namespace("pb/model", tenant="", **SMALL)
            n = SMALL_BLOCK_BYTES
            buf = c.allocate_publish_buffer(3 * n)
            assert len(buf) == 3 * n
            engine = np.frombuffer(buf, dtype=np.uint8)  # writable, in place
            src = blocks_of(3, seed=7)
            for i, b in enumerate(src):
                engine[i * n:(i + 1) * n] = b
            tokens = tokens_of(3, start=4000)
            staged = c.stats()["counters"]["published_staged_total"]
            assert c.publish(ns, tokens, [engine[i * n:(i + 1) * n] for i in range(3)]).stored == 3
            assert c.stats()["counters"]["published_staged_total"] == staged + 3
            engine[:] = 0xAB  # the engine reuses its buffer: what was stored stays
            out = [np.zeros(n, np.uint8) for _ in range(3)]
            assert c.fetch(ns, c.block_ids(ns, tokens), out).fetched == 3
            for got, want in zip(out, src):
                assert np.array_equal(got, want)
        # The buffer's memory is the client's: it stays usable after close().
        view = memoryview(buf)
        view[0] = 1
        assert view[0] == 1
        del view, engine, buf
    finally:
        d.stop()


def test_blocks_are_fetched_into_a_lent_device_buffer(gpu_stand_in_client):
    # A GPU tier of host memory standing in for the device, and an engine "device buffer" of
    # shared memory standing in for the engine's: the same loans and copies a GPU node makes
    # with CUDA IPC.
    c = gpu_stand_in_client
    ns = c.open_namespace("dev/model", tenant="t", **SMALL)
    n = SMALL_BLOCK_BYTES
    src = blocks_of(3, seed=11)
    tokens = tokens_of(3, start=9000)
    assert c.publish(ns, tokens, src).stored == 3
    ids = c.block_ids(ns, tokens)
    device = strata.StandInDeviceBuffer(4 * n)
    loan = c.lend_device_buffer(device)
    assert loan.id != 0
    r = c.fetch_to_device(ns, loan, [ids[2], ids[0]], [0, 2 * n])
    assert r.fetched == 2 and r.bytes == 2 * n
    assert r.sources == ["gpu", "gpu"]
    mem = np.frombuffer(device, dtype=np.uint8)
    assert np.array_equal(mem[:n], src[2])
    assert np.array_equal(mem[2 * n:3 * n], src[0])
    r = c.fetch_to_device(ns, loan, [ids[1]], [n], promote=False)
    assert r.sources == ["host"] and np.array_equal(mem[n:2 * n], src[1])
    with pytest.raises(errors.InvalidArgumentError):
        c.lend_device_buffer(bytearray(16))
    c.return_device_buffer(loan)
    with pytest.raises(errors.NotFoundError):
        c.fetch_to_device(ns, loan, [ids[0]], [0])


def test_blocks_are_published_out_of_a_lent_device_buffer(gpu_stand_in_client):
    # The engine's KV stays where it is: the daemon reads each block out of the lent buffer and
    # publishes it, chained as publish_ids chains them.
    c = gpu_stand_in_client
    ns = c.open_namespace("dev/model", tenant="t", **SMALL)
    n = SMALL_BLOCK_BYTES
    src = blocks_of(3, seed=13)
    ids = c.block_ids(ns, tokens_of(3, start=9800))
    device = strata.StandInDeviceBuffer(3 * n)
    mem = np.frombuffer(device, dtype=np.uint8)
    for i, b in zip([2, 0, 1], src):
        mem[i * n:(i + 1) * n] = b
    loan = c.lend_device_buffer(device)
    r = c.publish_from_device(ns, loan, ids, [2 * n, 0, n], [n] * 3)
    assert r.stored == 3 and r.bytes_read == 3 * n and r.stored_bytes == [n] * 3
    assert not r.encoded_on_device
    out = [np.zeros(n, dtype=np.uint8) for _ in range(3)]
    assert c.fetch(ns, ids, out).fetched == 3
    for got, want in zip(out, src):
        assert np.array_equal(got, want)
    r = c.publish_from_device(ns, loan, ids[:1], [3 * n - 1], [n])
    assert r.status == [strata.BlockStatus.INVALID]
    with pytest.raises(errors.InvalidArgumentError):
        c.publish_from_device(ns, loan, ids, [0], [n])
    c.return_device_buffer(loan)


def test_reposition_puts_blocks_into_the_gpu_tier(gpu_stand_in_client):
    c = gpu_stand_in_client
    ns = c.open_namespace("dev/model", tenant="t", **SMALL)
    n = SMALL_BLOCK_BYTES
    src = blocks_of(2, seed=12)
    tokens = tokens_of(2, start=9500)
    assert c.publish(ns, tokens, src).stored == 2
    ids = c.block_ids(ns, tokens)
    r = c.reposition(ns, ids[:1], target_tier="gpu")
    assert r["status"] == [strata.BlockStatus.OK]
    # Without promotion, only the repositioned block comes from the device.
    device = strata.StandInDeviceBuffer(2 * n)
    loan = c.lend_device_buffer(device)
    f = c.fetch_to_device(ns, loan, ids, [0, n], promote=False)
    assert f.sources == ["gpu", "host"]
    mem = np.frombuffer(device, dtype=np.uint8)
    assert np.array_equal(mem[:n], src[0]) and np.array_equal(mem[n:], src[1])
    c.return_device_buffer(loan)
    assert c.reposition(ns, ids)["already_there"] == 2
    with pytest.raises(errors.InvalidArgumentError):
        c.reposition(ns, ids, target_tier="nvme")
    with pytest.raises(errors.NotFoundError):
        c.reposition(ns, ids, target_node="no-such-node")
