"""The thesis in one command: ``wattserve study studies/thesis.toml --short`` on the simulated GPU.

Issue 28, point 3: adaptive in joules, adaptive in seconds and the swept fixed configurations
(static, dynamic at three delays, continuous) at low / medium / high / bursty load, J/inference
(simulated) at the objective for each, and a report whose first screen answers the question.
The short variant is CI's; scripts/gpu_check.sh runs the same file on a lent GPU
(scripts/gpu_study.py --real-gpu), checked here only as far as the rewrite goes.
"""

from __future__ import annotations

import importlib.util
import json
import tomllib
from pathlib import Path

from wattserve.loadgen import study_summary
from wattserve.loadgen.cli import main
from wattserve.loadgen.study import load_study, parse_adaptive_state, server_environment

ROOT = Path(__file__).resolve().parent.parent
THESIS = ROOT / "studies" / "thesis.toml"
CONFIGS = ["adaptive-joules", "adaptive-seconds", "static-8", "dynamic-2ms", "dynamic-20ms",
           "dynamic-60ms", "continuous-32"]  # fmt: skip
LOADS = ["low", "medium", "high", "bursty"]
FIRST_SCREEN = 25


def test_thesis_file_maps_to_simulated_servers_and_has_a_short_variant() -> None:
    study = load_study(THESIS)
    assert [b.name for b in study.batching] == CONFIGS
    assert [w.name for w in study.workload] == LOADS
    assert {b.batcher for b in study.batching} == {"adaptive", "static", "dynamic", "continuous"}
    for cfg in study.server_configs():
        env = server_environment(study, cfg)
        assert env["WATTSERVE_SIMULATED_GPU"] == "superlinear"
        assert env["WATTSERVE_MODEL"] == "identity" and env["WATTSERVE_IDENTITY_DELAY_PER_ITEM_MS"] == "1"
        assert env["WATTSERVE_BATCHER"] == cfg.batching.batcher
    units = {b.name: b.env.get("WATTSERVE_ADAPTIVE_UNIT") for b in study.batching if b.batcher == "adaptive"}
    assert units == {"adaptive-joules": "joules", "adaptive-seconds": "seconds"}
    short = study.shortened()
    assert short.study.duration_s < study.study.duration_s and short.study.warmup_s < study.study.warmup_s
    # CI's variant stays short by its plan, not by a stopwatch on a shared machine: the load
    # it sends (every configuration x workload: warm-up, window, pause) is about a minute
    specs = [short.load_spec(cfg, w) for cfg in short.server_configs() for w in short.workload]
    planned = sum(spec.warmup_s + spec.duration_s + short.study.pause_s for spec in specs)
    assert len(specs) == len(CONFIGS) * len(LOADS) and planned <= 60, planned
    assert [b.name for b in short.batching] == CONFIGS and [w.name for w in short.workload] == LOADS
    assert study.study.real_gpu is not None and study.study.real_gpu.models


def test_gpu_check_runs_the_same_file_on_a_real_gpu(tmp_path: Path) -> None:
    """scripts/gpu_check.sh step 5a: studies/thesis.toml through gpu_study.py --real-gpu, which
    drops the simulator and the identity delays and takes [study.real_gpu]."""
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    assert "scripts/gpu_study.py --study studies/thesis.toml --real-gpu" in script
    spec = importlib.util.spec_from_file_location("gpu_study", ROOT / "scripts" / "gpu_study.py")
    gpu_study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_study)
    doc = gpu_study.real_gpu_study(tomllib.loads(THESIS.read_text()))
    path = tmp_path / "real.toml"
    path.write_text(gpu_study.to_toml(doc))
    real = load_study(path)
    assert [m.name for m in real.model] == ["resnet50"] and real.study.slo_ms == 25
    assert [b.name for b in real.batching] == CONFIGS and [w.name for w in real.workload] == LOADS
    for cfg in real.server_configs():
        env = server_environment(real, cfg)
        assert env["WATTSERVE_DEVICE"] == "cuda:0" and env["WATTSERVE_SLO_MS"] == "25"
        assert not any(k in cfg.batching.env or k in real.study.env for k in gpu_study.SIMULATION_ONLY)
        assert "WATTSERVE_IDENTITY_DELAY_MS" not in real.study.env
    units = {b.name: b.env.get("WATTSERVE_ADAPTIVE_UNIT") for b in real.batching if b.batcher == "adaptive"}
    assert units == {"adaptive-joules": "joules", "adaptive-seconds": "seconds"}


def test_adaptive_state_is_read_from_the_mode_metric() -> None:
    text = (
        "# TYPE wattserve_adaptive_mode gauge\n"
        'wattserve_adaptive_mode{batcher="adaptive",model="m",mode="seconds",reason="no meter",source=""} 1.0\n'
        "# TYPE wattserve_adaptive_target_batch_size gauge\n"
        'wattserve_adaptive_target_batch_size{batcher="adaptive",model="m"} 4.0\n'
    )
    state = parse_adaptive_state(text)
    assert state["mode"] == "seconds" and state["reason"] == "no meter" and state["target_batch_size"] == 4.0
    assert parse_adaptive_state("")["mode"] is None


