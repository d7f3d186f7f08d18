#!/usr/bin/env python3
"""Write docs/gpu-results.md and gpu_results.json from what scripts/gpu_check.sh measured.

Reads, under --results: environment.txt, gpu_engines_check.json, gpu_engines_preflight.json,
gpu_energy.json, gpu_study.json and study/results.json (whichever exist: a step that did not
run is reported as not run, never filled in). Writes the page (--doc), the combined JSON, the
J/inference-vs-latency plot per configuration, and, into --summary (the device tool's $OUT),
the page, the JSON, the plot and the study folder as one tar.gz (the tool returns 8 files).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HEADER = """# Results on real GPUs

Everything here was written by `scripts/gpu_check.sh` (through `scripts/gpu_report.py`) on a
real GPU, with the date and the device. Nothing else belongs on this page. How to produce it:
`scripts/gpu_kit.sh` here, then on the GPU machine (carrying `.whl`):
`python3 -m pip install -q --no-index --find-links .whl wattserve && scripts/gpu_check.sh`
(with `GPU_ENGINES=torch,cuda-graphs` where TensorRT, pycuda and ORT-CUDA are absent).
"""


def load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return out


def environment(results: Path) -> dict[str, Any]:
    env: dict[str, Any] = {}
    path = results / "environment.txt"
    if not path.exists():
        return env
    lines = path.read_text().splitlines()
    for line in lines:
        if line.startswith("date: "):
            env["date"] = line[6:]
        elif line.startswith("host: "):
            env["host"] = line[6:]
    for i, line in enumerate(lines):  # nvidia-smi's csv: a header line, then one line per GPU
        if line.startswith("name, driver_version") and i + 1 < len(lines):
            parts = [p.strip() for p in lines[i + 1].split(",")]
            if len(parts) >= 4:
                env.update(gpu=parts[0], driver=parts[1], memory=parts[2], power_limit=parts[3])
    env["libraries"] = [ln for ln in lines if ": " in ln and not ln.startswith(("date", "host"))][-14:]
    return env


def study_rows(doc: dict[str, Any] | None) -> list[dict[str, Any]]:
    rows = []
    for run in (doc or {}).get("runs", []):
        server = run.get("server") or {}
        lat = run.get("latency_ms") or {}
        rows.append({
            "model": run.get("model"), "batching": run.get("batching"), "workload": run.get("workload"),
            "target_rps": run.get("target_rate"), "achieved_rps": run.get("achieved_rate"),
            "p50_ms": lat.get("p50"), "p95_ms": lat.get("p95"), "p99_ms": lat.get("p99"),
            "avg_batch": server.get("avg_batch_size"), "power_w": server.get("gpu_power_w"),
            "energy_per_inference_j": server.get("energy_per_inference_j"),
            "busy_energy_per_inference_j": server.get("busy_energy_per_inference_j"),
            "energy_idle_j": server.get("energy_idle_j"), "energy_source": server.get("energy_source"),
            "gpu_utilization": server.get("gpu_utilization"), "valid": run.get("valid"),
        })  # fmt: skip
    return rows


ENGINE_COLUMNS = [("model", "model"), ("engine", "engine"), ("precision", "precision"),
                  ("batch", "batch_size"), ("median ms", "median_ms"), ("img/s", "images_per_s"),
                  ("rel diff", "rel_diff"), ("top-1 agree", "top1_agreement")]  # fmt: skip
ENERGY_COLUMNS = [("batch", "batch_size"), ("img/s", "throughput_per_s"), ("mean W", "mean_power_w"),
                  ("J/inf (counter)", "joules_per_inference"),
                  ("J/inf (meter, busy)", "meter_joules_per_inference"),
                  ("J/inf (window)", "service_joules_per_inference"),
                  ("avg-power vs counter", "average_power_vs_counter"),
                  ("instant vs counter", "instant_power_vs_counter")]  # fmt: skip
STUDY_COLUMNS = [("model", "model"), ("batching", "batching"), ("workload", "workload"),
                 ("target/s", "target_rps"), ("achieved/s", "achieved_rps"), ("p50", "p50_ms"),
                 ("p95", "p95_ms"), ("p99", "p99_ms"), ("avg batch", "avg_batch"), ("GPU W", "power_w"),
                 ("J/inf", "energy_per_inference_j"), ("busy J/inf", "busy_energy_per_inference_j"),
                 ("GPU util", "gpu_utilization"), ("valid", "valid")]  # fmt: skip


def columns(spec: list[tuple[str, str]], rows: list[dict[str, Any]]) -> list[str]:
    return table([h for h, _ in spec], [[r.get(k) for _, k in spec] for r in rows])


def capacity_rows(study: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for model, cap in study.get("capacity", {}).items():
        telemetry = cap.get("telemetry") or {}
        periods = (telemetry.get("update_period_s") or {}).values()
        idle = (telemetry.get("idle_power_w") or {}).values()
        rows.append(
            {
                "model": model,
                "capacity": cap.get("capacity_rps"),
                "stopped": cap.get("stopped_by") or cap.get("error"),
                "nvml": telemetry.get("gpu_telemetry_available"),
                "period": ", ".join(f"{v * 1e3:.1f} ms" for v in periods),
                "idle": ", ".join(f"{v:.0f}" for v in idle),
            }
        )
    return rows


CAPACITY_COLUMNS = [("model", "model"), ("capacity req/s", "capacity"), ("stopped by", "stopped"),
                    ("NVML", "nvml"), ("counter update period", "period"), ("idle W", "idle")]  # fmt: skip


def build(results: Path) -> tuple[dict[str, Any], list[str], Path | None]:
    from wattserve.loadgen.plots import energy_latency_per_config

    env = environment(results)
    engines = load(results / "gpu_engines_check.json")
    preflight = load(results / "gpu_engines_preflight.json")
    energy = load(results / "gpu_energy.json")
    study = load(results / "gpu_study.json")
    study_doc = load(results / "study" / "results.json")
    rows = study_rows(study_doc)
    plot, plot_note = (None, None)
    if rows:
        plot, plot_note = energy_latency_per_config(rows, results / "study" / "energy_latency_per_config.png")
    doc = {
        "environment": env,
        "engines": engines,
        "preflight": preflight,
        "energy": energy,
        "study": study,
        "study_runs": rows,
        "verdict": (study_doc or {}).get("verdict"),
    }
    gpu = f"{env.get('gpu', '?')}, driver {env.get('driver', '?')}, {env.get('memory', '?')}"
    md = [HEADER, f"## Run of {env.get('date', 'unknown date')}", ""]
    md.append(f"- GPU: {gpu}, power limit {env.get('power_limit', '?')}; host {env.get('host', '?')}")
    md += [f"- {line}" for line in env.get("libraries", [])]

    md += ["", "### Engines against a TF32-off torch reference", ""]
    if engines is None:
        md.append("Not run.")
    else:
        md += columns(ENGINE_COLUMNS, [r for r in engines.get("rows", []) if "batch_size" in r])
        for engine, reason in (engines.get("not_checked") or {}).items():
            md.append(f"\n**NOT CHECKED: {engine}** ({reason})")
        md += [f"\n**FAILED:** {f}" for f in engines.get("failures", [])]
        md += [f"\nNote: {n}" for n in engines.get("notes", [])]

    md += ["", "### Energy: NVML counter vs integrated power, J/inference (ResNet50)", ""]
    if energy is None:
        md.append("Not run.")
    else:
        idle_w = (energy.get("idle") or {}).get("mean_power_w")
        md.append(
            f"Counter: {fmt(energy.get('energy_counter'))}; instant field: "
            f"{fmt(energy.get('instant_power_field'))}; idle {fmt(idle_w)} W; "
            f"telemetry: {energy.get('service', '-')}"
        )
        md += ["", *columns(ENERGY_COLUMNS, energy.get("runs", []))]

    md += ["", "### Live server: capacity (SLO search) and NVML telemetry", ""]
    if study is None:
        md.append("Not run.")
    else:
        md += columns(CAPACITY_COLUMNS, capacity_rows(study))
        md += [f"\nNote: {n}" for n in study.get("notes", [])]

    md += ["", "### Study (studies/gpu-thesis.toml, rates scaled to capacity)", ""]
    if not rows:
        md.append("Not run.")
    else:
        md += columns(STUDY_COLUMNS, rows)
        md.append(
            "\nJ/inf: (busy + idle) counter energy over the window / requests; busy J/inf: the "
            "requests' attributed share only (docs/telemetry.md)."
        )
        md += [f"\n{line}" for line in ((study_doc or {}).get("verdict") or {}).get("lines", [])]
        if plot is not None:
            md.append(f"\nPlot: `{plot.name}` (J/inference vs p95 per configuration), in the study tarball.")
        elif plot_note:
            md.append(f"\n{plot_note}")
    return doc, md, plot


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "results" / "gpu")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "gpu-results.md")
    parser.add_argument("--summary", type=Path, default=None, help="also copy the outputs here ($OUT)")
    args = parser.parse_args(argv)
    doc, md, plot = build(args.results)
    (args.results / "gpu_results.json").write_text(json.dumps(doc, indent=2, default=str))
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.doc.write_text("\n".join(md) + "\n")
    print(f"wrote {args.doc} and {args.results / 'gpu_results.json'}")
    if args.summary is not None and args.summary.resolve() != args.results.resolve():
        args.summary.mkdir(parents=True, exist_ok=True)
        shutil.copy(args.doc, args.summary / "gpu-results.md")
        shutil.copy(args.results / "gpu_results.json", args.summary / "gpu_results.json")
        if plot is not None:
            shutil.copy(plot, args.summary / plot.name)
        study_dir = args.results / "study"
        if study_dir.is_dir():
            with tarfile.open(args.summary / "study.tar.gz", "w:gz") as tar:
                tar.add(study_dir, arcname="study")
        print(f"copied the summary to {args.summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
