"""One self-contained HTML report: tables of every run plus the PNGs embedded as base64."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .output import summary_row, value_text
from .runner import RunResult
from .stats import PERCENTILES, percentile_key

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3} td.l,th.l{text-align:left}
.bad{color:#a00;font-weight:bold} .good{color:#070}
.note{background:#fff8e0;border-left:4px solid #e0b000;padding:.4em .8em;margin:.4em 0}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0}
.answer{font-size:1.15em;background:#eef6ee;border-left:4px solid #070;padding:.3em .9em}
"""


def fmt(v: Any, digits: int = 3) -> str:
    return html.escape(value_text(v, digits))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1) -> str:
    """An HTML table; the first ``left`` columns are left-aligned text."""
    head = "".join(
        f'<th class="{"l" if i < left else ""}">{html.escape(h)}</th>' for i, h in enumerate(headers)
    )
    body = []
    for row in rows:
        cells = []
        for i, v in enumerate(row):
            cls = "l" if i < left else ""
            text = v if isinstance(v, _Raw) else fmt(v)
            cells.append(f'<td class="{cls}">{text}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


class _Raw(str):
    """Already-escaped HTML for a table cell."""


def raw(text: str) -> _Raw:
    return _Raw(text)


def runs_table(runs: Sequence[RunResult]) -> str:
    headers = [
        "run",
        "target/s",
        "offered/s",
        "achieved/s",
        "sent",
        "ok",
        "failed",
        *[percentile_key(p) for p in PERCENTILES],
        "mean",
        "max",
        "lag p99",
        "valid",
    ]
    rows = []
    for run in runs:
        r = summary_row(run)
        valid = (
            raw('<span class="good">yes</span>')
            if r["valid"]
            else raw(f'<span class="bad" title="{html.escape(r["invalid_reasons"])}">NO</span>')
        )
        rows.append(
            [
                r["label"],
                r["target_rate"],
                r["offered_rate"],
                r["achieved_rate"],
                r["sent"],
                r["completed"],
                r["failed"],
                *[r[f"latency_{percentile_key(p)}_ms"] for p in PERCENTILES],
                r["latency_mean_ms"],
                r["latency_max_ms"],
                r["lag_p99_ms"],
                valid,
            ]
        )
    return "<p>Latencies in ms, from each request's intended send time; rates in requests/s.</p>" + table(
        headers, rows
    )


def server_table(runs: Sequence[RunResult]) -> str:
    headers = [
        "run",
        "avg batch",
        "mean queue ms",
        "mean compute ms",
        "server req ms",
        "J/inference",
        "GPU W",
        "GPU util",
        "errors by status",
    ]
    rows = []
    for run in runs:
        s = run.server or {}
        errors = ", ".join(f"{k}: {v}" for k, v in run.summary["errors_by_status"].items()) or "none"
        rows.append(
            [
                run.label,
                s.get("avg_batch_size"),
                s.get("mean_queue_ms"),
                s.get("mean_compute_ms"),
                s.get("mean_request_ms"),
                s.get("energy_per_inference_j") if s else None,
                s.get("gpu_power_w"),
                s.get("gpu_utilization"),
                errors,
            ]
        )
    note = ""
    if not any(run.server for run in runs):
        note = '<p class="note">The server exposed no /metrics: server-side columns are not available.</p>'
    elif not any((run.server or {}).get("energy_per_inference_j") is not None for run in runs):
        note = (
            '<p class="note">Energy per inference, GPU power and utilization: not available '
            "(the server reported no GPU/energy measurement for these runs).</p>"
        )
    return note + table(headers, rows)


SIMULATED_BANNER = (
    "SIMULATED GPU: every energy, power and utilization figure here comes from wattserve's "
    "simulated GPU (WATTSERVE_SIMULATED_GPU, a power model driven by real busy time), not a measurement."
)


def is_simulated(runs: Sequence[Any]) -> bool:
    """True when any run's server figures carry source="simulated" (telemetry/simulated_gpu.py)."""
    for run in runs:
        server = run.server or {}
        if "simulated" in str(server.get("energy_source") or ""):
            return True
        if any(t.get("labels", {}).get("source") == "simulated" for t in server.get("telemetry", [])):
            return True
    return False


def telemetry_table(runs: Sequence[RunResult]) -> str:
    """Every telemetry series the server exported, per run (empty when there were none)."""
    rows = []
    for run in runs:
        for t in (run.server or {}).get("telemetry", []):
            labels = ",".join(f"{k}={v}" for k, v in t["labels"].items() if k not in ("model",))
            value = t.get("mean") if t["type"] != "counter" else t.get("delta")
            rows.append([run.label, t["name"], labels, t["type"], value, t.get("per_inference")])
    if not rows:
        return ""
    source = next(
        ((r.server or {}).get("energy_source") for r in runs if (r.server or {}).get("energy_source")),
        None,
    )
    intro = f"<p>Energy per inference above: {html.escape(source)}.</p>" if source else ""
    return (
        "<h2>Telemetry over each window</h2>" + intro + "<p>Gauges: mean over the window's "
        "scrapes; counters: increase over the window; histograms: mean observation.</p>"
        + table(["run", "metric", "labels", "type", "value", "per inference"], rows, left=4)
    )


def invalid_notes(runs: Sequence[RunResult]) -> str:
    items = [
        f"<li><b>{html.escape(r.label)}</b>: {html.escape('; '.join(r.summary['invalid_reasons']))}</li>"
        for r in runs
        if not r.summary["valid"]
    ]
    return f'<div class="note"><b>Invalid runs</b><ul>{"".join(items)}</ul></div>' if items else ""


def image(path: Path, caption: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    alt = html.escape(caption)
    return f'<h3>{alt}</h3><img alt="{alt}" src="data:image/png;base64,{data}">'


def _engine_ms_per_inference(run: RunResult) -> float | None:
    """Batch compute time / batch size: the engine time one inference cost (no energy data)."""
    server = run.server or {}
    compute, batch = server.get("mean_compute_ms"), server.get("avg_batch_size")
    return compute / batch if compute is not None and batch else None


def study_headline(
    verdict: dict[str, Any], runs: Sequence[RunResult], out_dir: Path
) -> tuple[str, Path | None]:
    """The study's question answered first: at each load, which configuration meets the
    objective at the fewest joules per inference (engine-ms per inference without energy
    data). One sentence per model and one picture (study_headline.png)."""
    from .plots import cost_per_load

    obj = verdict["objective"]
    objective = f"{percentile_key(obj['percentile'])} \u2264 {obj['slo_ms']:g} ms"
    by_label = {r.label: r for r in runs}
    rows = []
    for v in verdict["runs"]:
        run = by_label.get(v["label"])
        rows.append(
            {**v, "rate": v.get("target_rate"), "engine_ms": _engine_ms_per_inference(run) if run else None}
        )
    qualifying = [r for r in rows if r["meets"]]
    by_energy = bool(qualifying) and all(r["energy_per_inference_j"] is not None for r in qualifying)
    cost_key, unit = ("energy_per_inference_j", "J") if by_energy else ("engine_ms", "engine-ms")
    for r in rows:
        r["cost"], r["winner"] = r[cost_key], False
    sentences = []
    for model in dict.fromkeys(r["model"] for r in rows):
        answers = []
        loads = sorted({(r["rate"] or 0.0, r["workload"]) for r in rows if r["model"] == model})
        for rate, workload in loads:
            cands = [r for r in rows if r["model"] == model and r["workload"] == workload and r["meets"]]
            priced = [r for r in cands if r["cost"] is not None]
            where = f"{workload} ({rate:g}/s)" if rate else workload
            if not priced:
                answers.append(f"none at {where}")
                continue
            best = min(priced, key=lambda r: r["cost"])
            best["winner"] = True
            name = html.escape(str(best["batching"]))
            answers.append(f"<b>{name}</b> at {html.escape(where)} ({best['cost']:.3g} {unit})")
        fewest = "joules" if by_energy else "engine-ms"
        sentences.append(
            f"For {html.escape(str(model))}, the configuration meeting {objective} at the fewest "
            f"{fewest} per inference: {'; '.join(answers)}."
        )
    if not by_energy:
        sentences.append(
            "No energy was measured (no GPU or RAPL), so the cost is engine time per inference: batch "
            "compute time divided by batch size, from the server's metrics."
        )
    cost_label = "J per inference" if by_energy else "engine-ms per inference"
    picture, _note = cost_per_load(rows, out_dir / "study_headline.png", cost_label, objective)
    parts = ['<div class="answer">' + "".join(f"<p>{s}</p>" for s in sentences) + "</div>"]
    if picture is not None:
        data = base64.b64encode(picture.read_bytes()).decode("ascii")
        parts.append(f'<img alt="{html.escape(cost_label)} per load" src="data:image/png;base64,{data}">')
    return "".join(parts), picture


def write_report(
    path: Path,
    title: str,
    runs: Sequence[RunResult],
    figures: Sequence[tuple[Path | None, str]],
    notes: Sequence[str],
    intro_html: str = "",
    extra_html: str = "",
    headline_html: str = "",
) -> None:
    targets = sorted({(r.target.get("url"), r.target.get("model"), r.target.get("protocol")) for r in runs})
    created = datetime.now(UTC).isoformat(timespec="seconds")
    if len(targets) == 1:
        url, model, protocol = targets[0]
        where = f"Target {fmt(url)}, model {fmt(model)}, protocol {fmt(protocol)}."
    else:
        models = sorted({fmt(t[1]) for t in targets})
        where = f"{len(targets)} server configurations; models {', '.join(models)}."
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f'<p class="note"><b>{html.escape(SIMULATED_BANNER)}</b></p>' if is_simulated(runs) else "",
        f"<h1>{html.escape(title)}</h1>",
        headline_html,
        f"<p>Generated {created} by wattserve loadgen. {where}</p>",
        intro_html,
        invalid_notes(runs),
        "<h2>Runs</h2>",
        runs_table(runs),
        "<h2>Server side, over each measurement window</h2>",
        server_table(runs),
        telemetry_table(runs),
        extra_html,
        "<h2>Figures</h2>",
    ]
    parts += [image(p, caption) for p, caption in figures if p is not None]
    parts += [f'<p class="note">{html.escape(n)}</p>' for n in notes]
    parts.append("</body></html>")
    path.write_text("\n".join(parts))


def _ratio_cell(triple: Sequence[Any]) -> _Raw:
    a, b, ratio = triple
    if ratio is None:
        return raw(f"{fmt(a)} &rarr; {fmt(b)}" if a is not None or b is not None else "not measured")
    return raw(f"{fmt(a)} &rarr; {fmt(b)} <b>({ratio:.2f}x)</b>")


def write_compare_page(
    path: Path,
    sets: Sequence[Any],
    rows: Sequence[dict[str, Any]],
    figures: Sequence[tuple[Path | None, str]],
    notes: Sequence[str],
) -> None:
    """``report compare``'s page: the picture first, then the ratios, then every set's runs."""
    names = [s.name for s in sets]
    title = "wattserve compare: " + " vs ".join(names)
    intro = (
        f"<p>Baseline: <b>{html.escape(names[0])}</b>. Ratios are other / baseline at the load "
        "levels both ran (rates within 2%): below 1 is lower latency, above 1 more throughput "
        "or more joules. Latencies in ms from each request's intended send time.</p>"
    )
    headers = ["other / baseline", "load", "p50 ms", "p99 ms", "throughput req/s", "J/inference", "note"]
    body = [
        [
            f"{r['other']} / {r['baseline']}",
            r["load"],
            _ratio_cell(r["p50_ms"]),
            _ratio_cell(r["p99_ms"]),
            _ratio_cell(r["throughput"]),
            _ratio_cell(r["j_per_inference"]),
            raw(f'<span class="bad">{html.escape(r["note"])}</span>') if r["note"] else "",
        ]
        for r in rows
    ]
    ratios = table(headers, body, left=2) if rows else '<p class="note">No load level in common.</p>'
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
        intro,
    ]
    shown = [(p, c) for p, c in figures if p is not None]
    if shown:
        parts.append(image(*shown[0]))
    parts += ["<h2>Ratios at matched load</h2>", ratios]
    parts += [image(p, c) for p, c in shown[1:]]
    parts += [f'<p class="note">{html.escape(n)}</p>' for n in notes]
    for s in sets:
        parts += [f"<h2>{html.escape(s.name)}</h2><p>{html.escape(str(s.folder))}</p>"]
        parts += [invalid_notes(s.runs), runs_table(s.runs)]
    parts.append("</body></html>")
    path.write_text("\n".join(parts))
