"""One vLLM (CPU) engine process for scripts/test-engines.sh.

    python tests/engines/run_engine.py --model DIR --prompts PROMPTS.json --out RESULT.json
        [--connector --endpoint HOST:PORT] [--prefix-caching 0|1] [--max-tokens 16]

PROMPTS.json is a list of token-id lists (or {"prompts": [...]}). The process builds one LLM, runs a warm-up request,
then two phases:
  timing:  each prompt alone with max_tokens=1 (its wall time is the request's prefill time,
           including the connector's lookup and load when there is one), in order;
  outputs: all prompts in one generate call, greedy, ignore_eos, --max-tokens tokens each.
With --connector, strata.vllm's counters are snapshot around every request / phase and, at the
end, the process waits for the connector's publishes to complete. RESULT.json holds everything.
Env (set here if absent): VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0
VLLM_CPU_OMP_THREADS_BIND=nobind. PYTHONHASHSEED must be the same for every process that shares
blocks (vLLM seeds its block hashes with it); the caller sets it.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--connector", action="store_true")
    ap.add_argument("--endpoint", default="127.0.0.1:7420")
    ap.add_argument("--prefix-caching", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--rpc-timeout", type=float, default=1.0)
    args = ap.parse_args()

    t_start = time.monotonic()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = {}
    counters = lambda: {}  # noqa: E731
    if args.connector:
        from vllm.config import KVTransferConfig
        import strata.vllm as sv
        counters = sv.counters
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="StrataConnector", kv_connector_module_path="strata.vllm",
            kv_role="kv_both", kv_load_failure_policy="recompute",
            kv_connector_extra_config={"strata.endpoint": args.endpoint,
                                       "strata.rpc_timeout": args.rpc_timeout})
    with open(args.prompts) as f:
        prompts = json.load(f)
    if isinstance(prompts, dict):
        prompts = prompts["prompts"]
    llm = LLM(model=args.model, skip_tokenizer_init=True, block_size=args.block_size,
              enforce_eager=True, dtype="bfloat16", max_model_len=2048,
              enable_prefix_caching=bool(args.prefix_caching), seed=0, **kw)
    t_init = time.monotonic() - t_start

    def delta(before):
        after = counters()
        return {k: after.get(k, 0) - before.get(k, 0) for k in after}

    # Warm-up on an unrelated prompt (first-call allocations), not timed.
    llm.generate([TokensPrompt(prompt_token_ids=[3 + (i % 7) for i in range(40)])],
                 SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True), use_tqdm=False)

    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    timing = []
    c_phase = counters()
    for p in prompts:
        c0 = counters()
        t0 = time.monotonic()
        out = llm.generate([TokensPrompt(prompt_token_ids=p)], one, use_tqdm=False)[0]
        dt = time.monotonic() - t0
        timing.append({"prompt_len": len(p), "prefill_s": dt,
                       "num_cached_tokens": out.num_cached_tokens,
                       "first_token": list(out.outputs[0].token_ids), "connector": delta(c0)})
    timing_counters = delta(c_phase)

    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    c0 = counters()
    t0 = time.monotonic()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    t_gen = time.monotonic() - t0
    outputs_counters = delta(c0)
    saves_done = True
    if args.connector:
        saves_done = sv.wait_for_saves(30.0)
    result = {
        "connector": args.connector, "prefix_caching": bool(args.prefix_caching),
        "init_s": t_init, "generate_s": t_gen, "total_s": time.monotonic() - t_start,
        "timing": timing, "timing_counters": timing_counters,
        "outputs": [list(o.outputs[0].token_ids) for o in outs],
        "num_cached_tokens": [o.num_cached_tokens for o in outs],
        "outputs_counters": outputs_counters, "counters": counters(), "saves_done": saves_done,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("run_engine: done in %.1f s (init %.1f s), counters %s" %
          (result["total_s"], t_init, json.dumps(result["counters"], sort_keys=True)), flush=True)
    sys.stdout.flush()
    # Skip interpreter teardown of the engine (slow, noisy); the result is written.
    os._exit(0)


if __name__ == "__main__":
    main()
