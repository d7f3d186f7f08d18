"""``wattserve study studies/ci-tiny.toml``: 2 server configurations x 2 rates, end to end.

The runner starts wattserve itself for each configuration, runs both workloads, stops it with
SIGTERM, and writes one report with a verdict.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from wattserve.loadgen.cli import main
from wattserve.loadgen.study import load_study, server_environment, verdict

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "studies" / "ci-tiny.toml"
EXAMPLE = ROOT / "studies" / "example.toml"


def test_study_files_parse_and_map_to_server_settings() -> None:
    for path in (TINY, EXAMPLE):
        study = load_study(path)
        assert study.server_configs()
    example = load_study(EXAMPLE)
    assert {m.name for m in example.model} == {"mobilenet_v2", "resnet50"}
    assert {b.batcher for b in example.batching} == {"static", "dynamic", "continuous", "adaptive"}
    assert {w.arrival for w in example.workload} == {"poisson", "bursty"}
    cfg = next(c for c in example.server_configs() if c.batching.batcher == "dynamic")
    env = server_environment(example, cfg)
    assert env["WATTSERVE_MODEL"] == cfg.model.name
    assert env["WATTSERVE_BATCHER"] == "dynamic"
    assert env["WATTSERVE_MAX_BATCH_SIZE"] == str(cfg.batching.max_batch_size)
    assert env["WATTSERVE_MAX_QUEUE_DELAY_MS"] == str(cfg.batching.max_queue_delay_ms)
    assert env["WATTSERVE_PREFERRED_BATCH_SIZES"] == "4,8"
    # The same workload gets the same arrival schedule (seed) under every configuration.
    w = example.workload[0]
    seeds = {example.load_spec(c, w).seed for c in example.server_configs()}
    assert len(seeds) == 1


def test_bad_study_files_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[study]\nslo_ms = 10\n[[model]]\nname = "identity"\nrates = {low = 5}\n'
        '[[batching]]\nname = "d"\nbatcher = "dynamic"\n'
        '[[workload]]\nname = "w"\nlevel = "high"\n'
    )
    with pytest.raises(ValueError, match="no rate for level 'high'"):
        load_study(bad)


@pytest.mark.slow
def test_tiny_study_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "study"
    assert main(["study", str(TINY), "--out", str(out), "--no-progress"]) == 0
    doc = json.loads((out / "results.json").read_text())
    runs = doc["runs"]
    assert len(runs) == 4
    assert {(r["batching"], r["workload"]) for r in runs} == {
        (b, w) for b in ("dynamic-4-2ms", "static-4") for w in ("low-poisson", "high-poisson")
    }
    for r in runs:
        assert r["model"] == "identity" and r["sent"] > 0
        assert r["completed"] + r["failed"] == r["sent"]
        # Every measured request was answered, static batching included: the load went on
        # after the window until the last partial batch filled.
        assert r["failed"] == 0, r["errors_by_status"]
        assert r["server"]["inferences"] > 0  # /metrics was read over each window
        assert r["latency_ms"]["p50"] <= r["latency_ms"]["p99"]
    # Same workload, same schedule, whichever configuration served it.
    by_workload: dict[str, set[int]] = {}
    for r in runs:
        by_workload.setdefault(r["workload"], set()).add(r["scheduled"])
    assert all(len(counts) == 1 for counts in by_workload.values())
    # Each server started, became ready, and drained on SIGTERM (exit 0, not killed).
    configs = doc["server_configs"]
    assert [c["label"] for c in configs] == ["identity dynamic-4-2ms", "identity static-4"]
    assert all(c["error"] is None and c["exit_code"] == 0 and not c["killed"] for c in configs)
    assert all(Path(c["log"]).exists() for c in configs)
    # The verdict names a winner per workload and for the model, with its ranking rule.
    result = doc["verdict"]
    assert result["ranked_by"] in ("throughput_meeting_objective", "energy_per_inference")
    assert {(w["model"], w["workload"]) for w in result["per_workload"]} == {
        ("identity", "low-poisson"),
        ("identity", "high-poisson"),
    }
    assert result["per_model"][0]["model"] == "identity"
    page = (out / "report.html").read_text()
    assert "Which configuration wins" in page and "identity overall" in page
    with (out / "summary.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 4
    assert (out / "latency_cdf.png").exists() and (out / "throughput_latency.png").exists()


def fake_row(batching: str, workload: str, achieved: float, p95_ok: bool, energy=None):
    """A minimal RunResult stand-in for the verdict's arithmetic."""
    from wattserve.loadgen.runner import LoadSpec, RunResult
    from wattserve.loadgen.stats import RequestRecord

    spec = LoadSpec("poisson", rate=achieved, warmup_s=0.0, duration_s=1.0)
    latency = 0.010 if p95_ok else 1.0
    records = [RequestRecord(i, i / 100, i / 100, i / 100 + latency, "200") for i in range(100)]
    summary = {"achieved_rate": achieved, "target_rate": achieved, "valid": True}
    server = {"energy_per_inference_j": energy, "avg_batch_size": 1.0}
    run = RunResult(f"{batching} {workload}", spec, {}, records, summary, server, {}, "now")
    run.extra = {"model": "m", "batching": batching, "workload": workload}
    return run


def test_verdict_ranks_by_energy_when_measured_else_by_throughput() -> None:
    runs = [
        fake_row("a", "low", 10.0, True, energy=2.0),
        fake_row("b", "low", 10.0, True, energy=1.0),
        fake_row("c", "low", 10.0, False, energy=0.1),  # cheapest, but misses the objective
    ]
    result = verdict(runs, 95.0, 100.0)
    assert result["ranked_by"] == "energy_per_inference"
    assert result["per_workload"][0]["winner"] == "b"
    assert result["per_model"][0]["winner"] == "b"

    no_energy = [
        fake_row("a", "high", 50.0, True),
        fake_row("b", "high", 40.0, True),
        fake_row("c", "high", 60.0, False),
    ]
    result = verdict(no_energy, 95.0, 100.0)
    assert result["ranked_by"] == "throughput_meeting_objective"
    assert result["per_workload"][0]["winner"] == "a"
    assert any("not available" in line for line in result["lines"])
