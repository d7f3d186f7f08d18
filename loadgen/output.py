"""Machine-readable results: results.json, summary.csv (a row per run), requests.csv (a row per
request)."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .runner import RunResult
from .stats import PERCENTILES, percentile_key

# a language model's run (empty for other models): HDR percentiles of TTFT, TPOT, latency
LM_FIGURES = ("ttft", "tpot")
LM_SUMMARY_COLUMNS = [
    *[f"{fig}_{percentile_key(p)}_ms" for fig in LM_FIGURES for p in PERCENTILES],
    "output_tokens",
    "output_tokens_per_s",
    "mean_output_tokens",
    "mean_prompt_tokens",
    "token_source",
    "server_output_tokens_per_s",
    "energy_per_output_token_j",
]
LM_REQUEST_COLUMNS = ["ttft_ms", "tpot_ms", "output_tokens", "prompt_tokens", "token_source"]
SUMMARY_COLUMNS = [
    "label",
    "model",
    "batching",
    "workload",
    "mode",
    "arrival",
    "target_rate",
    "concurrency",
    "offered_rate",
    "achieved_rate",
    "sent",
    "completed",
    "failed",
    "error_rate",
    *[f"latency_{percentile_key(p)}_ms" for p in PERCENTILES],
    "latency_mean_ms",
    "latency_max_ms",
    "lag_p99_ms",
    "lag_max_ms",
    "valid",
    "invalid_reasons",
    "avg_batch_size",
    "mean_queue_ms",
    "mean_compute_ms",
    "energy_per_inference_j",
    "gpu_power_w",
    "gpu_utilization",
    *LM_SUMMARY_COLUMNS,
]
REQUEST_COLUMNS = [
    "run",
    "index",
    "phase",
    "intended_s",
    "sent_s",
    "done_s",
    "latency_ms",
    "lag_ms",
    "status",
    "queue_ms",
    "compute_ms",
    "batch_size",
    *LM_REQUEST_COLUMNS,
]


def value_text(v: Any, digits: int = 3) -> str:
    """A table cell as plain text: "-" for nothing, yes/no, a float to ``digits``
    significant digits (whole from 1,000 on, "∞" when not finite), anything else as str."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "∞"
        return f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def summary_row(run: RunResult) -> dict[str, Any]:
    s, server = run.summary, run.server or {}
    lat, lag = s["latency_ms"], s["lag_ms"] or {}
    row = {
        "label": run.label,
        "model": run.extra.get("model", run.target.get("model")),
        "batching": run.extra.get("batching"),
        "workload": run.extra.get("workload"),
        "mode": s["mode"],
        "arrival": s["arrival"],
        "target_rate": s["target_rate"],
        "concurrency": s["concurrency"],
        "offered_rate": s["offered_rate"],
        "achieved_rate": s["achieved_rate"],
        "sent": s["sent"],
        "completed": s["completed"],
        "failed": s["failed"],
        "error_rate": s["error_rate"],
        "latency_mean_ms": lat["mean"],
        "latency_max_ms": lat["max"],
        "lag_p99_ms": lag.get("p99"),
        "lag_max_ms": lag.get("max"),
        "valid": s["valid"],
        "invalid_reasons": "; ".join(s["invalid_reasons"]),
        "avg_batch_size": server.get("avg_batch_size"),
        "mean_queue_ms": server.get("mean_queue_ms"),
        "mean_compute_ms": server.get("mean_compute_ms"),
        "energy_per_inference_j": server.get("energy_per_inference_j"),
        "gpu_power_w": server.get("gpu_power_w"),
        "gpu_utilization": server.get("gpu_utilization"),
    }
    for p in PERCENTILES:
        row[f"latency_{percentile_key(p)}_ms"] = lat[percentile_key(p)]
    lm = s.get("lm") or {}
    for fig in LM_FIGURES:
        for p in PERCENTILES:
            row[f"{fig}_{percentile_key(p)}_ms"] = (lm.get(f"{fig}_ms") or {}).get(percentile_key(p))
    for key in ("output_tokens", "output_tokens_per_s", "mean_output_tokens", "mean_prompt_tokens"):
        row[key] = lm.get(key)
    row["token_source"] = ", ".join(lm.get("token_source", [])) or None
    server_lm = server.get("lm") or {}  # the server's own count (lm_window.py)
    row["server_output_tokens_per_s"] = server_lm.get("output_tokens_per_s")
    row["energy_per_output_token_j"] = server_lm.get("energy_per_output_token_j")
    return row


def write_summary_csv(runs: Sequence[RunResult], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS)
        writer.writeheader()
        for run in runs:
            writer.writerow({k: _cell(v) for k, v in summary_row(run).items()})


def write_requests_csv(runs: Sequence[RunResult], path: Path) -> None:
    """Every request of every run; ``phase`` says whether it counted (``measure``)."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(REQUEST_COLUMNS)
        for run in runs:
            w0 = run.spec.warmup_s
            w1 = w0 + run.spec.duration_s
            for r in run.records:
                phase = "warmup" if r.intended_s < w0 else "measure" if r.intended_s < w1 else "after"
                writer.writerow(
                    [
                        run.label,
                        r.index,
                        phase,
                        f"{r.intended_s:.6f}",
                        f"{r.sent_s:.6f}",
                        f"{r.done_s:.6f}",
                        f"{r.latency_s * 1000:.3f}",
                        f"{r.lag_s * 1000:.3f}",
                        r.status,
                        _cell(r.queue_ms),
                        _cell(r.compute_ms),
                        _cell(r.batch_size),
                        _ms(r.ttft_s),
                        _ms(r.tpot_s),
                        _cell(r.output_tokens),
                        _cell(r.prompt_tokens),
                        _cell(r.token_source),
                    ]
                )


def results_document(
    runs: Sequence[RunResult], command: Sequence[str] | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "tool": "wattserve loadgen",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": list(command) if command else None,
        "valid": all(r.summary["valid"] for r in runs),
        "runs": [r.to_json() for r in runs],
        **extra,
    }


def write_json(doc: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(_clean(doc), indent=2, allow_nan=False) + "\n")


def _clean(obj: Any) -> Any:
    """JSON has no infinity: write it as null (the reasons say why)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item"):  # numpy scalars
        return _clean(obj.item())
    return obj


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v * 1000:.3f}"


def _cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}" if math.isfinite(v) else ""
    return v
