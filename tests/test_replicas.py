"""Three wattserve replicas behind a real HAProxy on loopback: a rolling restart (SIGTERM one at a
time, start it again, wait until the balancer has it back) under steady open-loop load from the
built-in generator loses no request and returns no 5xx. The figures (kill -9, scaling) come
from ``python -m benchmarks.replicas`` / scripts/replicas.sh and are in docs/deployment.md; the
rolling restart here runs that same command, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.haproxy import BalancerSpec, haproxy_binary, haproxy_config

ROOT = Path(__file__).resolve().parent.parent


def require_haproxy() -> str:
    binary = haproxy_binary()
    if binary is None:
        message = "haproxy not installed (apt-get install haproxy)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; CI must run the replica test")
        pytest.skip(message)
    return binary


@pytest.mark.parametrize("l7_retries", [True, False])
def test_generated_haproxy_config_is_valid(tmp_path: Path, l7_retries: bool):
    binary = require_haproxy()
    spec = BalancerSpec([18001, 18002, 18003], l7_retries=l7_retries)
    text = haproxy_config(spec, 18000, 18100)
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(text)
    out = subprocess.run([binary, "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "option httpchk GET /v2/health/ready" in text
    assert ("retry-on conn-failure empty-response junk-response 503" in text) is l7_retries
    assert text.count("\n    server r") == 3


@pytest.mark.slow
def test_rolling_restart_under_load_loses_nothing(tmp_path: Path):
    require_haproxy()
    out = tmp_path / "out"
    # The window ends 2 s (--tail-s) after the last replica is back; 40 s is only its longest:
    # on a crowded machine three restarts have taken up to ~25 s.
    args = ["--scenarios", "rolling", "--rate", "50", "--rolling-window-s", "40", "--out", str(out)]
    run = subprocess.run([sys.executable, "-m", "benchmarks", "replicas", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    report = json.loads((out / "results.json").read_text())
    (run,) = report["disruptions"]
    assert run["failures"] == {}, run["failure_times_s"]
    events = run["events"]
    assert [e["replica"] for e in events] == [0, 1, 2]
    assert all(e["exit_code"] == 0 for e in events), events  # each one drained and exited by itself
    assert run["disruption_inside_window"], events
    window = run["window"]
    assert window["completed"] == window["sent"] > 0, window
    assert run["haproxy"]["client_5xx"] == 0  # what clients saw (retried 503s never reach them)
