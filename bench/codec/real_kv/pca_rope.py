"""How much RoPE costs the pca mode's key transform (docs/codec.md, "Calibrated transform").

Per (layer, kv head), a PCA basis of the keys is computed on a calibration prefix and applied to
the keys of an evaluation prefix (both written by model_quality.py prefix); the rate that reverse
water-filling needs for the evaluation keys along those axes (Gaussian model: sum over axes of
max(0, log2(var_i / theta)) / 2, theta set for a relative MSE) is compared for
  post   keys as an engine caches them (after RoPE; what the codec gets and calibrates on),
  pre    RoPE undone with the token positions (what a position-aware codec could calibrate on).

  pca_rope.py CALIB.safetensors EVAL.safetensors THETA
"""
import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from model_quality import read_safetensors  # noqa: E402


def unrope(k, theta):  # k [L, T, H, D], rotate-half pairs (j, j + D/2), positions 0..T-1
    D = k.shape[-1]
    inv = theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)
    ang = np.arange(k.shape[1])[:, None] * inv[None, :]  # [T, D/2]
    c, s = np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :]
    a, b = k[..., : D // 2], k[..., D // 2:]
    return np.concatenate([a * c + b * s, b * c - a * s], -1)


def rate(calib, ev, rel_mse):
    L, _, H, D = calib.shape
    total = 0.0
    for l in range(L):
        for h in range(H):
            x = calib[l, :, h].astype(np.float64)
            mu = x.mean(0)
            _, vecs = np.linalg.eigh(np.cov((x - mu).T))
            y = (ev[l, :, h].astype(np.float64) - mu) @ vecs
            var = (y ** 2).mean(0)
            target = rel_mse * (ev[l, :, h].astype(np.float64) ** 2).sum(1).mean()
            lo, hi = 0.0, var.max()
            for _ in range(60):  # water level theta with sum min(theta, var) = target
                th = 0.5 * (lo + hi)
                lo, hi = (th, hi) if np.minimum(th, var).sum() < target else (lo, th)
            total += 0.5 * np.log2(np.maximum(var / th, 1.0)).sum()
    return total / (L * H * D)


def main():
    calib, _ = read_safetensors(sys.argv[1])
    ev, _ = read_safetensors(sys.argv[2])
    theta = float(sys.argv[3])
    kc, ke = calib["kv_f32"][:, 0], ev["kv_f32"][:, 0]
    print("relative MSE   post-RoPE bits/value   pre-RoPE bits/value")
    for r in (0.003, 0.01, 0.03):
        print(f"{r:<14} {rate(kc, ke, r):>20.3f} {rate(unrope(kc, theta), unrope(ke, theta), r):>21.3f}")


if __name__ == "__main__":
    main()
