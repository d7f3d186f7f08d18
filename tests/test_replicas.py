"""Three wattserve replicas behind a real HAProxy on loopback: a rolling restart (SIGTERM one at a
time, start it again, wait until the balancer has it back) under steady open-loop load from the
built-in generator loses no request and returns no 5xx. The figures (kill -9, scaling) come
from ``python -m benchmarks.replicas`` / scripts/replicas.sh and are in docs/deployment.md."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from benchmarks import replicas as rp


def require_haproxy() -> str:
    binary = rp.haproxy_binary()
    if binary is None:
        message = "haproxy not installed (apt-get install haproxy)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; CI must run the replica test")
        pytest.skip(message)
    return binary


@pytest.mark.parametrize("l7_retries", [True, False])
def test_generated_haproxy_config_is_valid(tmp_path: Path, l7_retries: bool):
    binary = require_haproxy()
    spec = rp.BalancerSpec([18001, 18002, 18003], l7_retries=l7_retries)
    text = rp.haproxy_config(spec, 18000, 18100)
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
    args = rp.parse_args(
        # A generous window: on a crowded machine three restarts have taken up to ~25 s.
        ["--scenarios", "rolling", "--rate", "50", "--rolling-window-s", "40", "--out", str(tmp_path / "out")]
    )
    report = asyncio.run(rp.main_async(args))
    (run,) = report["disruptions"]
    assert run["failures"] == {}, run["failure_times_s"]
    events = run["events"]
    assert [e["replica"] for e in events] == [0, 1, 2]
    assert all(e["exit_code"] == 0 for e in events), events  # each one drained and exited by itself
    assert run["disruption_inside_window"], events
    window = run["window"]
    assert window["completed"] == window["sent"] > 0, window
    assert run["haproxy"]["client_5xx"] == 0  # what clients saw (retried 503s never reach them)
