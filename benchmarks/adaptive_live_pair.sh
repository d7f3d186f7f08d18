#!/usr/bin/env bash
# adaptive and dynamic (5 ms) on a real model, side by side: the servers up at once (idle
# while another is measured), and at each rate one run of each, back to back, so that a
# shared machine's slow minutes fall on all alike:
#   flock /tmp/wattserve-measure.lock benchmarks/adaptive_live_pair.sh MODEL RATES OUT
# Objective p99 <= SLO_MS (default 100) ms, max batch MAX_BATCH (default 16), binary tensors,
# Poisson (seed: the round less one), 2 s warm-up + DURATION s (default 10) per run, ROUNDS
# (default 1) passes over the rates, each round rotating the order of the servers, on engine
# ENGINE (default torch; onnxruntime serves mobilenet_v2 ~3.5x faster on a 2-core CPU).
# BEFORE=<another checkout> adds a third server, adaptive-before, running that checkout's
# code (a same-run before/after). FIXED="dynamic-2ms dynamic-20ms ..." adds fixed dynamic
# configurations at those delays (each its own server), so that "wherever some fixed
# configuration meets the objective" is asked of more than the default delay in the same run.
# Table: python -m benchmarks.adaptive_live_table OUT
set -euo pipefail
model=$1 rates=$2 out=$3
py=${PYTHON:-python}
duration=${DURATION:-10} rounds=${ROUNDS:-1}
common=(WATTSERVE_MODEL="$model" WATTSERVE_MAX_BATCH_SIZE="${MAX_BATCH:-16}" WATTSERVE_SLO_MS="${SLO_MS:-100}"
        WATTSERVE_SLO_PERCENTILE=99 WATTSERVE_GRPC_PORT=0 WATTSERVE_ENGINE="${ENGINE:-torch}")
declare -A port=([adaptive]=18478 [dynamic-5ms]=18479 [adaptive-before]=18477)
configs=(adaptive dynamic-5ms)
mkdir -p "$out"
out=$(cd "$out" && pwd)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait "${pids[@]}" 2>/dev/null || true' EXIT
env "${common[@]}" WATTSERVE_PORT=18478 WATTSERVE_BATCHER=adaptive "$py" -m wattserve serve >"$out/adaptive.log" 2>&1 &
pids+=($!)
env "${common[@]}" WATTSERVE_PORT=18479 WATTSERVE_BATCHER=dynamic WATTSERVE_MAX_QUEUE_DELAY_MS=5 \
  "$py" -m wattserve serve >"$out/dynamic-5ms.log" 2>&1 &
pids+=($!)
if [[ -n ${BEFORE:-} ]]; then
  # started from that checkout: ``python -m`` puts the working directory first on the
  # path, so with PYTHONPATH alone (until the tenth session) this server ran *this*
  # checkout's code and "before/after" pairs were the same code twice
  (cd "$BEFORE" && exec env "${common[@]}" PYTHONPATH="$BEFORE" WATTSERVE_PORT=18477 WATTSERVE_BATCHER=adaptive \
    "$py" -m wattserve serve) >"$out/adaptive-before.log" 2>&1 &
  pids+=($!)
  configs=(adaptive-before adaptive dynamic-5ms)
fi
next_port=18480
for cfg in ${FIXED:-}; do
  [[ $cfg =~ ^dynamic-([0-9.]+)ms$ ]] || { echo "FIXED: $cfg is not dynamic-<ms>ms" >&2; exit 2; }
  port[$cfg]=$next_port
  env "${common[@]}" WATTSERVE_PORT=$next_port WATTSERVE_BATCHER=dynamic WATTSERVE_MAX_QUEUE_DELAY_MS="${BASH_REMATCH[1]}" \
    "$py" -m wattserve serve >"$out/$cfg.log" 2>&1 &
  pids+=($!)
  configs+=("$cfg")
  next_port=$((next_port + 1))
done
for cfg in "${configs[@]}"; do
  p=${port[$cfg]}
  for _ in $(seq 240); do curl -sf "http://127.0.0.1:$p/v2/health/ready" >/dev/null && break; sleep 0.5; done
done
sleep 1  # (the adaptive batcher times its batch sizes before it reports ready)
for round in $(seq "$rounds"); do
  # each round starts one server later, so that no configuration always runs in the same
  # slot of a round (this host's speed varied by slot: about 10% between first and last)
  shift_by=$(( (round - 1) % ${#configs[@]} ))
  order=("${configs[@]:shift_by}" "${configs[@]:0:shift_by}")
  for rate in ${rates//,/ }; do
    for cfg in "${order[@]}"; do
      run=$cfg-$rate; ((rounds > 1)) && run=$run-r$round
      echo "$run/s: $(uptime)" | tee -a "$out/uptime.txt"
      # one schedule per round, the same for every server in it: with one seed for all
      # rounds (until the thirteenth session) three rounds were three passes over the
      # same bursts, not three samples of them
      "$py" -m wattserve loadgen --url "http://127.0.0.1:${port[$cfg]}" --model "$model" --arrival poisson \
        --rate "$rate" --seed "$((round - 1))" --warmup 2 --duration "$duration" --binary --no-progress \
        --out "$out/$run" >"$out/$run.txt" 2>&1 || true
    done
  done
done
echo "end: $(uptime)" | tee -a "$out/uptime.txt"
for cfg in "${configs[@]}"; do
  curl -sf "http://127.0.0.1:${port[$cfg]}/metrics" | grep -E '^wattserve_(slo_requests_total|adaptive_(planned_budget|max_hold|margin|latency_margin|compute_margin|backoffs_total|window_miss))' >"$out/$cfg-metrics.txt" || true
done
