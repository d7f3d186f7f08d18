"""``wattserve report compare RUN_A RUN_B [...]``: saved run sets side by side.

Each argument is a folder ``wattserve loadgen --out`` or ``wattserve study`` wrote. The runs
are read back from its results.json and requests.csv (so the latency CDFs are exact, not
redrawn from percentiles), drawn on the same throughput-latency and CDF axes, and the first
set is the baseline of a table of ratios at the rates both sets ran (p50, p99, throughput,
J/inference where measured), with a note wherever either run was invalid.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .arrivals import BurstSpec
from .runner import LoadSpec, RunResult
from .stats import RequestRecord

MATCH_TOLERANCE = 0.02  # rates within 2% of each other are the same load level
SET_KEY = "compare_set"


@dataclass
class RunSet:
    """One series of the comparison: a loadgen folder, or one batching configuration of a study."""

    name: str
    folder: Path
    runs: list[RunResult]
    capacity: float | None = None  # achieved rate at the highest passing SLO-search step
    objective: dict[str, Any] | None = None


def _float_or_none(text: str) -> float | None:
    return float(text) if text not in ("", None) else None


def read_requests(path: Path) -> dict[str, list[list[RequestRecord]]]:
    """requests.csv -> per run label, its runs' records in file order (a run's rows are
    contiguous; a label repeats only if the same run was repeated)."""
    blocks: dict[str, list[list[RequestRecord]]] = defaultdict(list)
    if not path.exists():
        return blocks
    last_label, last_index = None, -1
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            label, index = row["run"], int(row["index"])
            if label != last_label or index <= last_index:
                blocks[label].append([])
            last_label, last_index = label, index
            batch = row.get("batch_size") or ""
            blocks[label][-1].append(
                RequestRecord(
                    index,
                    float(row["intended_s"]),
                    float(row["sent_s"]),
                    float(row["done_s"]),
                    row["status"],
                    _float_or_none(row.get("queue_ms") or ""),
                    _float_or_none(row.get("compute_ms") or ""),
                    int(float(batch)) if batch else None,
                )
            )
    return blocks


def _spec(load: dict[str, Any]) -> LoadSpec:
    names = {f.name for f in dataclasses.fields(LoadSpec)}
    kwargs = {k: v for k, v in load.items() if k in names and k not in ("burst", "trace")}
    burst = load.get("burst")
    return LoadSpec(**kwargs, burst=BurstSpec(**burst) if burst else None)


_NOT_SUMMARY = {"label", "started_at", "load", "target", "server", "power_series"}
_EXTRA_KEYS = ("model", "batching", "workload", "server_config")


def load_runs(folder: Path) -> tuple[dict[str, Any], list[RunResult]]:
    """A results folder's document and its runs, as the runner made them."""
    path = folder / "results.json"
    if not path.exists():
        raise FileNotFoundError(
            f"{folder}: no results.json (give a folder that loadgen --out or study wrote)"
        )
    doc = json.loads(path.read_text())
    blocks = read_requests(folder / "requests.csv")
    runs = []
    for r in doc["runs"]:
        label = r["label"]
        records = blocks[label].pop(0) if blocks.get(label) else []
        summary = {k: v for k, v in r.items() if k not in _NOT_SUMMARY and k not in _EXTRA_KEYS}
        power = {k: [tuple(p) for p in v] for k, v in (r.get("power_series") or {}).items()}
        run = RunResult(label, _spec(r["load"]), r["target"], records, summary, r.get("server"), power,
                        r.get("started_at", ""), {k: r[k] for k in _EXTRA_KEYS if k in r})  # fmt: skip
        runs.append(run)
    return doc, runs


