"""Matplotlib figures for people. Each function writes one PNG and returns its path, or returns
None and a note saying why the figure was skipped (no energy data, no server metrics, ...).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np

from .runner import RunResult
from .stats import percentile_key

Plot = tuple[Path | None, str | None]
GroupKey = Callable[[RunResult], str]


def _ok_latencies_ms(run: RunResult) -> np.ndarray:
    return np.sort(np.array([r.latency_s * 1000 for r in run.measured() if r.ok]))


@dataclass(frozen=True)
class Marks:
    """What a figure draws beside the data: the latency objective and the capacity found.

    ``capacity`` is the achieved rate (req/s) of the highest passing SLO-search step;
    ``capacities`` the same per series (a comparison of run sets), drawn in its colour."""

    slo_ms: float | None = None
    percentile: float | None = None
    capacity: float | None = None
    capacities: tuple[tuple[str, float], ...] = ()

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> Marks:
        """From a results document's ``search`` (loadgen --slo-ms) or ``verdict`` (study)."""
        extra = extra or {}
        search, verdict = extra.get("search") or {}, extra.get("verdict") or {}
        obj = search.get("objective") or verdict.get("objective") or {}
        return cls(obj.get("slo_ms"), obj.get("percentile"), search.get("best_achieved_rate"))

    @property
    def objective_label(self) -> str:
        return f"objective {percentile_key(self.percentile or 0)} \u2264 {self.slo_ms:g} ms"


# Millisecond ticks a reader can read on a log axis: 1-2-5 per decade, denser when the data
# spans less than a decade. Numbers, never 10^k.
_TICKS_125 = [m * 10.0**e for e in range(-2, 6) for m in (1, 2, 5)]
_TICKS_DENSE = [m * 10.0**e for e in range(-2, 6) for m in (1, 1.5, 2, 3, 5, 7)]


def _ms_label(v: float, _pos: int = 0) -> str:
    if v >= 1000:
        return f"{v / 1000:g} s"
    return f"{v:g}"


def ms_log_axis(ax: plt.Axes, which: str = "y") -> None:
    """Log scale with millisecond ticks (5, 10, 20, 50, ...) instead of 10^k notation."""
    axis = ax.yaxis if which == "y" else ax.xaxis
    lo, hi = ax.get_ylim() if which == "y" else ax.get_xlim()
    ticks = [t for t in _TICKS_125 if lo <= t <= hi]
    if len(ticks) < 3:
        ticks = [t for t in _TICKS_DENSE if lo <= t <= hi]
    if len(ticks) < 2:  # a very narrow range: a few evenly spaced round values
        ticks = [float(f"{v:.2g}") for v in np.geomspace(lo, hi, 4)]
    axis.set_major_locator(mticker.FixedLocator(ticks))
    axis.set_major_formatter(mticker.FuncFormatter(_ms_label))
    axis.set_minor_formatter(mticker.NullFormatter())


def _grid(
    n: int, cols_max: int = 3, width: float = 5.0, height: float = 3.6
) -> tuple[plt.Figure, list[plt.Axes]]:
    cols = min(n, cols_max)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _groups(runs: Sequence[RunResult], key: GroupKey | None) -> dict[str, list[RunResult]]:
    groups: dict[str, list[RunResult]] = defaultdict(list)
    for run in runs:
        groups[key(run) if key else ""].append(run)
    return dict(groups)


def load_level(run: RunResult) -> float:
    """What orders runs: the target rate (open loop) or the concurrency (closed loop)."""
    if run.spec.closed:
        return float(run.spec.concurrency)
    if run.spec.rate is not None:
        return float(run.spec.rate)
    return float(run.summary.get("target_rate") or 0.0)


def default_name(runs: Sequence[RunResult]) -> str:
    """A legend name for a run set without series: its model (and URL when they differ)."""
    models = sorted({str(r.target.get("model") or "") for r in runs} - {""})
    return ", ".join(models) or "runs"


def _valid(run: RunResult) -> bool:
    return bool(run.summary.get("valid", True))


TAIL_TICKS = {0.5: "p50", 0.1: "p90", 0.01: "p99", 0.001: "p99.9", 0.0001: "p99.99", 0.00001: "p99.999"}


