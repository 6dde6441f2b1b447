"""stratad's KV events read by a real ZMQ subscriber: decoded with msgpack, and with vLLM's own
KVEventBatch decoder when vLLM is installed (the format a router written for vLLM expects)."""
import time
import urllib.request

import msgpack
import pytest
import zmq

import strata
from conftest import SMALL, SMALL_BLOCK_BYTES, Daemon

EVENTS_CONFIG = ("host_tier:\n  capacity: 64MiB\nhttp_listen: 127.0.0.1:0\n"
                 "events:\n  endpoint: tcp://127.0.0.1:*\n  replay_endpoint: tcp://127.0.0.1:*\n")


@pytest.fixture
def events_daemon():
    d = Daemon(config=EVENTS_CONFIG)
    yield d
    d.stop()


def receive(sub, want_events, timeout=10.0):
    batches, n = [], 0
    deadline = time.monotonic() + timeout
    while n < want_events and time.monotonic() < deadline:
        if not sub.poll(200):
            continue
        topic, seq, payload = sub.recv_multipart()
        batches.append((topic.decode(), int.from_bytes(seq, "big"), payload))
        n += len(msgpack.unpackb(payload)[1])
    return batches


def low64(block_id: bytes) -> int:
    return int.from_bytes(block_id, "big") & (2**64 - 1)


def publish_and_evict(events_daemon):
    """Publishes a 4-block chain, evicts its last block; returns (ns, ids, batches received)."""
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.connect(events_daemon.info["events_endpoint"])
    time.sleep(0.3)

    c = strata.Client(events_daemon.endpoint)
    ns = c.open_namespace("events/py", tenant="t", **SMALL)
    tokens = list(range(1, 1 + 4 * 16))
    blocks = [bytes([i]) * SMALL_BLOCK_BYTES for i in range(4)]
    ids = c.publish(ns, tokens, blocks).ids
    c.evict(ns, ids[3:])

    batches = receive(sub, 3)
    c.close()
    sub.close()
    return ns, ids, batches


def test_published_and_evicted_blocks_reach_a_subscriber(events_daemon):
    ns, ids, batches = publish_and_evict(events_daemon)
    events = [e for _, _, p in batches for e in msgpack.unpackb(p)[1]]
    assert [e["type"] for e in events] == ["AllBlocksCleared", "BlockStored", "BlockRemoved"]
    assert events[1]["block_hashes"] == [low64(i) for i in ids]
    assert events[1]["parent_block_hash"] is None and events[1]["block_size"] == 16
    assert events[2]["block_hashes"] == [low64(ids[3])]
    assert all(t.startswith("kv@") and t.endswith(ns.hex()[:16]) for t, _, _ in batches)
    seqs = [s for _, s, _ in batches]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))

    # Prometheus sees the batches published and no drops.
    metrics = urllib.request.urlopen(f"http://{events_daemon.info['http_endpoint']}/metrics",
                                     timeout=5).read().decode()
    values = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
              if line.startswith("strata_kv_event")}
    assert values["strata_kv_event_batches_total"] >= len(batches)
    assert values["strata_kv_events_dropped_total"] == 0



def test_vllm_decodes_the_events(events_daemon):
    """vLLM's own decoder reads the same bytes into its event classes."""
    kv_events = pytest.importorskip("vllm.distributed.kv_events")
    import msgspec
    ns, ids, batches = publish_and_evict(events_daemon)
    decoder = msgspec.msgpack.Decoder(type=kv_events.KVEventBatch)
    decoded = [decoder.decode(p) for _, _, p in batches]
    kinds = [type(e).__name__ for b in decoded for e in b.events]
    assert kinds == ["AllBlocksCleared", "BlockStored", "BlockRemoved"]
    stored = [e for b in decoded for e in b.events if isinstance(e, kv_events.BlockStored)][0]
    assert stored.block_hashes == [low64(i) for i in ids] and stored.medium == "CPU"
