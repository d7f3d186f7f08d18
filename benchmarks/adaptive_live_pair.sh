#!/usr/bin/env bash
# adaptive and dynamic (5 ms) on a real model, side by side: both servers up at once (idle
# while the other is measured), and at each rate one run of each, back to back, so that a
# shared machine's slow minutes fall on both alike:
#   flock /tmp/wattserve-measure.lock benchmarks/adaptive_live_pair.sh MODEL RATES OUT
# Objective p99 <= 100 ms, max batch 16, binary tensors, Poisson, 2 s warm-up + 10 s per run.
set -euo pipefail
model=$1 rates=$2 out=$3
py=${PYTHON:-python}
common=(WATTSERVE_MODEL="$model" WATTSERVE_MAX_BATCH_SIZE=16 WATTSERVE_SLO_MS=100
        WATTSERVE_SLO_PERCENTILE=99 WATTSERVE_GRPC_PORT=0)
declare -A port=([adaptive]=18478 [dynamic-5ms]=18479)
mkdir -p "$out"
env "${common[@]}" WATTSERVE_PORT=18478 WATTSERVE_BATCHER=adaptive "$py" -m wattserve serve >"$out/adaptive.log" 2>&1 &
a=$!
env "${common[@]}" WATTSERVE_PORT=18479 WATTSERVE_BATCHER=dynamic WATTSERVE_MAX_QUEUE_DELAY_MS=5 \
  "$py" -m wattserve serve >"$out/dynamic-5ms.log" 2>&1 &
d=$!
trap 'kill "$a" "$d" 2>/dev/null; wait "$a" "$d" 2>/dev/null || true' EXIT
for p in 18478 18479; do
  for _ in $(seq 240); do curl -sf "http://127.0.0.1:$p/v2/health/ready" >/dev/null && break; sleep 0.5; done
done
sleep 1  # (the adaptive batcher now times its batch sizes before it reports ready)
for rate in ${rates//,/ }; do
  for cfg in adaptive dynamic-5ms; do
    echo "$cfg $rate/s: $(uptime)" | tee -a "$out/uptime.txt"
    "$py" -m wattserve loadgen --url "http://127.0.0.1:${port[$cfg]}" --model "$model" --arrival poisson \
      --rate "$rate" --warmup 2 --duration 10 --binary --no-progress --out "$out/$cfg-$rate" >"$out/$cfg-$rate.txt" 2>&1 || true
  done
done
echo "end: $(uptime)" | tee -a "$out/uptime.txt"
for cfg in adaptive dynamic-5ms; do
  curl -sf "http://127.0.0.1:${port[$cfg]}/metrics" | grep -E '^wattserve_(slo_requests_total|adaptive_(planned_budget|margin|latency_margin|compute_margin|backoffs_total|window_miss))' >"$out/$cfg-metrics.txt" || true
done