def latency_cdf(
    runs: Sequence[RunResult],
    path: Path,
    group: GroupKey | None = None,
    line: GroupKey | None = None,
    marks: Marks | None = None,
    tail: bool = False,
) -> Plot:
    """One CDF line per run, sorted by rate (log latency axis); one panel per group.

    ``tail=True`` draws 1 - F on a log axis instead, where p99 and p99.9 are far apart and
    readable. Invalid runs are dashed and say so in the legend; the objective is drawn."""
    groups = _groups(runs, group)
    single = len(groups) == 1  # one panel: the legend goes beside it, off the curves
    fig, axes = _grid(len(groups), width=7.0 if single else 5.0)
    drawn, lowest = 0, 1.0
    line_names = list(dict.fromkeys(line(r) for r in runs)) if line else []  # first seen, first colour
    colors = {name: f"C{i % 10}" for i, name in enumerate(line_names)}
    for ax, (name, members) in zip(axes, groups.items(), strict=True):
        members = sorted(members, key=load_level)
        ramp = plt.get_cmap("viridis")(np.linspace(0.0, 0.85, max(len(members), 1)))
        for i, run in enumerate(members):
            lat = _ok_latencies_ms(run)
            if lat.size == 0:
                continue
            n = lat.size
            y = (n - np.arange(n)) / n if tail else np.arange(1, n + 1) / n
            lowest = min(lowest, 1.0 / n)
            label = line(run) if line else run.label
            ok = _valid(run)
            ax.step(
                lat,
                y,
                where="post",
                color=colors[label] if line else ramp[i],
                ls="-" if ok else "--",
                lw=1.2 if ok else 0.9,
                alpha=1.0 if ok else 0.7,
                label=label if ok else f"{label} (invalid)",
            )
            drawn += 1
        _objective_on_cdf(ax, marks, tail)
        ax.set_xscale("log")
        ax.set_xlabel("latency from intended send (ms)")
        if tail:
            ax.set_yscale("log")
            ax.set_ylim(max(lowest / 2, 1e-6), 1.05)
            ax.yaxis.set_major_locator(mticker.FixedLocator(list(TAIL_TICKS)))
            ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _p: TAIL_TICKS.get(v, "")))
            ax.yaxis.set_minor_formatter(mticker.NullFormatter())
            ax.set_ylabel("fraction of requests slower (log)")
        else:
            ax.set_ylabel("fraction of requests")
            ax.set_ylim(0, 1.01)
            for q in (0.5, 0.95, 0.99):
                ax.axhline(q, color="grey", lw=0.6, ls=":")
        ax.grid(True, which="major", alpha=0.3)
        ms_log_axis(ax, "x")
        kind = "tail latency (1 - CDF)" if tail else "latency CDF"
        ax.set_title(f"{name}: {kind}" if name else f"{kind}, runs by rate", fontsize=9)
        if single:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        else:
            ax.legend(fontsize=7, loc="lower left" if tail else "lower right")
    if not drawn:
        plt.close(fig)
        return None, "latency CDF skipped: no successful requests in any window"
    return _save(fig, path), None


def _objective_on_cdf(ax: plt.Axes, marks: Marks | None, tail: bool) -> None:
    if marks is None or marks.slo_ms is None:
        return
    ax.axvline(marks.slo_ms, color="red", lw=1.0, ls="-.", label=marks.objective_label)
    if marks.percentile is not None:
        q = marks.percentile / 100.0
        ax.axhline(1 - q if tail else q, color="red", lw=0.8, ls="-.")


