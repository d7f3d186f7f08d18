"""Coordinated omission: a server that freezes for 1 s once.

Open loop (requests due on a fixed schedule, latency from the intended send time) must show
the freeze in its tail; a closed loop (one worker that waits for each answer) sends nothing
while the server is frozen, so only one of its thousands of requests sees the freeze and its
p99 stays low. Both runs see the same 1 s maximum: the difference is what the percentiles say.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from wattserve.loadgen.calibration_server import running_calibration_server
from wattserve.loadgen.client import make_session
from wattserve.loadgen.runner import LoadSpec, prepare_target, run_load

# Latency thresholds on a real server and generator sharing the CPUs: alone, not beside
# another test (tests/serial_lock.py).
pytestmark = [pytest.mark.slow, pytest.mark.serial]


def window_latencies_ms(run) -> list[float]:
    w0, w1 = run.spec.warmup_s, run.spec.warmup_s + run.spec.duration_s
    return [r.latency_s * 1000 for r in run.records if r.ok and w0 <= r.intended_s < w1]


async def test_open_loop_p99_shows_a_stall_that_closed_loop_hides() -> None:
    async with running_calibration_server() as (server, url), make_session(30) as session:
        target = await prepare_target(session, url, "identity", "binary")
        # Freeze 2 s after each run's first request: inside the window [0.5 s, 5 s).
        server.arm_stall(after_s=2.0, stall_s=1.0)
        # The generator shares this process (and a loaded 2-core machine) with the server: a
        # send lag bound of 25 ms, not the default 10, so the run stays valid when the
        # machine is busy (the freeze it must show is 1,000 ms).
        open_run = await run_load(
            session, target, LoadSpec("constant", rate=100, warmup_s=0.5, duration_s=4.5, max_lag_ms=25)
        )
        stalled_open = server.stalled_requests
        server.arm_stall(after_s=2.0, stall_s=1.0)
        closed_run = await run_load(
            session, target, LoadSpec("closed", concurrency=1, warmup_s=0.5, duration_s=4.5)
        )
        stalled_closed = server.stalled_requests - stalled_open

    open_lat, closed_lat = open_run.summary["latency_ms"], closed_run.summary["latency_ms"]
    # Both runs met the freeze.
    assert open_lat["max"] >= 900 and closed_lat["max"] >= 900
    # Open loop: ~100 requests fell due during the freeze (a fifth of the window) and waited.
    assert stalled_open >= 80
    assert sum(1 for v in window_latencies_ms(open_run) if v > 500) >= 30
    assert open_lat["p99"] >= 700
    assert open_lat["p90"] >= 200
    # Closed loop: its single worker was stuck in one request, so one request saw it ...
    assert stalled_closed == 1
    assert sum(1 for v in window_latencies_ms(closed_run) if v > 500) == 1
    assert closed_run.summary["completed"] > 1000
    # ... and its p99 hides the freeze that the open loop's p99 shows.
    assert closed_lat["p99"] < 0.1 * open_lat["p99"]
    assert open_run.summary["valid"], open_run.summary["invalid_reasons"]


async def test_a_generator_stall_is_charged_to_latency_and_invalidates_the_run() -> None:
    """If the generator itself freezes, the requests it owed are late, not forgotten."""
    async with running_calibration_server() as (_, url), make_session(30) as session:
        target = await prepare_target(session, url, "identity", "binary")

        async def freeze_the_generator() -> None:
            await asyncio.sleep(1.5)
            time.sleep(0.3)  # noqa: ASYNC251 - blocking the generator's loop is the point

        freezer = asyncio.create_task(freeze_the_generator())
        run = await run_load(
            session,
            target,
            LoadSpec("constant", rate=100, warmup_s=0.2, duration_s=2.8, max_lag_ms=10),
        )
        await freezer
    s = run.summary
    assert not s["valid"]
    assert any("send lag" in reason for reason in s["invalid_reasons"])
    assert s["lag_ms"]["max"] >= 250
    # The ~30 requests due during the freeze were sent late and their latency says so.
    assert s["latency_ms"]["max"] >= 250
    assert s["sent"] == s["scheduled"] == 280