def _row(batching: str, workload: str, energy: float, meets: bool = True, mode: str | None = None) -> dict:
    return {"model": "identity", "batching": batching, "workload": workload, "target_rate": 50.0,
            "achieved_rate": 50.0, "percentile_ms": 90.0 if meets else 400.0, "valid": True, "meets": meets,
            "energy_per_inference_j": energy, "avg_batch_size": 3.0, "adaptive_mode": mode}  # fmt: skip


def test_summary_answers_per_load_and_flags_a_unit_the_server_did_not_use() -> None:
    batchings = [
        {"name": "adaptive-joules", "batcher": "adaptive", "env": {"WATTSERVE_ADAPTIVE_UNIT": "joules"}},
        {"name": "adaptive-seconds", "batcher": "adaptive", "env": {"WATTSERVE_ADAPTIVE_UNIT": "seconds"}},
        {"name": "static-8", "batcher": "static", "env": {}},
        {"name": "dynamic-2ms", "batcher": "dynamic", "env": {}},
    ]
    rows = [
        _row("adaptive-joules", "low", 2.0, mode="joules"),
        _row("adaptive-seconds", "low", 2.5, mode="joules"),  # the server ignored the unit
        _row("static-8", "low", 1.0, meets=False),
        _row("dynamic-2ms", "low", 2.2),
        _row("adaptive-joules", "high", 1.2, mode="joules"),
        _row("adaptive-seconds", "high", 1.1, mode="joules"),
        _row("static-8", "high", 1.0),
        _row("dynamic-2ms", "high", 1.3),
    ]
    verdict = {
        "objective": {"percentile": 95, "slo_ms": 150},
        "ranked_by": "energy_per_inference",
        "runs": rows,
    }
    lines = study_summary.summary_lines("t", verdict, batchings, ["low", "high"], True, "superlinear")
    assert lines[0].startswith("**SIMULATED GPU") and "superlinear" in lines[0]
    text = "\n".join(lines[:FIRST_SCREEN])
    # static-8 is cheapest at low load but misses: the winner is the cheapest that meets it.
    assert "| low (50/s) | **adaptive-joules** | 2 |" in text
    assert "| high (50/s) | **static-8** | 1 |" in text
    assert "J/inf (simulated)" in text
    assert "adaptive-joules lower at 1 of 2 loads where both met the objective (low -20%; high +9%)" in text
    assert "Caveat:** adaptive-seconds was asked to decide in seconds" in text
    honest = [dict(r, adaptive_mode="seconds") if r["batching"] == "adaptive-seconds" else r for r in rows]
    lines = study_summary.summary_lines("t", dict(verdict, runs=honest), batchings, ["low", "high"], False)
    assert not lines[0].startswith("**SIMULATED") and "Caveat" not in "\n".join(lines)
    assert "(simulated)" not in "\n".join(lines)


def test_short_thesis_study_runs_and_its_first_screen_answers(tmp_path: Path) -> None:
    out = tmp_path / "thesis"
    assert main(["study", str(THESIS), "--short", "--out", str(out), "--no-progress"]) == 0
    doc = json.loads((out / "results.json").read_text())
    runs = doc["runs"]
    assert {(r["batching"], r["workload"]) for r in runs} == {(b, w) for b in CONFIGS for w in LOADS}
    assert all(c["error"] is None and c["exit_code"] == 0 for c in doc["server_configs"])
    for r in runs:
        assert r["sent"] > 0 and r["failed"] == 0, (r["label"], r["errors_by_status"])
        server = r["server"]
        assert server["energy_per_inference_j"] and server["energy_per_inference_j"] > 0, r["label"]
        assert "simulated" in server["energy_source"], r["label"]
    rows = doc["verdict"]["runs"]
    assert doc["verdict"]["ranked_by"] == "energy_per_inference"
    # Joule mode switches on after 8 metered batches: by the end of the second window at the
    # latest (the first, at 15/s, holds about a dozen batches, some still in open windows).
    joules = {r["workload"]: r["adaptive_mode"] for r in rows if r["batching"] == "adaptive-joules"}
    assert joules.pop("low") in ("joules", "seconds") and set(joules.values()) == {"joules"}, joules
    assert all(
        r["adaptive_mode"] in ("seconds", "joules") for r in rows if r["batching"] == "adaptive-seconds"
    )

    lines = (out / "summary.md").read_text().splitlines()
    screen = "\n".join(lines[:FIRST_SCREEN])
    assert lines[0].startswith("**SIMULATED GPU") and "superlinear" in lines[0]
    assert "J/inf (simulated)" in screen
    for load in LOADS:  # one answer per load: its winner (or none), each adaptive, the best fixed
        row = next(line for line in lines[:FIRST_SCREEN] if line.startswith(f"| {load} ("))
        winner = row.split(" | ")[1]
        assert winner == "none met it" or winner.strip("*") in CONFIGS
        met = [r for r in rows if r["workload"] == load and r["meets"]]
        if met:
            best = min(met, key=lambda r: r["energy_per_inference_j"])
            assert winner == f"**{best['batching']}**"
    assert "**adaptive-joules vs adaptive-seconds** (J/inference (simulated))" in screen
    seconds_modes = {r["adaptive_mode"] for r in rows if r["batching"] == "adaptive-seconds"}
    assert ("Caveat:** adaptive-seconds" in screen) == (seconds_modes != {"seconds"})
    page = (out / "report.html").read_text()
    assert "SIMULATED GPU" in page.split("<h1>")[0]