def load_sets(folders: Sequence[Path], names: Sequence[str] | None = None) -> list[RunSet]:
    """One RunSet per loadgen folder; one per batching configuration of a study folder."""
    sets: list[RunSet] = []
    for i, folder in enumerate(folders):
        doc, runs = load_runs(folder)
        name = names[i] if names and i < len(names) else folder.name
        search = doc.get("search") or {}
        objective = search.get("objective") or (doc.get("verdict") or {}).get("objective")
        if "verdict" in doc:  # a study: its configurations are the series
            by_config: dict[str, list[RunResult]] = defaultdict(list)
            for run in runs:
                by_config[str(run.extra.get("batching"))].append(run)
            for config, members in by_config.items():
                sets.append(RunSet(f"{name}: {config}", folder, members, None, objective))
        else:
            sets.append(RunSet(name, folder, runs, search.get("best_achieved_rate"), objective))
    for s in sets:
        for run in s.runs:
            run.extra[SET_KEY] = s.name
    return sets


def _level(run: RunResult) -> tuple[str, float]:
    from .plots import load_level

    return ("closed" if run.spec.closed else run.spec.arrival, load_level(run))


def _same_level(a: RunResult, b: RunResult) -> bool:
    (mode_a, la), (mode_b, lb) = _level(a), _level(b)
    if mode_a != mode_b or a.extra.get("workload") != b.extra.get("workload"):
        return False
    return abs(la - lb) <= MATCH_TOLERANCE * max(la, lb)


def _ratio(b: float | None, a: float | None) -> float | None:
    if a is None or b is None or a == 0 or not math.isfinite(a) or not math.isfinite(b):
        return None
    return b / a


def _note(a: RunResult, b: RunResult, base: str, other: str) -> str:
    notes = []
    for name, run in ((base, a), (other, b)):
        if not run.summary.get("valid", True):
            notes.append(f"{name} invalid: {'; '.join(run.summary.get('invalid_reasons') or [])}")
    return " | ".join(notes)


def ratio_rows(sets: Sequence[RunSet]) -> list[dict[str, Any]]:
    """Against the first set: each other set's runs at the rates the baseline also ran."""
    if len(sets) < 2:
        return []
    base = sets[0]
    rows = []
    for other in sets[1:]:
        for a in sorted(base.runs, key=lambda r: _level(r)[1]):
            b = next((r for r in other.runs if _same_level(a, r)), None)
            if b is None:
                continue
            la, lb = a.summary["latency_ms"], b.summary["latency_ms"]
            ea = (a.server or {}).get("energy_per_inference_j")
            eb = (b.server or {}).get("energy_per_inference_j")
            mode, level = _level(a)
            rows.append(
                {
                    "baseline": base.name,
                    "other": other.name,
                    "load": f"c={level:g}" if mode == "closed" else f"{mode} {level:g}/s",
                    "p50_ms": (la["p50"], lb["p50"], _ratio(lb["p50"], la["p50"])),
                    "p99_ms": (la["p99"], lb["p99"], _ratio(lb["p99"], la["p99"])),
                    "throughput": (
                        a.summary["achieved_rate"],
                        b.summary["achieved_rate"],
                        _ratio(b.summary["achieved_rate"], a.summary["achieved_rate"]),
                    ),
                    "j_per_inference": (ea, eb, _ratio(eb, ea)),
                    "valid": bool(a.summary.get("valid", True) and b.summary.get("valid", True)),
                    "note": _note(a, b, base.name, other.name),
                }
            )
    return rows


def _common_levels(sets: Sequence[RunSet]) -> set[tuple[str, float]]:
    """Load levels at least two sets ran (rounded to match within the tolerance)."""
    seen: dict[tuple[str, float], set[str]] = defaultdict(set)
    for s in sets:
        for run in s.runs:
            mode, level = _level(run)
            key = next(
                (k for k in seen if k[0] == mode and abs(k[1] - level) <= MATCH_TOLERANCE * level), None
            )
            seen[key or (mode, level)].add(s.name)
    return {k for k, names in seen.items() if len(names) >= 2}


def _level_name(run: RunResult) -> str:
    mode, level = _level(run)
    return f"at c={level:g}" if mode == "closed" else f"at {mode} {level:g}/s"


