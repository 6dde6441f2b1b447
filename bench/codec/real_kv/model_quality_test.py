#!/usr/bin/env python3
"""ctest codec_model_quality: the model-quality pipeline end to end on tiny-random (a 2-layer
Llama-shaped model with random weights): model_quality.py prefix, codec_eval --write-decoded
(the real Encoder/Decoder), model_quality.py eval, codec_eval --quality. Checks that the
metrics separate a bit-exact mode from coarse ones, and that mismatched shapes are refused with
a clear error. Exits 77 (skipped) without numpy.

  model_quality_test.py --codec-eval build/bench/codec/codec_eval --work DIR
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

try:
    import numpy as np
except ImportError:
    print("numpy is not installed for", sys.executable, "- skipped")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import model_quality as mq  # noqa: E402

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def run(cmd, expect_ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if expect_ok and p.returncode != 0:
        sys.exit(f"command failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p


def read_tsv(path):
    rows = {}
    with open(path) as f:
        next(f)
        for line in f:
            c = line.rstrip("\n").split("\t")
            rows[c[0]] = dict(tokens=int(c[1]), kl_mean=float(c[2]), kl_p90=float(c[3]),
                              kl_max=float(c[4]), top1=float(c[5]), dnll=float(c[6]), verdict=c[7])
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--codec-eval", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    py = [sys.executable, os.path.join(HERE, "model_quality.py")]
    prefix = os.path.join(a.work, "prefix.safetensors")
    dec = os.path.join(a.work, "decoded")
    tsv = os.path.join(a.work, "quality.tsv")
    modes = "lossless,int8-g64,int2-g64,quant:k2v2:ol"
    run(py + ["prefix", "--model", "tiny-random", "--prefix-tokens", "128",
              "--continuation-tokens", "32", "--out", prefix])
    run([a.codec_eval, "--data", prefix + ":kv", "--tokens-per-block", "64", "--modes", modes,
         "--reps", "1", "--write-decoded", dec])
    run(py + ["eval", "--model", "tiny-random", "--prefix", prefix, "--decoded", dec, "--out", tsv])
    q = read_tsv(tsv)
    check(sorted(q) == sorted(modes.split(",") + [mq.FLOOR_MODE]), f"one row per mode and the floor: {sorted(q)}")
    ll = q["lossless"]
    check(ll["kl_max"] == 0 and ll["top1"] == 1 and ll["dnll"] == 0,
          f"lossless decodes the reference's own KV: KL max {ll['kl_max']}, top-1 {ll['top1']}, dNLL {ll['dnll']}")
    check(ll["tokens"] == 32 and ll["verdict"] == "n/a",
          f"32 continuation tokens, too few for a near-lossless verdict: {ll['tokens']}, {ll['verdict']}")
    fl, i8, i2 = q[mq.FLOOR_MODE], q["int8-g64"], q["int2-g64"]
    check(0 < fl["kl_mean"] < i2["kl_mean"], f"fp32 floor {fl['kl_mean']:.3g} in (0, int2-g64 {i2['kl_mean']:.3g})")
    check(i2["kl_mean"] > 1e-3 and i2["kl_mean"] > 20 * i8["kl_mean"],
          f"int2-g64 KL {i2['kl_mean']:.3g} > 1e-3 and > 20x int8-g64's {i8['kl_mean']:.3g}")
    check(i2["top1"] < 1 and i2["kl_max"] >= i2["kl_p90"] >= 0,
          f"int2-g64 flips some argmax ({i2['top1']:.3f}); KL max {i2['kl_max']:.3g} >= p90 {i2['kl_p90']:.3g}")
    check(q["quant:k2v2:ol"]["kl_mean"] > 0, "quant:k2v2:ol is lossy to the model")

    # codec_eval prints the model's figures beside bits/value.
    p = run([a.codec_eval, "--data", prefix + ":kv", "--tokens-per-block", "64", "--modes", modes,
             "--reps", "1", "--quality", tsv])
    table = p.stdout[p.stdout.find("Quality as the model sees it"):]
    i2_line = next((l for l in table.splitlines() if l.startswith("int2-g64 ")), "")
    check(f"{i2['kl_mean']:.3g}" in i2_line.split() and "fp32 KV (floor)" in table,
          f"codec_eval --quality row: {i2_line!r}")
    p = run([a.codec_eval, "--data", prefix + ":kv", "--tokens-per-block", "64", "--modes", modes,
             "--reps", "1", "--json", "--quality", tsv])
    check('"kl_mean"' in p.stdout and '"floor_fp32_kv"' in p.stdout, "codec_eval --json carries the quality fields")

    # Sensitivity: per (layer, tensor), what the decoded KV of one mode costs the model; it
    # steers a pca calibration (codec_eval --pca-importance), as does the metric.
    probe = os.path.join(a.work, "probe")
    run([a.codec_eval, "--data", prefix + ":kv", "--tokens-per-block", "64", "--modes", "int2-g64",
         "--reps", "1", "--write-decoded", probe])
    imp_path = os.path.join(a.work, "importance.safetensors")
    run(py + ["sensitivity", "--model", "tiny-random", "--prefix", prefix, "--decoded", probe,
              "--out", imp_path, "--tokens", "16"])
    t, _ = mq.read_safetensors(imp_path)
    imp, kl = t["importance"], t["kl"]
    check(imp.shape == (2, 2) and np.all(kl > 0) and np.all(t["distortion"] > 0),
          f"one importance per layer and tensor, every probe lossy: {imp.shape}, KL {kl.ravel()}")
    check(imp.min() >= 0.1 - 1e-6 and imp.max() <= 10 + 1e-6 and imp.min() < 1 < imp.max(),
          f"importances on both sides of 1, within sqrt(spread) of it: {imp.ravel()}")
    pca = [a.codec_eval, "--data", prefix + ":kv", "--tokens-per-block", "64", "--modes", "pca:b2",
           "--reps", "1", "--calibrate-from", prefix + ":kv"]
    def coded(extra):  # what the blobs are: their size and their error, not the run's speeds
        row = json.loads(run(pca + ["--json"] + extra).stdout)["rows"][0]
        return row["bits_per_value"], row["rel_mse"]
    plain = coded([])
    steered = coded(["--pca-importance", imp_path + ":importance"])
    metric = coded(["--pca-metric", prefix + ":metric"])
    check(steered != plain and metric != plain,
          f"importance and metric change the pca blobs: {plain} vs {steered} and {metric}")
    p = run(pca + ["--pca-importance", imp_path + ":kl_bad"], expect_ok=False)
    check(p.returncode != 0 and "kl_bad" in p.stderr, f"a missing tensor is refused: {p.stderr.strip()!r}")
    p = run(pca + ["--pca-metric", imp_path + ":importance"], expect_ok=False)
    check(p.returncode != 0 and "expected shape (2, 2, 2, 64, 64)" in p.stderr,
          f"a metric of another shape is refused: {p.stderr.strip()!r}")

    # The numpy model of transforms not built yet (cross_layer_model.py) writes decoded KV that
    # eval reads like codec_eval's; a coarser step costs fewer bits and more of the model's KL.
    xl = os.path.join(a.work, "xl")
    bits = {}
    for variant, step, extra in (("head", "0.5", []), ("xl", "0.5", []), ("xl", "2", []),
                                 ("xl", "0.5", ["--predictor", "two"]),
                                 ("xl", "0.5", ["--predictor-rank", "8"])):
        p = run([sys.executable, os.path.join(HERE, "cross_layer_model.py"), "--calib", prefix,
                 "--prefix", prefix, "--rope-theta", "10000", "--variant", variant, "--step", step,
                 "--importance", imp_path, "--out", xl] + extra)
        name = f"{variant}-s{step}-imp" + ("-two" if "two" in extra else "") + (
            "-r8" if "--predictor-rank" in extra else "")
        check(p.stdout.startswith(name + ": "), f"cross_layer_model.py names its output: {p.stdout.strip()!r}")
        bits[name] = float(p.stdout.split()[1])
    xl_tsv = os.path.join(xl, "quality.tsv")
    run(py + ["eval", "--model", "tiny-random", "--prefix", prefix, "--decoded", xl, "--out", xl_tsv])
    qx = read_tsv(xl_tsv)
    check(sorted(qx) == sorted(list(bits) + [mq.FLOOR_MODE]), f"one row per variant: {sorted(qx)}")
    fine, coarse = qx["xl-s0.5-imp"], qx["xl-s2-imp"]
    check(bits["xl-s2-imp"] < bits["xl-s0.5-imp"] and coarse["kl_mean"] > fine["kl_mean"] > 0,
          f"xl step 2 vs 0.5: bits {bits['xl-s2-imp']:.3f} < {bits['xl-s0.5-imp']:.3f}, "
          f"KL {coarse['kl_mean']:.3g} > {fine['kl_mean']:.3g}")

    # Refusals, each with a message that names the problem.
    p = run([a.codec_eval, "--data", prefix + ":kv", "--tokens-per-block", "96", "--modes", "lossless",
             "--write-decoded", os.path.join(a.work, "partial")], expect_ok=False)
    check(p.returncode != 0 and "whole number of blocks" in p.stderr,
          f"codec_eval refuses to write a partial last block: {p.stderr.strip()!r}")
    bad = os.path.join(a.work, "bad")
    os.makedirs(bad)
    kv, _ = mq.read_safetensors(os.path.join(dec, "lossless.safetensors"))
    mq.write_safetensors(os.path.join(bad, "short.safetensors"), [("kv", np.ascontiguousarray(kv["kv"][:, :, :64]))], {})
    with open(os.path.join(bad, "modes.tsv"), "w") as f:
        f.write("short\tshort.safetensors\n")
    p = run(py + ["eval", "--model", "tiny-random", "--prefix", prefix, "--decoded", bad,
                  "--out", os.path.join(bad, "q.tsv")], expect_ok=False)
    check(p.returncode != 0 and "(2, 2, 64, 2, 64)" in p.stderr and "(2, 2, 128, 2, 64)" in p.stderr,
          f"eval refuses decoded KV of another shape: {p.stderr.strip()!r}")
    p = run(py + ["eval", "--model", "tiny-random:1", "--prefix", prefix, "--decoded", dec,
                  "--out", os.path.join(bad, "q.tsv")], expect_ok=False)
    check(p.returncode != 0 and "tiny-random:0" in p.stderr,
          f"eval refuses a prefix made by another model: {p.stderr.strip()!r}")
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
