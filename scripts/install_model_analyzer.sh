#!/usr/bin/env bash
# Install Triton's Model Analyzer in a venv of its own, outside the tree (it pins optuna, numba,
# matplotlib, grpcio<1.68 ...: none of them wattserve's business).
#   scripts/install_model_analyzer.sh [VENV]
#     VENV: default $WATTSERVE_MA_VENV, else /tmp/wattserve-ma-venv
# Prints the model-analyzer executable's path on its last line; export it as
# WATTSERVE_MODEL_ANALYZER. Idempotent. It drives perf_analyzer, which comes from
# scripts/install_perf_analyzer.sh (Model Analyzer's wheel bundles a newer perf_analyzer binary
# that does not run on this glibc; --perf-analyzer-path points it at 2.51 instead).
#
# Why 1.44.0: the release of Triton 24.10 (2.51, the perf_analyzer that runs here) would be 1.45,
# which was never published on PyPI; 1.44.0 (24.09) is the newest not newer than perf_analyzer
# 2.51, so every flag it passes to perf_analyzer exists there. tritonclient is pinned to 2.51 too.
set -euo pipefail
VENV="${1:-${WATTSERVE_MA_VENV:-/tmp/wattserve-ma-venv}}"
MA_VERSION="${WATTSERVE_MA_VERSION:-1.44.0}"
TC_VERSION="${WATTSERVE_PA_VERSION:-2.51.0}"

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV" >&2
fi
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('triton-model-analyzer') != '$MA_VERSION')" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q "triton-model-analyzer==$MA_VERSION" "tritonclient[all]==$TC_VERSION" >&2
fi
"$VENV/bin/model-analyzer" --version >/dev/null 2>&1 || { echo "model-analyzer does not run" >&2; exit 1; }
echo "$VENV/bin/model-analyzer"
