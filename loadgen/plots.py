"""Matplotlib figures for people. Each function writes one PNG and returns its path, or returns
None and a note saying why the figure was skipped (no energy data, no server metrics, ...).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from .runner import RunResult

Plot = tuple[Path | None, str | None]
GroupKey = Callable[[RunResult], str]


def _ok_latencies_ms(run: RunResult) -> np.ndarray:
    return np.sort(np.array([r.latency_s * 1000 for r in run.measured() if r.ok]))


def _grid(n: int) -> tuple[plt.Figure, list[plt.Axes]]:
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _groups(runs: Sequence[RunResult], key: GroupKey | None) -> dict[str, list[RunResult]]:
    groups: dict[str, list[RunResult]] = defaultdict(list)
    for run in runs:
        groups[key(run) if key else ""].append(run)
    return dict(groups)


def latency_cdf(
    runs: Sequence[RunResult],
    path: Path,
    group: GroupKey | None = None,
    line: GroupKey | None = None,
) -> Plot:
    """One CDF line per run (log latency axis); one panel per group (e.g. model x workload)."""
    groups = _groups(runs, group)
    fig, axes = _grid(len(groups))
    drawn = 0
    for ax, (name, members) in zip(axes, groups.items(), strict=True):
        for run in members:
            lat = _ok_latencies_ms(run)
            if lat.size == 0:
                continue
            y = np.arange(1, lat.size + 1) / lat.size
            ax.step(lat, y, where="post", label=line(run) if line else run.label)
            drawn += 1
        ax.set_xscale("log")
        ax.set_xlabel("latency from intended send (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.01)
        ax.grid(True, which="both", alpha=0.3)
        for q in (0.5, 0.95, 0.99):
            ax.axhline(q, color="grey", lw=0.6, ls=":")
        ax.set_title(name or "latency CDF")
        ax.legend(fontsize=7)
    if not drawn:
        plt.close(fig)
        return None, "latency CDF skipped: no successful requests in any window"
    return _save(fig, path), None


def throughput_latency(
    runs: Sequence[RunResult],
    path: Path,
    series: GroupKey | None = None,
    panel: GroupKey | None = None,
) -> Plot:
    """Achieved throughput vs p50 (dotted), p95 (solid) and p99 (dashed) latency.

    One line per series (e.g. batching configuration), points ordered by throughput; one panel
    per ``panel`` key (e.g. model and arrival process, so bursty and Poisson do not mix).
    """
    panels = _groups(runs, panel)
    fig, axes = _grid(len(panels))
    names = sorted({series(r) if series else "" for r in runs})
    colors = {name: f"C{i % 10}" for i, name in enumerate(names)}
    drawn = 0
    for ax, (title, members) in zip(axes, panels.items(), strict=True):
        for name, group in _groups(members, series).items():
            pts = sorted(
                (r.summary["achieved_rate"], r.summary["latency_ms"])
                for r in group
                if r.summary["latency_ms"]["count"]
            )
            if not pts:
                continue
            x = [p[0] for p in pts]
            for key, style in (("p50", ":"), ("p95", "-"), ("p99", "--")):
                ax.plot(
                    x,
                    [p[1][key] for p in pts],
                    style,
                    marker="o",
                    ms=3,
                    color=colors[name],
                    label=(name or "run") if key == "p95" else None,
                )
            drawn += 1
        ax.set_yscale("log")
        ax.set_xlabel("achieved throughput (req/s)")
        ax.set_ylabel("latency (ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(
            f"{title}  (p50 dotted, p95 solid, p99 dashed)"
            if title
            else "throughput vs latency: p50 dotted, p95 solid, p99 dashed",
            fontsize=9,
        )
        ax.legend(fontsize=7)
    if not drawn:
        plt.close(fig)
        return None, "throughput-latency plot skipped: no successful requests"
    return _save(fig, path), None


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of points not beaten on both axes (lower is better on each), by increasing x."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front, best_y = [], math.inf
    for i in order:
        if points[i][1] < best_y:
            front.append(i)
            best_y = points[i][1]
    return front


def energy_latency(runs: Sequence[RunResult], path: Path, name: GroupKey | None = None) -> Plot:
    """Energy per inference vs p95 latency with the Pareto front marked."""
    pts, labels = [], []
    for run in runs:
        energy = (run.server or {}).get("energy_per_inference_j")
        p95 = run.summary["latency_ms"]["p95"]
        if energy is not None and p95 is not None:
            pts.append((p95, energy))
            labels.append(name(run) if name else run.label)
    if not pts:
        return None, (
            "energy vs latency plot skipped: the server reported no energy measurement for "
            "these runs (no GPU or RAPL telemetry), so no energy per inference is reported"
        )
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], color="C0", zorder=2)
    for (x, y), text in zip(pts, labels, strict=True):
        ax.annotate(text, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    front = pareto_front(pts)
    ax.plot(
        [pts[i][0] for i in front],
        [pts[i][1] for i in front],
        "-o",
        color="C3",
        label="Pareto front (lower is better on both)",
        zorder=3,
    )
    ax.set_xlabel("p95 latency (ms)")
    ax.set_ylabel("energy per inference (J)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("energy per inference vs p95 latency")
    return _save(fig, path), None


def batch_sizes(runs: Sequence[RunResult], path: Path, name: GroupKey | None = None) -> Plot:
    """Server-side batch-size distribution per run over its window (from /metrics histograms)."""
    hists = []
    for r in runs:
        hist = (r.server or {}).get("batch_size_histogram")
        if hist and sum(b["count"] for b in hist) > 0:
            hists.append((r, hist))
    if not hists:
        return (
            None,
            "batch-size histogram skipped: the server exported no wattserve_batch_size metric",
        )
    fig, axes = _grid(len(hists))
    for ax, (run, hist) in zip(axes, hists, strict=True):
        last = max(i for i, b in enumerate(hist) if b["count"] > 0)
        hist = hist[: max(last + 1, 4)]  # drop the empty buckets above the largest batch
        labels = [_bucket_label(b) for b in hist]
        ax.bar(range(len(hist)), [b["count"] for b in hist], color="C2")
        ax.set_xticks(range(len(hist)), labels, rotation=45, fontsize=7)
        avg = (run.server or {}).get("avg_batch_size")
        title = name(run) if name else run.label
        ax.set_title(f"{title}\navg batch {avg:.2f}" if avg else title, fontsize=8)
        ax.set_xlabel("batch size")
        ax.set_ylabel("batches")
    return _save(fig, path), None


def power_over_time(runs: Sequence[RunResult], path: Path, name: GroupKey | None = None) -> Plot:
    """Device power samples scraped during each run (offset from the run's start)."""
    series = [(r, s) for r in runs for s in r.power_series.items()]
    if not series:
        return None, "power-over-time plot skipped: the server exported no GPU or CPU power metric"
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run, (metric, pts) in series:
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            lw=1,
            label=f"{name(run) if name else run.label}: {metric}",
        )
    ax.set_xlabel("seconds since run start (window starts after warm-up)")
    ax.set_ylabel("watts")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6)
    ax.set_title("device power over time")
    return _save(fig, path), None


