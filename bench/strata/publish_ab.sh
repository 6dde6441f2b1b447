#!/usr/bin/env bash
# A/B of the publish path between two builds, alternating, on this noisy machine:
#   bench/strata/publish_ab.sh OLD_BUILD_DIR NEW_BUILD_DIR [ROUNDS]
# Each round runs, for each build, strata_bench --publish-only over shared memory through
# publish buffers (two tenants, read-only zones), through the staging window, and without
# authentication; then prints the median GB/s per build, route and block size (64 KiB, 1 MiB,
# 8 MiB). Both builds need strata_bench with --publish-only (commit 50b2a24 or later; for an
# older build, copy this tree's bench/strata/strata_bench.cc into it and rebuild that target).
set -euo pipefail
OLD=${1:?old build dir}
NEW=${2:?new build dir}
ROUNDS=${3:-8}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
run() {  # build label route args...
  local build=$1 label=$2 route=$3
  shift 3
  local gbps
  gbps=$("$build/bench/strata/strata_bench" --stratad "$build/daemon/stratad" --transports shm \
    --publish-only --rounds 40 "$@" 2>&1 | awk '/^publish/ {printf "%s ", $4}')
  echo "$label $route $gbps" | tee -a "$out"
}
for ((i = 1; i <= ROUNDS; i++)); do
  for side in old new; do
    build=$OLD
    [ "$side" = new ] && build=$NEW
    run "$build" "$side" publish-buffer --auth --tenants 2 --publish-buffer
    run "$build" "$side" staging-window --auth --tenants 2
    run "$build" "$side" no-auth
  done
done
echo
echo "medians (GB/s: 64 KiB, 1 MiB, 8 MiB):"
python3 - "$out" <<'EOF'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) == 5:
        runs[(p[0], p[1])].append([float(x) for x in p[2:]])
for (side, route), v in sorted(runs.items()):
    med = [statistics.median(r[i] for r in v) for i in range(3)]
    print(f"{side:4} {route:15} " + " ".join(f"{m:6.2f}" for m in med) + f"   ({len(v)} runs)")
EOF
