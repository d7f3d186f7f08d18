#!/usr/bin/env bash
# Check that a built wattserve image serves: run it with podman (host network, the server
# bound to 127.0.0.1 on free ports: loopback only), then
#   1. the default model (mobilenet_v2, random weights): ready, the image's HEALTHCHECK passes,
#      tritonclient infers over HTTP and gRPC and the answers agree; not root, PID 1 is the
#      server; `podman stop` (SIGTERM) ends it with exit code 0 after a drain;
#   2. (in 1's container, before the stop) the compose file's Prometheus half: Debian's
#      prometheus (the prom/prometheus image cannot be pulled here) with
#      deploy/prometheus/prometheus.yml, its target `wattserve:8000` pointed at the container,
#      scrapes it; every Grafana dashboard query runs there. Grafana itself is not run (its
#      image cannot be pulled here).
#   3. a model repository mounted read-only at /models (an identity model that takes 2 s a
#      batch): served over HTTP and gRPC; SIGTERM with 4 requests in flight: every one
#      answered 200, the log says it drained, exit code 0.
# Prints the image size first. Stops and removes everything it starts.
#   scripts/check_image.sh [IMAGE]        default localhost/wattserve:cpu
# The clients run here, from this checkout's venv (.venv, or $PYTHON): tritonclient[http,grpc].
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${1:-localhost/wattserve:cpu}"
export CONTAINERS_STORAGE_CONF="${CONTAINERS_STORAGE_CONF:-$PWD/scripts/containers-storage.conf}"
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
# podman as this machine allows: runc where cgroups are hybrid (crun refuses them), file and
# process limits set at or below the host's (the default raises them, which needs
# CAP_SYS_RESOURCE), and no healthcheck timer (it needs systemd; `podman healthcheck run`
# below runs the image's HEALTHCHECK by hand).
PODMAN=(podman)
if [ -d /sys/fs/cgroup/unified ] && command -v runc >/dev/null; then PODMAN+=(--runtime runc); fi
NOFILE="$(ulimit -Hn)"; [ "$NOFILE" = unlimited ] || [ "$NOFILE" -gt 65536 ] && NOFILE=65536
RUN_FLAGS=(--ulimit "nofile=$NOFILE:$NOFILE" --ulimit nproc=4096:4096 --health-interval disable)
NAME="wattserve-check-$$"
WORK="$(mktemp -d /tmp/wattserve-check.XXXXXX)"
STARTED=()
cleanup() {
  for ctr in "${STARTED[@]}"; do "${PODMAN[@]}" rm -f -t 0 "$ctr" >/dev/null 2>&1 || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
log() { echo "[check_image $(date -u +%H:%M:%S)] $*" >&2; }
client() { "$PYTHON" scripts/image_client.py "$@"; }
free_port() { "$PYTHON" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }

bytes="$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE")"
log "$IMAGE: $bytes bytes ($(awk -v b="$bytes" 'BEGIN { printf "%.2f GB", b / 1e9 }'))"

# run NAME HTTP_PORT GRPC_PORT [podman run flags...]
run() {
  local name="$1" http="$2" grpc="$3"
  shift 3
  STARTED+=("$name")
  "${PODMAN[@]}" run -d --name "$name" --network host "${RUN_FLAGS[@]}" \
    -e WATTSERVE_HOST=127.0.0.1 -e "WATTSERVE_PORT=$http" -e "WATTSERVE_GRPC_PORT=$grpc" \
    "$@" "$IMAGE" >/dev/null
}

# stopped NAME: wait for the exit, show the drain in the log, require exit code 0.
stopped() {
  local code
  code="$("${PODMAN[@]}" wait "$1")"
  "${PODMAN[@]}" logs "$1" 2>&1 | grep -E "draining|drained|Shutting down|Finished server process" >&2 || true
  [ "$code" = 0 ] || { log "$1 exited with $code"; "${PODMAN[@]}" logs --tail 30 "$1" >&2; exit 1; }
  log "$1 exited with code 0"
}

log "1. default model"
http="$(free_port)"; grpc="$(free_port)"
run "$NAME-default" "$http" "$grpc"
start=$(date +%s)
client wait "$http" 600 || { "${PODMAN[@]}" logs --tail 40 "$NAME-default" >&2; exit 1; }
log "ready after $(( $(date +%s) - start )) s"
"${PODMAN[@]}" healthcheck run "$NAME-default" && log "HEALTHCHECK: healthy"
log "user $("${PODMAN[@]}" exec "$NAME-default" id -un) (uid $("${PODMAN[@]}" exec "$NAME-default" id -u)); PID 1: $("${PODMAN[@]}" exec "$NAME-default" cat /proc/1/cmdline | tr '\0' ' ')"
[ "$("${PODMAN[@]}" exec "$NAME-default" id -u)" != 0 ] || { log "runs as root"; exit 1; }
client infer "$http" "$grpc" mobilenet_v2
log "2. Prometheus with deploy/prometheus/prometheus.yml, scraping this container"
command -v prometheus >/dev/null || { log "needs prometheus: apt-get install -y prometheus"; exit 1; }
prom="$(free_port)"
sed "s/wattserve:8000/127.0.0.1:$http/" deploy/prometheus/prometheus.yml > "$WORK/prometheus.yml"
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address="127.0.0.1:$prom" >"$WORK/prometheus.log" 2>&1 &
PROM_PID=$!
client infer "$http" "$grpc" mobilenet_v2 >/dev/null
if ! client prometheus "$prom" deploy/grafana/dashboards/wattserve.json; then
  tail -20 "$WORK/prometheus.log" >&2; kill "$PROM_PID"; exit 1
fi
kill "$PROM_PID"; wait "$PROM_PID" 2>/dev/null || true
"${PODMAN[@]}" stop -t 60 "$NAME-default" >/dev/null  # STOPSIGNAL: SIGTERM, then 60 s before SIGKILL
stopped "$NAME-default"

log "3. a mounted model repository"
"$PYTHON" - "$WORK/models" <<'EOF'
import sys
from pathlib import Path

from support.model_repository import IDENTITY_CONFIG, write

delay = 'parameters { key: "identity_delay_ms" value: { string_value: "2000" } }\n'
write(Path(sys.argv[1]) / "identity" / "config.pbtxt", IDENTITY_CONFIG + delay)
EOF
chmod -R a+rX "$WORK/models"
http="$(free_port)"; grpc="$(free_port)"
run "$NAME-repo" "$http" "$grpc" -v "$WORK/models:/models:ro" -e WATTSERVE_MODEL_REPOSITORY=/models
client wait "$http" 300 || { "${PODMAN[@]}" logs --tail 40 "$NAME-repo" >&2; exit 1; }
client infer "$http" "$grpc" identity
client drain "$http" identity 4 -- "${PODMAN[@]}" kill --signal TERM "$NAME-repo"
stopped "$NAME-repo"
log "all checks passed"
