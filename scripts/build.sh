#!/usr/bin/env bash
# Configures and builds Strata into BUILD_DIR (default: build). Used by start.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} \
  -DPython_EXECUTABLE=/usr/bin/python3 "$@"
cmake --build "$BUILD_DIR" -j "$JOBS"
