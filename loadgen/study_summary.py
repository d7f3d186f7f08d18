"""A study's answer on its first screen: ``summary.md``, printed at the end of the run too.

The question a study asks is which configuration spends the fewest joules per inference
while meeting the latency objective, at each load, and (when the grid has the adaptive
batcher in both units) whether deciding in joules beats deciding in engine-seconds. The
first ~20 lines answer it per load (winner, its J/inference, each adaptive configuration,
the best fixed one, who missed); every run's row follows. When the GPU is simulated the
first line says so and every energy column is labelled simulated.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .output import value_text
from .stats import percentile_key

SUMMARY_MD = "summary.md"
UNIT_ENV = "WATTSERVE_ADAPTIVE_UNIT"


def simulated_banner(power_model: str | None) -> str:
    model = f" (power model {power_model!r})" if power_model else ""
    return (
        f"**SIMULATED GPU{model}: every J/inference here is computed by wattserve's simulated GPU "
        "(WATTSERVE_SIMULATED_GPU), a power model driven by real busy time, not measured.**"
    )


def adaptive_roles(batchings: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Adaptive configuration name -> the unit it is asked to decide in ("joules",
    "seconds", or "auto" when the study leaves it to the server)."""
    roles = {}
    for b in batchings:
        if b.get("batcher") != "adaptive":
            continue
        unit = str((b.get("env") or {}).get(UNIT_ENV, "")).lower()
        name = str(b["name"])
        if unit not in ("joules", "seconds"):
            unit = "joules" if "joule" in name else "seconds" if "second" in name else "auto"
        roles[name] = unit
    return roles


def _pct(a: float, b: float) -> str:
    return f"{(a / b - 1) * 100:+.0f}%"


def _cell(row: dict[str, Any] | None, key: str, by_energy: bool) -> str:
    if row is None:
        return "-"
    p = f"{key} {row['percentile_ms']:.0f} ms"
    if not row["meets"]:
        return f"misses ({p})" if row["valid"] else f"invalid run ({p})"
    cost = row["energy_per_inference_j"]
    batch = row.get("avg_batch_size")
    b = f", batch {batch:.1f}" if batch else ""
    return f"{cost:.3g} J ({p}{b})" if by_energy and cost is not None else f"{p}{b}"


def summary_lines(
    title: str,
    verdict: dict[str, Any],
    batchings: Sequence[dict[str, Any]],
    workload_order: Sequence[str],
    simulated: bool,
    power_model: str | None = None,
) -> list[str]:
    """The Markdown summary: the answer first (one table row per model x load), then the
    adaptive comparisons, then every run."""
    obj = verdict["objective"]
    key = percentile_key(obj["percentile"])
    objective = f"{key} <= {obj['slo_ms']:g} ms"
    rows: list[dict[str, Any]] = verdict["runs"]
    by_energy = verdict["ranked_by"] == "energy_per_inference"
    sim = " (simulated)" if simulated else ""
    roles = adaptive_roles(batchings)
    adaptive = list(roles)
    lines = [simulated_banner(power_model)] if simulated else []
    lines += [f"# {title}", ""]
    cost = f"J/inference{sim}" if by_energy else "throughput"
    lines.append(
        f"**Which configuration meets {objective} at the lowest {cost}, per load"
        + (" -- and does adaptive in joules beat adaptive in seconds?**" if len(adaptive) > 1 else "?**")
    )
    lines.append("")
    head = ["load", "winner", f"J/inf{sim}", *adaptive, "best fixed", "not meeting it"]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    models = list(dict.fromkeys(r["model"] for r in rows))
    order = {w: i for i, w in enumerate(workload_order)}
    cells: list[tuple[str, dict[str, dict[str, Any]]]] = []
    for model in models:
        workloads = sorted(
            {r["workload"] for r in rows if r["model"] == model}, key=lambda w: order.get(w, 99)
        )
        for workload in workloads:
            group = {r["batching"]: r for r in rows if r["model"] == model and r["workload"] == workload}
            rate = next(iter(group.values()))["target_rate"]
            where = (f"{model} / " if len(models) > 1 else "") + workload + (f" ({rate:g}/s)" if rate else "")
            cells.append((where, group))
            met = [r for r in group.values() if r["meets"]]
            win = _winner(met, by_energy)
            fixed = _winner([r for r in met if r["batching"] not in roles], by_energy)
            missed = sorted(r["batching"] for r in group.values() if not r["meets"])
            row = [
                where,
                f"**{win['batching']}**" if win else "none met it",
                f"{win['energy_per_inference_j']:.3g}" if win and by_energy else "-",
                *[_cell(group.get(a), key, by_energy) for a in adaptive],
                f"{fixed['batching']}: {_cell(fixed, key, by_energy)}" if fixed else "none met it",
                ", ".join(missed) or "none",
            ]
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines += _comparisons(cells, roles, by_energy, sim)
    lines.append(
        f"Objective: {objective} over each measurement window, failed requests counted as misses; "
        "an invalid run (generator lag) never qualifies. "
        + (
            f"J/inference{sim}: the metered device's energy, busy + idle, over the window / inferences."
            if by_energy
            else "No energy was measured, so the winner is the highest throughput meeting the objective."
        )
    )
    lines += ["", "## Every run", ""]
    head = ["model", "workload", "batching", "target/s", "achieved/s", f"{key} ms", "meets", "avg batch",
            f"J/inf{sim}", "adaptive unit"]  # fmt: skip
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        vals = [r["model"], r["workload"], r["batching"], r["target_rate"], r["achieved_rate"],
                r["percentile_ms"], r["meets"], r["avg_batch_size"], r["energy_per_inference_j"],
                r.get("adaptive_mode")]  # fmt: skip
        lines.append("| " + " | ".join(value_text(v, 4) for v in vals) + " |")
    return lines


