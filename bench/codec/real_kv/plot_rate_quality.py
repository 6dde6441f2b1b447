"""Rate-quality curves of the codec modes as the model sees them (docs/codec_rate_quality.png).

Input: `codec_eval --json --quality ...` outputs, one or more per model (rows of the same mode in
later files replace earlier ones). Plots mean KL(fp16 || mode) against bits/value, one panel
per model, one line per family (pca:bR, pca:bR+importance, xl:sS, xl:sS+importance, the same
rate-capped as xl:sS:rB, quant:kAvB:ol, quant:kAvB, intN-g64).

  plot_rate_quality.py OUT.png "SmolLM2-135M=a.json,b.json" "Qwen2.5-Coder-1.5B=c.json"
"""
import json
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FAMILIES = [
    ("pca (calibrated transform)", re.compile(r"^pca:b[0-9.]+$"), "C3", "o"),
    # Rows of a run calibrated with --pca-importance, renamed with this suffix before plotting.
    ("pca + importance (model-probed)", re.compile(r"^pca:b[0-9.]+\+importance$"), "C1", "D"),
    # The experimental cross-layer coder (codec_eval xl:sSTEP), plain and calibrated with
    # importances (rows renamed as above).
    ("xl (cross-layer, experimental)", re.compile(r"^xl:s[0-9.]+$"), "C4", "v"),
    ("xl + importance", re.compile(r"^xl:s[0-9.]+\+importance$"), "C5", "P"),
    # xl under a rate cap (codec_eval xl:sSTEP:rC: each block within C bits per value).
    ("xl, rate-capped", re.compile(r"^xl:s[0-9.]+:r[0-9.]+$"), "C6", "*"),
    ("xl + importance, rate-capped", re.compile(r"^xl:s[0-9.]+:r[0-9.]+\+importance$"), "C8", "X"),
    ("quant:kAvB:ol", re.compile(r"^quant:k\dv\d:ol$"), "C0", "s"),
    ("quant:kAvB", re.compile(r"^quant:k\dv\d$"), "C2", "^"),
    ("intN-g64 (baseline)", re.compile(r"^int\d-g64$"), "C7", "x"),
]


def load(files):
    rows = {}
    for f in files:
        for r in json.load(open(f))["rows"]:
            if "kl_mean" in r:
                rows[r["mode"]] = r
    return rows


def main():
    out, panels = sys.argv[1], sys.argv[2:]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        title, files = panel.split("=", 1)
        rows = load(files.split(","))
        for name, pat, color, marker in FAMILIES:
            pts = sorted((r["bits_per_value"], max(r["kl_mean"], 1e-6)) for m, r in rows.items()
                         if pat.match(m))
            if pts:
                ax.plot(*zip(*pts), color=color, marker=marker, label=name)
        ax.axhline(0.01, color="k", ls=":", lw=1, label="near-lossless KL 0.01")
        ax.axvline(1.6, color="k", ls="--", lw=0.8, label="1.6 bits/value (10x fp16)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bits per value (blob size)")
        ax.set_ylabel("mean KL(fp16 KV || decoded KV), nats/token")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
