"""The rows of a live batching sweep (``benchmarks/adaptive_live_pair.sh``), per run and
pooled over its rounds, read from the load generator's own files (``results.json``,
``requests.csv``): what ``benchmarks.adaptive_live_table`` prints, shared with its test.

"meets" = the percentile <= the objective and attainment >= the percentile (requests
answered 200 within the objective / requests sent in the measured windows: a 503 counts
as a miss). Pooling a configuration's rounds (same server, same rate) gives the percentile
on thousands of requests rather than one short run's few hundred.
"""

from __future__ import annotations

import csv
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

RUN = re.compile(r"^(?P<config>.+)-(?P<rate>\d+(?:\.\d+)?)(?:-r(?P<round>\d+))?$")


def read_run(folder: Path, slo_ms: float) -> dict:
    """One loadgen run: its requests in the measured window and its summary figures."""
    result = json.loads((folder / "results.json").read_text())["runs"][0]
    latencies, ok_within, sent = [], 0, 0
    with (folder / "requests.csv").open() as f:
        for row in csv.DictReader(f):
            if row["phase"] != "measure":  # not the warm-up, nor what was sent after the window
                continue
            sent += 1
            if row["status"] == "200":
                latency = float(row["latency_ms"])
                latencies.append(latency)
                ok_within += latency <= slo_ms
    server = result.get("server") or {}
    hold = policy_figure(server, "wattserve_adaptive_max_hold_seconds", "min")
    return {
        "latencies": latencies,
        "within": ok_within,
        "sent": sent,
        "batch": server.get("avg_batch_size"),
        "throughput": result.get("achieved_rate"),
        "rejected": sum(
            n for status, n in (result.get("errors_by_status") or {}).items() if status in ("503", "429")
        ),
        "valid": bool(result.get("valid")),
        # the adaptive batcher's own state over the run (loadgen's ``server.policy``)
        "hold_ms": None if hold is None else 1000 * hold,
        "backoffs": policy_figure(server, "wattserve_adaptive_backoffs_total", "delta"),
    }


def policy_figure(server: dict, name: str, key: str) -> float | None:
    """One figure of the batcher's own series over the run (the load generator's
    ``server.policy`` rows), None where the run did not record it."""
    return next((r.get(key) for r in server.get("policy") or [] if r["name"] == name), None)


def row(config: str, rate: float, label: str, runs: list[dict], slo_ms: float, percentile: float) -> dict:
    latencies = np.concatenate([r["latencies"] for r in runs]) if runs else np.array([])
    sent = sum(r["sent"] for r in runs)
    tail = float(np.percentile(latencies, percentile)) if len(latencies) else float("inf")
    attainment = sum(r["within"] for r in runs) / sent if sent else 0.0
    batches = [r["batch"] for r in runs if r["batch"] is not None]
    holds = [r["hold_ms"] for r in runs if r.get("hold_ms") is not None]
    backoffs = [r["backoffs"] for r in runs if r.get("backoffs") is not None]
    return {
        "config": config,
        "rate": rate,
        "run": label,
        "requests": sent,
        "tail_ms": tail,
        "attainment": attainment,
        "mean_batch": float(np.mean(batches)) if batches else None,
        "throughput": float(np.mean([r["throughput"] or 0.0 for r in runs])) if runs else 0.0,
        "rejected": sum(r["rejected"] for r in runs),
        "valid": all(r["valid"] for r in runs),
        "meets": tail <= slo_ms and attainment >= percentile / 100,
        "min_hold_ms": min(holds) if holds else None,
        "backoffs": sum(backoffs) if backoffs else None,
    }


def table(out: Path, slo_ms: float, percentile: float) -> list[dict]:
    grouped: dict[tuple[str, float], dict[str, dict]] = defaultdict(dict)
    for folder in sorted(p for p in out.iterdir() if (p / "results.json").is_file()):
        match = RUN.match(folder.name)
        if match:
            key = (match["config"], float(match["rate"]))
            grouped[key][match["round"] or "1"] = read_run(folder, slo_ms)
    rows = []
    for (config, rate), runs in sorted(grouped.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        for label, run in sorted(runs.items()):
            rows.append(row(config, rate, f"r{label}", [run], slo_ms, percentile))
        if len(runs) > 1:
            rows.append(row(config, rate, "pooled", list(runs.values()), slo_ms, percentile))
    return rows


def markdown(rows: list[dict], percentile: float) -> str:
    p = f"p{percentile:g}"
    lines = [
        f"| rate/s | config | run | requests | {p} ms | attainment | mean batch | throughput/s | 503s "
        "| valid | meets | min hold ms | back-offs |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: |",
    ]
    for r in rows:
        batch = "-" if r["mean_batch"] is None else f"{r['mean_batch']:.2f}"
        meets = ("**yes**" if r["run"] == "pooled" else "yes") if r["meets"] else "no"
        hold = "-" if r.get("min_hold_ms") is None else f"{r['min_hold_ms']:.1f}"
        backoffs = "-" if r.get("backoffs") is None else f"{r['backoffs']:g}"
        lines.append(
            f"| {r['rate']:g} | {r['config']} | {r['run']} | {r['requests']} | {r['tail_ms']:,.0f} | "
            f"{r['attainment']:.1%} | {batch} | {r['throughput']:.1f} | {r['rejected']} | "
            f"{'yes' if r['valid'] else 'no'} | {meets} | {hold} | {backoffs} |"
        )
    return "\n".join(lines)
