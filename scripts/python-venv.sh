#!/usr/bin/env bash
# Ensures the virtualenv the Python package builds and tests with exists, $STRATA_PY_VENV
# (default ~/.cache/strata-py-venv), and prints its path: pybind11 for the extension, and pytest,
# numpy, msgpack, pyzmq and cbor2 for the tests. Used by scripts/test.sh.
set -euo pipefail
venv="${STRATA_PY_VENV:-$HOME/.cache/strata-py-venv}"
PY_PACKAGES=(pybind11==3.1.0 scikit-build-core==1.1.2 pytest==9.2.0 numpy==2.4.6 msgpack==1.2.4
             pyzmq==27.3.0 cbor2==6.3.0)
if ! "$venv/bin/python" -c "import pybind11, pytest, numpy, msgpack, zmq, cbor2" 2>/dev/null; then
  echo "python venv: creating $venv" >&2
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "${PY_PACKAGES[@]}" >&2
fi
echo "$venv"
