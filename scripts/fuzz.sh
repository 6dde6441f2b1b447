#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (ASan + UBSan) in their own build folder
# and runs each for FUZZ_SECONDS over its seed corpus (tests/fuzz/corpus/<name>/). Prints each
# target's executed inputs; exits non-zero when any target crashes (its reproducer is left in
# FUZZ_ARTIFACTS, default build-fuzz/artifacts).
#
#   FUZZ_SECONDS=30 JOBS=1 scripts/fuzz.sh [target ...]   (targets: names without _fuzzer)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
ARTIFACTS=${FUZZ_ARTIFACTS:-$BUILD_DIR/artifacts}
ALL=(am_request am_reply locate_reply grpc_request config catalog_record codec_blob)
TARGETS=("${@:-${ALL[@]}}")

if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSTRATA_BUILD_FUZZ=ON -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_BENCH=OFF \
    -DSTRATA_WITH_CUDA=OFF -DSTRATA_BUILD_PYTHON=OFF >/dev/null
fi
for t in "${TARGETS[@]}"; do
  cmake --build "$BUILD_DIR" -j"${JOBS:-1}" --target "${t}_fuzzer"
done

mkdir -p "$ARTIFACTS"
failed=()
printf '\n%-16s %12s  %s\n' target executions result
for t in "${TARGETS[@]}"; do
  # The committed seeds stay as they are; what the run adds goes to a scratch corpus.
  work="$BUILD_DIR/corpus/$t"
  mkdir -p "$work"
  log="$BUILD_DIR/$t.log"
  rc=0
  # Leaks: the fuzzers hold static state (the codec's decoder, the config defaults) on purpose.
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    "$BUILD_DIR/tests/fuzz/${t}_fuzzer" -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 \
    -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 -artifact_prefix="$ARTIFACTS/${t}-" \
    "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if [ "$rc" -ne 0 ]; then
    failed+=("$t")
    printf '%-16s %12s  CRASH (rc %s): %s\n' "$t" "${execs:-?}" "$rc" \
      "$(grep -m1 -E 'ERROR: |runtime error|invariant broken|deadly signal' "$log" || echo see log)"
    grep -m3 -E '^artifact_prefix|Test unit written to' "$log" | sed 's/^/    /' || true
    echo "    log: $log"
  else
    printf '%-16s %12s  ok\n' "$t" "${execs:-?}"
  fi
done
if [ "${#failed[@]}" -ne 0 ]; then
  echo "fuzz: crashes in: ${failed[*]}" >&2
  exit 1
fi
