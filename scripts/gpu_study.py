#!/usr/bin/env python3
"""On a lent GPU: each model's capacity by SLO search, then the study with loads scaled to it.

1. For every model in the study file, start the live server (dynamic batching, the study's
   environment: cuda:0, fp16, NVML telemetry on), check its telemetry (NVML available, the
   energy counter's update period published), and find the highest Poisson rate whose
   percentile meets the study's objective (``python -m wattserve.loadgen --slo-ms ...``).
2. Rewrite the study's rates: low = 0.25, medium = 0.5, high = 0.8 of that capacity.
3. Run the study (``python -m wattserve.loadgen study``): every configuration x workload, with
   throughput, percentiles, power, counter-based energy per inference (idle apart) and GPU
   utilization from the server's own metrics.

Writes everything under --results (capacity-*/, study/, gpu_study.json). Needs the server
packages (the wheel kit on the device). ``--smoke`` runs the same plumbing with the identity
model on the CPU in seconds (tests/test_telemetry_gpu_report.py). Exit 1 when the GPU
telemetry check failed, else the study's exit status.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from wattserve.loadgen.server_process import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LEVELS = {"low": 0.25, "medium": 0.5, "high": 0.8}  # fractions of the measured capacity
CAPACITY_BATCHING = {"batcher": "dynamic", "max_batch_size": 32, "max_queue_delay_ms": 2}


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------- TOML out (our study's shape)
def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def to_toml(doc: dict[str, Any]) -> str:
    """A study document as TOML: [study] (+ [study.env]), then [[model]], [[batching]], [[workload]]."""
    lines: list[str] = []
    study = dict(doc["study"])
    env = study.pop("env", None)
    lines.append("[study]")
    lines += [f"{k} = {_value(v)}" for k, v in study.items()]
    if env:
        lines += ["", "[study.env]"] + [f"{k} = {_value(v)}" for k, v in env.items()]
    for table in ("model", "batching", "workload"):
        for entry in doc.get(table, []):
            lines += ["", f"[[{table}]]"] + [f"{k} = {_value(v)}" for k, v in entry.items()]
    return "\n".join(lines) + "\n"


def scaled_rates(capacity: float) -> dict[str, float]:
    return {level: round(capacity * f, 1) for level, f in LEVELS.items()}


# ---------------------------------------------------------------- the live server
def start_server(model: str, env_extra: dict[str, str], log_path: Path) -> ServerProcess:
    """The server for the capacity search, started through the project's harness."""
    from wattserve.loadgen.server_process import wattserve_process  # after ROOT is on sys.path

    env = {"WATTSERVE_MODEL": model, "WATTSERVE_HOST": "127.0.0.1", **env_extra}
    env.update({f"WATTSERVE_{k.upper()}": str(v) for k, v in CAPACITY_BATCHING.items()})
    return wattserve_process(env, root=ROOT, log_path=log_path).start()


def telemetry_check(metrics_text: str) -> dict[str, Any]:
    """What the live server's /metrics says about NVML telemetry."""
    found: dict[str, Any] = {"gpu_telemetry_available": None, "update_period_s": {}, "idle_power_w": {},
                             "energy_joules": {}}  # fmt: skip
    for line in metrics_text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        if name == "wattserve_gpu_telemetry_available":
            found["gpu_telemetry_available"] = float(value) == 1.0
        elif name.startswith("wattserve_energy_counter_update_period_seconds{"):
            found["update_period_s"][name.split("{", 1)[1].rstrip("}")] = float(value)
        elif name.startswith("wattserve_energy_idle_power_watts{"):
            found["idle_power_w"][name.split("{", 1)[1].rstrip("}")] = float(value)
        elif name.startswith("wattserve_energy_joules_total{"):
            found["energy_joules"][name.split("{", 1)[1].rstrip("}")] = float(value)
    return found


