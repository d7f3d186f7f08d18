#!/usr/bin/env bash
# Triton's Model Analyzer (remote mode) against a live wattserve, end to end: installs
# perf_analyzer 2.51 and Model Analyzer 1.44 in their own venvs if needed, starts wattserve on a
# small repository, profiles the ONNX model `add` over max_batch_size 4/8 x concurrency 1/2,
# prints the table Model Analyzer exports and where its reports are. docs/model-analyzer.md
# explains the configuration.
#   scripts/model_analyzer_check.sh [WORKDIR]
# Uses $WATTSERVE_PERF_ANALYZER / $WATTSERVE_MODEL_ANALYZER when set; PYTHON picks the
# interpreter that has wattserve (default: .venv/bin/python, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
PA="${WATTSERVE_PERF_ANALYZER:-$(bash scripts/install_perf_analyzer.sh | tail -n 1)}"
MA="${WATTSERVE_MODEL_ANALYZER:-$(bash scripts/install_model_analyzer.sh | tail -n 1)}"
args=(--model-analyzer "$MA" --perf-analyzer "$PA")
if [ $# -ge 1 ]; then args+=(--workdir "$1"); fi
exec "$PY" -m support.model_analyzer_run "${args[@]}"
