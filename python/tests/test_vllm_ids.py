"""vLLM-compatible block ids: Strata's C++ derivation against vLLM 0.32's formula written here
with pickle, cbor2 and hashlib, and against hashes vLLM 0.32.0 itself printed for tokens 1..96
(test_vllm_engine_ids.py repeats the check with vLLM's own code when vLLM is installed)."""
import hashlib
import pickle

import cbor2

import strata
from conftest import SMALL


def serialize(algo, obj) -> bytes:
    if algo == "sha256":
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return cbor2.dumps(obj, canonical=True)


def reference(tokens, block_size, algo="sha256", seed="vllm-none-hash", lora=None, salt=None):
    parent = hashlib.sha256(serialize(algo, seed)).digest()
    out = []
    for i in range(len(tokens) // block_size):
        keys = ([("lora", lora[0], lora[1])] if lora else []) + \
               ([("cache_salt", salt)] if salt and i == 0 else [])
        block = tuple(tokens[i * block_size:(i + 1) * block_size])
        parent = hashlib.sha256(serialize(algo, (parent, block, tuple(keys) if keys else None))).digest()
        out.append(parent)
    return out


# Printed by vLLM 0.32.0 (Request.block_hashes) for tokens 1..96, block size 32, no PYTHONHASHSEED.
VLLM_PRINTED = {
    ("sha256", None): ["647b02382fa9b9cde4d9582f5fb8b11f022c61f9842df2cf9cb0fb1a19ab6f9c",
                       "85e9f56d16ef4ea9421735da7176f503da45621fb3b7bec49b47638184b32ba2",
                       "717b191c9bd623b4e1dd03846624d1030e1572217eab8587502c2c59539fa9af"],
    ("sha256", "abc"): ["051373c4234a5f222ab04c55e86037275c9516f84d5a8085af94d202ddc0b20c",
                        "2468a79a4a4614ccd91b978db5629b02904bb3d47e250778cf14e01befd5175e",
                        "bf14fbf309a9d23ff36f95425e49a1ea683ab1e3041d49052faacbfdc2524fd7"],
    ("sha256_cbor", None): ["b2a727d31d71531aa716681e4783e0219ad14445f650848ba95e744b6ac91bce",
                            "0e511777fef56bf89905655aeeed8e662902ebfa6b08f4c53a69a32ed05d8f2e",
                            "8bf66a26038fc97105b0b16c44d4f454c48de1174adeaffc6558d11f74b60a73"],
    ("sha256_cbor", "abc"): ["812bea709394e12b8b9407ff839d70e3d0602569758875d660dfa930dbe49d13",
                             "a1a9e2d5c4e1ef0540a9db83f4f446a9588f9c721361ffc43c6e514bc22fc37a",
                             "c1960db2cf4c8158adf7f598db1d8970bc7f85fc48dd157cf99e03112bfffb0b"],
}


def test_hashes_match_what_vllm_printed():
    tokens = list(range(1, 97))
    for (algo, salt), want in VLLM_PRINTED.items():
        got = strata.vllm_block_hashes(tokens, 32, algo=algo, cache_salt=salt or "")
        assert [h.hex() for h in got] == want, (algo, salt)


def test_hashes_match_the_formula():
    # Token values on every integer-encoding boundary of both serializations.
    edges = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1]
    tokens = (edges * 12)[:128] + [5, 6]
    for algo in ("sha256", "sha256_cbor"):
        for block_size in (16, 32):
            for kw in ({}, {"seed": "0"}, {"seed": "x" * 300}, {"lora": ("adapter", "/p")},
                       {"salt": "tenant-salt"}, {"lora": ("l", ""), "salt": "s" * 260}):
                args = dict(algo=algo, hash_seed=kw.get("seed", "vllm-none-hash"),
                            lora_name=kw.get("lora", ("", ""))[0],
                            lora_path=kw.get("lora", ("", ""))[1], cache_salt=kw.get("salt", ""))
                assert strata.vllm_block_hashes(tokens, block_size, **args) == \
                    reference(tokens, block_size, algo, **kw), (algo, block_size, kw)


def test_a_vllm_namespace_names_blocks_as_vllm(daemon):
    c = strata.Client(daemon.endpoint, vllm_hash_seed="7")
    tokens = list(range(100, 100 + 3 * 16))
    for scheme, algo in (("vllm", "sha256"), ("vllm_cbor", "sha256_cbor")):
        ns = c.open_namespace("py/model", tenant="team-a", id_scheme=scheme, **SMALL)
        want = reference(tokens, 16, algo, seed="7")
        assert c.block_ids(ns, tokens) == want
        assert c.block_ids(ns, tokens, cache_salt="abc") == reference(tokens, 16, algo, seed="7",
                                                                      salt="abc")
        blocks = [bytes([i]) * 4096 for i in range(3)]
        assert c.publish(ns, tokens, blocks).stored == 3
        assert c.lookup_ids(ns, want) == 3
        # Another tenant's namespace does not see them, though it names them alike.
        other = c.open_namespace("py/model", tenant="team-b", id_scheme=scheme, **SMALL)
        assert c.block_ids(other, tokens) == want
        assert c.lookup_ids(other, want) == 0
    c.close()
