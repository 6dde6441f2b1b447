#!/usr/bin/env python3
"""A numpy model of transform coders for a model's KV cache, to decide what to build before
building it (docs/codec.md, "Measured, not built: one transform per layer and a prediction
from the layer below"). Not Strata's codec: no rANS, no blob; a symbol costs its empirical
entropy per coordinate (over the evaluated tokens), every coordinate gets the same uniform
step in relative units, and the sequence's first token is kept exact (16 bits per value).

Variants (--variant):
  head     one PCA per (layer, tensor, kv head), as the pca mode codes today
  layer    one PCA per layer over every kv head's key and value
  headxl   per head, coding each layer's residual after a linear prediction from the decoded
           layer below (closed loop: the prediction reads what a decoder would have)
  xl       one PCA per layer over the residual of that prediction

Keys are coded with RoPE undone (rotate-half, --rope-theta) and redone after. Every head's
key and value are scaled to unit rms per value on the calibration KV, then, with
--importance (model_quality.py sensitivity's output), by the square root of the slice's
importance, so that one step is one weighted relative error. The basis, means and the
predictor (ridge regression, --ridge times the samples on the diagonal) come from the
calibration KV alone. Writes OUT/<variant>-s<step>[-imp][-head].safetensors (tensor 'kv', the
prefix's shape, fp16) and appends it to OUT/modes.tsv for `model_quality.py eval`.

  cross_layer_model.py --calib mq-smollm2/calib.safetensors \\
      --prefix mq-smollm2/prefix.safetensors --rope-theta 100000 --variant xl --step 0.7 \\
      --importance importance.safetensors --out DIR
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_quality import read_safetensors, write_safetensors  # noqa: E402


def rotate(x, theta, inverse):
    """Rotate-half RoPE of x [tokens, heads, dim] at positions 0.., or its inverse."""
    dim = x.shape[-1]
    half = dim // 2
    angle = np.arange(x.shape[0])[:, None] * theta ** (-2.0 * np.arange(half) / dim)[None, :]
    c = np.cos(angle)[:, None, :]
    s = np.sin(angle)[:, None, :] * (-1.0 if inverse else 1.0)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], -1)


def entropy_bits(q):
    _, counts = np.unique(q, return_counts=True)
    p = counts / counts.sum()
    return float(-(counts * np.log2(p)).sum())


class Layout:
    """A layer's key and value heads as one row per token, scaled per (tensor, head)."""

    def __init__(self, calib, theta, importance):
        self.L, _, _, self.H, self.D = calib.shape
        self.theta = theta
        self.scale = np.zeros((self.L, 2, self.H))
        for l in range(self.L):
            for t, x in enumerate(self.tensors(calib, l)):
                centred = x - x.mean(0)
                rms = np.sqrt((centred ** 2).sum(-1).mean(0) / self.D)
                w = 1.0 if importance is None else importance[l, t]
                self.scale[l, t] = rms / np.sqrt(w)

    def tensors(self, kv, l):
        keys = rotate(kv[l, 0], self.theta, True) if self.theta > 0 else kv[l, 0]
        return keys, kv[l, 1]

    def rows(self, kv, l):
        k, v = self.tensors(kv, l)
        n = k.shape[0]
        k = k / self.scale[l, 0][None, :, None]
        v = v / self.scale[l, 1][None, :, None]
        return np.concatenate([k.reshape(n, -1), v.reshape(n, -1)], 1)

    def unrows(self, rows, l):
        n, hd = rows.shape[0], self.H * self.D
        k = rows[:, :hd].reshape(n, self.H, self.D) * self.scale[l, 0][None, :, None]
        v = rows[:, hd:].reshape(n, self.H, self.D) * self.scale[l, 1][None, :, None]
        return (rotate(k, self.theta, False) if self.theta > 0 else k), v