def _comparisons(
    cells: Sequence[tuple[str, dict[str, dict[str, Any]]]], roles: dict[str, str], by_energy: bool, sim: str
) -> list[str]:
    """Adaptive in joules vs in seconds, and each adaptive vs the best fixed, over the loads
    where both met the objective; plus which unit each adaptive run really decided in."""
    if not by_energy or not roles:
        return []
    out = []
    joules = next((n for n, u in roles.items() if u == "joules"), None)
    seconds = next((n for n, u in roles.items() if u == "seconds"), None)
    if joules and seconds:
        out.append(f"**{joules} vs {seconds}** (J/inference{sim}): " + _versus(cells, joules, seconds))
    for name in roles:
        diffs = []
        for where, group in cells:
            a = group.get(name)
            fixed = _winner([r for r in group.values() if r["meets"] and r["batching"] not in roles], True)
            if a and a["meets"] and fixed:
                pct = _pct(a["energy_per_inference_j"], fixed["energy_per_inference_j"])
                diffs.append(f"{where.split(' (')[0]} {pct}")
            elif a and not a["meets"]:
                what = "missed" if a["valid"] else "invalid run"
                diffs.append(f"{where.split(' (')[0]} {what}" + (" (a fixed one met it)" if fixed else ""))
        if diffs:
            out.append(f"**{name} vs the best fixed configuration**: {'; '.join(diffs)}.")
    modes = []
    for name, unit in roles.items():
        seen = sorted({str(g[name].get("adaptive_mode")) for _, g in cells if name in g})
        modes.append(f"{name} asked for {unit}, decided in {'/'.join(seen)}")
        if unit in ("joules", "seconds") and seen != [unit]:
            out.append(
                f"**Caveat:** {name} was asked to decide in {unit} ({UNIT_ENV}) but its server "
                f"reported wattserve_adaptive_mode {'/'.join(seen)}: "
                f"its figures are not those of {unit} mode."
            )
    out.append("Units (wattserve_adaptive_mode at the end of each run): " + "; ".join(modes) + ".")
    return [*out, ""]


def _versus(cells: Sequence[tuple[str, dict[str, dict[str, Any]]]], a: str, b: str) -> str:
    wins, both, parts = 0, 0, []
    for where, group in cells:
        ra, rb = group.get(a), group.get(b)
        load = where.split(" (")[0]
        if not ra or not rb:
            continue
        if ra["meets"] and rb["meets"]:
            both += 1
            ea, eb = ra["energy_per_inference_j"], rb["energy_per_inference_j"]
            wins += ea < eb
            parts.append(f"{load} {_pct(ea, eb)}")
        else:
            parts.append(
                f"{load}: "
                + ", ".join(
                    f"{n} {'missed' if r['valid'] else 'invalid run'}"
                    for n, r in ((a, ra), (b, rb))
                    if not r["meets"]
                )
            )
    verdict = (
        f"{a} lower at {wins} of {both} loads where both met the objective"
        if both
        else "no load where both met it"
    )
    return f"{verdict} ({'; '.join(parts)})."


def _winner(cands: list[dict[str, Any]], by_energy: bool) -> dict[str, Any] | None:
    if not cands:
        return None
    if by_energy:
        priced = [r for r in cands if r["energy_per_inference_j"] is not None]
        return min(priced, key=lambda r: r["energy_per_inference_j"]) if priced else None
    return max(cands, key=lambda r: (r["achieved_rate"], -r["percentile_ms"]))


def write_summary(out_dir: Path, lines: Sequence[str]) -> Path:
    path = out_dir / SUMMARY_MD
    path.write_text("\n".join(lines) + "\n")
    return path
