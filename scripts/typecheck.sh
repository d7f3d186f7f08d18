#!/usr/bin/env bash
# mypy over the whole package, as pyproject's [tool.mypy] lists it (every subpackage). mypy
# sees each folder under its import name through a link tree built from pyproject's package-dir (scripts/typecheck_tree.py),
# and its messages name the checkout's own files.
#   scripts/typecheck.sh                     (CI: one line in .ci/run)
#   scripts/typecheck.sh -p wattserve.server (any mypy arguments instead of the configured list)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
"$PY" -m mypy --version >/dev/null 2>&1 || { echo "mypy is missing: pip install 'wattserve[dev]'" >&2; exit 2; }
echo "$("$PY" -m mypy --version | cut -d' ' -f1-2) over the packages in pyproject's [tool.mypy]"
exec "$PY" scripts/typecheck_tree.py mypy "$@"
