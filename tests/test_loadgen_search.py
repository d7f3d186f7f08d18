"""The SLO search's bisection, against a simulated server whose knee is known exactly.

``run_load`` is replaced by a model of a server (latency jumps above a capacity), so the
search logic is checked without wall-clock timing; the live path is exercised by the
end-to-end test.
"""

from __future__ import annotations

import pytest
from wattserve.loadgen import search
from wattserve.loadgen.runner import LoadSpec, RunResult, summarize
from wattserve.loadgen.search import Objective, SearchLimits, find_max_rate
from wattserve.loadgen.stats import RequestRecord


def fake_server(capacity: float, errors_above: float | None = None, invalid_above: float | None = None):
    calls: list[LoadSpec] = []

    async def run_load(session, target, spec: LoadSpec, progress=None) -> RunResult:
        calls.append(spec)
        n = int(spec.rate * spec.duration_s)
        latency = 0.010 if spec.rate <= capacity else 2.0
        records = []
        for i in range(n):
            t = spec.warmup_s + i / spec.rate
            status = "503" if errors_above and spec.rate > errors_above and i % 10 == 0 else "200"
            lag = 0.05 if invalid_above and spec.rate > invalid_above else 0.0
            records.append(RequestRecord(i, t, t + lag, t + lag + latency, status))
        summary = summarize(records, spec, n)
        return RunResult(spec.label, spec, {}, records, summary, None, {}, "now")

    return run_load, calls


async def test_bisection_finds_the_knee_within_tolerance(monkeypatch) -> None:
    run_load, calls = fake_server(capacity=73.0)
    monkeypatch.setattr(search, "run_load", run_load)
    base = LoadSpec("poisson", warmup_s=1.0, duration_s=5.0)
    limits = SearchLimits(start_rate=10, tolerance=0.02, max_steps=20)
    summary, runs = await find_max_rate(None, None, base, Objective(100.0, 95.0), limits)
    assert summary["stopped_by"] == "objective"
    assert 73.0 * 0.98 <= summary["best_rate"] <= 73.0
    assert summary["lowest_failing_rate"] > 73.0
    assert (summary["lowest_failing_rate"] - summary["best_rate"]) / summary["lowest_failing_rate"] <= 0.02
    # Doubling 10 -> 20 -> 40 -> 80, then bisection; every step's verdict is recorded.
    assert [s.rate for s in calls[:4]] == [10, 20, 40, 80]
    assert len(runs) == len(summary["steps"]) == len(calls)
    # Every step ran long enough for 500 queries (p95: 25 beyond the percentile).
    assert summary["min_queries_per_step"] == 500
    assert all(spec.rate * spec.duration_s >= 500 - 1e-6 for spec in calls)


async def test_failed_requests_count_as_misses(monkeypatch) -> None:
    # Fast answers everywhere, but 10% are 503s above 30 req/s: p95 counts them as misses.
    run_load, _ = fake_server(capacity=1e9, errors_above=30.0)
    monkeypatch.setattr(search, "run_load", run_load)
    limits = SearchLimits(start_rate=8, tolerance=0.05)
    summary, _ = await find_max_rate(None, None, LoadSpec("poisson"), Objective(100.0), limits)
    assert 30.0 * 0.95 <= summary["best_rate"] <= 30.0


async def test_an_invalid_generator_run_never_passes(monkeypatch) -> None:
    run_load, _ = fake_server(capacity=1e9, invalid_above=50.0)
    monkeypatch.setattr(search, "run_load", run_load)
    limits = SearchLimits(start_rate=10, tolerance=0.05)
    summary, _ = await find_max_rate(None, None, LoadSpec("poisson"), Objective(100.0), limits)
    assert summary["best_rate"] <= 50.0
    assert summary["generator_limited"] is True


@pytest.mark.parametrize("start", [200.0, 1000.0])
async def test_search_halves_down_when_the_start_rate_fails(monkeypatch, start: float) -> None:
    run_load, calls = fake_server(capacity=40.0)
    monkeypatch.setattr(search, "run_load", run_load)
    limits = SearchLimits(start_rate=start, tolerance=0.05, max_steps=30)
    summary, _ = await find_max_rate(None, None, LoadSpec("poisson"), Objective(100.0), limits)
    assert calls[0].rate == start and calls[1].rate == start / 2
    assert 40.0 * 0.95 <= summary["best_rate"] <= 40.0


async def test_nothing_passes_above_the_minimum(monkeypatch) -> None:
    run_load, _ = fake_server(capacity=0.01)
    monkeypatch.setattr(search, "run_load", run_load)
    limits = SearchLimits(start_rate=4, min_rate=1, min_queries=20)
    summary, _ = await find_max_rate(None, None, LoadSpec("poisson"), Objective(100.0), limits)
    assert summary["best_rate"] is None
    assert "no rate" in summary["stopped_by"]
