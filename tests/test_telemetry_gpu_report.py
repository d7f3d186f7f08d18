"""The GPU study driver and report writer (scripts/gpu_study.py, scripts/gpu_report.py) and the
per-configuration energy plot, without a GPU: fixtures shaped like the device's outputs, and
the study driver's whole plumbing on the CPU (identity model)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
from wattserve.loadgen.plots import energy_latency_per_config
from wattserve.loadgen.study import Study

ROOT = Path(__file__).resolve().parent.parent


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(model, batching, workload, p95, joules):
    return {"model": model, "batching": batching, "workload": workload, "p95_ms": p95,
            "energy_per_inference_j": joules}  # fmt: skip


def test_energy_latency_per_config_draws_one_line_per_configuration(tmp_path):
    rows = [run(m, b, w, p, j) for m in ("resnet50", "mobilenet_v2")
            for b, scale in (("static-8", 1.0), ("dynamic-32-2ms", 0.8))
            for w, p, j in (("low", 5.0, 0.2), ("high", 12.0, 0.05))]  # fmt: skip
    path, note = energy_latency_per_config(rows, tmp_path / "e.png")
    assert note is None and path.exists() and path.stat().st_size > 10_000
    path, note = energy_latency_per_config([run("m", "b", "w", 3.0, None)], tmp_path / "none.png")
    assert path is None and "no run has an energy per inference" in note
    assert not (tmp_path / "none.png").exists()


def test_scaled_study_is_a_valid_study_with_rates_from_capacity():
    study = load_script("gpu_study")
    doc = tomllib.loads((ROOT / "studies" / "gpu-thesis.toml").read_text())
    parsed = Study.model_validate(doc)
    assert {m.name for m in parsed.model} == {"resnet50", "mobilenet_v2"}
    assert {b.batcher for b in parsed.batching} == {"static", "dynamic", "continuous"}
    assert len([b for b in parsed.batching if b.batcher == "dynamic"]) == 2
    assert {w.name for w in parsed.workload} == {"low-poisson", "medium-poisson", "high-poisson", "bursty"}
    assert doc["study"]["env"]["WATTSERVE_FP16"] == "true"
    doc["model"][0]["rates"] = study.scaled_rates(1000.0)
    again = tomllib.loads(study.to_toml(doc))
    assert again == doc
    assert again["model"][0]["rates"] == {"low": 250.0, "medium": 500.0, "high": 800.0}
    Study.model_validate(again)
    for shrink in (study.quick_study, study.smoke_study):
        Study.model_validate(tomllib.loads(study.to_toml(shrink(doc))))


def write_device_outputs(results: Path) -> None:
    """What gpu_check.sh leaves under results/gpu on a GPU (shapes of the real scripts' JSON)."""
    (results / "study").mkdir(parents=True)
    (results / "environment.txt").write_text(
        "date: 2026-12-24T10:00:00Z\nhost: h200-box\nengines requested: torch,cuda-graphs\n"
        "name, driver_version, memory.total [MiB], power.limit [W]\n"
        "NVIDIA H200, 580.159.04, 143771 MiB, 700.00 W\ntorch: 2.11.0+cu130\ntensorrt: NOT importable (x)\n"
    )
    (results / "gpu_engines_check.json").write_text(json.dumps({
        "rows": [{"model": "resnet50", "engine": "torch cuda-graphs", "precision": "fp16", "batch_size": 8,
                  "median_ms": 1.9, "images_per_s": 4210.0, "rel_diff": 0.004, "top1_agreement": 1.0}],
        "failures": [], "notes": [], "not_checked": {"tensorrt": "tensorrt not importable"}}))  # fmt: skip
    (results / "gpu_energy.json").write_text(json.dumps({
        "energy_counter": True, "instant_power_field": True, "idle": {"mean_power_w": 92.0},
        "service": "GPUs [0:NVIDIA H200 counter=yes]", "runs": [
            {"batch_size": 32, "throughput_per_s": 6000.0, "mean_power_w": 410.0, "joules_per_inference": 0.068,
             "meter_joules_per_inference": 0.061, "service_joules_per_inference": 0.069,
             "average_power_vs_counter": 0.02, "instant_power_vs_counter": -0.01}]}))  # fmt: skip
    (results / "gpu_study.json").write_text(json.dumps({"capacity": {"resnet50": {
        "capacity_rps": 2400.0, "stopped_by": "tolerance", "telemetry": {
            "gpu_telemetry_available": True, "update_period_s": {'device="gpu0",source="nvml_counter"': 0.1},
            "idle_power_w": {'device="gpu0",source="nvml_counter"': 95.0}}}}}))  # fmt: skip
    runs = [{"model": "resnet50", "batching": b, "workload": w, "target_rate": r, "achieved_rate": r,
             "latency_ms": {"p50": p / 2, "p95": p, "p99": p * 1.5}, "valid": True,
             "server": {"avg_batch_size": 6.0, "gpu_power_w": 300.0, "energy_per_inference_j": j,
                        "busy_energy_per_inference_j": j / 2, "gpu_utilization": 0.5}}
            for b in ("static-8", "dynamic-32-2ms") for w, r, p, j in (("low", 600, 4.0, 0.2), ("high", 1900, 9.0, 0.07))]  # fmt: skip
    (results / "study" / "results.json").write_text(json.dumps({"runs": runs, "verdict": {"lines": [
        "resnet50 overall: dynamic-32-2ms (met 2/2 workloads)."]}}))  # fmt: skip


def test_gpu_report_writes_the_page_json_plot_and_summary(tmp_path):
    report = load_script("gpu_report")
    results, out = tmp_path / "results", tmp_path / "out"
    write_device_outputs(results)
    doc_path = tmp_path / "gpu-results.md"
    assert report.main(["--results", str(results), "--doc", str(doc_path), "--summary", str(out)]) == 0
    page = doc_path.read_text()
    assert "## Run of 2026-12-24T10:00:00Z" in page
    assert "NVIDIA H200, driver 580.159.04" in page
    assert "**NOT CHECKED: tensorrt**" in page
    assert "| resnet50 | torch cuda-graphs | fp16 | 8 | 1.9 | 4.21e+03 |" in page
    assert "| 2.4e+03 | tolerance | yes | 100.0 ms | 95 |" in page
    assert "| resnet50 | dynamic-32-2ms | high | 1900 | 1900 | 4.5 | 9 | 13.5 |" in page
    assert "resnet50 overall: dynamic-32-2ms" in page
    assert "energy_latency_per_config.png" in page
    combined = json.loads((results / "gpu_results.json").read_text())
    assert combined["environment"]["gpu"] == "NVIDIA H200" and len(combined["study_runs"]) == 4
    names = sorted(p.name for p in out.iterdir())
    assert names == ["energy_latency_per_config.png", "gpu-results.md", "gpu_results.json", "study.tar.gz"]
    assert len(names) <= 8  # what the device tool brings back
    with tarfile.open(out / "study.tar.gz") as tar:
        assert "study/results.json" in tar.getnames()


@pytest.mark.slow
def test_gpu_study_plumbing_runs_end_to_end_on_the_cpu(tmp_path):
    """Capacity search on a live server, rates scaled to it, the study run: identity on CPU."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_study.py"), "--smoke", "--results",
                           str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "gpu_study.json").read_text())
    capacity = summary["capacity"]["identity"]["capacity_rps"]
    assert capacity and capacity > 0
    scaled = tomllib.loads((tmp_path / "gpu-thesis-scaled.toml").read_text())
    assert scaled["model"][0]["rates"]["high"] == pytest.approx(round(capacity * 0.8, 1))
    runs = json.loads((tmp_path / "study" / "results.json").read_text())["runs"]
    assert len(runs) == 4 and {r["workload"] for r in runs} == {"low-poisson", "bursty"}
