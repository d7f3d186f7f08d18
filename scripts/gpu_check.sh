#!/usr/bin/env bash
# The one prepared GPU check: run it in one call on a lent GPU machine (H200: < 10 minutes
# without step 5a, about 15 with it: GPU_STUDY=0 or GPU_THESIS=0 when the budget is tighter).
#
#   scripts/gpu_check.sh                       # every engine; fails loudly where one is absent
#   GPU_ENGINES=torch,cuda-graphs scripts/gpu_check.sh   # only what that machine has
#
# Steps (each one's log and JSON under results/gpu, the summary also in $OUT):
#   1. environment (date, host, nvidia-smi, library versions)
#   2. preflight: is every requested engine's library here? (absent = NOT CHECKED, never a pass)
#   3. engines: torch eager fp32 (TF32) / fp16, CUDA graphs, ORT CUDA, TensorRT vs a TF32-off
#      torch reference, per batch size (scripts/gpu_engines_check.py)
#   4. energy: NVML counter vs integrated power, J/inference (scripts/gpu_energy_check.py)
#   5. live server with NVML telemetry + the study studies/gpu-thesis.toml, rates scaled to the
#      capacity the SLO search measures (scripts/gpu_study.py; needs the wheel kit's packages)
#   5a. the thesis study studies/thesis.toml (the same file CI runs on the simulated GPU with
#      --short): adaptive in joules / in seconds vs static, dynamic at 3 delays, continuous, at
#      low / medium / high / bursty load, J/inference from the real NVML counter; run with
#      scripts/gpu_study.py --real-gpu (its [study.real_gpu]: resnet50, fp16, p95 <= 25 ms, rates
#      from the measured capacity; about 5 minutes); GPU_THESIS=0 skips it
#   5b. text-to-image: a tiny Stable Diffusion pipeline (scripts/build_tiny_sd.py) served on the GPU,
#      iteration-level vs dynamic vs static at Poisson rates (benchmarks/diffusion_batching.py
#      --pipeline text_to_image; J/image where NVML meters it); GPU_T2I=0 skips it
#   6. report: docs/gpu-results.md and gpu_results.json written from the above (scripts/gpu_report.py)
#
# Exit status: the first non-zero of the steps: 1 a check failed, 2 no CUDA, 3 something
# requested was not checked (an absent engine library, the server packages missing). 0 only
# when everything requested ran and passed. GPU_STUDY=0 skips step 5 on purpose (reported).
# GPU_QUICK=1 shrinks every step (for a rerun inside the device budget).
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS="${GPU_RESULTS:-results/gpu}"
SUMMARY="${OUT:-$RESULTS}"
mkdir -p "$RESULTS" "$SUMMARY"
PY="${PYTHON:-python3}"
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
ENGINES="${GPU_ENGINES:-torch,cuda-graphs,onnxruntime-cuda,tensorrt}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
LOG="$SUMMARY/gpu_check.log"
: >"$LOG"
status=0
record() {  # record STATUS NAME: keep the first non-zero status
  echo "$2 exit status: $1" | tee -a "$LOG"
  if [ "$status" -eq 0 ] && [ "$1" -ne 0 ]; then status=$1; fi
}
if [ "${GPU_QUICK:-0}" = 1 ]; then
  T2I_ARGS=(--rates 10,30 --requests 60 --warmup 10 --mixes "10,20,40")
  ENGINE_ARGS=(--batch-sizes 1,8 --min-iters 5 --min-seconds 0.1)
  ENERGY_ARGS=(--batch-sizes 8 --seconds-per-size 3)
  STUDY_ARGS=(--quick)
else
  T2I_ARGS=(--rates 5,15,30 --requests 90 --warmup 15 --mixes "10,20,40;20")
  STUDY_ARGS=()
  ENGINE_ARGS=(--batch-sizes 1,8,32 --min-iters 10 --min-seconds 0.2)
  ENERGY_ARGS=(--batch-sizes 1,32 --seconds-per-size 6)
fi

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)"
  echo "engines requested: $ENGINES"
  nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv 2>&1 || echo "nvidia-smi: not available"
  "$PY" - <<'PYEOF'
import importlib
for mod in ("torch", "torchvision", "onnx", "onnxruntime", "tensorrt", "pycuda.driver", "pynvml",
            "prometheus_client", "fastapi", "uvicorn", "pydantic", "pydantic_settings", "orjson", "hdrh"):
    try:
        m = importlib.import_module(mod)
        print(f"{mod}: {getattr(m, '__version__', 'imported')}")
    except Exception as exc:
        print(f"{mod}: NOT importable ({exc})")
