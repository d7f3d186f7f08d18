#!/usr/bin/env bash
# One call on a lent GPU machine: record the device, run the energy check, keep the outputs.
# Needs Python with torch (CUDA), torchvision, nvidia-ml-py, numpy and prometheus-client.
# Outputs go to $OUT (the device tool's folder) or ./out.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=index,name,uuid,driver_version,power.limit,power.draw --format=csv || true
  "$PY" -c "import torch, torchvision, pynvml, prometheus_client; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
} 2>&1 | tee "$OUT/gpu_env.txt"
"$PY" scripts/gpu_energy_check.py --out "$OUT/gpu_energy.json" "$@" 2>&1 | tee "$OUT/gpu_energy.txt"