def find_capacity(model: str, study: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    s = study["study"]
    out = args.results / f"capacity-{model}"
    env = {k: str(v) for k, v in s.get("env", {}).items()}
    proc = start_server(model, env, out / "server.log")
    url = proc.url
    result: dict[str, Any] = {"model": model, "batching": CAPACITY_BATCHING, "url": url}
    try:
        proc.wait_ready(s.get("ready_timeout_s", 300))
        command = [sys.executable, "-m", "wattserve.loadgen", "loadgen", "--url", url, "--model", model,
                   "--binary", "--slo-ms", str(s["slo_ms"]), "--percentile", str(s.get("percentile", 95)),
                   "--search-start", str(args.search_start), "--search-max", str(args.search_max),
                   "--search-steps", str(args.search_steps), "--duration", str(args.search_duration),
                   "--min-queries", str(args.min_queries), "--warmup", str(args.search_warmup),
                   "--max-lag-ms", str(s.get("max_lag_ms", 10)), "--out", str(out),
                   "--no-progress"]  # fmt: skip
        log(f"capacity of {model}: {' '.join(command[2:])}")
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        result["loadgen_exit"] = done.returncode
        doc = json.loads((out / "results.json").read_text())
        search = doc.get("search") or {}
        result.update(capacity_rps=search.get("best_rate"), achieved_rps=search.get("best_achieved_rate"),
                      stopped_by=search.get("stopped_by"), steps=len(search.get("steps", [])))  # fmt: skip
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as reply:
            metrics = reply.read().decode()
        (out / "metrics.txt").write_text(metrics)
        result["telemetry"] = telemetry_check(metrics)
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        log(f"capacity of {model}: {result['error']}")
    finally:
        proc.stop(30)
    return result


# ---------------------------------------------------------------- main
def smoke_study(study: dict[str, Any]) -> dict[str, Any]:
    """The same grid shape, tiny: identity on the CPU, 2 configurations x 2 workloads."""
    s = dict(study["study"], warmup_s=0.3, duration_s=1.0, pause_s=0.1, slo_ms=200, max_lag_ms=50,
             ready_timeout_s=120)  # fmt: skip
    s["env"] = {
        "WATTSERVE_LOG_LEVEL": "warning",
        "WATTSERVE_DEVICE": "cpu",
        "WATTSERVE_IDENTITY_DELAY_MS": "2",
    }
    return {
        "study": s,
        "model": [{"name": "identity", "rates": {"low": 20, "medium": 40, "high": 60}}],
        "batching": study["batching"][1:3],
        "workload": [w for w in study["workload"] if w["name"] in ("low-poisson", "bursty")],
    }


def quick_study(study: dict[str, Any]) -> dict[str, Any]:
    """For a rerun inside the device budget: mobilenet_v2 only, 3 configurations, 2 workloads."""
    return {
        "study": dict(study["study"], duration_s=3, warmup_s=1),
        "model": [m for m in study["model"] if m["name"] == "mobilenet_v2"] or study["model"][:1],
        "batching": study["batching"][:3],
        "workload": [w for w in study["workload"] if w["name"] in ("medium-poisson", "bursty")],
    }


SIMULATION_ONLY = (
    "WATTSERVE_SIMULATED_GPU",
    "WATTSERVE_IDENTITY_DELAY_MS",
    "WATTSERVE_IDENTITY_DELAY_PER_ITEM_MS",
)


def real_gpu_study(study: dict[str, Any]) -> dict[str, Any]:
    """A study written for the simulated GPU (studies/thesis.toml), as it runs on a lent one:
    [study.real_gpu]'s models (placeholder rates until the capacity search rescales them),
    objective, windows and environment; the simulator and the identity delays dropped from
    every environment. Configurations and workloads unchanged."""
    s = dict(study["study"])
    real = s.pop("real_gpu", None) or {}
    s.pop("short", None)
    env = {k: v for k, v in s.get("env", {}).items() if k not in SIMULATION_ONLY}
    env.update(real.get("env", {}))
    if real.get("slo_ms"):
        s["slo_ms"] = real["slo_ms"]
        if "WATTSERVE_SLO_MS" in env:  # the adaptive batcher's objective is the study's
            env["WATTSERVE_SLO_MS"] = str(real["slo_ms"])
    for key in ("warmup_s", "duration_s", "pause_s"):
        if real.get(key) is not None:
            s[key] = real[key]
    s["env"] = env
    s["name"] = f"{s.get('name', 'study')} (real GPU)"
    rates = study["model"][0].get("rates", {})
    batching = []
    for b in study["batching"]:
        b = dict(b)
        if "env" in b:
            b["env"] = {k: v for k, v in b["env"].items() if k not in SIMULATION_ONLY}
        batching.append(b)
    models = [{"name": m, "rates": dict(rates)} for m in real.get("models", ["resnet50"])]
    return {**study, "study": s, "model": models, "batching": batching}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, default=ROOT / "studies" / "gpu-thesis.toml")
    parser.add_argument("--results", type=Path, default=ROOT / "results" / "gpu")
    parser.add_argument("--quick", action="store_true", help="a smaller grid (a rerun in the budget)")
    parser.add_argument("--smoke", action="store_true", help="identity on CPU: the plumbing only")
    parser.add_argument("--real-gpu", action="store_true",
                        help="a study written for the simulated GPU (studies/thesis.toml) with its "
                        "[study.real_gpu] models, objective and environment")  # fmt: skip
    parser.add_argument("--search-start", type=float, default=200.0)
    parser.add_argument("--search-max", type=float, default=4000.0,
                        help="the generator's own ceiling on one host process (docs/loadgen.md)")  # fmt: skip
    parser.add_argument("--search-steps", type=int, default=8)
    parser.add_argument("--search-duration", type=float, default=3.0)
    parser.add_argument("--search-warmup", type=float, default=1.0, help="per search step")
    parser.add_argument("--min-queries", type=int, default=500, help="per search step (p95: 25 beyond)")
    args = parser.parse_args(argv)
    args.results.mkdir(parents=True, exist_ok=True)
    study = tomllib.loads(args.study.read_text())
    if args.real_gpu:
        study = real_gpu_study(study)
    if args.smoke:
        study = smoke_study(study)
        # identity with a 2 ms delay serves far more than 40 req/s: every step from 40 passes,
        # and each is as short as its 40 queries allow (the plumbing is what is checked)
        args.search_start, args.search_max, args.search_steps, args.search_duration = 40.0, 200.0, 3, 1.0
        args.search_warmup, args.min_queries = 0.3, 40
    elif args.quick:
        study = quick_study(study)
    report: dict[str, Any] = {"study_file": str(args.study), "smoke": args.smoke, "quick": args.quick,
                              "real_gpu": args.real_gpu,
                              "levels": LEVELS, "capacity": {}}  # fmt: skip
    telemetry_ok = True
    for model in study["model"]:
        cap = find_capacity(model["name"], study, args)
        report["capacity"][model["name"]] = cap
        telemetry = cap.get("telemetry") or {}
        if not args.smoke and not (
            telemetry.get("gpu_telemetry_available") and telemetry.get("update_period_s")
        ):
            telemetry_ok = False
            why = telemetry or cap.get("error")
            log(f"FAIL: live server for {model['name']}: NVML telemetry not working: {why}")
        if cap.get("capacity_rps"):
            model["rates"] = scaled_rates(cap["capacity_rps"])
            log(f"{model['name']}: capacity {cap['capacity_rps']:.0f} req/s -> rates {model['rates']}")
        else:
            report.setdefault("notes", []).append(
                f"{model['name']}: no passing rate found ({cap.get('error') or cap.get('stopped_by')}); "
                "the study file's placeholder rates were used"
            )
    study["study"]["out"] = str(args.results / "study")
    scaled = args.results / f"{args.study.stem}-scaled.toml"
    scaled.write_text(to_toml(study))
    report["scaled_study"] = str(scaled)
    command = [sys.executable, "-m", "wattserve.loadgen", "study", str(scaled), "--no-progress"]
    log(f"study: {' '.join(command[2:])}")
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    report["study_exit"] = done.returncode
    report["study_out"] = study["study"]["out"]
    report["telemetry_ok"] = telemetry_ok
    (args.results / "gpu_study.json").write_text(json.dumps(report, indent=2))
    log(f"wrote {args.results / 'gpu_study.json'}")
    if not telemetry_ok:
        return 1
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