PYEOF
} 2>&1 | tee "$RESULTS/environment.txt" | tee -a "$LOG"

"$PY" scripts/gpu_engines_check.py --preflight --engines "$ENGINES" --out-dir "$RESULTS" 2>&1 | tee -a "$LOG"
record "${PIPESTATUS[0]}" preflight

"$PY" scripts/gpu_engines_check.py --engines "$ENGINES" --out-dir "$RESULTS" "${ENGINE_ARGS[@]}" "$@" 2>&1 \
  | tee "$RESULTS/gpu_engines_check.log" | tee -a "$LOG"
engines_status=${PIPESTATUS[0]}
record "$engines_status" gpu_engines_check
if [ "$engines_status" -eq 2 ]; then
  echo "no CUDA device: energy, server and study not run" | tee -a "$LOG"
  exit "$status"
fi

"$PY" scripts/gpu_energy_check.py --out "$RESULTS/gpu_energy.json" --fp16 "${ENERGY_ARGS[@]}" 2>&1 \
  | tee "$RESULTS/gpu_energy.txt" | tee -a "$LOG"
record "${PIPESTATUS[0]}" gpu_energy_check

if [ "${GPU_STUDY:-1}" = 1 ]; then
  if "$PY" -c "import fastapi, uvicorn, pydantic_settings, orjson, hdrh, aiohttp" 2>/dev/null; then
    "$PY" scripts/gpu_study.py --results "$RESULTS" "${STUDY_ARGS[@]}" 2>&1 | tee "$RESULTS/gpu_study.log" | tee -a "$LOG"
    record "${PIPESTATUS[0]}" gpu_study
  else
    echo "NOT CHECKED: live server and study: server packages missing (install the wheel kit: scripts/gpu_kit.sh)" | tee -a "$LOG"
    record 3 gpu_study
  fi
else
  echo "NOT RUN (GPU_STUDY=0): live server and study" | tee -a "$LOG"
fi

if [ "${GPU_THESIS:-1}" = 1 ]; then
  if "$PY" -c "import fastapi, uvicorn, pydantic_settings, orjson, hdrh, aiohttp" 2>/dev/null; then
    "$PY" scripts/gpu_study.py --study studies/thesis.toml --real-gpu --results "$RESULTS/thesis" \
      "${STUDY_ARGS[@]}" 2>&1 | tee "$RESULTS/thesis_study.log" | tee -a "$LOG"
    record "${PIPESTATUS[0]}" thesis_study
    cp "$RESULTS/thesis/study/summary.md" "$SUMMARY/thesis_summary.md" 2>/dev/null || true
  else
    echo "NOT CHECKED: thesis study: server packages missing (install the wheel kit: scripts/gpu_kit.sh)" | tee -a "$LOG"
    record 3 thesis_study
  fi
else
  echo "NOT RUN (GPU_THESIS=0): thesis study" | tee -a "$LOG"
fi

if [ "${GPU_T2I:-1}" = 1 ]; then
  if "$PY" -c "import fastapi, uvicorn, pydantic_settings, diffusers, transformers" 2>/dev/null; then
    "$PY" -m benchmarks.diffusion_batching --pipeline text_to_image --device cuda:0 --fp16 "${T2I_ARGS[@]}" \
      --out "$RESULTS/text_to_image" 2>&1 | tee "$RESULTS/text_to_image.log" | tee -a "$LOG"
    record "${PIPESTATUS[0]}" text_to_image
    cp "$RESULTS/text_to_image/diffusion_batching.json" "$SUMMARY/text_to_image.json" 2>/dev/null || true
    cp "$RESULTS/text_to_image/latency_cdf.png" "$SUMMARY/text_to_image_cdf.png" 2>/dev/null || true
  else
    echo "NOT CHECKED: text-to-image: diffusers/transformers or server packages missing (kit: 'wattserve[diffusion]')" | tee -a "$LOG"
    record 3 text_to_image
  fi
else
  echo "NOT RUN (GPU_T2I=0): text-to-image" | tee -a "$LOG"
fi

"$PY" scripts/gpu_report.py --results "$RESULTS" --doc docs/gpu-results.md --summary "$SUMMARY" 2>&1 | tee -a "$LOG"
record "${PIPESTATUS[0]}" gpu_report
echo "gpu_check exit status: $status" | tee -a "$LOG"
exit "$status"
