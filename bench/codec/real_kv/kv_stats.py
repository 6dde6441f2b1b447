#!/usr/bin/env python3
"""Sanity statistics of a real-KV safetensors file written by dump_kv.py (tensor 'kv', HF order)."""
import sys

import numpy as np
from safetensors.numpy import load_file

path = sys.argv[1] if len(sys.argv) > 1 else "real_kv_smollm2-135m.safetensors"
t = load_file(path)
kv = t["kv"].astype(np.float32)  # [L, 2, T, H, D]
L, _, T, H, D = kv.shape
half = D // 2
rng = np.random.default_rng(0)
print(f"{path}: kv {kv.shape}, tokens {T}")
print("layer | K: top1/med chan RMS, top chans(h0), top-chan-in-token-top4 %, pair corr (j,j+D/2) vs random, "
      "low-freq energy % | V: top1/med | tok0 |k|/median")
pc_all, rc_all = [], []
for l in range(L):
    K, V = kv[l, 0], kv[l, 1]  # [T, H, D]
    rms = np.sqrt((K ** 2).mean(0))  # [H, D]
    vrms = np.sqrt((V ** 2).mean(0))
    ratio = np.mean(rms.max(1) / np.median(rms, 1))
    vratio = np.mean(vrms.max(1) / np.median(vrms, 1))
    top = np.argsort(-rms[0])[:3]
    # consistency: per token, is the head's top-RMS channel among that token's 4 largest |k|?
    cons = []
    for h in range(H):
        c = np.argmax(rms[h])
        r4 = np.argsort(-np.abs(K[:, h, :]), axis=1)[:, :4]
        cons.append(np.mean((r4 == c).any(1)))
    lr = np.log(rms)
    pc = np.mean([np.corrcoef(lr[h, :half], lr[h, half:])[0, 1] for h in range(H)])
    perm = rng.permutation(D)
    rc = np.mean([np.corrcoef(lr[h, perm[:half]], lr[h, perm[half:]])[0, 1] for h in range(H)])
    pc_all.append(pc); rc_all.append(rc)
    e = rms ** 2
    low = np.concatenate([np.arange(half // 2, half), np.arange(half + half // 2, D)])
    lowfrac = e[:, low].sum() / e.sum()
    kn = np.linalg.norm(K, axis=2).mean(1)
    print(f"{l:5d} | {ratio:6.1f}  {str(top.tolist()):14s} {100*np.mean(cons):5.1f}%  {pc:5.2f} vs {rc:5.2f}  "
          f"{100*lowfrac:5.1f}% | {vratio:5.1f} | {kn[0]/np.median(kn):5.2f}")
print(f"mean pair corr {np.mean(pc_all):.2f} vs random pairing {np.mean(rc_all):.2f}")
K = kv[:, 0]
print(f"K: |max| {np.abs(K).max():.2f}, rms {np.sqrt((K**2).mean()):.3f}, kurtosis per-channel-pooled "
      f"{((K-K.mean())**4).mean()/K.var()**2:.1f}; V: |max| {np.abs(kv[:,1]).max():.2f}, rms {np.sqrt((kv[:,1]**2).mean()):.3f}")
# token-to-token correlation of keys / values (adjacent tokens), like the generator's AR(1) knob
for name, X in (("K", kv[:, 0]), ("V", kv[:, 1])):
    Xc = X - X.mean(1, keepdims=True)
    num = (Xc[:, 1:] * Xc[:, :-1]).sum((1, 2, 3)).sum()
    den = (Xc ** 2).sum()
    print(f"{name}: adjacent-token correlation (centered per channel) {num/den:.2f}")
