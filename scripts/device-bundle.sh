#!/usr/bin/env bash
# Packs what scripts/device-check.sh runs into one tarball, for a GPU node that cannot install
# packages (no registry reachable): the device programs built here with CUDA on, stratad and
# stratactl, libstrata, and every shared library they load beyond glibc, with UCX's modules.
# The programs keep the absolute paths of this build folder (the tests find stratad there), so
# the check unpacks the tarball into the same folder on the node.
#   bash scripts/device-bundle.sh [BUILD_DIR] [TARBALL]    (defaults: build, .device/bundle.tar.gz)
#   then on the node: STRATA_DEVICE_BUNDLE=.device/bundle.tar.gz bash scripts/device-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=$(realpath "${1:-build}")
TARBALL=${2:-.device/bundle.tar.gz}
[ -x "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" ] \
  || { echo "device-bundle: nvcc is needed to build the device programs" >&2; exit 1; }

# Built relative to BUILD_DIR; the list is the one scripts/device-check.sh runs.
PROGRAMS=(daemon/stratad client/stratactl client/libstrata.so.0
          tests/gpu/cuda_device_memory_test tests/gpu/gpu_tier_test
          tests/codec/cuda/codec_cuda_device_test tests/transport/device_link_test
          tests/integration/gpu_tier_daemon_test bench/gpu/gpu_bench bench/gpu/gpu_fetch_bench)
TARGETS=()
for p in "${PROGRAMS[@]}"; do
  t=$(basename "$p"); t=${t%.so.0}; t=${t#lib}; TARGETS+=("$t")
done
cmake --build "$BUILD_DIR" -j "${JOBS:-2}" --target "${TARGETS[@]}"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for p in "${PROGRAMS[@]}"; do
  [ -f "$BUILD_DIR/$p" ] || { echo "device-bundle: $p was not built" >&2; exit 1; }
  mkdir -p "$stage/$(dirname "$p")"
  # Symbols stay for backtraces; debug sections would triple the size.
  objcopy --strip-debug "$BUILD_DIR/$p" "$stage/$p"
done

# Every library the programs load, except glibc's own (the node has its own, at least as new).
# libstdc++ and libgcc_s go in a fallback folder, used only where the node's are missing or old.
mkdir -p "$stage/device-libs/fallback" "$stage/device-libs/ucx"
for p in "${PROGRAMS[@]}"; do ldd "$BUILD_DIR/$p"; done | awk '/=> \//{print $1, $3}' | sort -u |
while read -r name path; do
  case "$name" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|ld-linux*) ;;
    libstrata.so*) ;;
    libstdc++.so*|libgcc_s.so*) cp -L "$path" "$stage/device-libs/fallback/$name" ;;
    libcuda.so*|libnvidia*) ;;
    *) cp -L "$path" "$stage/device-libs/$name" ;;
  esac
done
ucx_modules=$(dirname "$(ldd "$BUILD_DIR/daemon/stratad" | awk '/libucs.so/{print $3}')")/ucx
for m in "$ucx_modules"/libuct_cma.so.0; do cp -L "$m" "$stage/device-libs/ucx/"; done
echo "$BUILD_DIR" > "$stage/device-libs/build-dir"
git rev-parse --short HEAD > "$stage/device-libs/commit" 2>/dev/null || true

mkdir -p "$(dirname "$TARBALL")"
tar -C "$stage" -czf "$TARBALL" .
echo "device-bundle: $TARBALL ($(du -h "$TARBALL" | cut -f1)) from $BUILD_DIR"
