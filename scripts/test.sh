#!/usr/bin/env bash
# README command 2 (and CI): install what is missing, build everything, run the whole test suite
# (unit, integration with real stratad processes, benchmark smoke runs) with ctest -j2.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
bash scripts/build.sh
cd "$BUILD_DIR"
ctest -j2 --output-on-failure --timeout 300
