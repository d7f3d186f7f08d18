"""The host replay: a profile from load generator rows, and the replay on it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from wattserve.batchers.adaptive_decision import Objective
from wattserve.loadgen.output import REQUEST_COLUMNS

from support.batch_simulation import Continuous, simulate
from support.host_replay import Draws, HostProfile, profile_from_runs, replay

FIELDS = REQUEST_COLUMNS  # the columns the load generator writes


def write_run(folder: Path, batches: list[tuple[int, float]], outside_ms: float = 4.0) -> None:
    """One run's requests.csv: each batch's requests share its size and compute time."""
    folder.mkdir(parents=True)
    with (folder / "requests.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        index = 0
        for size, compute in batches:
            for _ in range(size):
                queue = 2.0
                w.writerow({
                    "run": "poisson 30/s", "index": index, "phase": "measure", "intended_s": index,
                    "sent_s": index, "done_s": index + 0.1, "latency_ms": queue + compute + outside_ms,
                    "lag_ms": 0.1, "status": 200, "queue_ms": queue, "compute_ms": f"{compute:.3f}",
                    "batch_size": size,
                })  # fmt: skip
                index += 1
        # a warm-up row and a failed one: neither is profiled
        w.writerow({**dict.fromkeys(FIELDS, ""), "phase": "warmup", "status": 200, "batch_size": 1,
                    "compute_ms": "900", "latency_ms": "999", "queue_ms": "0"})  # fmt: skip
        w.writerow({**dict.fromkeys(FIELDS, ""), "phase": "measure", "status": 503})


def test_a_profile_counts_each_batch_once_and_its_slowdown_against_its_size(tmp_path):
    ones = [(1, 10.0 + i * 0.001) for i in range(9)] + [(1, 30.0)]  # one stall of 3x
    fours = [(4, 20.0 + i * 0.001) for i in range(6)]
    write_run(tmp_path / "a", ones + fours)
    write_run(tmp_path / "b", [(2, 15.0 + i * 0.001) for i in range(3)])  # too few batches of 2
    profile = profile_from_runs([tmp_path / "a", tmp_path / "b"])
    assert set(profile.median_ms) == {1, 4}  # 4 weighs once per batch, not once per request
    assert profile.median_ms[1] == pytest.approx(10.0045, abs=1e-3)
    assert profile.median_ms[4] == pytest.approx(20.0025, abs=1e-3)
    assert profile.slowdown_quantiles[-1] == pytest.approx(30.0 / 10.0045, rel=1e-3)
    assert profile.outside_ms_quantiles[100] == pytest.approx(4.0, abs=0.01)
    # sizes not measured follow the line through the measured ones
    assert profile.compute_s(2) == pytest.approx((10.0045 + (20.0025 - 10.0045) / 3) / 1000, rel=1e-3)
    assert HostProfile.from_json(json.loads(json.dumps(profile.to_json()))) == profile


def test_a_run_without_measured_batches_is_an_error(tmp_path):
    write_run(tmp_path / "a", [])
    with pytest.raises(ValueError, match="no measured batches"):
        profile_from_runs([tmp_path / "a"])


def test_draws_follow_the_quantile_table():
    draws = Draws(np.random.default_rng(1)).draw(list(np.linspace(1.0, 3.0, 201)), 20_000)
    assert draws.min() >= 1.0 and draws.max() <= 3.0
    assert np.median(draws) == pytest.approx(2.0, abs=0.05)


STEADY = HostProfile(
    median_ms={1: 10.0, 8: 24.0}, slowdown_quantiles=[1.0] * 201, outside_ms_quantiles=[1.0] * 201
)
OBJECTIVE = Objective(0.1, 99.0, 0.01)


def test_on_a_host_that_never_stalls_both_policies_meet_and_adaptive_batches_more():
    dynamic = replay("dynamic-5ms", 40, STEADY, OBJECTIVE, duration=10, seeds=2)
    adaptive = replay("adaptive", 40, STEADY, OBJECTIVE, duration=10, seeds=2)
    assert dynamic.requests == adaptive.requests > 600  # the same schedules
    assert dynamic.p99_ms < 30 and dynamic.missed_pct == 0
    assert adaptive.p99_ms <= 100 and adaptive.missed_pct == 0
    assert adaptive.mean_batch > dynamic.mean_batch
    assert adaptive.busy_ms_per_inf < dynamic.busy_ms_per_inf


def test_stalls_in_the_profile_reach_the_latencies():
    stalling = HostProfile(
        median_ms=STEADY.median_ms,
        slowdown_quantiles=[1.0] * 190 + [15.0] * 11,  # ~5% of batches take 15x
        outside_ms_quantiles=STEADY.outside_ms_quantiles,
    )
    steady = replay("dynamic-5ms", 40, STEADY, OBJECTIVE, duration=10, seeds=2)
    stalled = replay("dynamic-5ms", 40, stalling, OBJECTIVE, duration=10, seeds=2)
    assert stalled.p99_ms > 100 > steady.p99_ms
    assert stalled.missed_pct > 1.0


def test_sizes_seen_often_get_their_own_slowdowns(tmp_path):
    ones = [(1, 10.0 + i * 0.001) for i in range(60)]
    twos = [(2, 14.0 + i * 0.001) for i in range(59)] + [(2, 70.0)]  # size 2 stalls 5x once
    write_run(tmp_path / "a", ones + twos + [(8, 40.0 + i * 0.001) for i in range(6)])
    profile = profile_from_runs([tmp_path / "a"])
    assert set(profile.slowdown_by_size) == {1, 2}
    assert profile.slowdowns(1)[-1] == pytest.approx(1.0, abs=0.01)
    assert profile.slowdowns(2)[-1] == pytest.approx(5.0, rel=0.01)
    assert profile.slowdowns(8) is profile.slowdown_by_size[2]  # the largest size below with its own
    assert HostProfile.from_json(json.loads(json.dumps(profile.to_json()))) == profile


class _LateContinuous(Continuous):
    """A fixed policy with a late lane: the base ``decide_late`` (no wait, up to the max)."""

    max_batch = 2

    def late_age(self):
        return 0.030


class _Fifo(Continuous):
    max_batch = 2


def test_the_simulators_late_lane_serves_on_time_requests_first_and_every_request_once():
    """8 requests at once, then two at 25 and 30 ms; 10 ms per request, batches of 2: when
    the engine frees at ~40 ms the burst's rest is past 30 ms old, so the two fresh ones go
    ahead of it, and it is still served, each request once."""
    arrivals = np.concatenate([np.zeros(8), [0.025, 0.030]])
    finish, batches = simulate(
        _LateContinuous(), arrivals, lambda n: 0.010 * n, np.random.default_rng(0), 0.0
    )
    assert np.isfinite(finish).all() and sum(n for n, _, _ in batches) == len(arrivals)
    assert finish[8] < finish[4]  # a fresh arrival answered before the late part of the burst
    fifo, _ = simulate(_Fifo(), arrivals, lambda n: 0.010 * n, np.random.default_rng(0), 0.0)
    assert fifo[4] < fifo[8]  # the control: first come, first served