def throughput_latency(
    runs: Sequence[RunResult],
    path: Path,
    series: GroupKey | None = None,
    panel: GroupKey | None = None,
    marks: Marks | None = None,
    name: str | None = None,
) -> Plot:
    """Achieved throughput vs p50 (dotted), p95 (solid) and p99 (dashed) latency.

    One line per series (e.g. batching configuration, or a run set in a comparison), named in
    the legend, through its valid runs ordered by throughput; invalid runs are hollow grey
    points. The objective is a horizontal line, the capacity an SLO search found a vertical
    one. One panel per ``panel`` key (e.g. model and arrival process)."""
    panels = _groups(runs, panel)
    fig, axes = _grid(len(panels), cols_max=2, width=7.6, height=3.8)
    fallback = name or default_name(runs)
    names = list(dict.fromkeys(series(r) if series else fallback for r in runs))
    colors = {n: f"C{i % 10}" for i, n in enumerate(names)}
    keys = ["p50", "p95", "p99"]
    if marks and marks.percentile is not None and percentile_key(marks.percentile) not in keys:
        keys.append(percentile_key(marks.percentile))
    styles = {"p50": ":", "p95": "-", "p99": "--"}
    drawn = 0
    for ax, (title, members) in zip(axes, panels.items(), strict=True):
        invalid_drawn = False
        for label, group in _groups(members, series).items():
            label = label or fallback
            pts = sorted(
                (r.summary["achieved_rate"], r.summary["latency_ms"], _valid(r))
                for r in group
                if r.summary["latency_ms"]["count"]
            )
            if not pts:
                continue
            good = [p for p in pts if p[2]]
            bad = [p for p in pts if not p[2]]
            ax.plot([], [], "-", marker="o", ms=3, color=colors[label], label=label)  # legend: the series
            for key in keys:
                emphasis = (
                    marks is not None
                    and marks.percentile is not None
                    and key == percentile_key(marks.percentile)
                )
                ax.plot(
                    [p[0] for p in good],
                    [p[1][key] for p in good],
                    styles.get(key, "-."),
                    marker="o",
                    ms=3.5 if emphasis else 2.5,
                    lw=1.8 if emphasis else 1.0,
                    color=colors[label],
                )
                if bad:
                    ax.plot(
                        [p[0] for p in bad],
                        [p[1][key] for p in bad],
                        "o",
                        ms=6,
                        mfc="none",
                        mec="grey",
                        mew=1.2,
                        label=None if invalid_drawn else "invalid run (generator could not keep up)",
                    )
                    invalid_drawn = True
            drawn += 1
        _objective_and_capacity(ax, marks, colors)
        for key in keys:  # a legend entry per line style
            ax.plot([], [], styles.get(key, "-."), color="0.3", label=key)
        ax.set_yscale("log")
        ax.set_xlim(left=0)
        ax.set_xlabel("achieved throughput (req/s)")
        ax.set_ylabel("latency from intended send (ms)")
        ax.grid(True, which="major", alpha=0.3)
        ms_log_axis(ax, "y")
        ax.set_title(title or "throughput vs latency", fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    if not drawn:
        plt.close(fig)
        return None, "throughput-latency plot skipped: no successful requests"
    return _save(fig, path), None


def _objective_and_capacity(ax: plt.Axes, marks: Marks | None, colors: Mapping[str, str]) -> None:
    if marks is None:
        return
    for series_name, capacity in marks.capacities:
        ax.axvline(
            capacity,
            color=colors.get(series_name, "green"),
            lw=1.2,
            ls=(0, (4, 2)),
            label=f"capacity found, {series_name}: {capacity:,.0f} req/s",
        )
    if marks.slo_ms is not None:
        ax.axhline(marks.slo_ms, color="red", lw=1.2, ls="-.", label=marks.objective_label)
    if marks.capacity is not None:
        ax.axvline(
            marks.capacity,
            color="green",
            lw=1.2,
            ls=(0, (4, 2)),
            label=f"capacity found: {marks.capacity:,.0f} req/s",
        )


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
    panels = sum(ax.get_visible() for ax in fig.axes)
    fig.savefig(path, dpi=100 if panels <= 2 else 80)  # many panels: keep the PNG small
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


def cost_per_load(rows: Sequence[Mapping[str, Any]], path: Path, cost_label: str, objective: str) -> Plot:
    """The study's answer in one picture: per model, the cost per inference (J, or engine-ms
    without energy data) of each configuration at each load, filled where it meets the
    objective, hollow where it misses, the winner at each load ringed.

    ``rows``: ``model``, ``workload``, ``rate``, ``batching``, ``cost``, ``meets``, ``winner``."""
    usable = [r for r in rows if r.get("cost") is not None]
    if not usable:
        return None, "study headline picture skipped: no run has a cost per inference"
    models = list(dict.fromkeys(r["model"] for r in usable))
    configs = list(dict.fromkeys(r["batching"] for r in usable))
    colors = {c: f"C{i % 10}" for i, c in enumerate(configs)}
    fig, axes = _grid(len(models), cols_max=2, width=6.4, height=3.8)
    for ax, model in zip(axes, models, strict=True):
        mine = [r for r in usable if r["model"] == model]
        loads = sorted({(r["rate"] or 0.0, r["workload"]) for r in mine})
        xpos = {w: i for i, (_rate, w) in enumerate(loads)}
        for config in configs:
            pts = sorted((xpos[r["workload"]], r) for r in mine if r["batching"] == config)
            if not pts:
                continue
            ax.plot(
                [x for x, _ in pts], [r["cost"] for _, r in pts], "-", color=colors[config], lw=1, alpha=0.6
            )
            for x, r in pts:
                ax.plot(
                    x,
                    r["cost"],
                    "o",
                    ms=6,
                    color=colors[config],
                    mfc=colors[config] if r["meets"] else "white",
                )
                if r["winner"]:
                    ax.plot(x, r["cost"], "o", ms=14, mfc="none", mec="black", mew=1.5)
            ax.plot([], [], "-o", color=colors[config], label=config)
        ax.plot([], [], "o", mfc="white", mec="grey", label=f"misses {objective} (or invalid)")
        ax.plot([], [], "o", ms=12, mfc="none", mec="black", mew=1.5, label="fewest cost meeting it")
        ax.set_xticks(range(len(loads)), [f"{w}\n{rate:g}/s" if rate else w for rate, w in loads], fontsize=7)
        ax.set_ylabel(cost_label)
        ax.set_ylim(bottom=0)
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_title(f"{model}: cost per inference at each load", fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _save(fig, path), None
