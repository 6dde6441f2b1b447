#!/usr/bin/env bash
# Ensures the Python tools the chart check uses (a Helm engine from PyPI helm-python-sdk,
# kubernetes-validate, checkov) are installed in a virtualenv, $STRATA_CHART_VENV (default
# ~/.cache/strata-chart-venv), and prints its path. Used by charts/check.sh and scripts/test.sh.
set -euo pipefail
venv="${STRATA_CHART_VENV:-$HOME/.cache/strata-chart-venv}"
if [ ! -x "$venv/bin/checkov" ] || [ ! -x "$venv/bin/kubernetes-validate" ] ||
   ! "$venv/bin/python" -c "import helm_python" 2>/dev/null; then
  echo "chart tools: creating the virtualenv in $venv" >&2
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check \
    helm-python-sdk==0.2.2 kubernetes-validate==1.37.0 checkov==3.3.30 >&2
fi
echo "$venv"
