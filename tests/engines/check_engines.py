"""Helpers of scripts/test-engines.sh.

    check_engines.py prompts OUT.json [--prefix 1024] [--count 6]
    check_engines.py stats ENDPOINT OUT.json          (stratad's counters, via the Python client)
    check_engines.py check DIR                        (reads DIR/run{0..3}.json, DIR/stats*.json)

`check` prints the figures and a PASS/FAIL line per check, and exits 1 on any failure.
"""
import json
import os
import random
import statistics
import sys

BLOCK = 32


def make_prompts(out, prefix=1024, count=6):
    rng = random.Random(1234)
    shared = [rng.randrange(3, 1000) for _ in range(prefix)]
    prompts = [shared + [rng.randrange(3, 1000) for _ in range(40 + 8 * i)] for i in range(count)]
    with open(out, "w") as f:
        json.dump({"prefix_len": prefix, "prompts": prompts}, f)


def stats(endpoint, out):
    import strata
    with strata.Client(endpoint, rpc_timeout=5.0, quiet=True) as c:
        s = c.stats()
    with open(out, "w") as f:
        json.dump(s["counters"], f, indent=1, sort_keys=True)


def check(d):
    def load(name):
        with open(os.path.join(d, name)) as f:
            return json.load(f)

    meta = load("prompts.json")
    prefix, n = meta["prefix_len"], len(meta["prompts"])
    runs = {i: load(f"run{i}.json") for i in range(4) if os.path.exists(os.path.join(d, f"run{i}.json"))}
    s0, s1, s2 = load("stats0.json"), load("stats1.json"), load("stats2.json")
    failures = []

    def verdict(ok, what):
        print(("PASS  " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    for i in range(4):
        verdict(i in runs, f"run {i} finished and wrote its result")
    if failures:
        return 1
    r0, r1, r2, r3 = (runs[i] for i in range(4))
    ref = r0["outputs"]
    ref_first = [t["first_token"] for t in r0["timing"]]
    print(f"prompts: {n} of {len(meta['prompts'][0])}..{len(meta['prompts'][-1])} tokens, "
          f"shared prefix {prefix} tokens ({prefix // BLOCK} blocks of {BLOCK}), "
          f"{len(ref[0])} output tokens each")
    for i, r in ((1, r1), (2, r2), (3, r3)):
        same = r["outputs"] == ref and [t["first_token"] for t in r["timing"]] == ref_first
        verdict(same, f"run {i} outputs token-identical to run 0 (no connector)")

    c1 = r1["counters"]
    d1 = {k: s1.get(k, 0) - s0.get(k, 0) for k in s1}
    print(f"run 1 connector: {json.dumps(c1, sort_keys=True)}")
    print(f"run 1 stratad counter deltas: committed_blocks {d1.get('committed_blocks_total')}, "
          f"dedup_blocks {d1.get('dedup_blocks_total')}")
    verdict(r1["saves_done"] and c1["blocks_saved"] >= prefix // BLOCK and c1["save_errors"] == 0
            and d1.get("committed_blocks_total", 0) >= prefix // BLOCK,
            f"run 1 published the shared prefix (connector saved {c1['blocks_saved']} blocks, "
            f"stratad committed {d1.get('committed_blocks_total')})")

    c2 = r2["counters"]
    d2 = {k: s2.get(k, 0) - s1.get(k, 0) for k in s2}
    print(f"run 2 connector: {json.dumps(c2, sort_keys=True)}")
    print(f"run 2 stratad counter deltas: fetch_hit_blocks {d2.get('fetch_hit_blocks_total')}, "
          f"fetch_miss_blocks {d2.get('fetch_miss_blocks_total')}, lookups {d2.get('lookups_total')}, "
          f"lookup_hit_blocks {d2.get('lookup_hit_blocks_total')}")
    per_req = [t["connector"].get("tokens_loaded", 0) for t in r2["timing"]]
    print(f"run 2 tokens loaded per request (timing phase): {per_req} "
          f"(shared prefix {prefix}, threshold {int(0.9 * prefix)})")
    out_loaded = r2["outputs_counters"].get("tokens_loaded", 0)
    print(f"run 2 tokens loaded, batched outputs phase: {out_loaded} for {n} requests "
          f"({out_loaded / n:.0f} per request)")
    verdict(all(x >= 0.9 * prefix for x in per_req) and out_loaded >= 0.9 * prefix * n,
            "run 2 loaded >= 90% of the shared-prefix tokens of every request from Strata")
    verdict(c2["load_errors"] == 0, f"run 2 had no load errors ({c2['load_errors']})")
    verdict(d2.get("fetch_hit_blocks_total", -1) == c2["blocks_loaded"],
            f"stratad served the blocks run 2 loaded (fetch_hit_blocks delta "
            f"{d2.get('fetch_hit_blocks_total')} == connector blocks_loaded {c2['blocks_loaded']})")

    c3 = r3["counters"]
    print(f"run 3 (stratad killed) connector: {json.dumps(c3, sort_keys=True)}")
    verdict(c3["tokens_loaded"] == 0, f"run 3 loaded nothing ({c3['tokens_loaded']} tokens)")

    def ms(r):
        return [1000 * t["prefill_s"] for t in r["timing"]]
    print("prefill time per request (ms, max_tokens=1, each prompt alone, engine process):")
    for name, r in (("run 0 no connector, full prefill", r0), ("run 2 loaded from Strata", r2),
                    ("run 3 stratad dead", r3)):
        v = ms(r)
        print(f"  {name:34s} median {statistics.median(v):7.1f}  "
              f"[{', '.join('%.1f' % x for x in v)}]")
    speed = statistics.median(ms(r0)) / max(1e-9, statistics.median(ms(r2)))
    print(f"  median speed-up with the load: {speed:.2f}x")
    print(f"process wall time (s): run0 {r0['total_s']:.1f}, run1 {r1['total_s']:.1f}, "
          f"run2 {r2['total_s']:.1f}, run3 {r3['total_s']:.1f}; "
          f"run 3 generate {r3['generate_s']:.2f} s vs run 0 {r0['generate_s']:.2f} s")
    verdict(max(ms(r3)) < 5000, "run 3 requests did not stall (every prefill < 5 s)")
    print(f"checks: {'FAIL (' + str(len(failures)) + ')' if failures else 'all passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "prompts":
        args = sys.argv[2:]
        make_prompts(args[0])
    elif cmd == "stats":
        stats(sys.argv[2], sys.argv[3])
    elif cmd == "check":
        sys.exit(check(sys.argv[2]))
    else:
        sys.exit(f"unknown command {cmd}")
