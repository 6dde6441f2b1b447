"""vLLM-compatible block ids: Strata's C++ derivation against vLLM's formula written with cbor2
and hashlib (tests/engines/ checks the same ids against vLLM's own code)."""
import hashlib

import cbor2

import strata
from conftest import SMALL


def sha256_cbor(obj) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def reference(tokens, block_size, seed="0", lora=None, salt=None):
    parent = sha256_cbor(seed)
    out = []
    for i in range(len(tokens) // block_size):
        keys = ([lora] if lora else []) + ([salt] if salt and i == 0 else [])
        parent = sha256_cbor((parent, tuple(tokens[i * block_size:(i + 1) * block_size]),
                              tuple(keys) if keys else None))
        out.append(parent)
    return out


def test_hashes_match_the_formula():
    tokens = [1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1] * 12 + [5, 6]
    for block_size in (16, 32):
        for kw in ({}, {"seed": "42"}, {"lora": "adapter-x"}, {"salt": "tenant-salt"},
                   {"lora": "l", "salt": "s"}):
            args = dict(hash_seed=kw.get("seed", "0"), lora_name=kw.get("lora", ""),
                        cache_salt=kw.get("salt", ""))
            assert strata.vllm_block_hashes(tokens, block_size, **args) == \
                reference(tokens, block_size, **kw), (block_size, kw)


def test_a_vllm_namespace_names_blocks_as_vllm(daemon):
    c = strata.Client(daemon.endpoint, vllm_hash_seed="7")
    ns = c.open_namespace("py/model", tenant="team-a", id_scheme="vllm", **SMALL)
    tokens = list(range(100, 100 + 3 * 16))
    assert c.block_ids(ns, tokens) == reference(tokens, 16, seed="7")
    assert c.block_ids(ns, tokens, cache_salt="abc") == reference(tokens, 16, seed="7", salt="abc")
    blocks = [bytes([i]) * 4096 for i in range(3)]
    assert c.publish(ns, tokens, blocks).stored == 3
    assert c.lookup_ids(ns, reference(tokens, 16, seed="7")) == 3
    # Another tenant's namespace does not see them, though it names them alike.
    other = c.open_namespace("py/model", tenant="team-b", id_scheme="vllm", **SMALL)
    assert c.lookup_ids(other, reference(tokens, 16, seed="7")) == 0
    c.close()
