#!/usr/bin/env bash
# Quality as the model sees it, for one real model (docs/codec.md): the model's KV for a
# 1,024-token prefix of the GPL-3 text goes through every codec mode (Strata's Encoder/Decoder,
# block by block, in codec_eval), then the model predicts the next 256 tokens attending to each
# decoded prefix; codec_eval prints KL, top-1 agreement and NLL change beside bits/value.
#
#   bench/codec/real_kv/model_quality.sh smollm2|qwen2.5-coder-1.5b [WORKDIR]
#       (default WORKDIR /tmp/strata-real-kv; one core; see docs/codec.md for run times)
#
# Env: TEXT (the evaluated text, default the GPL-3), CODEC_EVAL (default
# build/bench/codec/codec_eval), MODES (comma-separated codec specs,
# as ParseCodecSpec takes them; default codec_eval's list), PREFIX_TOKENS (1024, a multiple of
# TOKENS_PER_BLOCK, 256), CONTINUATION_TOKENS (256), REPS (3); for pca:bR modes CALIB_TEXT (a
# text other than the evaluated one: its prefix KV is what the modes calibrate on) and
# PCA_ARGS (more codec_eval options, e.g. "--pca-rope-theta 100000"); with CALIB_TEXT,
# IMPORTANCE=1 first measures what each layer's error costs the model on that text
# (model_quality.py sensitivity: PROBE_MODE, default pca:b1.5, PROBE_TOKENS, default 128) and
# calibrates with it (--pca-importance).
# Output in WORKDIR/mq-MODEL: table.txt (the table), quality.tsv / quality.json (per mode),
# prefix.safetensors and decoded/ (the KV). Nothing here is committed data.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
model="$1"
work="${2:-/tmp/strata-real-kv}"
codec_eval="${CODEC_EVAL:-$repo/build/bench/codec/codec_eval}"
gguf="$(bash "$here/fetch_gguf.sh" "$model" "$work")"
cd "$work"
[[ -x venv/bin/python ]] || python3 -m venv venv
venv/bin/python -c "import numpy, gguf, tokenizers" 2>/dev/null ||
  venv/bin/pip install -q numpy gguf tokenizers safetensors
out="$work/mq-$model"
mkdir -p "$out"
modes=()
[[ -n "${MODES:-}" ]] && modes=(--modes "$MODES")
# shellcheck disable=SC2206
[[ -n "${PCA_ARGS:-}" ]] && modes+=(${PCA_ARGS})
py=(env OPENBLAS_NUM_THREADS=1 venv/bin/python "$here/model_quality.py")
"${py[@]}" prefix --model "$gguf" --text "${TEXT:-/usr/share/common-licenses/GPL-3}" \
  --prefix-tokens "${PREFIX_TOKENS:-1024}" --continuation-tokens "${CONTINUATION_TOKENS:-256}" \
  --out "$out/prefix.safetensors"
if [[ -n "${CALIB_TEXT:-}" ]]; then
  "${py[@]}" prefix --model "$gguf" --text "$CALIB_TEXT" --prefix-tokens "${PREFIX_TOKENS:-1024}" \
    --continuation-tokens "${CONTINUATION_TOKENS:-256}" --out "$out/calib.safetensors"
  modes+=(--calibrate-from "$out/calib.safetensors:kv")
  if [[ "${IMPORTANCE:-0}" = 1 ]]; then
    # What each layer's error costs the model, probed on the calibration text alone: its KV
    # coded at PROBE_MODE (calibrated on itself), one (layer, tensor) at a time.
    # shellcheck disable=SC2206
    "$codec_eval" --data "$out/calib.safetensors:kv" --tokens-per-block "${TOKENS_PER_BLOCK:-256}" \
      --modes "${PROBE_MODE:-pca:b1.5}" --calibrate-from "$out/calib.safetensors:kv" ${PCA_ARGS:-} \
      --reps 1 --write-decoded "$out/probe" > /dev/null
    "${py[@]}" sensitivity --model "$gguf" --prefix "$out/calib.safetensors" --decoded "$out/probe" \
      --tokens "${PROBE_TOKENS:-128}" --out "$out/importance.safetensors"
    modes+=(--pca-importance "$out/importance.safetensors:importance")
  fi
fi
rm -rf "$out/decoded"
"$codec_eval" --data "$out/prefix.safetensors:kv" --tokens-per-block "${TOKENS_PER_BLOCK:-256}" \
  "${modes[@]}" --reps 1 --write-decoded "$out/decoded" > "$out/write_decoded.txt"
"${py[@]}" eval --model "$gguf" --prefix "$out/prefix.safetensors" --decoded "$out/decoded" \
  --out "$out/quality.tsv" --json "$out/quality.json"
"$codec_eval" --data "$out/prefix.safetensors:kv" --queries "$out/prefix.safetensors:q" \
  --tokens-per-block "${TOKENS_PER_BLOCK:-256}" "${modes[@]}" --reps "${REPS:-3}" \
  --quality "$out/quality.tsv" | tee "$out/table.txt"
