#!/usr/bin/env bash
# Issue 17's device check, for a GPU node: runs every device test (the GPU tier's device memory;
# the CUDA codec against the CPU codec, encoder and decoder; the CUDA IPC fetch into and publish
# out of an engine's buffer through a real stratad; an NCCL device link between two GPUs, where
# the node has two; the tier's bookkeeping), then gpu_bench (GPU-tier fetch vs cudaMemcpy
# device-to-device and host-to-device, CUDA codec encode/decode GB/s, quant blocks encoded from
# device memory vs the CPU encoder) and gpu_fetch_bench (FetchToDevice through stratad into a
# lent engine buffer vs cudaMemcpy device-to-device), all in the same run. It builds Strata with
# CUDA first (packages from scripts/install-deps.sh), or, on a node that cannot install
# packages, takes the programs from a tarball made by scripts/device-bundle.sh. Results go
# under $OUT when it is set (else ./device-check-out). Budget: under 8 minutes on 16 cores.
#   bash scripts/device-check.sh
#   STRATA_DEVICE_BUNDLE=.device/bundle.tar.gz bash scripts/device-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-check-out}
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-device}
JOBS=${JOBS:-$(nproc)}
log() { echo "device-check: $*" | tee -a "$OUT/summary.txt"; }
start=$(date +%s)

{ nvidia-smi || echo "nvidia-smi unavailable"; } > "$OUT/nvidia-smi.txt" 2>&1
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)
log "device: ${gpu:-none}"

if [ -n "${STRATA_DEVICE_BUNDLE:-}" ]; then
  # Built elsewhere by scripts/device-bundle.sh: unpack into the folder it was built in (the
  # tests find stratad by that path) and load its libraries instead of installing packages.
  BUILD_DIR=$(tar -xzOf "$STRATA_DEVICE_BUNDLE" ./device-libs/build-dir)
  mkdir -p "$BUILD_DIR" && tar -C "$BUILD_DIR" -xzf "$STRATA_DEVICE_BUNDLE" \
    || { log "cannot unpack $STRATA_DEVICE_BUNDLE into $BUILD_DIR"; exit 1; }
  libs=$BUILD_DIR/device-libs
  export LD_LIBRARY_PATH=$libs:$BUILD_DIR/client${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export UCX_MODULE_DIR=$libs/ucx
  if ldd "$BUILD_DIR/daemon/stratad" | grep -q "not found"; then
    export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$libs/fallback
  fi
  ldd "$BUILD_DIR/daemon/stratad" "$BUILD_DIR/tests/integration/gpu_tier_daemon_test" \
    > "$OUT/ldd.txt" 2>&1
  if grep -q "not found" "$OUT/ldd.txt"; then
    log "libraries missing:"; grep "not found" "$OUT/ldd.txt" | sort -u | head; exit 1
  fi
  log "bundle of $(cat "$libs/commit" 2>/dev/null) unpacked into $BUILD_DIR"
  # NCCL is opened at run time: the node's Python packages may carry it.
  nccl=$(find /opt /usr/local /usr/lib -name 'libnccl.so.2' 2>/dev/null | head -1)
  [ -n "$nccl" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$nccl")
else
bash scripts/install-deps.sh > "$OUT/install.txt" 2>&1 \
  || { log "install-deps failed (see install.txt)"; exit 1; }
log "packages ready after $(( $(date +%s) - start )) s"

export PATH=/usr/local/cuda/bin:$PATH
if ! cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DSTRATA_WITH_CUDA=ON \
     -DSTRATA_BUILD_PYTHON=OFF -DSTRATA_BUILD_FUZZ=OFF -DPython_EXECUTABLE=/usr/bin/python3 \
     > "$OUT/configure.txt" 2>&1; then
  log "configure failed (see configure.txt)"; tail -20 "$OUT/configure.txt"; exit 1
fi
TARGETS=(cuda_device_memory_test codec_cuda_device_test gpu_tier_test gpu_bench stratad
         gpu_tier_daemon_test gpu_fetch_bench device_link_test)
if ! cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}" > "$OUT/build.txt" 2>&1; then
  log "build failed (see build.txt)"; grep -m20 -E "error" "$OUT/build.txt"; exit 1
fi
log "built after $(( $(date +%s) - start )) s"
fi

# Every device test binary (ctest label "cuda", plus the GPU tier in a real stratad and its
# bookkeeping with host memory standing in), run directly so a bundle needs no ctest files.
# All their output goes to one log; the summary keeps each test's verdict.
rc=0
TESTS=(tests/gpu/cuda_device_memory_test tests/codec/cuda/codec_cuda_device_test
       tests/transport/device_link_test tests/integration/gpu_tier_daemon_test
       tests/gpu/gpu_tier_test)
for t in "${TESTS[@]}"; do
  echo "=== $t" >> "$OUT/tests.txt"
  timeout 90 "$BUILD_DIR/$t" >> "$OUT/tests.txt" 2>&1 || { e=$?; rc=1; log "FAILED: $t (exit $e)"; }
done
grep -E "^\[ +(FAILED|SKIPPED) +\] [A-Za-z_.]+ \(|^\[  PASSED  \]|^=== " "$OUT/tests.txt" \
  | tee -a "$OUT/summary.txt"
if grep -q "SKIPPED \]" "$OUT/tests.txt"; then
  log "skipped, with their reasons:"
  grep --no-group-separator -B1 "SKIPPED \]" "$OUT/tests.txt" | grep -v "^\[" \
    | sort | uniq -c | head -8 | tee -a "$OUT/summary.txt"
fi

timeout 150 "$BUILD_DIR/bench/gpu/gpu_bench" --json "$OUT/gpu_bench.json" \
  > "$OUT/gpu_bench.txt" 2>&1 || { rc=1; log "gpu_bench failed"; }
cat "$OUT/gpu_bench.txt" | tee -a "$OUT/summary.txt"
timeout 150 "$BUILD_DIR/bench/gpu/gpu_fetch_bench" --json "$OUT/gpu_fetch_bench.json" \
  > "$OUT/gpu_fetch_bench.txt" 2>&1 || { rc=1; log "gpu_fetch_bench failed"; }
cat "$OUT/gpu_fetch_bench.txt" | tee -a "$OUT/summary.txt"
log "done in $(( $(date +%s) - start )) s, rc=$rc"
exit $rc
