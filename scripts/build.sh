#!/usr/bin/env bash
# Configures and builds Strata into BUILD_DIR (default: build). Used by start.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
# The Python extension builds when a venv with pybind11 is given (scripts/python-venv.sh).
PY_ARGS=(-DPython_EXECUTABLE=/usr/bin/python3)
if [ -n "${STRATA_PY_VENV:-}" ]; then
  PY_ARGS=(-DPython_EXECUTABLE="$STRATA_PY_VENV/bin/python"
           -Dpybind11_DIR="$("$STRATA_PY_VENV/bin/python" -m pybind11 --cmakedir)")
fi
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} "${PY_ARGS[@]}" "$@"
cmake --build "$BUILD_DIR" -j "$JOBS"
