#!/usr/bin/env python3
"""Quality as the model sees it: a codec mode is judged by what a real model predicts when it
attends to that mode's decoded prefix KV (docs/codec.md, "Quality as the model sees it").

  prefix  runs the model over the first P tokens of a text and saves their KV cache
          (post-RoPE, Hugging Face channel order, as serving engines hold it):
          kv [layers, 2, P, kv_heads, head_dim] F16 (what the codec gets), kv_f32 (the same
          before rounding to fp16, for the floor), q [layers, P, q_heads, head_dim] F16 (the
          queries, for codec_eval's logit error), tokens [P + N + 1] I32.
  eval    teacher-forces the next N tokens three ways: attending to the fp16 prefix KV (the
          reference), to the fp32 one (the floor: what fp16 storage alone costs), and to each
          mode's decoded KV (codec_eval --write-decoded DIR: DIR/modes.tsv names the files).
          Per mode: KL(reference || mode) of the next-token distributions per continuation
          token (mean, p90, max), top-1 agreement, and the change of the continuation's mean
          negative log-likelihood. Writes quality.tsv for codec_eval --quality, and JSON.

MODEL is a GGUF file (architectures llama and qwen2; weights dequantised to fp32, or fp16 above
1 GiB of fp32, and computed in fp32) or tiny-random[:SEED], a 2-layer Llama-shaped model with
random weights and key outlier channels, for tests. Only numpy is needed for tiny-random; GGUF
models also need the gguf and tokenizers packages.
"""
import argparse
import json
import os
import struct
import sys
import time

import numpy as np

# Near-lossless: the decoded KV changes the model's next-token distribution by at most this mean
# KL (nats/token) and its greedy choice on at least this share of tokens, judged over at least
# this many continuation tokens.
NEAR_LOSSLESS_KL = 0.01
NEAR_LOSSLESS_TOP1 = 0.98
NEAR_LOSSLESS_MIN_TOKENS = 256

FLOOR_MODE = "fp32-kv"


class Lm:
    """Decoder-only transformer (RMSNorm, GQA attention with rotate-half RoPE, SwiGLU), all in
    the Hugging Face channel order, so the KV it records and reads is what serving engines
    hold. `w` maps names (emb, out, out_norm, L.attn_norm, L.wq, L.bq, ...) to arrays, matrices
    as (out, in)."""

    def __init__(self, cfg, w, name):
        self.cfg, self.w, self.name = cfg, w, name
        self.L, self.nh, self.nkv, self.hd = cfg["layers"], cfg["q_heads"], cfg["kv_heads"], cfg["head_dim"]
        half = self.hd // 2
        self.inv_freq = cfg["rope_theta"] ** (-np.arange(half, dtype=np.float64) * 2 / self.hd)

    def m(self, key):
        a = self.w.get(key)
        return None if a is None else a.astype(np.float32, copy=False)

    def norm(self, x, key):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.cfg["rms_eps"]) * self.m(key)

    def proj(self, h, l, name):
        y = h @ self.m(f"{l}.w{name}").T
        b = self.m(f"{l}.b{name}")
        return y if b is None else y + b

    def rope(self, x, pos):  # x [T, H, D]; pairs (j, j + D/2)
        ang = np.outer(pos, self.inv_freq)
        c = np.cos(ang)[:, None, :].astype(np.float32)
        s = np.sin(ang)[:, None, :].astype(np.float32)
        half = self.hd // 2
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)

    def forward(self, toks, past=None, want_logits=True, queries=None):
        """toks: token ids at positions len(past) onwards; past: per layer (K, V) float32
        [S, kv_heads, head_dim] post-RoPE. Returns (logits [T, vocab] or None, this call's K,
        V per layer); appends each layer's post-RoPE queries to the list `queries` if given."""
        T = len(toks)
        S0 = 0 if past is None else past[0][0].shape[0]
        pos = np.arange(S0, S0 + T)
        x = self.w["emb"][np.asarray(toks)].astype(np.float32)
        rep = self.nh // self.nkv
        new = []
        for l in range(self.L):
            h = self.norm(x, f"{l}.attn_norm")
            q = self.rope(self.proj(h, l, "q").reshape(T, self.nh, self.hd), pos)
            k = self.rope(self.proj(h, l, "k").reshape(T, self.nkv, self.hd), pos)
            v = self.proj(h, l, "v").reshape(T, self.nkv, self.hd)
            new.append((k, v))
            if queries is not None:
                queries.append(q.astype(np.float16))
            if past is not None:
                k = np.concatenate([past[l][0], k])
                v = np.concatenate([past[l][1], v])
            S = k.shape[0]
            # [kv_head, group, T, S]: each kv head's query group attends without copying K/V.
            qg = q.reshape(T, self.nkv, rep, self.hd).transpose(1, 2, 0, 3)
            sc = np.einsum("hgtd,shd->hgts", qg, k) / np.float32(np.sqrt(self.hd))
            sc = np.where(np.arange(S)[None, :] > pos[:, None], -np.inf, sc)
            sc -= sc.max(-1, keepdims=True)
            p = np.exp(sc)
            p /= p.sum(-1, keepdims=True)
            o = np.einsum("hgts,shd->thgd", p, v).reshape(T, self.nh * self.hd)
            x = x + o @ self.m(f"{l}.wo").T
            h = self.norm(x, f"{l}.ffn_norm")
            g = h @ self.m(f"{l}.wgate").T
            x = x + ((g / (1 + np.exp(-g))) * (h @ self.m(f"{l}.wup").T)) @ self.m(f"{l}.wdown").T
        if not want_logits:
            return None, new
        x = self.norm(x, "out_norm")
        out = self.w.get("out", self.w["emb"])
        # The output matrix in vocab slices: a 150k-token vocabulary in fp32 at once is ~1 GB.
        step = 16384
        logits = np.empty((T, out.shape[0]), np.float32)
        for i in range(0, out.shape[0], step):
            logits[:, i:i + step] = x @ out[i:i + step].astype(np.float32).T
        return logits, new


