"""How far can the load generator itself push? Its maximum sustainable open-loop rate.

Against the trivial calibration endpoint (``loadgen.calibration_server``, an identity model with
no queue and no model work, in its own process on this machine), run open-loop Poisson load at
rising rates: double until a run is invalid (send lag p99 above the limit, or fewer than 95% of
the window's scheduled requests sent within it), then bisect. The highest valid rate is the
generator's sustainable rate here, and its lag there is reported. If the endpoint saturates
first, latency climbs and the outstanding-request cap turns it into lag too: the latency
columns show which side gave out.

    python -m benchmarks.loadgen_capacity [--duration 5] [--max-lag-ms 10] [--loop uvloop]

Prints a table and writes JSON (default results/loadgen_capacity.json, git-ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wattserve.loadgen.client import make_session  # noqa: E402
from wattserve.loadgen.runner import LoadSpec, prepare_target, run_load  # noqa: E402
from wattserve.loadgen.server_process import free_port  # noqa: E402


def start_endpoint(port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "wattserve.loadgen", "calibration-server", "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def row(run: Any) -> dict[str, Any]:
    s = run.summary
    return {
        "rate": run.spec.rate,
        "valid": s["valid"],
        "reasons": s["invalid_reasons"],
        "sent": s["sent"],
        "offered_rate": s["offered_rate"],
        "achieved_rate": s["achieved_rate"],
        "failed": s["failed"],
        "lag_p50_ms": s["lag_ms"]["p50"],
        "lag_p99_ms": s["lag_ms"]["p99"],
        "lag_max_ms": s["lag_ms"]["max"],
        "latency_p50_ms": s["latency_ms"]["p50"],
        "latency_p99_ms": s["latency_ms"]["p99"],
    }


async def measure(args: argparse.Namespace, url: str) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    async with make_session(30) as session:
        target = await prepare_target(session, url, "identity", "binary", ready_timeout_s=30)

        async def attempt(rate: float) -> bool:
            spec = LoadSpec(
                "poisson", rate=rate, warmup_s=args.warmup, duration_s=args.duration,
                seed=len(results), max_lag_ms=args.max_lag_ms,
            )  # fmt: skip
            r = row(await run_load(session, target, spec))
            results.append(r)
            print(
                f"rate {rate:8.1f}/s  achieved {r['achieved_rate']:8.1f}  lag p50 "
                f"{r['lag_p50_ms']:6.2f} p99 {r['lag_p99_ms']:7.2f} max {r['lag_max_ms']:7.2f} ms  "
                f"latency p50 {r['latency_p50_ms']:7.2f} p99 {r['latency_p99_ms']:8.2f} ms  "
                f"{'valid' if r['valid'] else 'INVALID'}",
                flush=True,
            )
            await asyncio.sleep(0.5)
            return r["valid"]

        rate, good, bad = args.start_rate, None, None
        while bad is None and rate <= args.max_rate:
            if await attempt(rate):
                good, rate = rate, rate * 2
            else:
                bad = rate
        while good is not None and bad is not None and (bad - good) / bad > args.tolerance:
            mid = (good + bad) / 2
            if await attempt(mid):
                good = mid
            else:
                bad = mid
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--start-rate", type=float, default=250.0)
    p.add_argument("--max-rate", type=float, default=64000.0)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--max-lag-ms", type=float, default=10.0)
    p.add_argument("--tolerance", type=float, default=0.1)
    p.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "loadgen_capacity.json")
    args = p.parse_args()

    port = free_port()
    endpoint = start_endpoint(port)
    try:
        time.sleep(1.5)
        url = f"http://127.0.0.1:{port}"
        if args.loop == "uvloop":
            import uvloop

            results = uvloop.run(measure(args, url))
        else:
            results = asyncio.run(measure(args, url))
    finally:
        endpoint.terminate()
        endpoint.wait(10)
    valid = [r for r in results if r["valid"]]
    best = max(valid, key=lambda r: r["rate"]) if valid else None
    doc = {
        "benchmark": "loadgen_capacity",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
        },
        "settings": vars(args) | {"out": str(args.out)},
        "criterion": f"valid = send lag p99 <= {args.max_lag_ms:g} ms and >= 95% of the window's "
        "scheduled requests sent within it",
        "max_sustainable_rate": best["rate"] if best else None,
        "lag_at_max_ms": {k: best[k] for k in ("lag_p50_ms", "lag_p99_ms", "lag_max_ms")} if best else None,
        "achieved_at_max": best["achieved_rate"] if best else None,
        "steps": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    if best:
        print(
            f"\nmax sustainable rate ({args.loop}): {best['rate']:.0f} req/s "
            f"(achieved {best['achieved_rate']:.0f}); lag there p50 {best['lag_p50_ms']:.2f} ms, "
            f"p99 {best['lag_p99_ms']:.2f} ms, max {best['lag_max_ms']:.2f} ms"
        )
    else:
        print("\nno rate was sustainable")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