def code_groups(rc, rp, groups, step):
    """PCA of the calibration rows rc per group of columns; the evaluated rows rp projected,
    rounded to the step (token 0 left out: kept exact) and reconstructed. Returns the bits and
    the reconstruction."""
    bits, out = 0.0, np.zeros_like(rp)
    for g in groups:
        mu = rc[:, g].mean(0)
        _, basis = np.linalg.eigh(np.cov((rc[:, g] - mu).T))
        y = (rp[:, g] - mu) @ basis
        y[0] = 0
        q = np.round(y / step)
        bits += sum(entropy_bits(q[1:, k]) for k in range(q.shape[1]) if np.any(q[1:, k]))
        out[:, g] = (q * step) @ basis.T + mu
    return bits, out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calib", required=True, help="model_quality.py prefix output (tensor kv)")
    ap.add_argument("--prefix", required=True, help="the evaluated KV (tensor kv)")
    ap.add_argument("--rope-theta", type=float, default=0.0)
    ap.add_argument("--variant", choices=["head", "layer", "headxl", "xl"], required=True)
    ap.add_argument("--step", type=float, required=True, help="in relative units")
    ap.add_argument("--importance", help="safetensors, tensor importance [layers, 2]")
    ap.add_argument("--ridge", type=float, default=0.1)
    ap.add_argument("--predictor", choices=["full", "head", "two"], default="full",
                    help="head: each kv head's key and value from the same head's below only; "
                         "two: from the two layers below (a 2 width x width ridge fit)")
    ap.add_argument("--predictor-rank", type=int, default=0,
                    help="> 0: the full predictor reduced to this rank (reduced-rank regression: "
                         "the ridge fit projected on the top right singular vectors of its fitted "
                         "values), 2 x width x rank numbers instead of width^2")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    calib = read_safetensors(a.calib)[0]["kv"].astype(np.float64)
    prefix16 = read_safetensors(a.prefix)[0]["kv"]
    prefix = prefix16.astype(np.float64)
    importance = None
    if a.importance:
        importance = read_safetensors(a.importance)[0]["importance"].astype(np.float64)
        if importance.ndim != 2:
            sys.exit("--importance: per (layer, tensor) only")
    lay = Layout(calib, a.rope_theta, importance)
    width = 2 * lay.H * lay.D
    joint = a.variant in ("layer", "xl")
    predict = a.variant in ("headxl", "xl")
    groups = [np.arange(width)] if joint else [
        np.arange(i * lay.D, (i + 1) * lay.D) for i in range(2 * lay.H)]

    decoded = np.zeros_like(prefix)
    bits = 0.0
    below_calib = below_hat = None
    below2_calib = below2_hat = None  # two layers down (--predictor two)
    for l in range(lay.L):
        xc, xp = lay.rows(calib, l), lay.rows(prefix, l)
        mc = xc.mean(0)
        if predict and below_calib is not None:
            a_rows = below_calib - below_calib.mean(0)
            if a.predictor == "two" and below2_calib is not None:
                a2 = np.hstack([a_rows, below2_calib - below2_calib.mean(0)])
                w2 = np.linalg.solve(a2.T @ a2 + a.ridge * len(a2) * np.eye(2 * width),
                                     a2.T @ (xc - mc))
                guess2 = np.hstack([below_hat - below_calib.mean(0),
                                    below2_hat - below2_calib.mean(0)]) @ w2
            if a.predictor in ("full", "two"):
                w = np.linalg.solve(a_rows.T @ a_rows + a.ridge * len(a_rows) * np.eye(width),
                                    a_rows.T @ (xc - mc))
                if 0 < a.predictor_rank < width:
                    _, _, vt = np.linalg.svd(a_rows @ w, full_matrices=False)
                    v = vt[:a.predictor_rank].T
                    w = (w @ v) @ v.T
            else:  # block diagonal: head h's (key, value) columns from the same columns below
                w = np.zeros((width, width))
                for h in range(lay.H):
                    cols = np.r_[h * lay.D:(h + 1) * lay.D,
                                 (lay.H + h) * lay.D:(lay.H + h + 1) * lay.D]
                    ah = a_rows[:, cols]
                    gram = ah.T @ ah + a.ridge * len(ah) * np.eye(len(cols))
                    w[np.ix_(cols, cols)] = np.linalg.solve(gram, ah.T @ (xc - mc)[:, cols])
            guess = (below_hat - below_calib.mean(0)) @ w
            rc = xc - mc - a_rows @ w
            if a.predictor == "two" and below2_calib is not None:
                guess, rc = guess2, xc - mc - a2 @ w2
        else:
            guess = 0.0
            rc = xc - mc
        b, residual = code_groups(rc, xp - mc - guess, groups, a.step)
        bits += b
        hat = residual + guess + mc
        hat[0] = xp[0]
        decoded[l, 0], decoded[l, 1] = lay.unrows(hat, l)
        below2_calib, below2_hat = below_calib, below_hat
        below_calib, below_hat = xc, hat
    values = prefix.size
    bits += width * lay.L * 16  # the first token, as given
    rel = ((decoded - prefix) ** 2).sum() / ((prefix - prefix.mean(2, keepdims=True)) ** 2).sum()
    name = f"{a.variant}-s{a.step:g}" + ("-imp" if importance is not None else "")
    if a.predictor != "full":
        name += "-" + a.predictor
    if a.predictor_rank > 0:
        name += f"-r{a.predictor_rank}"
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(os.path.join(a.out, name + ".safetensors"),
                      [("kv", decoded.astype(np.float16))], {"variant": name})
    with open(os.path.join(a.out, "modes.tsv"), "a") as f:
        f.write(f"{name}\t{name}.safetensors\n")
    print(f"{name}: {bits / values:.3f} bits/value, relative error {rel:.4f}")


if __name__ == "__main__":
    main()
