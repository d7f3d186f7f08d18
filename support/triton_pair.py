"""wattserve vs Triton side by side (``benchmarks.vs_triton``): the knobs both servers are
configured with, the windows, the capacity search and fixed-rate runs against two v2 URLs
(``measure``), and the rates, ratio and tables made of them. Shared with its test, which
runs ``measure`` against two wattserve servers (no Triton there); the Triton side itself is
``support/triton_mobilenet.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

WATTSERVE, TRITON = "wattserve", "triton"
DEFAULT_TRITON_PYTHON = "/work/.venv-triton/bin/python"
DEFAULT_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
SAME_RATE_TOLERANCE = 0.02  # two capacity fractions this close are one rate


@dataclass(frozen=True)
class Windows:
    """How long each measurement is; the full and --quick profiles differ only here."""

    warmup_s: float
    duration_s: float  # shortest window of a fixed-rate run
    point_queries: int  # ... long enough for this many expected queries
    search_queries: int  # each search step: this many queries (1.2x headroom added by search)
    search_tolerance: float
    search_steps: int


# Sized for a shared 2-core machine where mobilenet_v2 capacity is ~10-30 req/s: a full run
# takes about 20 minutes. A p99 from a few hundred queries rests on a handful of requests;
# raise --search-queries / --point-queries on a quiet machine with time to spare.
FULL = Windows(
    warmup_s=2, duration_s=15, point_queries=200, search_queries=300, search_tolerance=0.15, search_steps=6
)
QUICK = Windows(
    warmup_s=1, duration_s=4, point_queries=40, search_queries=60, search_tolerance=0.3, search_steps=4
)


@dataclass(frozen=True)
class ServingKnobs:
    """What both servers are configured with; one source so they cannot drift apart."""

    model: str
    max_batch_size: int
    max_queue_delay_ms: float
    seed: int
    channels_last: bool
    torch_threads: int | None

    def wattserve_env(self) -> dict[str, str]:
        env = {
            "WATTSERVE_MODEL": self.model,
            "WATTSERVE_BATCHER": "dynamic",
            "WATTSERVE_MAX_BATCH_SIZE": str(self.max_batch_size),
            "WATTSERVE_MAX_QUEUE_DELAY_MS": f"{self.max_queue_delay_ms:g}",
            "WATTSERVE_INSTANCES": "1",
            "WATTSERVE_SEED": str(self.seed),
            "WATTSERVE_CHANNELS_LAST": str(self.channels_last).lower(),
            "WATTSERVE_DEVICE": "cpu",
        }
        if self.torch_threads is not None:
            env["WATTSERVE_TORCH_THREADS"] = str(self.torch_threads)
        return env

    def triton_args(self, http_port: int, grpc_port: int, metrics_port: int) -> list[str]:
        args = [
            "--model", self.model,
            "--max-batch-size", str(self.max_batch_size),
            "--max-queue-delay-ms", f"{self.max_queue_delay_ms:g}",
            "--instances", "1",
            "--seed", str(self.seed),
            "--http-port", str(http_port),
            "--grpc-port", str(grpc_port),
            "--metrics-port", str(metrics_port),
        ]  # fmt: skip
        if not self.channels_last:
            args.append("--no-channels-last")
        if self.torch_threads is not None:
            args += ["--torch-threads", str(self.torch_threads)]
        return args


def default_knobs(model: str, torch_threads: int | None) -> ServingKnobs:
    """wattserve's own defaults (server.settings) for everything not given on the command line."""
    from wattserve.server.settings import Settings

    s = Settings()
    return ServingKnobs(
        model=model,
        max_batch_size=s.max_batch_size,
        max_queue_delay_ms=s.max_queue_delay_ms,
        seed=s.seed,
        channels_last=s.channels_last,
        torch_threads=torch_threads if torch_threads is not None else s.torch_threads,
    )


# --------------------------------------------------------------------------------------------
# Pure computations (tested without Triton: tests/test_vs_triton_harness.py)


def rates_to_run(
    capacities: Mapping[str, float | None], fractions: Sequence[float] = DEFAULT_FRACTIONS
) -> list[dict[str, Any]]:
    """Fixed rates: each fraction of each server's capacity, ascending; rates within 2% of
    one another are run once, labelled with every basis they stand for."""
    wanted: list[tuple[float, str]] = []
    for server, cap in capacities.items():
        if cap is None or cap <= 0:
            continue
        for f in fractions:
            wanted.append((cap * f, f"{100 * f:g}% of {server}"))
    out: list[dict[str, Any]] = []
    for rate, basis in sorted(wanted):
        if out and abs(rate - out[-1]["rate"]) <= SAME_RATE_TOLERANCE * rate:
            out[-1]["basis"].append(basis)
            continue
        out.append({"rate": round(rate, 3), "basis": [basis]})
    return out


def capacity_ratio(wattserve_rate: float | None, triton_rate: float | None) -> float | None:
    """wattserve / Triton capacity under the objective; None when either has none."""
    if not wattserve_rate or not triton_rate:
        return None
    return wattserve_rate / triton_rate