def draw(sets: Sequence[RunSet], out: Path) -> tuple[list[tuple[Path | None, str]], list[str]]:
    """The comparison's figures: every set on one throughput-latency plot; CDF and tail panels
    per load level the sets share (or per set when they share none)."""
    from . import plots

    runs = [run for s in sets for run in s.runs]
    obj = next((s.objective for s in sets if s.objective), None) or {}
    marks = plots.Marks(
        obj.get("slo_ms"),
        obj.get("percentile"),
        None,
        tuple((s.name, s.capacity) for s in sets if s.capacity is not None),
    )
    series = lambda r: r.extra[SET_KEY]  # noqa: E731
    figures: list[tuple[Path | None, str]] = []
    notes: list[str] = []
    fig = plots.throughput_latency(runs, out / "throughput_latency.png", series, None, marks)
    figures.append((fig[0], "Throughput vs latency, every set"))
    common = _common_levels(sets)
    if common:
        shared = [r for r in runs if any(_same_level_key(r, k) for k in common)]
        group, line = _level_name, series
    else:
        shared, group, line = runs, series, None
    for tail, filename, caption in (
        (False, "latency_cdf.png", "Latency CDF"),
        (True, "latency_tail.png", "Tail latency (1 - CDF, log)"),
    ):
        path, note = plots.latency_cdf(shared, out / filename, group, line, marks, tail=tail)
        figures.append((path, caption + (" at the load levels the sets share" if common else ", per set")))
        if note:
            notes.append(note)
    if fig[1]:
        notes.append(fig[1])
    return figures, notes


def _same_level_key(run: RunResult, key: tuple[str, float]) -> bool:
    mode, level = _level(run)
    return mode == key[0] and abs(level - key[1]) <= MATCH_TOLERANCE * max(level, key[1])


def _fmt(v: float | None, ratio: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}x" if ratio else f"{v:.4g}"


def table_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The ratio table as plain text, one line per matched load level."""
    lines = []
    for r in rows:
        cells = [f"{r['other']} / {r['baseline']}", r["load"]]
        for key, name in (("p50_ms", "p50"), ("p99_ms", "p99"), ("throughput", "throughput")):
            a, b, ratio = r[key]
            cells.append(f"{name} {_fmt(a)} -> {_fmt(b)} ({_fmt(ratio, True)})")
        a, b, ratio = r["j_per_inference"]
        cells.append(f"J/inf {_fmt(a)} -> {_fmt(b)} ({_fmt(ratio, True)})" if ratio else "J/inf not measured")
        if r["note"]:
            cells.append("NOTE " + r["note"])
        lines.append("  ".join(cells))
    return lines


def write_compare(
    folders: Sequence[Path], out: Path, names: Sequence[str] | None = None
) -> tuple[dict[str, Path], list[dict[str, Any]]]:
    """Read the sets, draw them, write compare.html and compare.json to ``out``."""
    from . import htmlreport
    from .output import write_json

    sets = load_sets(folders, names)
    out.mkdir(parents=True, exist_ok=True)
    figures, notes = draw(sets, out)
    rows = ratio_rows(sets)
    paths = {"html": out / "compare.html", "json": out / "compare.json"}
    write_json(
        {
            "tool": "wattserve report compare",
            "sets": [{"name": s.name, "folder": str(s.folder), "runs": len(s.runs), "capacity": s.capacity}
                     for s in sets],
            "ratios": rows,
            "notes": notes,
        },
        paths["json"],
    )  # fmt: skip
    for path, _caption in figures:
        if path is not None:
            paths[path.stem] = path
    htmlreport.write_compare_page(paths["html"], sets, rows, figures, notes)
    return paths, rows


def run_compare(args: argparse.Namespace) -> int:
    """``report compare``'s body (the parser is cli.add_report_parser)."""
    if len(args.runs) < 2:
        args.compare_parser.error("give at least two results folders to compare")
    missing = [str(r) for r in args.runs if not (r / "results.json").exists()]
    if missing:
        args.compare_parser.error(f"no results.json in {', '.join(missing)}")
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    out = args.out or Path("results") / ("compare-" + "-vs-".join(r.name for r in args.runs))
    paths, rows = write_compare(args.runs, out, names)
    for line in table_lines(rows) or ["no load level in common: compare the pictures"]:
        print(line)
    print(f"wrote {paths['html']}, {paths['json']} and the PNGs beside them")
    return 0
