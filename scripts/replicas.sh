#!/usr/bin/env bash
# wattserve replicas behind a real HAProxy on loopback, driven by the built-in load generator:
# rolling restart and kill -9 under load (with and without HAProxy's layer-7 retries), and
# throughput / p99 for 1, 2 and 3 replicas. About 2.5 minutes; prints a table and writes
# results/replicas/results.json. Options go to `python -m benchmarks.replicas` (--help).
# Needs haproxy (Debian: apt-get install haproxy). Figures and what they mean: docs/deployment.md.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then
  echo "replicas.sh needs haproxy (Debian: apt-get install haproxy)" >&2
  exit 2
fi
PYTHON=${PYTHON:-python3}
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" -m benchmarks.replicas "$@"
