#!/usr/bin/env bash
# bench/peers: Strata beside Redis and Mooncake Store (README.md here). Makes the venv with
# Mooncake (unless --no-install), then runs peers_bench.py, which prints the table and writes
# JSON and a PNG chart.
#   bench/peers/run.sh [--smoke] [--no-install] [--build-dir DIR] [--out-dir DIR] [-- ARGS]
# Full run: docs/peers_bench.{json,png} and bench/peers/last_table.txt. --smoke: tiny sizes, one
# repetition, outputs in --out-dir (default: a temporary folder). Exit 77: a peer is missing and
# --no-install forbids fetching it (CI: Mooncake's pip install is too slow for it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
smoke=0 install=1 build="$root/build" out="" extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) smoke=1 ;;
    --no-install) install=0 ;;
    --build-dir) build=$2; shift ;;
    --out-dir) out=$2; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
venv=${STRATA_PEERS_VENV:-$HOME/.cache/strata-peers-venv}
# Pinned: the versions bench/peers/README.md reports.
PEERS_PACKAGES=(mooncake-transfer-engine-non-cuda==0.3.13.post1 numpy==2.4.6 matplotlib==3.11.2)
skip() { echo "peers_bench_smoke: SKIPPED: $*"; exit 77; }

if ! command -v redis-server >/dev/null; then
  [ $install = 1 ] || skip "redis-server is not installed (scripts/install-deps.sh installs it)"
  bash "$root/scripts/install-deps.sh"
fi
if ! "$venv/bin/python" -c "import mooncake.store, numpy, matplotlib" 2>/dev/null; then
  [ $install = 1 ] || skip "no Mooncake venv at $venv (bench/peers/run.sh without --no-install makes it)"
  echo "run.sh: creating $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "${PEERS_PACKAGES[@]}"
fi
for bin in "$build/daemon/stratad" "$build/bench/peers/peers_client"; do
  [ -x "$bin" ] || { echo "run.sh: $bin is missing: build first (scripts/build.sh)" >&2; exit 1; }
done
sides=()
# The Python rows need the strata extension, built when scripts/build.sh had STRATA_PY_VENV.
if ! PYTHONPATH="$build/python" "$venv/bin/python" -c "import strata" 2>/dev/null; then
  echo "run.sh: no strata Python package in $build/python: the Strata Python row is left out" >&2
  sides=(--sides "strata c++ tcp,redis c++ tcp,mooncake python tcp,strata c++ shm,redis c++ unix")
fi
if [ $smoke = 1 ]; then
  [ -n "$out" ] || { out=$(mktemp -d); trap 'rm -rf "$out"' EXIT; }
  mkdir -p "$out"
  args=(--smoke --json "$out/peers_bench.json" --png "$out/peers_bench.png")
else
  out=${out:-$root/docs}
  mkdir -p "$out"
  args=(--json "$out/peers_bench.json" --png "$out/peers_bench.png"
        --table "$here/last_table.txt")
fi
PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" "$venv/bin/python" "$here/peers_bench.py" \
  --stratad "$build/daemon/stratad" --peers-client "$build/bench/peers/peers_client" \
  --venv "$venv" "${args[@]}" "${sides[@]}" "${extra[@]}"
