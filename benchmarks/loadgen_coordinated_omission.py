"""Coordinated omission in numbers: the same 1 s server freeze seen open-loop and closed-loop.

The calibration endpoint (in this process, on loopback) freezes once for ``--stall-s``
seconds, 2 s into each run. Open loop sends at a constant rate and measures from each
request's intended send time; closed loop runs ``--concurrency`` workers that wait for each
answer. Prints both latency summaries and writes JSON (default results/loadgen_co.json).

    python -m benchmarks.loadgen_coordinated_omission [--rate 100] [--duration 4.5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from wattserve.loadgen.calibration_server import running_calibration_server
from wattserve.loadgen.client import make_session
from wattserve.loadgen.runner import LoadSpec, prepare_target, run_load

from benchmarks._harness import RESULTS


async def measure(args: argparse.Namespace) -> dict:
    out = {}
    async with running_calibration_server() as (server, url), make_session(30) as session:
        target = await prepare_target(session, url, "identity", "binary")
        specs = {
            "open": LoadSpec("constant", rate=args.rate, warmup_s=0.5, duration_s=args.duration),
            "closed": LoadSpec(
                "closed", concurrency=args.concurrency, warmup_s=0.5, duration_s=args.duration
            ),
        }
        for name, spec in specs.items():
            before = server.stalled_requests
            server.arm_stall(after_s=2.0, stall_s=args.stall_s)
            run = await run_load(session, target, spec)
            lat = run.summary["latency_ms"]
            out[name] = {
                "completed": run.summary["completed"],
                "requests_held_by_the_freeze": server.stalled_requests - before,
                "latency_ms": lat,
            }
            print(
                f"{name:6s}  completed {run.summary['completed']:6d}  held by freeze "
                f"{out[name]['requests_held_by_the_freeze']:4d}  p50 {lat['p50']:8.2f}  "
                f"p90 {lat['p90']:8.2f}  p99 {lat['p99']:8.2f}  p99.9 {lat['p99.9']:8.2f}  "
                f"max {lat['max']:8.2f} ms"
            )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--duration", type=float, default=4.5)
    p.add_argument("--stall-s", type=float, default=1.0)
    p.add_argument("--out", type=Path, default=RESULTS / "loadgen_co.json")
    args = p.parse_args()
    result = asyncio.run(measure(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"settings": vars(args) | {"out": str(args.out)}, **result}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
