#!/usr/bin/env bash
# Validates charts/strata with real tools: a Helm engine (PyPI helm-python-sdk, Helm's Go SDK
# behind a C ABI: no helm binary is packaged for Debian or PyPI), helm lint --strict, yamllint,
# kubernetes-validate --strict and checkov, for values.yaml and values-production.yaml; and
# starts a real stratad on the config each render's ConfigMap carries.
#
#   charts/check.sh [path/to/stratad]       (default: build/daemon/stratad)
#
# The tools live in a virtualenv, $STRATA_CHART_VENV (default ~/.cache/strata-chart-venv),
# created on first use; ctest's chart_check uses the same one when it exists, and skips otherwise.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
stratad="${1:-$root/build/daemon/stratad}"
venv="$(bash "$root/scripts/chart-tools.sh")"
STRATA_CHART_VENV="$venv" exec "$venv/bin/python" "$root/tests/operability/chart_check.py" \
  --stratad "$stratad" --require
