"""Latency under open-loop load, checkouts or environment variants side by side, same run.

    python -m benchmarks.open_loop_ab --rates 24,32 [--rounds 2] [--before PATH]
        [--variant NAME:VAR=VALUE[,VAR=VALUE]] [--model mobilenet_v2] [--duration 20]

Every server (this checkout; ``--before``'s; this checkout with each variant's environment)
is up for the whole run, serving the model with the dynamic batcher (max batch 8, binary
tensors). At each rate each server gets the project's open-loop Poisson load with the same
arrival schedule, the order alternating from one rate to the next so drift hits all alike;
latency counts from the intended send time. Prints p50/p99 per rate and server (means over
rounds) and writes results/open_loop_ab.json. Closed-loop figures are in benchmarks.hot_path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import platform
import statistics
from pathlib import Path
from typing import Any

from benchmarks._harness import ROOT, parse_variant, save, wattserve


def servers_to_run(args: argparse.Namespace) -> dict[str, tuple[Path, dict[str, str]]]:
    servers = {"now": (ROOT, {})}
    if args.before is not None:
        servers["before"] = (args.before.resolve(), {})
    for name, env in args.variant:
        servers[name] = (ROOT, env)
    return servers


async def measure(args: argparse.Namespace, urls: dict[str, str]) -> list[dict[str, Any]]:
    from wattserve.loadgen import client
    from wattserve.loadgen.runner import LoadSpec, prepare_target, run_load

    rows: list[dict[str, Any]] = []
    async with client.make_session(args.request_timeout) as session:
        targets = {
            k: await prepare_target(session, u, args.model, protocol="binary") for k, u in urls.items()
        }
        for rnd in range(args.rounds):
            for i, rate in enumerate(args.rates):
                spec = LoadSpec(arrival="poisson", rate=rate, warmup_s=args.warmup, duration_s=args.duration,
                                seed=args.seed + 100 * rnd + i, max_lag_ms=args.max_lag_ms,
                                cooldown_s=args.request_timeout)  # fmt: skip
                order = list(targets) if (i + rnd) % 2 == 0 else list(targets)[::-1]
                for name in order:
                    summary = (await run_load(session, targets[name], spec)).summary
                    lat = summary.get("latency_ms") or {}
                    row = {"round": rnd, "rate": rate, "server": name, "p50_ms": lat.get("p50"),
                           "p99_ms": lat.get("p99"), "achieved_rate": summary.get("achieved_rate"),
                           "failed": summary.get("failed", 0), "valid": summary.get("valid")}  # fmt: skip
                    rows.append(row)
                    print(f"{rate:6.1f}/s {name:<14} p50 {row['p50_ms'] or -1:7.1f} ms  p99 {row['p99_ms'] or -1:7.1f} "
                          f"ms  failed {row['failed']}  valid {row['valid']}", flush=True)  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]], names: list[str], rates: list[float]) -> str:
    def mean(rate: float, name: str, key: str) -> str:
        values = [r[key] for r in rows if r["rate"] == rate and r["server"] == name and r[key] is not None]
        return f"{statistics.mean(values):.0f}" if values else "-"

    lines = ["| rate (req/s) | " + " | ".join(f"{n} p50 / p99 ms" for n in names) + " |",
             "| ---: | " + " | ".join("---" for _ in names) + " |"]  # fmt: skip
    for rate in rates:
        cells = [f"{mean(rate, n, 'p50_ms')} / {mean(rate, n, 'p99_ms')}" for n in names]
        lines.append(f"| {rate:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", required=True, type=lambda s: [float(r) for r in s.split(",")])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--before", type=Path, default=None, help="an older checkout, up in the same run")
    p.add_argument(
        "--variant", action="append", default=[], type=parse_variant, metavar="NAME:VAR=VALUE[,VAR=VALUE]"
    )
    p.add_argument("--model", default="mobilenet_v2")
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--max-lag-ms", type=float, default=250.0)
    p.add_argument("--request-timeout", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    servers = servers_to_run(args)
    base = {"WATTSERVE_MODEL": args.model, "WATTSERVE_BATCHER": "dynamic",
            "WATTSERVE_MAX_BATCH_SIZE": str(args.max_batch_size)}  # fmt: skip
    with contextlib.ExitStack() as stack:
        urls = {name: stack.enter_context(wattserve({**base, **env}, root=root))
                for name, (root, env) in servers.items()}  # fmt: skip
        rows = asyncio.run(measure(args, urls))
    print()
    print(table(rows, list(servers), args.rates))
    doc = {"machine": platform.platform(), "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}
    print(f"\nwrote {save('open_loop_ab', doc)}")


if __name__ == "__main__":
    main()
