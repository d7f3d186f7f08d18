#!/usr/bin/env bash
# The one prepared GPU check (run it in one call on a lent GPU machine):
# records the environment, then builds/captures every engine, checks outputs against torch
# and times each per batch size (scripts/gpu_engines_check.py), then measures energy
# (scripts/gpu_energy_check.py: NVML counter vs integrated power, J/inference, idle power). Results go to $OUT (the
# device tool's output folder) or results/gpu. Exit codes: 0 all good, 1 an engine
# disagreed or failed, 2 no CUDA device. Extra arguments go to gpu_engines_check.py, e.g.
#   scripts/gpu_check.sh --models mobilenet_v2 --precisions fp16
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-results/gpu}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-python3}"
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv 2>&1 || echo "nvidia-smi: not available"
  "$PY" - <<'PYEOF'
import importlib
for mod in ("torch", "torchvision", "onnx", "onnxscript", "onnxruntime", "tensorrt", "pycuda.driver"):
    try:
        m = importlib.import_module(mod)
        print(f"{mod}: {getattr(m, '__version__', 'imported')}")
    except Exception as exc:
        print(f"{mod}: NOT importable ({exc})")
PYEOF
} 2>&1 | tee "$OUT_DIR/environment.txt"

PYTHONPATH=. "$PY" scripts/gpu_engines_check.py --out-dir "$OUT_DIR" "$@" 2>&1 | tee "$OUT_DIR/gpu_engines_check.log"
status=${PIPESTATUS[0]}
echo "gpu_engines_check exit status: $status" | tee -a "$OUT_DIR/gpu_engines_check.log"

# Energy (issue 3): counter vs integrated power, J/inference per batch size, idle power.
PYTHONPATH=. "$PY" scripts/gpu_energy_check.py --out "$OUT_DIR/gpu_energy.json" 2>&1 | tee "$OUT_DIR/gpu_energy.txt"
energy_status=${PIPESTATUS[0]}
echo "gpu_energy_check exit status: $energy_status" | tee -a "$OUT_DIR/gpu_energy.txt"
[ "$status" -ne 0 ] && exit "$status"
exit "$energy_status"