def tiny_random(seed):
    """2 layers, 4 query heads over 2 kv heads of 64, vocab 512; one RoPE channel pair per kv
    head scaled up in W_k, so keys have the outlier channels that real models have."""
    rng = np.random.default_rng(seed)
    cfg = dict(arch="llama", layers=2, dim=128, q_heads=4, kv_heads=2, head_dim=64, ffn=256,
               rope_theta=10000.0, rms_eps=1e-5, vocab=512)
    d, f, hd = cfg["dim"], cfg["ffn"], cfg["head_dim"]
    g = lambda *s: (rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32)
    w = {"emb": g(cfg["vocab"], d) * 4, "out_norm": np.ones(d, np.float32),
         "out": g(cfg["vocab"], d) * 6}
    for l in range(cfg["layers"]):
        wk = g(cfg["kv_heads"] * hd, d)
        for h in range(cfg["kv_heads"]):
            wk[h * hd + 3] *= 12
            wk[h * hd + 3 + hd // 2] *= 12
        w.update({f"{l}.attn_norm": np.ones(d, np.float32), f"{l}.ffn_norm": np.ones(d, np.float32),
                  f"{l}.wq": g(cfg["q_heads"] * hd, d) * 2, f"{l}.wk": wk,
                  f"{l}.wv": g(cfg["kv_heads"] * hd, d), f"{l}.wo": g(d, cfg["q_heads"] * hd),
                  f"{l}.wgate": g(f, d), f"{l}.wup": g(f, d), f"{l}.wdown": g(d, f)})
    return Lm(cfg, w, f"tiny-random:{seed}")


GGUF_NAMES = {"attn_norm": "attn_norm", "ffn_norm": "ffn_norm", "attn_q": "wq", "attn_k": "wk",
              "attn_v": "wv", "attn_output": "wo", "ffn_gate": "wgate", "ffn_up": "wup",
              "ffn_down": "wdown"}


def load_gguf(path):
    from gguf import GGUFReader
    from gguf.quants import dequantize
    r = GGUFReader(path)
    f = lambda k: r.fields[k].contents()
    arch = f("general.architecture")
    if arch not in ("llama", "qwen2"):
        sys.exit(f"model_quality: {path}: architecture {arch!r} is not supported (llama, qwen2)")
    nh = int(f(f"{arch}.attention.head_count"))
    dim = int(f(f"{arch}.embedding_length"))
    cfg = dict(arch=arch, layers=int(f(f"{arch}.block_count")), dim=dim, q_heads=nh,
               kv_heads=int(f(f"{arch}.attention.head_count_kv")), head_dim=dim // nh,
               ffn=int(f(f"{arch}.feed_forward_length")),
               rope_theta=float(f(f"{arch}.rope.freq_base")),
               rms_eps=float(f(f"{arch}.attention.layer_norm_rms_epsilon")),
               vocab=len(r.fields["tokenizer.ggml.tokens"].data))
    params = sum(int(np.prod([int(x) for x in t.shape])) for t in r.tensors)
    keep = np.float32 if params * 4 <= 1 << 30 else np.float16
    hd = cfg["head_dim"]
    w = {}
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape)]
        if len(shape) == 2:
            # Row slices: dequantising a 150k-row embedding at once takes gigabytes of temporaries.
            a = np.empty(shape, keep)
            for i in range(0, shape[0], 4096):
                a[i:i + 4096] = dequantize(t.data[i:i + 4096], t.tensor_type).reshape(-1, shape[1])
        else:
            a = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        parts = t.name.split(".")
        if parts[0] == "blk":
            base, kind = GGUF_NAMES[parts[2]], parts[3]
            key = f"{parts[1]}.{base if kind == 'weight' else 'b' + base[1:]}"
            # llama.cpp stores llama's Q/K rows interleaved for its GPT-J-style RoPE (head
            # channel 2j+s is HF channel s*D/2+j); qwen2 is stored and rotated rotate-half.
            if arch == "llama" and base in ("wq", "wk"):
                a = a.reshape(-1, hd // 2, 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)
        else:
            key = {"token_embd": "emb", "output": "out", "output_norm": "out_norm"}[parts[0]]
        w[key] = a
    m = Lm(cfg, w, os.path.basename(path))
    # Copies, not the reader: its memory map would keep the whole file resident.
    m.tokenizer_fields = {k: list(f(k)) if k != "tokenizer.ggml.pre" else f(k)
                          for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.pre")}
    return m


def tokenizer_for(m):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    f = m.tokenizer_fields.get
    tokens = list(f("tokenizer.ggml.tokens"))
    merges = [tuple(x.split(" ", 1)) for x in f("tokenizer.ggml.merges")]
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    if f("tokenizer.ggml.pre") == "qwen2":
        split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tk.decoder = decoders.ByteLevel()
    return tk


def load_model(spec):
    if spec.startswith("tiny-random"):
        return tiny_random(int(spec.split(":", 1)[1]) if ":" in spec else 0)
    return load_gguf(spec)


def write_safetensors(path, tensors, metadata):
    dt = {np.float16: "F16", np.float32: "F32", np.int32: "I32"}
    header, off = {"__metadata__": metadata}, 0
    for name, a in tensors:
        header[name] = {"dtype": dt[a.dtype.type], "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as fo:
        fo.write(struct.pack("<Q", len(h)))
        fo.write(h)
        for _, a in tensors:
            fo.write(np.ascontiguousarray(a).tobytes())


def read_safetensors(path):
    dt = {"F16": np.float16, "F32": np.float32, "I32": np.int32}
    with open(path, "rb") as fi:
        n = struct.unpack("<Q", fi.read(8))[0]
        header = json.loads(fi.read(n))
        body = fi.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(body[b:e], dtype=dt[t["dtype"]]).reshape(t["shape"])
    return out, meta


def distortion_metric(m, qs):
    """[L, 2, kv_heads, D, D] f32: per kv head, the matrix M with which an error e in a key or
    value vector costs e^T M e. Keys: the second moment of the group's queries (an error in k
    moves each logit by q.e), averaged over each RoPE pair's rotation, so it holds in the
    post-RoPE frame and with RoPE undone alike (the relative rotation between a query and a key
    varies with their distance). Values: W_o^T W_o over the group's slices of the output
    projection (an error in v moves the residual stream by W_o e, weighted by attention)."""
    L, H, D, rep = m.L, m.nkv, m.hd, m.nh // m.nkv
    half = D // 2
    out = np.zeros((L, 2, H, D, D), np.float32)
    for l in range(L):
        q = qs[l].astype(np.float64)  # [T, nh, D]
        wo = m.m(f"{l}.wo").astype(np.float64)  # [hidden, nh * D]
        for h in range(H):
            e = (q[:, h * rep:(h + 1) * rep, :] ** 2).mean(0).sum(0)  # [D]
            pair = 0.5 * (e[:half] + e[half:])
            out[l, 0, h] = np.diag(np.concatenate([pair, pair]))
            for g in range(h * rep, (h + 1) * rep):
                s = wo[:, g * D:(g + 1) * D]
                out[l, 1, h] += (s.T @ s).astype(np.float32)
    return out


def cmd_prefix(a):
    t0 = time.time()
    m = load_model(a.model)
    need = a.prefix_tokens + a.continuation_tokens + 1
    if a.model.startswith("tiny-random"):
        toks = np.random.default_rng(1).integers(0, m.cfg["vocab"], need)
    else:
        text = " ".join(open(a.text).read().split())
        toks = np.asarray(tokenizer_for(m).encode(text).ids)
        if len(toks) < need:
            sys.exit(f"model_quality: {a.text} has {len(toks)} tokens, {need} needed")
    toks = toks[:need].astype(np.int32)
    print(f"{m.name}: {json.dumps(m.cfg)} (load {time.time() - t0:.0f}s)", flush=True)
    qs = []
    _, kv = m.forward(toks[:a.prefix_tokens], want_logits=False, queries=qs)
    kv32 = np.stack([np.stack(x) for x in kv])  # [L, 2, P, H, D]
    k = kv32[:, 0]
    rms = np.sqrt((k.astype(np.float64) ** 2).mean(1))  # [L, H, D]
    print(f"prefix {a.prefix_tokens} tokens in {time.time() - t0:.0f}s; key channel RMS, largest "
          f"over median per (layer, head): median {np.median(rms.max(-1) / np.median(rms, -1)):.1f}x, "
          f"max {np.max(rms.max(-1) / np.median(rms, -1)):.1f}x; max |K| {np.abs(k).max():.1f}, "
          f"max |V| {np.abs(kv32[:, 1]).max():.1f}", flush=True)
    meta = {"model": m.name, "config": json.dumps(m.cfg), "prefix_tokens": str(a.prefix_tokens),
            "continuation_tokens": str(a.continuation_tokens),
            "kv_order": "HF rotate_half: RoPE pairs are channels (j, j+head_dim/2), post-RoPE"}
    # q: the real queries for codec_eval's logit error (--queries FILE:q); metric: what an error
    # in each head vector costs the model (codec_eval --pca-metric FILE:metric).
    write_safetensors(a.out, [("kv", kv32.astype(np.float16)), ("kv_f32", kv32), ("q", np.stack(qs)),
                              ("metric", distortion_metric(m, qs)), ("tokens", toks)], meta)
    print(f"wrote {a.out}")


def log_softmax(z):
    z = z.astype(np.float64)
    z -= z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def compare(ref_logits, logits, targets):
    """Per-token KL(ref || mode), top-1 agreement, mean NLL change, over the continuation.
    In float64 (the floor's KL is ~1e-7), a few tokens at a time to bound the memory."""
    n = len(targets)
    kl, dnll = np.empty(n), np.empty(n)
    for i in range(0, n, 16):
        r, lp = log_softmax(ref_logits[i:i + 16]), log_softmax(logits[i:i + 16])
        kl[i:i + 16] = (np.exp(r) * (r - lp)).sum(-1)
        j = np.arange(len(r))
        dnll[i:i + 16] = r[j, targets[i:i + 16]] - lp[j, targets[i:i + 16]]
    return dict(tokens=n, kl_mean=float(kl.mean()), kl_p90=float(np.percentile(kl, 90)),
                kl_max=float(kl.max()),
                top1=float(np.mean(ref_logits.argmax(-1) == logits.argmax(-1))),
                dnll=float(dnll.mean()))


def verdict(q):
    if q["tokens"] < NEAR_LOSSLESS_MIN_TOKENS:
        return "n/a"
    return "yes" if q["kl_mean"] <= NEAR_LOSSLESS_KL and q["top1"] >= NEAR_LOSSLESS_TOP1 else "no"


def cmd_eval(a):
    t0 = time.time()
    pre, meta = read_safetensors(a.prefix)
    kv16, toks = pre["kv"], pre["tokens"]
    m = load_model(a.model)
    c = m.cfg
    want = (c["layers"], 2, kv16.shape[2], c["kv_heads"], c["head_dim"])
    if kv16.ndim != 5 or kv16.shape != want or meta.get("model") != m.name:
        sys.exit(f"model_quality: {a.prefix} holds KV of shape {kv16.shape} from "
                 f"{meta.get('model')!r}; {m.name} needs (layers, 2, tokens, kv_heads, head_dim) = {want}")
    P = kv16.shape[2]
    cont, targets = toks[P:-1], toks[P + 1:]

    def run(kv):
        kv = kv.astype(np.float32)
        logits, _ = m.forward(cont, past=[(kv[l, 0], kv[l, 1]) for l in range(c["layers"])])
        return logits

    ref = run(kv16)
    nll = -np.concatenate([log_softmax(ref[i:i + 16])[np.arange(len(ref[i:i + 16])), targets[i:i + 16]]
                           for i in range(0, len(targets), 16)])
    print(f"{m.name}: reference (fp16 prefix KV) NLL {nll.mean():.3f} nats/token over "
          f"{len(targets)} continuation tokens ({time.time() - t0:.0f}s)", flush=True)
    rows = [(FLOOR_MODE, compare(ref, run(pre["kv_f32"]), targets))]
    with open(os.path.join(a.decoded, "modes.tsv")) as fi:
        modes = [line.rstrip("\n").split("\t") for line in fi if line.strip()]
    for mode, fname in modes:
        dec, _ = read_safetensors(os.path.join(a.decoded, fname))
        if "kv" not in dec or dec["kv"].shape != kv16.shape:
            sys.exit(f"model_quality: {fname} ({mode}) holds KV of shape "
                     f"{dec['kv'].shape if 'kv' in dec else None}, the prefix {kv16.shape}")
        rows.append((mode, compare(ref, run(dec["kv"]), targets)))
        q = rows[-1][1]
        print(f"  {mode:24s} KL mean {q['kl_mean']:.4g} p90 {q['kl_p90']:.4g} max {q['kl_max']:.4g} "
              f"top-1 {100 * q['top1']:.1f}% dNLL {q['dnll']:+.4f} ({time.time() - t0:.0f}s)", flush=True)
    with open(a.out, "w") as fo:
        fo.write("mode\ttokens\tkl_mean\tkl_p90\tkl_max\ttop1\tdnll\tnear_lossless\n")
        for mode, q in rows:
            fo.write(f"{mode}\t{q['tokens']}\t{q['kl_mean']:.6g}\t{q['kl_p90']:.6g}\t{q['kl_max']:.6g}\t"
                     f"{q['top1']:.6f}\t{q['dnll']:.6g}\t{verdict(q)}\n")
    if a.json:
        with open(a.json, "w") as fo:
            json.dump({"model": m.name, "config": c, "prefix_tokens": P,
                       "reference_nll": float(nll.mean()),
                       "near_lossless": {"kl_mean_max": NEAR_LOSSLESS_KL, "top1_min": NEAR_LOSSLESS_TOP1,
                                         "min_tokens": NEAR_LOSSLESS_MIN_TOKENS},
                       "rows": [dict(mode=mode, near_lossless=verdict(q), **q) for mode, q in rows]},
                      fo, indent=1)
    print(f"wrote {a.out} ({time.time() - t0:.0f}s)")


def cmd_sensitivity(a):
    """Per (layer, tensor): the model's KL when only that slice of the prefix KV is the decoded
    one, over the slice's distortion (each head's squared error relative to its energy, summed
    over heads: the pca calibration's unit). Run it on a calibration text, never on the text a
    mode is judged on."""
    t0 = time.time()
    pre, meta = read_safetensors(a.prefix)
    kv16, toks = pre["kv"], pre["tokens"]
    with open(os.path.join(a.decoded, "modes.tsv")) as fi:
        mode, fname = fi.readline().rstrip("\n").split("\t")
    dec = read_safetensors(os.path.join(a.decoded, fname))[0]["kv"]
    if dec.shape != kv16.shape:
        sys.exit(f"model_quality: {fname} holds KV of shape {dec.shape}, the prefix {kv16.shape}")
    m = load_model(a.model)
    L = m.cfg["layers"]
    P = kv16.shape[2]
    n = min(a.tokens, len(toks) - P - 1)
    cont, targets = toks[P:P + n], toks[P + 1:P + n + 1]

    def run(kv):
        kv = kv.astype(np.float32)
        return m.forward(cont, past=[(kv[l, 0], kv[l, 1]) for l in range(L)])[0]

    ref = run(kv16)
    H = kv16.shape[3]
    heads = [slice(None)] if not a.per_head else [slice(h, h + 1) for h in range(H)]
    kl = np.zeros((L, 2, len(heads)))
    dist = np.zeros((L, 2, len(heads)))
    for l in range(L):
        for t in range(2):
            for i, h in enumerate(heads):
                x = kv16[l, t, :, h].astype(np.float64)  # [P, heads, D]
                err = ((dec[l, t, :, h].astype(np.float64) - x) ** 2).sum((0, 2))
                energy = ((x - x.mean(0)) ** 2).sum((0, 2))
                dist[l, t, i] = (err / np.maximum(energy, 1e-30)).sum()
                probe = kv16.copy()
                probe[l, t, :, h] = dec[l, t, :, h]
                kl[l, t, i] = compare(ref, run(probe), targets)["kl_mean"]
        print(f"  layer {l}: KL keys {kl[l, 0].sum():.3g} values {kl[l, 1].sum():.3g} "
              f"({time.time() - t0:.0f}s)", flush=True)
    if not a.per_head:
        kl, dist = kl[..., 0], dist[..., 0]
    s = kl / np.maximum(dist, 1e-30)
    # The square root of the measured ratio, and within a factor `spread` of the median: the
    # probe is linear (KL per unit of distortion at one rate), the model is not: a slice coded
    # much coarser than the probe costs more than linearly (keys that lose their structure
    # flatten attention). With the full ratio, SmolLM2 at 1.5 bits/value went from KL 0.033 to
    # 0.25 (at 2 bits it gained 1.7x); with its square root it gained 1.5-1.6x at both rates.
    med = np.median(s)
    s = np.ones_like(s) if not med > 0 else np.sqrt(np.clip(s / med, 1 / a.spread, a.spread))
    write_safetensors(a.out, [("importance", s.astype(np.float32)), ("kl", kl.astype(np.float32)),
                              ("distortion", dist.astype(np.float32))],
                      {"model": m.name, "mode": mode, "tokens": str(n)})
    print(f"wrote {a.out}: importance {s.min():.3g}..{s.max():.3g} ({time.time() - t0:.0f}s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prefix")
    p.add_argument("--model", required=True, help="GGUF path or tiny-random[:SEED]")
    p.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    p.add_argument("--prefix-tokens", type=int, default=1024)
    p.add_argument("--continuation-tokens", type=int, default=256)
    p.add_argument("--out", required=True)
    e = sub.add_parser("eval")
    e.add_argument("--model", required=True)
    e.add_argument("--prefix", required=True, help="the prefix command's output")
    e.add_argument("--decoded", required=True, help="codec_eval --write-decoded's directory")
    e.add_argument("--out", required=True, help="quality.tsv for codec_eval --quality")
    e.add_argument("--json")
    s = sub.add_parser("sensitivity")
    s.add_argument("--model", required=True)
    s.add_argument("--prefix", required=True, help="the prefix command's output (calibration text)")
    s.add_argument("--decoded", required=True,
                   help="codec_eval --write-decoded's directory for that prefix (its first mode)")
    s.add_argument("--out", required=True, help="safetensors: importance [layers, 2(, kv_heads)]")
    s.add_argument("--tokens", type=int, default=128, help="continuation tokens per probe")
    s.add_argument("--per-head", action="store_true",
                   help="one importance per (layer, tensor, kv head): kv_heads times the probes")
    s.add_argument("--spread", type=float, default=100.0,
                   help="measured ratios are kept within this factor of their median")
    a = ap.parse_args()
    {"prefix": cmd_prefix, "eval": cmd_eval, "sensitivity": cmd_sensitivity}[a.cmd](a)


if __name__ == "__main__":
    main()
