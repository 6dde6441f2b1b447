#!/usr/bin/env bash
# Builds the unit and integration suites with sanitizers and runs them with ctest:
#   asan  ASan + UBSan (build-asan)     tsan  TSan (build-tsan)
#
#   JOBS=1 scripts/test-sanitizers.sh [asan|tsan|both]   (default: both)
#   CTEST_ARGS="-R Stall" SAN_TARGETS="stratad crash_regression_test" ...
#       (extra ctest arguments; build only these targets instead of everything)
#
# Every library, test binary and stratad itself is instrumented (STRATA_SANITIZE), and every
# process stops at its first report (halt_on_error, no UBSan recovery) with a distinct exit code.
# The daemons that integration tests start inherit the options through the environment, and
# DaemonProcess (tests/integration/daemon_process.h) fails the test whose daemon printed a report.
#
# Not part of CI (.ci/run, scripts/test.sh): on the 2-core runners each instrumented build is a
# cold build of the whole tree (about as long as CI's own 14 min, ccache cannot share objects
# with the plain build) and the suites run 2-3x (ASan) to 5-15x (TSan) slower, so either one
# alone would break CI's 25 min limit. Run it before merging changes to threading or memory
# lifetime, and nightly where a runner has the time.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WHICH=${1:-both}
case "$WHICH" in asan|tsan) KINDS=("$WHICH") ;; both) KINDS=(asan tsan) ;;
  *) echo "usage: $0 [asan|tsan|both]" >&2; exit 2 ;; esac
JOBS=${JOBS:-$(nproc)}
SUPP=$ROOT/tests/sanitizers

# Shared by both: -O1 keeps stacks readable and the instrumented build faster than -O2.
COMMON=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG"
        "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG"
        -DSTRATA_BUILD_TESTS=ON -DSTRATA_BUILD_BENCH=OFF -DSTRATA_BUILD_PYTHON=OFF
        -DSTRATA_WITH_CUDA=OFF -DSTRATA_BUILD_FUZZ=OFF)
# package.find_package_quickstart builds an outside project against the installed libstrata
# with plain flags: it cannot link an instrumented library, and it tests packaging, not memory.
EXCLUDE='^package\.'

status=0
for kind in "${KINDS[@]}"; do
  dir=${SAN_BUILD_PREFIX:-build}-$kind
  case "$kind" in
    asan) sanitize=address ;;
    tsan) sanitize=thread ;;
  esac
  echo "== $kind: configure and build ($dir, JOBS=$JOBS)"
  start=$(date +%s)
  cmake -S . -B "$dir" "${COMMON[@]}" -DSTRATA_SANITIZE=$sanitize >/dev/null
  targets=()
  for t in ${SAN_TARGETS:-}; do targets+=(--target "$t"); done
  # A TSan run of chosen targets still needs the Abseil shim it preloads (below); without it
  # every absl::Mutex inside gRPC reads as a race.
  if [ "$kind" = tsan ] && [ ${#targets[@]} -gt 0 ]; then targets+=(--target strata_tsan_absl); fi
  cmake --build "$dir" -j "$JOBS" "${targets[@]}"
  echo "== $kind: built in $(( $(date +%s) - start )) s"

  # exitcode 66/67: a sanitizer's exit is told apart from a test's own failure (1) and from a
  # daemon a test kills on purpose (signals). Leak checking stays on for ASan: the daemon's
  # shutdown path must not leak either; third-party leaks are in lsan.supp.
  export ASAN_OPTIONS="halt_on_error=1:abort_on_error=0:exitcode=66:detect_leaks=1:check_initialization_order=1"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=66:suppressions=$SUPP/ubsan.supp"
  export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=0"
  # DaemonProcess stops daemons with SIGTERM, so their shutdown runs (and LSan checks it).
  export STRATA_TEST_DAEMON_SIGTERM=1
  export TSAN_OPTIONS="halt_on_error=1:exitcode=67:second_deadlock_stack=1:suppressions=$SUPP/tsan.supp:print_suppressions=0"
  if [ "$kind" = tsan ]; then
    # UCX's memory hooks (libucm) intercept the madvise glibc makes on a thread's stack as the
    # thread exits; under TSan that lands in a mutex interceptor after the thread's TSan state is
    # gone and segfaults the process (data_mover_test's AcquireAndGetTest, whose fake daemon
    # restarts its progress thread). Without the hooks UCX's registration cache is not told of
    # unmaps: fine for these tests, which unregister what they register.
    export UCX_MEM_EVENTS=no
    # Debian's abseil is not built with TSan, so absl::Mutex's lock and unlock are invisible to
    # it and every field guarded by one would look racy. The shim tells TSan about them
    # (tests/sanitizers/tsan_absl_mutex.cc); processes the tests start inherit it.
    export LD_PRELOAD="$ROOT/$dir/tests/sanitizers/libstrata_tsan_absl.so"
    # UCX's memory hooks (libucm) patch madvise/mmap in libc itself ("bistro" mode). glibc calls
    # madvise on a thread's stack as the thread exits, after TSan has torn down that thread's
    # state, and the hook's rwlock then crashes TSan's interceptor (SIGSEGV in any process with
    # a UCX context whose threads exit). Without the hooks UCX only loses its registration
    # cache invalidation, which these tests do not depend on.
    export UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_MALLOC_HOOKS=n
  fi
  start=$(date +%s)
  rc=0
  (cd "$dir" && ctest -j"${CTEST_JOBS:-2}" --output-on-failure --timeout "${CTEST_TIMEOUT:-900}" \
     -E "$EXCLUDE" ${CTEST_ARGS:-}) 2>&1 | tee "$dir/ctest.log" || rc=$?
  unset LD_PRELOAD UCX_MEM_MMAP_HOOK_MODE UCX_MEM_MALLOC_HOOKS
  summary=$(grep -E '^[0-9]+% tests passed' "$dir/ctest.log" | tail -1 || true)
  echo "== $kind: ${summary:-no summary} ($(( $(date +%s) - start )) s)"
  [ "$rc" -ne 0 ] && status=1
done
exit $status
