#!/usr/bin/env bash
# Build the wheel kit for the lent GPU machine into .whl/ (ignored): every wheel wattserve needs
# that the device image lacks, for its Python (3.12) and platform, plus wattserve itself.
#   scripts/gpu_kit.sh                      # for the device (Python 3.12)
#   scripts/gpu_kit.sh --python-version 3.11 --dest /tmp/kit   # for a test on this machine
# On the device (carry .whl):
#   python3 -m pip install -q --no-index --find-links .whl wattserve && scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
exec "$PY" scripts/gpu_kit.py "$@"
