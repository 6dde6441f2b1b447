#!/usr/bin/env bash
# Installs this build into a scratch prefix, builds tests/package/engine (an outside CMake
# project using find_package(Strata CONFIG)) against it, starts the installed stratad and runs
# the quick start through the installed libstrata.
#   find_package_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
tmp=$(mktemp -d /tmp/strata-package.XXXXXX)
pid=
cleanup() {
  local rc=$?
  if [[ -n $pid ]]; then
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
fail() {
  echo "find_package_test: $*" >&2
  exit 1
}

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" || {
  cat "$tmp/install.log"
  fail "cmake --install failed"
}
# The public headers stand alone: nothing of UCX, gRPC, protobuf or our internals.
if grep -rnE '#include [<"](ucp/|ucs/|grpc|google/protobuf|common/|client/|transport/|daemon/|strata/v1/)' \
  "$tmp/prefix/include/strata"; then
  fail "an installed public header includes an internal or third-party transport header"
fi

cmake -S "$src/tests/package/engine" -B "$tmp/engine" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" -DSTRATA_QUICKSTART="$src/client/examples/quickstart.cc" \
  >"$tmp/configure.log" 2>&1 || {
  cat "$tmp/configure.log"
  fail "the outside project did not configure against the installed package"
}
cmake --build "$tmp/engine" >"$tmp/build.log" 2>&1 || {
  cat "$tmp/build.log"
  fail "the outside project did not build"
}

"$tmp/prefix/bin/stratad" --listen 127.0.0.1:0 --host-capacity 64MiB --data-dir "$tmp/data" \
  --ready-file "$tmp/ready.json" >"$tmp/stratad.log" 2>&1 &
pid=$!
endpoint=
for _ in $(seq 1 200); do
  endpoint=$(sed -n 's/.*"endpoint":"\([^"]*\)".*/\1/p' "$tmp/ready.json" 2>/dev/null || true)
  [[ -n $endpoint ]] && break
  kill -0 "$pid" 2>/dev/null || {
    cat "$tmp/stratad.log"
    fail "the installed stratad exited at start"
  }
  sleep 0.1
done
[[ -n $endpoint ]] || fail "the installed stratad did not become ready"

out=$("$tmp/engine/quickstart" "$endpoint") || {
  echo "$out"
  fail "the quick start failed"
}
echo "$out"
grep -q "bytes identical" <<<"$out" || fail "the quick start did not fetch its block back intact"
echo "find_package_test: ok (endpoint $endpoint)"
