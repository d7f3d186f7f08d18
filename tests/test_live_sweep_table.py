"""The per-run and pooled rows of a live sweep (support/live_sweep.py, what
benchmarks.adaptive_live_table prints), from the load generator's own files (results.json,
requests.csv) written here by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.live_sweep import markdown, table


def _run(
    out: Path,
    name: str,
    latencies_ms: list[float],
    statuses: list[int] | None = None,
    batch: float = 2.0,
    policy: list[dict] | None = None,
) -> None:
    folder = out / name
    folder.mkdir(parents=True)
    statuses = statuses or [200] * len(latencies_ms)
    rows = [
        "run,index,phase,intended_s,sent_s,done_s,latency_ms,lag_ms,status,queue_ms,compute_ms,batch_size"
    ]
    rows.append("r,0,warmup,0,0,0,900.0,0,200,0,0,1")  # the warm-up never counts
    for i, (latency, status) in enumerate(zip(latencies_ms, statuses, strict=True)):
        rows.append(f"r,{i + 1},measure,0,0,0,{latency},0,{status},0,0,1")
    rows.append("r,999,after,0,0,0,900.0,0,200,0,0,1")  # nor what was sent after the window
    (folder / "requests.csv").write_text("\n".join(rows) + "\n")
    errors = {str(s): statuses.count(s) for s in set(statuses) if s != 200}
    run = {
        "achieved_rate": 40.0,
        "valid": True,
        "errors_by_status": errors,
        "server": {"avg_batch_size": batch, **({"policy": policy} if policy is not None else {})},
    }
    (folder / "results.json").write_text(json.dumps({"runs": [run]}))


def test_rounds_are_pooled_per_configuration_and_rate(tmp_path: Path) -> None:
    # round 1: 100 requests, one at 150 ms (p99 within 100 ms); round 2: 100, two at 150 ms
    _run(tmp_path, "adaptive-45-r1", [50.0] * 99 + [150.0], batch=2.0)
    _run(tmp_path, "adaptive-45-r2", [50.0] * 98 + [150.0] * 2, batch=3.0)
    _run(tmp_path, "dynamic-5ms-45-r1", [40.0] * 100, batch=1.5)
    rows = table(tmp_path, slo_ms=100, percentile=99)
    by = {(r["config"], r["run"]): r for r in rows}
    assert set(by) == {("adaptive", "r1"), ("adaptive", "r2"), ("adaptive", "pooled"), ("dynamic-5ms", "r1")}
    assert by["adaptive", "r1"]["requests"] == 100  # warm-up and after-window rows left out
    assert by["adaptive", "r1"]["attainment"] == pytest.approx(0.99)
    assert by["adaptive", "r1"]["meets"]  # p99 of 100 with one late: interpolated below 150
    assert not by["adaptive", "r2"]["meets"]  # 98% within: below the 99% the objective asks
    pooled = by["adaptive", "pooled"]
    assert pooled["requests"] == 200 and pooled["attainment"] == pytest.approx(197 / 200)
    assert pooled["mean_batch"] == pytest.approx(2.5) and not pooled["meets"]
    assert by["dynamic-5ms", "r1"]["meets"]
    assert "| 45 | adaptive | pooled | 200 |" in markdown(rows, 99)


def test_a_refusal_counts_against_attainment_not_in_the_latency(tmp_path: Path) -> None:
    _run(tmp_path, "adaptive-120", [60.0] * 90 + [0.0] * 10, statuses=[200] * 90 + [503] * 10)
    (row,) = table(tmp_path, slo_ms=100, percentile=99)
    assert row["rejected"] == 10 and row["attainment"] == pytest.approx(0.9)
    assert row["tail_ms"] == pytest.approx(60.0) and not row["meets"]


def test_the_adaptive_batchers_own_state_is_shown_where_the_run_recorded_it(tmp_path: Path) -> None:
    ours = {"model": "mobilenet_v2", "batcher": "adaptive"}

    def policy(hold_min_s: float, backoffs: float) -> list[dict]:  # as loadgen's promwindow writes it
        return [
            {"name": "wattserve_adaptive_max_hold_seconds", "labels": ours, "type": "gauge",
             "mean": 0.05, "min": hold_min_s, "max": 0.09},
            {"name": "wattserve_adaptive_backoffs_total", "labels": ours, "type": "counter", "delta": backoffs},
            {"name": "wattserve_slo_requests_total", "labels": {**ours, "outcome": "met"}, "type": "counter",
             "delta": 99},
        ]  # fmt: skip

    _run(tmp_path, "adaptive-45-r1", [50.0] * 100, policy=policy(0.0045, 3))
    _run(tmp_path, "adaptive-45-r2", [50.0] * 100, policy=policy(0.0225, 1))
    _run(tmp_path, "dynamic-5ms-45-r1", [40.0] * 100)
    rows = table(tmp_path, slo_ms=100, percentile=99)
    by = {(r["config"], r["run"]): r for r in rows}
    assert by["adaptive", "r1"]["min_hold_ms"] == pytest.approx(4.5)
    assert by["adaptive", "pooled"]["min_hold_ms"] == pytest.approx(4.5)
    assert by["adaptive", "pooled"]["backoffs"] == 4
    assert by["dynamic-5ms", "r1"]["min_hold_ms"] is None  # no such series: shown as "-"
    text = markdown(rows, 99)
    assert "| yes | **yes** | 4.5 | 4 |" in text and "| yes | yes | - | - |" in text