def _bucket_label(bucket: dict) -> str:
    lo, hi = bucket["gt"], bucket["le"]
    if math.isinf(hi):
        return f">{lo:g}"
    if lo is None or hi - lo <= 1:
        return f"{hi:g}"
    return f"{math.floor(lo) + 1}-{hi:g}"


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def energy_latency_per_config(rows: Sequence[dict], path: Path) -> Plot:
    """J/inference vs p95 latency, one panel per model, one line per batching configuration
    through its workloads (ordered by latency): which configuration buys latency with energy.

    ``rows`` are plain records (``model``, ``batching``, ``workload``, ``p95_ms``,
    ``energy_per_inference_j``), e.g. from a study's results.json, so a report can be redrawn
    without the runs in memory (scripts/gpu_report.py)."""
    usable = [r for r in rows if r.get("energy_per_inference_j") is not None and r.get("p95_ms") is not None]
    if not usable:
        return None, (
            "energy vs latency per configuration skipped: no run has an energy per inference "
            "(the server measured no GPU or RAPL energy)"
        )
    models = sorted({r["model"] for r in usable})
    configs = sorted({r["batching"] for r in usable})
    colors = {c: f"C{i % 10}" for i, c in enumerate(configs)}
    fig, axes = _grid(len(models))
    for ax, model in zip(axes, models, strict=True):
        for config in configs:
            pts = sorted(
                (r["p95_ms"], r["energy_per_inference_j"], r.get("workload", ""))
                for r in usable
                if r["model"] == model and r["batching"] == config
            )
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", color=colors[config], label=config)
            for x, y, workload in pts:
                ax.annotate(workload, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        ax.set_title(model)
        ax.set_xlabel("p95 latency (ms)")
        ax.set_ylabel("energy per inference (J)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("energy per inference vs p95 latency, per batching configuration")
    return _save(fig, path), None
