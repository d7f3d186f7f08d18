#!/usr/bin/env bash
# One batching configuration on a real model, one server start, one Poisson rate sweep:
#   benchmarks/adaptive_live_model.sh CONFIG MODEL RATES OUT [PORT]
# CONFIG: adaptive | dynamic-<ms>ms. Objective p99 <= 100 ms, max batch 16, binary tensors,
# 2 s warm-up + 10 s per rate (docs/adaptive.md, "mobilenet_v2 live"), on engine ENGINE
# (default torch; onnxruntime serves mobilenet_v2 ~3.5x faster on a 2-core CPU). Run it under the
# shared measurement lock: flock /tmp/wattserve-measure.lock benchmarks/adaptive_live_model.sh ...
set -euo pipefail
config=$1 model=$2 rates=$3 out=$4 port=${5:-18477}
py=${PYTHON:-python}
settings=(WATTSERVE_MODEL="$model" WATTSERVE_MAX_BATCH_SIZE=16 WATTSERVE_SLO_MS=100
          WATTSERVE_SLO_PERCENTILE=99 WATTSERVE_GRPC_PORT=0 WATTSERVE_PORT="$port"
          WATTSERVE_ENGINE="${ENGINE:-torch}")
case $config in
  adaptive) settings+=(WATTSERVE_BATCHER=adaptive) ;;
  dynamic-*ms) delay=${config#dynamic-}; settings+=(WATTSERVE_BATCHER=dynamic WATTSERVE_MAX_QUEUE_DELAY_MS="${delay%ms}") ;;
  *) echo "unknown config $config" >&2; exit 2 ;;
esac
mkdir -p "$out"
env "${settings[@]}" "$py" -m wattserve serve >"$out/server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
for _ in $(seq 240); do
  curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null && break
  kill -0 "$server" || { cat "$out/server.log"; exit 1; }
  sleep 0.5
done
echo "before: $(uptime)" | tee "$out/uptime.txt"
"$py" -m wattserve loadgen --url "http://127.0.0.1:$port" --model "$model" --arrival poisson \
  --rates "$rates" --warmup 2 --duration 10 --binary --out "$out" | tee "$out/loadgen.txt"
echo "after: $(uptime)" | tee -a "$out/uptime.txt"
curl -sf "http://127.0.0.1:$port/metrics" | grep -E '^wattserve_(slo_requests_total|adaptive_(planned_budget|max_hold|margin|latency_margin|compute_margin|backoffs_total|window_miss))' \
  | tee "$out/metrics.txt" || true
