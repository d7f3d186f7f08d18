#!/usr/bin/env bash
# Type-check engines/tensorrt_engine.py against the real TensorRT 10 API surface: the published
# type stubs (PyPI tensorrt-stubs 10.13, installed --no-deps into an ignored folder, because
# their `tensorrt` dependency cannot be installed without a GPU host's NVIDIA index). This is
# the one check of the TensorRT calls possible where TensorRT cannot run.
#   scripts/typecheck_tensorrt.sh          (CI: one line in .ci/run)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
STUBS=.cache/typecheck/tensorrt-stubs
STUBS_VERSION="${TENSORRT_STUBS_VERSION:-10.13.0.35.1}"
if [ ! -f "$STUBS/tensorrt_bindings/tensorrt.pyi" ] || [ "$(cat "$STUBS/VERSION" 2>/dev/null)" != "$STUBS_VERSION" ]; then
  rm -rf "$STUBS"
  "$PY" -m pip install -q --no-deps --target "$STUBS" "tensorrt-stubs==$STUBS_VERSION"
  # The published 10.13 stub has two kinds of syntax error that stop mypy before it checks
  # anything: plugin-API parameters named `in` (a keyword), and add_scale_nd's channel_axis
  # (no default after defaults). Fix those two spellings; nothing else is touched.
  sed -i -E -e 's/([(,] ?)in: /\1in_: /g' \
    -e 's/(def add_scale_nd\(.*), channel_axis: int\)/\1, channel_axis: int = ...)/' \
    "$STUBS/tensorrt_bindings/tensorrt.pyi"
  echo "$STUBS_VERSION" >"$STUBS/VERSION"
fi
"$PY" -m mypy --version >/dev/null 2>&1 || { echo "mypy is missing: pip install 'wattserve[dev]'" >&2; exit 2; }
echo "mypy $("$PY" -m mypy --version | cut -d' ' -f2) on engines/tensorrt_engine.py against tensorrt-stubs $STUBS_VERSION"
# The engine imports wattserve.engines.*: mypy sees the folders under their import names
# through the same link tree scripts/typecheck.sh uses (scripts/typecheck_tree.py), with the
# stubs ahead of it on the path; messages name engines/tensorrt_engine.py.
NS="$("$PY" scripts/typecheck_tree.py)"
MYPYPATH="$STUBS:$NS" "$PY" scripts/typecheck_tree.py mypy --config-file scripts/mypy_tensorrt.ini \
  -m wattserve.engines.tensorrt_engine
