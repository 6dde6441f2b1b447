#!/usr/bin/env bash
# Issue 17's device check, for a GPU node: builds Strata with CUDA (only what the device checks
# link), runs every device test (ctest label "cuda": the GPU tier's device memory and the CUDA
# codec against the CPU codec, encoder and decoder; the CUDA IPC fetch into and publish out of an
# engine's buffer through a real stratad; an NCCL device link between two GPUs, where the node
# has two), gpu_bench (GPU-tier fetch vs cudaMemcpy device-to-device and host-to-device, CUDA
# codec encode/decode GB/s, quant blocks encoded from device memory vs the CPU encoder) and gpu_fetch_bench (FetchToDevice through stratad into a lent
# engine buffer vs cudaMemcpy device-to-device), all in the same run. Results go under $OUT
# when it is set (else ./device-check-out). Budget: under 8 minutes on a 16-core GPU node.
#   bash scripts/device-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device-check-out}
mkdir -p "$OUT"
BUILD_DIR=${BUILD_DIR:-build-device}
JOBS=${JOBS:-$(nproc)}
log() { echo "device-check: $*" | tee -a "$OUT/summary.txt"; }
start=$(date +%s)

{ nvidia-smi || echo "nvidia-smi unavailable"; } > "$OUT/nvidia-smi.txt" 2>&1
log "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo none)"

bash scripts/install-deps.sh > "$OUT/install.txt" 2>&1 || { log "install-deps failed (see install.txt)"; exit 1; }
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

rc=0
(cd "$BUILD_DIR" && ctest -L cuda -E 'gpu_(fetch_)?bench_smoke' --output-on-failure \
  --timeout 120) > "$OUT/ctest-cuda.txt" 2>&1 || rc=1
# Engines' device buffers lent over CUDA IPC to a real stratad with a CUDA GPU tier.
"$BUILD_DIR/tests/integration/gpu_tier_daemon_test" --gtest_filter='DeviceFetchTest.*:DevicePublishTest.*' \
  > "$OUT/device-fetch-test.txt" 2>&1 || rc=1
grep -E "^\[ +(OK|FAILED|SKIPPED) +\]" "$OUT/device-fetch-test.txt" | tee -a "$OUT/summary.txt"
# The tier's bookkeeping too (host memory standing in), on this machine's CPUs.
(cd "$BUILD_DIR" && ctest -R '^GpuTier' --output-on-failure --timeout 120) \
  > "$OUT/ctest-gpu-tier.txt" 2>&1 || rc=1
grep -E "tests passed|Skipped|Failed|\*\*\*" "$OUT/ctest-cuda.txt" | tee -a "$OUT/summary.txt"
grep -E "tests passed" "$OUT/ctest-gpu-tier.txt" | tee -a "$OUT/summary.txt"
if grep -q "Skipped" "$OUT/ctest-cuda.txt"; then
  log "WARNING: device tests skipped: no usable device?"; grep -m3 "no CUDA device" "$OUT/ctest-cuda.txt"
fi

"$BUILD_DIR/bench/gpu/gpu_bench" --json "$OUT/gpu_bench.json" > "$OUT/gpu_bench.txt" 2>&1 || rc=1
cat "$OUT/gpu_bench.txt" | tee -a "$OUT/summary.txt"
"$BUILD_DIR/bench/gpu/gpu_fetch_bench" --json "$OUT/gpu_fetch_bench.json" \
  > "$OUT/gpu_fetch_bench.txt" 2>&1 || rc=1
cat "$OUT/gpu_fetch_bench.txt" | tee -a "$OUT/summary.txt"
log "done in $(( $(date +%s) - start )) s, rc=$rc"
exit $rc
