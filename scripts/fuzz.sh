#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (ASan + UBSan) in their own build folder
# and runs each for FUZZ_SECONDS over its seed corpus (tests/fuzz/corpus/<name>/). Prints each
# target's executed inputs; exits non-zero when any target crashes (its reproducer is left in
# FUZZ_ARTIFACTS, default build-fuzz/artifacts).
#
#   FUZZ_SECONDS=30 FUZZ_JOBS=2 JOBS=1 scripts/fuzz.sh [target ...]   (names without _fuzzer)
#   FUZZ_BUILD_ONLY=1 scripts/fuzz.sh [target ...]                      (build, run nothing)
#
# CI (scripts/test.sh) runs every target for 20 s, two at a time. The build is most of the
# stage's cost: only the fuzzers and the libraries they link are built (never the daemon, the
# client or the tests), at -O1 with line tables only, which is enough for symbolized stacks
# and keeps clang's instrumented compiles short. The codec's SIMD kernels are compiled for this
# machine's instruction set only (-march=native, Highway's static target), the one the
# library's runtime dispatch would pick here, not once per instruction set (ASan makes each
# target costly).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
FUZZ_JOBS=${FUZZ_JOBS:-1}
ARTIFACTS=${FUZZ_ARTIFACTS:-$BUILD_DIR/artifacts}
ALL=(am_request am_reply locate_reply grpc_request replay_request config catalog_record
     codec_blob calibration)
TARGETS=("${@:-${ALL[@]}}")

start=$(date +%s)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only -march=native -DHWY_COMPILE_ONLY_STATIC=1" \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only" \
    -DSTRATA_BUILD_FUZZ=ON -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_BENCH=OFF \
    -DSTRATA_WITH_CUDA=OFF -DSTRATA_BUILD_PYTHON=OFF >/dev/null
fi
build_targets=()
for t in "${TARGETS[@]}"; do build_targets+=(--target "${t}_fuzzer"); done
cmake --build "$BUILD_DIR" -j"${JOBS:-1}" "${build_targets[@]}"
echo "fuzz: built in $(( $(date +%s) - start )) s"
[ "${FUZZ_BUILD_ONLY:-0}" = 1 ] && exit 0

# One target: runs it, writes "<executions> <rc>" to its .result file.
run_one() {
  local t=$1 work="$BUILD_DIR/corpus/$1" log="$BUILD_DIR/$1.log" rc=0
  # The committed seeds stay as they are; what the run adds goes to a scratch corpus.
  mkdir -p "$work"
  # Leaks: the fuzzers hold static state (the codec's decoder, the config defaults) on purpose.
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    "$BUILD_DIR/tests/fuzz/${t}_fuzzer" -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 \
    -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 -artifact_prefix="$ARTIFACTS/${t}-" \
    "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  local execs
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  echo "${execs:-?} $rc" >"$BUILD_DIR/$t.result"
}

mkdir -p "$ARTIFACTS"
start=$(date +%s)
running=0
for t in "${TARGETS[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$FUZZ_JOBS" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait || true

failed=()
printf '\n%-16s %12s  %s\n' target executions result
for t in "${TARGETS[@]}"; do
  read -r execs rc <"$BUILD_DIR/$t.result"
  log="$BUILD_DIR/$t.log"
  if [ "$rc" -ne 0 ]; then
    failed+=("$t")
    printf '%-16s %12s  CRASH (rc %s): %s\n' "$t" "$execs" "$rc" \
      "$(grep -m1 -E 'ERROR: |runtime error|invariant broken|deadly signal' "$log" || echo see log)"
    grep -m3 -E '^artifact_prefix|Test unit written to' "$log" | sed 's/^/    /' || true
    echo "    log: $log"
  else
    printf '%-16s %12s  ok\n' "$t" "$execs"
  fi
done
echo "fuzz: ran ${#TARGETS[@]} targets in $(( $(date +%s) - start )) s"
if [ "${#failed[@]}" -ne 0 ]; then
  echo "fuzz: crashes in: ${failed[*]}" >&2
  exit 1
fi