def point_row(
    server: str, rate: float, summary: Mapping[str, Any], verdict: Mapping[str, Any]
) -> dict[str, Any]:
    """One server at one rate, from a loadgen run summary and its objective verdict."""
    lat = summary.get("latency_ms") or {}
    slo_value = verdict.get("percentile_ms")
    return {
        "server": server,
        "rate": rate,
        "achieved_rate": summary.get("achieved_rate"),
        "sent": summary.get("sent"),
        "completed": summary.get("completed"),
        "errors": summary.get("failed", 0),
        "errors_by_status": summary.get("errors_by_status", {}),
        "p50_ms": lat.get("p50"),
        "p99_ms": lat.get("p99"),
        "slo_percentile_ms": None if slo_value is None or math.isinf(slo_value) else slo_value,
        "meets_objective": bool(verdict.get("passed")),
        "valid": summary.get("valid"),
        "invalid_reasons": summary.get("invalid_reasons", []),
    }


def triton_batch_stats(before: str | None, after: str | None, model: str) -> dict[str, float | None]:
    """Inferences, executions and mean batch size from two scrapes of Triton's /metrics."""

    def counts(text: str | None) -> dict[str, float] | None:
        if text is None:
            return None
        from prometheus_client.parser import text_string_to_metric_families

        found: dict[str, float] = {}
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.labels.get("model") != model:
                        continue
                    for name in ("nv_inference_count", "nv_inference_exec_count"):
                        if sample.name in (name, name + "_total"):
                            found[name] = found.get(name, 0.0) + sample.value
        except ValueError:  # text the parser refuses: no batch figures, never a crashed run
            return None
        return found

    a, b = counts(before), counts(after)
    if not a or not b or "nv_inference_count" not in a or "nv_inference_exec_count" not in a:
        return {"inferences": None, "executions": None, "avg_batch_size": None}
    inferences = b["nv_inference_count"] - a["nv_inference_count"]
    executions = b["nv_inference_exec_count"] - a["nv_inference_exec_count"]
    return {
        "inferences": inferences,
        "executions": executions,
        "avg_batch_size": inferences / executions if executions > 0 else None,
    }


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_tables(doc: Mapping[str, Any]) -> str:
    """The markdown tables printed at the end (and pasted into docs/vs-triton.md)."""
    obj = doc["objective"]
    name = f"p{obj['percentile']:g} <= {obj['slo_ms']:g} ms"
    lines = [
        f"Highest Poisson rate with {name} (failed requests count as misses):",
        "",
        f"| server | highest rate meeting {name} (req/s) | achieved there | lowest failing rate "
        "| search steps | stopped by |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for server in (WATTSERVE, TRITON):
        s = doc["search"].get(server) or {}
        lines.append(
            f"| {server} | {_f(s.get('best_rate'))} | {_f(s.get('best_achieved_rate'))} | "
            f"{_f(s.get('lowest_failing_rate'))} | {len(s.get('steps', []))} | {s.get('stopped_by', '-')} |"
        )
    ratio = doc.get("capacity_ratio")
    lines += ["", f"wattserve / Triton capacity under the objective: {_f(ratio, 2)}x", ""]
    lines += [
        "| rate (req/s) | basis | server | achieved (req/s) | p50 (ms) | p99 (ms) | errors | avg batch "
        "| meets |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for point in doc["points"]:
        for row in point["rows"]:
            lines.append(
                f"| {point['rate']:.1f} | {', '.join(point['basis'])} | {row['server']} | "
                f"{_f(row['achieved_rate'])} | {_f(row['p50_ms'])} | {_f(row['p99_ms'])} | "
                f"{row['errors']} | {_f(row.get('avg_batch_size'), 2)} | "
                f"{'yes' if row['meets_objective'] else 'no'}{'' if row['valid'] else ' (invalid)'} |"
            )
    return "\n".join(lines)


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


async def _run_point(
    session, target, spec, objective, server: str, metrics_url: str | None
) -> dict[str, Any]:
    from wattserve.loadgen import client
    from wattserve.loadgen.runner import run_load
    from wattserve.loadgen.search import step_verdict

    before = await client.get_text(session, metrics_url) if metrics_url else None
    run = await run_load(session, target, spec)
    after = await client.get_text(session, metrics_url) if metrics_url else None
    row = point_row(server, spec.rate, run.summary, step_verdict(run, objective))
    if server == TRITON:
        row |= triton_batch_stats(before, after, target.model)
    else:
        row["avg_batch_size"] = (run.server or {}).get("avg_batch_size")
        row["mean_compute_ms"] = (run.server or {}).get("mean_compute_ms")
    row["duration_s"] = spec.duration_s
    row["loadavg_after"] = loadavg()
    return row


async def measure(
    args: argparse.Namespace, win: Windows, urls: dict[str, str], triton_metrics: str
) -> dict[str, Any]:
    from wattserve.loadgen import client
    from wattserve.loadgen.runner import LoadSpec, prepare_target
    from wattserve.loadgen.search import Objective, SearchLimits, find_max_rate

    objective = Objective(slo_ms=args.slo_ms, percentile=args.percentile)
    doc: dict[str, Any] = {"search": {}, "points": []}
    async with client.make_session(args.request_timeout) as session:
        targets = {
            WATTSERVE: await prepare_target(session, urls[WATTSERVE], args.model, protocol="binary"),
            TRITON: await prepare_target(
                session, urls[TRITON], args.model, protocol="binary", metrics_url=None
            ),
        }
        doc["targets"] = {k: t.describe() for k, t in targets.items()}
        doc["server_metadata"] = {k: await client.get_json(session, f"{urls[k]}/v2") for k in urls}
        base = LoadSpec(
            arrival="poisson",
            warmup_s=win.warmup_s,
            duration_s=win.duration_s,
            seed=args.seed,
            max_lag_ms=args.max_lag_ms,
            cooldown_s=args.request_timeout,
        )
        limits = SearchLimits(
            start_rate=args.search_start,
            min_rate=args.min_rate if args.min_rate is not None else args.search_start / 8,
            tolerance=win.search_tolerance,
            max_steps=win.search_steps,
            min_queries=win.search_queries,
        )
        # 1. capacity of each (the order alternates with --triton-first)
        order = [TRITON, WATTSERVE] if args.triton_first else [WATTSERVE, TRITON]
        for server in order:
            print(
                f"searching {server}'s capacity ({objective.percentile:g}th <= {objective.slo_ms:g} ms) ..."
            )
            la = loadavg()
            summary, _ = await find_max_rate(session, targets[server], base, objective, limits)
            summary["loadavg_before"], summary["loadavg_after"] = la, loadavg()
            doc["search"][server] = summary
            print(
                f"  {server}: {summary['best_rate']} req/s ({summary['stopped_by']}); "
                f"load average {loadavg()}"
            )
        caps = {s: doc["search"][s]["best_rate"] for s in (WATTSERVE, TRITON)}
        doc["capacity_ratio"] = capacity_ratio(caps[WATTSERVE], caps[TRITON])
        # 2. both servers at each fraction of each capacity, alternating who goes first
        for i, point in enumerate(rates_to_run(caps, args.fractions)):
            rate = point["rate"]
            spec = dataclasses.replace(
                base,
                rate=rate,
                duration_s=max(win.duration_s, win.point_queries / rate),
                seed=args.seed + 1000 + i,  # same schedule for both servers at this rate
                label=f"{rate:.3g}/s",
            )
            rows = []
            for server in order[::-1] if i % 2 == 0 else order:
                metrics = triton_metrics if server == TRITON else None
                rows.append(await _run_point(session, targets[server], spec, objective, server, metrics))
                r = rows[-1]
                print(
                    f"  {rate:7.2f}/s {server:<9}: achieved {_f(r['achieved_rate'])}, "
                    f"p50 {_f(r['p50_ms'])} ms, "
                    f"p99 {_f(r['p99_ms'])} ms, errors {r['errors']}, load average {r['loadavg_after']}"
                )
            rows.sort(key=lambda r: r["server"] != WATTSERVE)
            doc["points"].append({**point, "rows": rows})
    doc["objective"] = {"percentile": objective.percentile, "slo_ms": objective.slo_ms}
    return doc


def parse_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    """The comparison's command line (``description``: the benchmark's own help text)."""
    p = argparse.ArgumentParser(
        description=description or "wattserve vs Triton, side by side (python -m benchmarks.vs_triton)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--triton-python", default=DEFAULT_TRITON_PYTHON, help="python of the PyTriton venv")
    p.add_argument("--model", default="mobilenet_v2")
    p.add_argument("--quick", action="store_true", help="short windows and a coarse search")
    p.add_argument("--slo-ms", type=float, default=200.0)
    p.add_argument("--percentile", type=float, default=99.0)
    p.add_argument(
        "--fractions",
        type=lambda s: [float(x) for x in s.split(",")],
        default=list(DEFAULT_FRACTIONS),
        help="fixed rates as fractions of each capacity (default 0.25,0.5,0.75,1)",
    )
    p.add_argument("--search-start", type=float, default=16.0, help="first rate the search tries")
    p.add_argument(
        "--min-rate", type=float, default=None, help="lowest rate the search tries (default start / 8)"
    )
    p.add_argument("--search-queries", type=int, default=None, help="queries per search step")
    p.add_argument("--point-queries", type=int, default=None, help="queries per fixed-rate run (at least)")
    p.add_argument("--torch-threads", type=int, default=None, help="both servers; unset: wattserve's default")
    p.add_argument("--max-lag-ms", type=float, default=25.0, help="generator lag that invalidates a run")
    p.add_argument("--request-timeout", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--triton-first", action="store_true", help="search Triton first")
    p.add_argument("--out", default="vs_triton", help="results/<OUT>.json")
    return p.parse_args(argv)
