"""perf_analyzer's own random data beside ordinary inputs, binary and JSON, in one run (issue 46).

NVIDIA's perf_analyzer (2.51, scripts/install_perf_analyzer.sh) sends random bytes as FP32
tensors unless told otherwise: NaN/Inf bit patterns and subnormals among them, and in JSON
mode NaN/Infinity tokens. This serves mobilenet_v2 (dynamic batcher, max batch 8) and runs
perf_analyzer open loop (Poisson, ``--async``) at a fixed rate in four modes: random data or
one ordinary image of normal floats (``--input-data`` file), each sent binary or as JSON. Per
mode: the rate served, client latency, and the server's own split (queue, compute input,
compute infer) from perf_analyzer's server-side statistics (the difference of
/v2/models/{model}/stats over its window).

``--root NAME=DIR`` adds another checkout (``git worktree add /tmp/base <commit>``: the code
before a fix) served the same way in the same run; ``--variant NAME:VAR=VALUE`` the same code
with other settings (``flush:WATTSERVE_FLUSH_DENORMAL=true``). Prints a table, saves
results/perf_analyzer_random_data.json.

    python -m benchmarks.perf_analyzer_random_data --root before=/tmp/base \\
        --variant flush:WATTSERVE_FLUSH_DENORMAL=true
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from benchmarks._harness import ROOT, parse_variant, save, wattserve_process

MODEL = "mobilenet_v2"
SHAPE = (3, 224, 224)
MODES = {  # name -> (perf_analyzer's data, its tensor format)
    "binary random": ("random", "binary"),
    "binary ordinary": ("ordinary", "binary"),
    "json random": ("random", "json"),
    "json ordinary": ("ordinary", "json"),
}
SPLIT = {"queue_ms": "Server Queue", "compute_input_ms": "Server Compute Input",
         "compute_infer_ms": "Server Compute Infer", "compute_output_ms": "Server Compute Output"}  # fmt: skip
# the rest of a request's time: the client's send and receive, the wire and the server's HTTP
# handling outside its statistics' timers (reading and parsing the body among it)
CLIENT_PARTS = {"client_send_ms": "Client Send", "network_server_ms": "Network+Server Send/Recv",
                "client_recv_ms": "Client Recv"}  # fmt: skip


def ordinary_data(path: Path) -> Path:
    """perf_analyzer's --input-data file: one image of standard normal floats (no subnormal,
    no NaN/Inf), the kind of input a preprocessed photo is."""
    image = np.random.default_rng(0).standard_normal(SHAPE, dtype=np.float32)
    path.write_text(
        json.dumps({"data": [{"input": {"content": image.ravel().tolist(), "shape": list(SHAPE)}}]})
    )
    return path


def perf_analyzer_path() -> str:
    tool = os.environ.get("WATTSERVE_PERF_ANALYZER")
    if not tool:
        raise SystemExit("set WATTSERVE_PERF_ANALYZER to the path scripts/install_perf_analyzer.sh prints")
    return tool


def run_mode(tool: str, url: str, data: str, fmt: str, rate: float, window_ms: int, data_file: Path) -> dict:
    """One perf_analyzer run; its CSV row in milliseconds (its own columns are microseconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.csv"
        argv = [tool, "-m", MODEL, "-u", url, "-i", "http", "--async", "--request-distribution", "poisson",
                "--request-rate-range", str(rate), "--measurement-interval", str(window_ms),
                "--max-trials", "3", "--stability-percentage", "999", "-f", str(report)]  # fmt: skip
        if data == "ordinary":
            argv += ["--input-data", str(data_file)]
        if fmt == "json":
            argv += ["--input-tensor-format", "json", "--output-tensor-format", "json"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if done.returncode != 0 or not report.exists():
            tail = (done.stdout + done.stderr)[-1500:]
            return {"error": f"perf_analyzer exited {done.returncode}: {tail}"}
        with report.open() as f:
            row = next(csv.DictReader(f))
    out = {"served_per_s": float(row["Inferences/Second"]), "client_p50_ms": float(row["p50 latency"]) / 1e3,
           "client_p99_ms": float(row["p99 latency"]) / 1e3}  # fmt: skip
    for key, column in {**SPLIT, **CLIENT_PARTS}.items():
        out[key] = float(row[column]) / 1e3
    out["server_ms"] = sum(out[k] for k in SPLIT)
    # perf_analyzer's average latency is the sum of its parts (its CSV has no column of it)
    out["client_avg_ms"] = out["server_ms"] + sum(out[k] for k in CLIENT_PARTS)
    return out


SERVER_ENV = {"WATTSERVE_MODEL": MODEL, "WATTSERVE_BATCHER": "dynamic", "WATTSERVE_MAX_BATCH_SIZE": "8",
              "WATTSERVE_TELEMETRY": "false"}  # fmt: skip


def measure(
    servers: list[tuple[str, Path, dict[str, str]]], args: argparse.Namespace, data_file: Path
) -> dict:
    """Every server up at once, then each mode run on each server in turn, ``--repeats``
    times, the modes' order reversed every other round: a load on this shared machine that
    comes and goes falls on all of them alike, and no mode always meets a cold server.
    Per server and mode, each figure's median over the runs (all of them kept)."""
    runs: dict[str, dict[str, list[dict]]] = {name: {mode: [] for mode in MODES} for name, _, _ in servers}
    tool = perf_analyzer_path()
    with contextlib.ExitStack() as stack:
        base = {**SERVER_ENV, "WATTSERVE_TORCH_THREADS": str(args.torch_threads)}
        urls = {name: f"127.0.0.1:{stack.enter_context(wattserve_process({**base, **env}, root=root)).port}"
                for name, root, env in servers}  # fmt: skip
        for repeat in range(args.repeats):
            order = list(MODES.items())
            for mode, (data, fmt) in order if repeat % 2 == 0 else order[::-1]:  # no mode always first
                rate = args.json_rate if fmt == "json" else args.rate
                for name in urls:
                    result = {
                        "offered_per_s": rate,
                        **run_mode(tool, urls[name], data, fmt, rate, args.window_ms, data_file),
                    }
                    runs[name][mode].append(result)
                    print(f"  {name:>8} {mode:<16} {_row(result)}", flush=True)
    return {name: {mode: _median_run(r) for mode, r in modes.items()} for name, modes in runs.items()}


def _median_run(runs: list[dict]) -> dict:
    """Each figure's median over the runs that completed (every run kept under ``runs``)."""
    good = [r for r in runs if "error" not in r]
    if not good:
        return {**runs[-1], "runs": runs}
    figures = {key: float(np.median([r[key] for r in good])) for key in good[0]}
    return {**figures, "runs": runs, "failed_runs": len(runs) - len(good)}


def _row(r: dict) -> str:
    if "error" in r:
        return r["error"].splitlines()[-1] if r["error"].strip() else r["error"]
    return (f"offered {r['offered_per_s']:5.1f}/s served {r['served_per_s']:5.1f}/s  client avg "
            f"{r['client_avg_ms']:7.1f} p99 {r['client_p99_ms']:7.1f} ms  server: queue {r['queue_ms']:6.1f} "
            f"input {r['compute_input_ms']:5.1f} infer {r['compute_infer_ms']:6.1f} ms  outside "
            f"{r['network_server_ms']:6.1f} ms")  # fmt: skip


def ratios(results: dict) -> dict:
    """random / ordinary, per format: served rate (ordinary / random, so > 1 is slower) and
    server compute infer and client latency (random / ordinary)."""
    out = {}
    for fmt in ("binary", "json"):
        rnd, ordn = results.get(f"{fmt} random", {}), results.get(f"{fmt} ordinary", {})
        if "served_per_s" in rnd and "served_per_s" in ordn and rnd["served_per_s"] > 0:
            out[fmt] = {"served": ordn["served_per_s"] / rnd["served_per_s"],
                        "client_avg": rnd["client_avg_ms"] / ordn["client_avg_ms"],
                        "compute_infer": rnd["compute_infer_ms"] / max(ordn["compute_infer_ms"], 1e-9)}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=4.0, help="offered requests/s, binary modes")
    p.add_argument("--json-rate", type=float, default=2.0, help="offered requests/s, JSON modes")
    p.add_argument("--window-ms", type=int, default=4000, help="perf_analyzer's measurement interval")
    p.add_argument("--repeats", type=int, default=1, help="runs of each mode on each server (median kept)")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="each server's torch threads: 1 by default, since on a shared 2-CPU machine an "
                   "OpenMP team one of whose threads is descheduled waits at every barrier")  # fmt: skip
    p.add_argument("--root", action="append", default=[], metavar="NAME=DIR",
                   help="another checkout to serve the same way (the code before a fix)")  # fmt: skip
    p.add_argument("--variant", action="append", default=[], type=parse_variant, metavar="NAME:VAR=VALUE")
    args = p.parse_args(argv)
    servers: list[tuple[str, Path, dict[str, str]]] = []
    for spec in args.root:
        name, _, path = spec.partition("=")
        servers.append((name, Path(path).resolve(), {}))
    servers.append(("this", ROOT, {}))
    servers += [(name, ROOT, env) for name, env in args.variant]
    doc: dict = {"model": MODEL, "batcher": "dynamic", "max_batch_size": 8, "window_ms": args.window_ms,
                 "servers": {}}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        data_file = ordinary_data(Path(tmp) / "ordinary.json")
        measured = measure(servers, args, data_file)
    for name, root, env in servers:
        doc["servers"][name] = {
            "root": str(root),
            "env": env,
            "modes": measured[name],
            "ratios": ratios(measured[name]),
        }
    print("\nmedians over the runs")
    for name, server in doc["servers"].items():
        for mode, r in server["modes"].items():
            print(f"  {name:>8} {mode:<16} {_row(r)}")
    print(
        "\nrandom vs ordinary (served: ordinary/random rate; client avg and compute infer: random/ordinary)"
    )
    for name, server in doc["servers"].items():
        for fmt, r in server["ratios"].items():
            print(f"  {name:>8} {fmt:<6} served {r['served']:.2f}x  client avg {r['client_avg']:.2f}x  "
                  f"compute infer {r['compute_infer']:.2f}x")  # fmt: skip
    print(f"saved {save('perf_analyzer_random_data', doc)}")


if __name__ == "__main__":
    main()
