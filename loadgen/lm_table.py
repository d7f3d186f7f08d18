"""The terminal summary of a language-model run set: tokens/s, TTFT, TPOT and latency
percentiles per run (milliseconds, HDR histograms), and who counted the tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

COLUMNS = ("run", "ok", "tokens", "tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
           "lat p50", "lat p99", "counted by", "J/token")  # fmt: skip


def lm_rows(runs: Sequence[Any]) -> list[list[str]]:
    """One row of text per run that has language-model figures."""
    rows = []
    for run in runs:
        lm = run.summary.get("lm")
        if not lm:
            continue
        ttft, tpot, lat = lm["ttft_ms"], lm["tpot_ms"], lm["latency_ms"]
        joules = ((run.server or {}).get("lm") or {}).get("energy_per_output_token_j")
        rows.append([
            run.label, str(run.summary["completed"]), str(lm["output_tokens"]), _f(lm["output_tokens_per_s"]),
            _f(ttft["p50"]), _f(ttft["p99"]), _f(tpot["p50"]), _f(tpot["p99"]),
            _f(lat["p50"]), _f(lat["p99"]), ", ".join(lm["token_source"]) or "-",
            _f(joules) if run.server else "n/a",
        ])  # fmt: skip
    return rows


def lm_html(runs: Sequence[Any]) -> str:
    """The same table for report.html ("" when no run has language-model figures)."""
    from .htmlreport import table

    rows = lm_rows(runs)
    if not rows:
        return ""
    head = (
        "<h2>Language model</h2><p>Milliseconds from the intended send time, HDR percentiles of the "
        "window's answered requests; TPOT per output token after the first; tokens/s: output tokens "
        "of the requests answered inside the window / its length.</p>"
    )
    return head + table(COLUMNS, rows)


def print_lm_table(console: Console, runs: Sequence[Any]) -> None:
    table = Table(title="language model (ms from intended send time; TPOT ms per token after the first)")
    for col in COLUMNS:
        table.add_column(col, justify="right")
    for row in lm_rows(runs):
        table.add_row(*row)
    console.print(table)


def _f(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)
