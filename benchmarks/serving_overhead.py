"""wattserve's own overhead: identity model + dynamic batcher (default 5 ms delay, and 0 ms) vs a bare
FastAPI endpoint doing the same work, 16 connections, measured side by side in one run.

    python -m benchmarks.serving_overhead [--seconds 3] [--rounds 8] [--before PATH]

Every server is started first and stays up; each round then drives each of them for
``--seconds`` in turn (the order rotates round by round). Short interleaved bursts see the
machine in the same state, so the figure is the median over rounds of each round's ratio to
the bare app, not a ratio of means over minutes of drift. Besides req/s, each burst's server
CPU per request (utime + stime of the server process, /proc) is reported.

With ``--before PATH`` (an older checkout) the wattserve variants also run from that tree,
in the same rounds, so a refactor's cost is a same-run ratio.

Prints a table and writes results/serving_overhead.json. Needs wrk.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
from pathlib import Path

import orjson

from benchmarks._harness import ROOT, free_port, process, save, wattserve_process, wrk

BODY = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                                 "data": [float(i) for i in range(16)]}]})  # fmt: skip


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3, help="one burst per server per round")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--before", type=Path, default=None, help="an older checkout, run in the same rounds")
    args = parser.parse_args()
    base = {  # the dynamic batcher with its default delay, and with none
        "wattserve_dynamic": {"WATTSERVE_MAX_QUEUE_DELAY_MS": "5"},
        "wattserve_dynamic_delay0": {"WATTSERVE_MAX_QUEUE_DELAY_MS": "0"},
    }
    roots = {"": ROOT} | ({"_before": args.before.resolve()} if args.before else {})
    variants = {name + suffix: (env, root) for suffix, root in roots.items() for name, env in base.items()}
    runs: dict[str, list[dict]] = {"bare_fastapi": [], **{name: [] for name in variants}}
    with contextlib.ExitStack() as stack:
        port = free_port()
        cmd = [sys.executable, "-m", "uvicorn", "benchmarks.bare_app:app", "--port", str(port),
               "--log-level", "warning", "--no-access-log"]  # fmt: skip
        servers = {
            "bare_fastapi": stack.enter_context(
                process(cmd, {}, f"http://127.0.0.1:{port}/v2/models/identity/infer")
            )
        }
        for name, (extra, root) in variants.items():
            env = {"WATTSERVE_MODEL": "identity", "WATTSERVE_BATCHER": "dynamic", "WATTSERVE_MAX_BATCH_SIZE": "16",
                   "WATTSERVE_GRPC_PORT": "0", **extra}  # fmt: skip
            servers[name] = stack.enter_context(wattserve_process(env, root=root))
        targets = {name: proc.url + "/v2/models/identity/infer" for name, proc in servers.items()}
        for target in targets.values():
            wrk(target, BODY, args.connections, 2)  # warm-up
        order = list(servers)
        for round_index in range(args.rounds):
            shift = round_index % len(order)
            for name in order[shift:] + order[:shift]:
                cpu_before = cpu_seconds(servers[name].pid)
                run = wrk(targets[name], BODY, args.connections, args.seconds)
                cpu = cpu_seconds(servers[name].pid) - cpu_before
                run["cpu_us_per_request"] = cpu / (run["rps"] * args.seconds) * 1e6 if run["rps"] else None
                runs[name].append(run)
    summary = {k: statistics.median(r["rps"] for r in v) for k, v in runs.items()}
    bare = runs["bare_fastapi"]
    ratios = {name: statistics.median(r["rps"] / b["rps"] for r, b in zip(runs[name], bare, strict=True))
              for name in variants}  # fmt: skip
    cpu = {k: statistics.median(r["cpu_us_per_request"] for r in v) for k, v in runs.items()}
    print(
        f"{'server':<34} {'req/s (median)':>14} {'/ bare (median of rounds)':>26} {'server CPU us/req':>18}"
    )
    for name in runs:
        ratio = f"{ratios[name]:.3f}" if name in ratios else "1"
        print(f"{name:<34} {summary[name]:>14.0f} {ratio:>26} {cpu[name]:>18.1f}")
    print(
        "per round req/s: "
        + "; ".join(f"{k} " + ", ".join(f"{r['rps']:.0f}" for r in v) for k, v in runs.items())
    )
    errors = sum(r["non_2xx"] for v in runs.values() for r in v)
    path = save("serving_overhead", {"runs": runs, "median_rps": summary, "ratio_to_bare": ratios,
                                      "cpu_us_per_request": cpu, "non_2xx": errors,
                                      "connections": args.connections, "seconds": args.seconds,
                                      "machine": platform.platform()})  # fmt: skip
    print(f"saved {path}")


if __name__ == "__main__":
    main()
