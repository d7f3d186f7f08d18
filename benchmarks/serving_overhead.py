"""wattserve's own overhead: identity model + dynamic batcher (default 5 ms delay, and 0 ms) vs a bare FastAPI endpoint
doing the same work, 16 connections, measured side by side (alternating) in one run.

    python -m benchmarks.serving_overhead [--seconds 10] [--rounds 2] [--before PATH]

With ``--before PATH`` (an older checkout) the wattserve variants also run from that tree,
in the same rounds, so a refactor's cost is a same-run ratio.

Prints a table and writes results/serving_overhead.json. Needs wrk.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path

import orjson

from benchmarks._harness import ROOT, free_port, process, save, wattserve, wrk

BODY = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                                 "data": [float(i) for i in range(16)]}]})  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=2)
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
    for _ in range(args.rounds):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "uvicorn", "benchmarks.bare_app:app", "--port", str(port),
               "--log-level", "warning", "--no-access-log"]  # fmt: skip
        with process(cmd, {}, url + "/v2/models/identity/infer"):
            wrk(url + "/v2/models/identity/infer", BODY, args.connections, 2)  # warm-up
            runs["bare_fastapi"].append(
                wrk(url + "/v2/models/identity/infer", BODY, args.connections, args.seconds)
            )
        for name, (extra, root) in variants.items():
            env = {"WATTSERVE_MODEL": "identity", "WATTSERVE_BATCHER": "dynamic",
                   "WATTSERVE_MAX_BATCH_SIZE": "16", **extra}  # fmt: skip
            with wattserve(env, root=root) as url:
                wrk(url + "/v2/models/identity/infer", BODY, args.connections, 2)
                runs[name].append(
                    wrk(url + "/v2/models/identity/infer", BODY, args.connections, args.seconds)
                )
    summary = {k: statistics.mean(r["rps"] for r in v) for k, v in runs.items()}
    ratios = {name: summary[name] / summary["bare_fastapi"] for name in variants}
    print(f"{'server':<26} {'req/s (mean)':>12}  per round")
    for name, rounds in runs.items():
        per = ", ".join(
            f"{r['rps']:.0f} (p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms)" for r in rounds
        )
        print(f"{name:<26} {summary[name]:>12.0f}  {per}")
    for name, ratio in ratios.items():
        print(f"{name} / bare = {ratio:.2f}")
    errors = sum(r["non_2xx"] for v in runs.values() for r in v)
    path = save("serving_overhead", {"runs": runs, "mean_rps": summary, "ratio_to_bare": ratios, "non_2xx": errors,
                                      "connections": args.connections, "seconds": args.seconds,
                                      "machine": platform.platform()})  # fmt: skip
    print(f"saved {path}")


if __name__ == "__main__":
    main()
