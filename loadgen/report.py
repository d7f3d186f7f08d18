"""Write everything a run set produces into one folder: JSON, CSVs, PNGs, HTML."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import htmlreport, output, plots
from .runner import RunResult

RESULTS = "results.json"
SUMMARY = "summary.csv"
REQUESTS = "requests.csv"
REPORT = "report.html"


def write_all(
    out_dir: Path,
    runs: Sequence[RunResult],
    title: str,
    command: Sequence[str] | None = None,
    extra: dict[str, Any] | None = None,
    group: plots.GroupKey | None = None,
    series: plots.GroupKey | None = None,
    line: plots.GroupKey | None = None,
    panel: plots.GroupKey | None = None,
    intro_html: str = "",
    extra_html: str = "",
    per_request_csv: bool = True,
) -> dict[str, Path]:
    """Write results.json, summary.csv, requests.csv, the PNGs and report.html; return paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"results": out_dir / RESULTS, "summary": out_dir / SUMMARY, "report": out_dir / REPORT}
    marks = plots.Marks.from_extra(extra)
    figures: list[tuple[Path | None, str]] = []
    notes: list[str] = []
    for fn, filename, caption in (
        (
            lambda p: plots.throughput_latency(runs, p, series, panel, marks),
            "throughput_latency.png",
            "Throughput vs latency percentile",
        ),
        (lambda p: plots.latency_cdf(runs, p, group, line, marks), "latency_cdf.png", "Latency CDF"),
        (
            lambda p: plots.latency_cdf(runs, p, group, line, marks, tail=True),
            "latency_tail.png",
            "Tail latency (1 - CDF, log)",
        ),
        (
            lambda p: plots.energy_latency(runs, p, line),
            "energy_latency.png",
            "Energy per inference vs p95 latency",
        ),
        (lambda p: plots.batch_sizes(runs, p), "batch_sizes.png", "Batch-size distribution"),
        (lambda p: plots.power_over_time(runs, p, line), "power.png", "Power over time"),
    ):
        path, note = fn(out_dir / filename)
        figures.append((path, caption))
        if path is not None:
            paths[filename.removesuffix(".png")] = path
        if note:
            notes.append(note)
    doc = output.results_document(runs, command, notes=notes, **(extra or {}))
    output.write_json(doc, paths["results"])
    output.write_summary_csv(runs, paths["summary"])
    if per_request_csv:
        paths["requests"] = out_dir / REQUESTS
        output.write_requests_csv(runs, paths["requests"])
    headline = ""
    if extra and extra.get("verdict"):  # a study: answer its question first
        headline, picture = htmlreport.study_headline(extra["verdict"], runs, out_dir)
        if picture is not None:
            paths["study_headline"] = picture
    htmlreport.write_report(paths["report"], title, runs, figures, notes, intro_html, extra_html, headline)
    return paths
