"""The study runner: models x batching configurations x workloads, from one TOML file.

For every (model, batching) pair it starts the server itself (``python -m wattserve serve`` with
WATTSERVE_* settings), waits for readiness, runs every workload against it, stops it with
SIGTERM, and finally writes one report with the tables, the plots and a verdict: which
configuration wins under the latency objective (lowest energy per inference where the server
measures energy; otherwise highest throughput meeting the objective).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import os
import re
import signal
import sys
import tomllib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.console import Console
from rich.table import Table
from wattserve.batchers.registry import BatcherName

from . import client, report, stats, study_summary
from .arrivals import BurstSpec
from .progress import RichProgress, make_console
from .runner import LoadSpec, RunResult, prepare_target, run_load
from .server_process import DEFAULT_COMMAND, ServerProcess, free_port, server_env

TIE = 0.02  # achieved rates within 2% of each other count as equal throughput


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ShortVariant(_Strict):
    """``--short``: the same grid with shorter windows (the CI variant of a study)."""

    warmup_s: float = Field(0.5, ge=0)
    duration_s: float = Field(2.0, gt=0)
    pause_s: float = Field(0.2, ge=0)


class RealGpu(_Strict):
    """What ``scripts/gpu_study.py --real-gpu`` changes to run a simulated study on a lent GPU:
    these models (rates from their measured capacity), this objective, this environment
    (WATTSERVE_SIMULATED_GPU and the identity delays dropped)."""

    models: list[str] = Field(default_factory=lambda: ["resnet50"])
    slo_ms: float | None = Field(None, gt=0)
    warmup_s: float | None = Field(None, ge=0)
    duration_s: float | None = Field(None, gt=0)
    pause_s: float | None = Field(None, ge=0)
    env: dict[str, str] = Field(default_factory=dict)


class StudySection(_Strict):
    name: str = "study"
    out: str = "reports/study"
    percentile: float = Field(95.0, gt=0, lt=100)
    slo_ms: float = Field(..., gt=0, description="latency objective for the percentile")
    warmup_s: float = Field(3.0, ge=0)
    duration_s: float = Field(15.0, gt=0)
    seed: int = 0
    protocol: Literal["auto", "binary", "json"] = "auto"
    ready_timeout_s: float = 300.0
    stop_timeout_s: float = 30.0
    request_timeout_s: float = 60.0
    max_lag_ms: float = 10.0
    pause_s: float = Field(1.0, ge=0, description="idle time between workloads")
    command: list[str] = Field(default_factory=lambda: list(DEFAULT_COMMAND))
    env: dict[str, str] = Field(default_factory=dict, description="extra server environment")
    short: ShortVariant | None = None
    real_gpu: RealGpu | None = None


class ModelEntry(_Strict):
    name: str
    rates: dict[str, float] = Field(default_factory=dict, description="level name -> req/s")
    env: dict[str, str] = Field(default_factory=dict)


class Batching(_Strict):
    name: str
    batcher: BatcherName
    max_batch_size: int = Field(8, ge=1)
    max_queue_delay_ms: float | None = None
    preferred_batch_sizes: list[int] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class Workload(_Strict):
    name: str
    arrival: Literal["poisson", "constant", "bursty", "closed"] = "poisson"
    rate: float | None = Field(None, gt=0)
    level: str | None = None
    concurrency: int = Field(1, ge=1)
    burst_factor: float = 4.0
    burst_low: float = 0.0
    burst_on_s: float = 0.5
    burst_dwell: Literal["exponential", "fixed"] = "exponential"
    warmup_s: float | None = None
    duration_s: float | None = None

    @model_validator(mode="after")
    def _one_rate(self) -> Workload:
        if self.arrival != "closed" and (self.rate is None) == (self.level is None):
            raise ValueError(f"workload {self.name!r}: give exactly one of rate or level")
        return self


@dataclass(frozen=True)
class ServerConfig:
    model: ModelEntry
    batching: Batching

    @property
    def label(self) -> str:
        return f"{self.model.name} {self.batching.name}"


class Study(_Strict):
    study: StudySection
    model: list[ModelEntry] = Field(..., min_length=1)
    batching: list[Batching] = Field(..., min_length=1)
    workload: list[Workload] = Field(..., min_length=1)

    @model_validator(mode="after")
    def _levels_exist(self) -> Study:
        for w in self.workload:
            for m in self.model:
                if w.level is not None and w.level not in m.rates:
                    raise ValueError(f"model {m.name!r} has no rate for level {w.level!r}")
        return self

    def shortened(self) -> Study:
        """The ``--short`` variant: every configuration and workload, ``[study.short]``'s
        windows (defaults when the file has none); per-workload windows give way to them."""
        short = self.study.short or ShortVariant()
        section = self.study.model_copy(
            update={"warmup_s": short.warmup_s, "duration_s": short.duration_s, "pause_s": short.pause_s}
        )
        workloads = [w.model_copy(update={"warmup_s": None, "duration_s": None}) for w in self.workload]
        return self.model_copy(update={"study": section, "workload": workloads})

    def server_configs(self) -> list[ServerConfig]:
        return [ServerConfig(m, b) for m in self.model for b in self.batching]

    def rate_for(self, model: ModelEntry, workload: Workload) -> float | None:
        if workload.arrival == "closed":
            return None
        return workload.rate if workload.rate is not None else model.rates[workload.level or ""]

    def load_spec(self, cfg: ServerConfig, workload: Workload) -> LoadSpec:
        """The run for one workload; every configuration gets the same arrival schedule."""
        s = self.study
        burst = None
        if workload.arrival == "bursty":
            burst = BurstSpec(
                workload.burst_factor, workload.burst_low, workload.burst_on_s, workload.burst_dwell
            )
        return LoadSpec(
            arrival=workload.arrival,
            rate=self.rate_for(cfg.model, workload),
            concurrency=workload.concurrency,
            warmup_s=workload.warmup_s if workload.warmup_s is not None else s.warmup_s,
            duration_s=workload.duration_s if workload.duration_s is not None else s.duration_s,
            seed=s.seed + self.workload.index(workload),
            burst=burst,
            max_lag_ms=s.max_lag_ms,
            cooldown_s=s.request_timeout_s,
            label=f"{cfg.label} {workload.name}",
        )


def load_study(path: str | Path) -> Study:
    with Path(path).open("rb") as f:
        return Study.model_validate(tomllib.load(f))


def server_environment(study: Study, cfg: ServerConfig) -> dict[str, str]:
    b = cfg.batching
    base = {**os.environ, **study.study.env, **cfg.model.env, **b.env}
    return server_env(
        base,
        model=cfg.model.name,
        batcher=b.batcher,
        max_batch_size=b.max_batch_size,
        max_queue_delay_ms=b.max_queue_delay_ms,
        preferred_batch_sizes=b.preferred_batch_sizes or None,
    )


async def run_study(study: Study, progress: bool = True, console: Console | None = None) -> int:
    """Run the whole grid and write the report; exit code 1 if any server configuration failed."""
    console = console or make_console()
    s = study.study
    out = Path(s.out)
    sink = RichProgress(console) if progress else None
    runs: list[RunResult] = []
    configs: list[dict[str, Any]] = []
    interrupted = False
    _cancel_on_signals()
    try:
        await _run_grid(study, console, sink, runs, configs)
    except asyncio.CancelledError:  # SIGTERM/SIGINT: the servers are already stopped
        interrupted = True
        console.print("[red]interrupted: writing the report for the runs so far[/red]")
    result = verdict(runs, s.percentile, s.slo_ms)
    if interrupted:
        result["lines"].insert(0, "Interrupted before the grid was complete.")
    paths = report.write_all(
        out,
        runs,
        f"wattserve study: {s.name}",
        command=sys.argv,
        extra={
            "study": study.model_dump(),
            "server_configs": configs,
            "verdict": result,
            "interrupted": interrupted,
        },
        group=lambda r: f"{r.extra['model']} / {r.extra['workload']}",
        series=lambda r: f"{r.extra['batching']}",
        line=lambda r: f"{r.extra['batching']}",
        panel=lambda r: f"{r.extra['model']} / {r.spec.arrival}",
        intro_html=verdict_html(result, configs),
    )
    for line in result["lines"]:
        console.print(line)
    lines = first_screen(study, result, runs)
    summary = study_summary.write_summary(out, lines)
    console.print("\n".join(lines[: lines.index("## Every run")] if "## Every run" in lines else lines))
    console.print(f"wrote {paths['results']}, {paths['report']} and {summary}")
    if interrupted:
        return 130
    return 1 if any(c["error"] for c in configs) else 0


def first_screen(study: Study, result: dict[str, Any], runs: Sequence[RunResult]) -> list[str]:
    """summary.md's lines: the answer per load first (study_summary.py), every run after."""
    from .htmlreport import is_simulated

    power_model = study.study.env.get("WATTSERVE_SIMULATED_GPU") or os.environ.get("WATTSERVE_SIMULATED_GPU")
    return study_summary.summary_lines(
        f"wattserve study: {study.study.name}",
        result,
        [b.model_dump() for b in study.batching],
        [w.name for w in study.workload],
        is_simulated(runs),
        power_model,
    )


def _cancel_on_signals() -> None:
    """SIGTERM/SIGINT cancel the study, so each server is stopped before the process exits."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    if task is None:
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, task.cancel)


async def _run_grid(
    study: Study,
    console: Console,
    sink: RichProgress | None,
    runs: list[RunResult],
    configs: list[dict[str, Any]],
) -> None:
    s = study.study
    out = Path(s.out)
    for cfg in study.server_configs():
        port = free_port()
        log_path = out / "logs" / f"{_slug(cfg.label)}.log"
        proc = ServerProcess(s.command, server_environment(study, cfg), port, log_path, new_session=True)
        info: dict[str, Any] = {
            "label": cfg.label,
            "model": cfg.model.name,
            "batching": cfg.batching.model_dump(),
            "port": port,
            "log": str(proc.log_path),
            "error": None,
        }
        console.rule(f"[bold]{cfg.label}")
        try:
            await proc.astart()
            info["ready_s"] = await proc.await_ready(s.ready_timeout_s)
            console.print(f"server ready on port {port} after {info['ready_s']:.1f} s")
            async with client.make_session(s.request_timeout_s) as session:
                target = await prepare_target(
                    session, proc.url, cfg.model.name, s.protocol, seed=s.seed, ready_timeout_s=30
                )
                for workload in study.workload:
                    run = await run_load(session, target, study.load_spec(cfg, workload), sink)
                    run.extra = {
                        "model": cfg.model.name,
                        "batching": cfg.batching.name,
                        "workload": workload.name,
                        "server_config": cfg.label,
                    }
                    if cfg.batching.batcher == "adaptive":
                        run.extra["adaptive"] = await adaptive_state(session, proc.url)
                    runs.append(run)
                    _print_run(console, run)
                    await asyncio.sleep(s.pause_s)
        except Exception as exc:  # one broken configuration must not end the study
            info["error"] = f"{type(exc).__name__}: {exc}"
            console.print(f"[red]{cfg.label} failed: {info['error']}[/red]")
        finally:
            info["exit_code"] = await proc.astop(s.stop_timeout_s)
            info["killed"] = proc.killed
            configs.append(info)


async def adaptive_state(session: Any, url: str) -> dict[str, Any]:
    """The adaptive batcher's unit at the end of a run, from ``wattserve_adaptive_mode``
    (mode=seconds|joules, reason, source), and its target batch size: which unit it really
    decided in, whatever the study asked for."""
    try:
        async with session.get(f"{url}/metrics") as reply:
            text = await reply.text()
    except Exception as exc:  # a report without the mode beats a lost run
        return {"mode": None, "error": f"{type(exc).__name__}: {exc}"}
    return parse_adaptive_state(text)


def parse_adaptive_state(text: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    state: dict[str, Any] = {"mode": None, "reason": None, "source": None, "target_batch_size": None}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "wattserve_adaptive_mode" and sample.value == 1:
                state.update({k: sample.labels.get(k) for k in ("mode", "reason", "source")})
            elif sample.name == "wattserve_adaptive_target_batch_size":
                state["target_batch_size"] = sample.value
    return state


def verdict(runs: Sequence[RunResult], percentile: float, slo_ms: float) -> dict[str, Any]:
    """Which configuration wins, per model x workload and per model, under the objective.

    A run qualifies when it is valid and its percentile, counting failed requests as misses,
    is within the objective. Winners: lowest energy per inference when every qualifying run
    has an energy figure; otherwise the highest achieved throughput, ties (within 2%) broken
    by the lower percentile.
    """
    key = stats.percentile_key(percentile)
    rows = [_verdict_row(run, percentile, slo_ms) for run in runs]
    qualifying = [r for r in rows if r["meets"]]
    by_energy = bool(qualifying) and all(r["energy_per_inference_j"] is not None for r in qualifying)
    objective = f"{key} <= {slo_ms:g} ms"
    lines = [f"Objective: {objective} (failed requests count as misses; invalid runs never qualify)."]
    if by_energy:
        lines.append("Ranking: lowest energy per inference among runs meeting the objective.")
    else:
        lines.append(
            "Energy per inference: not available (the server reported no energy measurement on "
            "this machine), so configurations are ranked by throughput meeting the objective, ties "
            f"(within {TIE:.0%}) broken by the lower {key}."
        )
    per_workload = _per_workload_winners(rows, key, by_energy, lines)
    per_model = _per_model_winners(rows, key, by_energy, lines)
    return {
        "objective": {"percentile": percentile, "slo_ms": slo_ms},
        "ranked_by": "energy_per_inference" if by_energy else "throughput_meeting_objective",
        "runs": rows,
        "per_workload": per_workload,
        "per_model": per_model,
        "lines": lines,
    }


def _verdict_row(run: RunResult, percentile: float, slo_ms: float) -> dict[str, Any]:
    """One run against the objective: its percentile over the measurement window, failures
    counted as misses."""
    value = run.slo_percentile_ms(percentile)
    return {
        "label": run.label,
        "model": run.extra.get("model"),
        "batching": run.extra.get("batching"),
        "workload": run.extra.get("workload"),
        "target_rate": run.summary["target_rate"],
        "achieved_rate": run.summary["achieved_rate"],
        "percentile_ms": value,
        "valid": run.summary["valid"],
        "meets": bool(run.summary["valid"] and value <= slo_ms),
        "energy_per_inference_j": (run.server or {}).get("energy_per_inference_j"),
        "avg_batch_size": (run.server or {}).get("avg_batch_size"),
        "adaptive_mode": (run.extra.get("adaptive") or {}).get("mode"),
    }


def _per_workload_winners(
    rows: list[dict[str, Any]], key: str, by_energy: bool, lines: list[str]
) -> list[dict[str, Any]]:
    """The best configuration of each model x workload; one line each appended to ``lines``."""
    per_workload = []
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["model"], r["workload"])].append(r)
    for (model, workload), members in groups.items():
        cands = [r for r in members if r["meets"]]
        win = _best(cands, by_energy)
        per_workload.append(
            {"model": model, "workload": workload, "winner": win["batching"] if win else None,
             "met": len(cands), "of": len(members)}
        )  # fmt: skip
        lines.append(
            f"{model} / {workload}: "
            + (f"{win['batching']} wins ({_describe(win, key, by_energy)}); " if win else "no winner; ")
            + f"{len(cands)}/{len(members)} configurations met the objective."
        )
    return per_workload


def _per_model_winners(
    rows: list[dict[str, Any]], key: str, by_energy: bool, lines: list[str]
) -> list[dict[str, Any]]:
    """Each model's configurations ranked over all its workloads; one line each appended."""
    per_model = []
    models: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        models[r["model"]][r["batching"]].append(r)
    for model, batchings in models.items():
        scored = [_score_config(batching, members) for batching, members in batchings.items()]
        ordered = _rank_configs(scored, by_energy)
        best = ordered[0] if ordered and ordered[0]["met"] else None
        per_model.append({"model": model, "winner": best["batching"] if best else None, "ranking": ordered})
        if best:
            detail = (
                f"mean {best['mean_energy_met_j']:.4g} J/inference over the workloads it met"
                if by_energy
                else f"highest throughput meeting the objective {best['max_rate_met']:.4g} req/s, "
                f"mean {key} {best['mean_percentile_met_ms']:.4g} ms over the workloads it met"
            )
            lines.append(
                f"{model} overall: {best['batching']} (met {best['met']}/{best['of']} workloads; {detail})."
            )
        else:
            lines.append(f"{model} overall: no configuration met the objective in any workload.")
    return per_model


def _score_config(batching: str, members: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration of one model over its workloads: how many it met, and how well."""
    met = [r for r in members if r["meets"]]
    energies = [r["energy_per_inference_j"] for r in met if r["energy_per_inference_j"]]
    return {
        "batching": batching,
        "met": len(met),
        "of": len(members),
        "max_rate_met": max((r["achieved_rate"] for r in met), default=None),
        "mean_energy_met_j": sum(energies) / len(energies) if energies else None,
        "mean_percentile_met_ms": sum(r["percentile_ms"] for r in met) / len(met) if met else None,
    }


def _rank_configs(scored: list[dict[str, Any]], by_energy: bool) -> list[dict[str, Any]]:
    """Most workloads met first; then lowest mean energy, or highest rate (ties by latency)."""
    inf = float("inf")
    if by_energy:
        return sorted(scored, key=lambda c: (-c["met"], c["mean_energy_met_j"] or inf))
    ordered = sorted(scored, key=lambda c: (-c["met"], -(c["max_rate_met"] or 0.0)))
    if not ordered or not ordered[0]["met"]:
        return ordered
    top = [c for c in ordered if c["met"] == ordered[0]["met"]]
    best_rate = top[0]["max_rate_met"]
    tied = [c for c in top if c["max_rate_met"] >= (1 - TIE) * best_rate]
    winner = min(tied, key=lambda c: c["mean_percentile_met_ms"])
    return [winner, *[c for c in ordered if c is not winner]]


def _best(cands: list[dict[str, Any]], by_energy: bool) -> dict[str, Any] | None:
    if not cands:
        return None
    if by_energy:
        return min(cands, key=lambda r: r["energy_per_inference_j"])
    top = max(r["achieved_rate"] for r in cands)
    tied = [r for r in cands if r["achieved_rate"] >= (1 - TIE) * top]
    return min(tied, key=lambda r: r["percentile_ms"])


def _describe(row: dict[str, Any], key: str, by_energy: bool) -> str:
    parts = [f"{key} {row['percentile_ms']:.4g} ms", f"{row['achieved_rate']:.4g} req/s"]
    if by_energy:
        parts.insert(0, f"{row['energy_per_inference_j']:.4g} J/inference")
    return ", ".join(parts)


def verdict_html(result: dict[str, Any], configs: Sequence[dict[str, Any]]) -> str:
    from .htmlreport import table

    key = stats.percentile_key(result["objective"]["percentile"])
    parts = ["<h2>Which configuration wins</h2><ul>"]
    parts += [f"<li>{html.escape(line)}</li>" for line in result["lines"]]
    parts.append("</ul>")
    rows = [
        [r["model"], r["workload"], r["batching"], r["target_rate"], r["achieved_rate"],
         r["percentile_ms"], r["avg_batch_size"], r["energy_per_inference_j"], r["valid"], r["meets"]]
        for r in result["runs"]
    ]  # fmt: skip
    parts.append(
        table(
            [
                "model",
                "workload",
                "batching",
                "target/s",
                "achieved/s",
                f"{key} ms (errors=miss)",
                "avg batch",
                "J/inference",
                "valid",
                "meets",
            ],
            rows,
            left=3,
        )
    )
    failed = [c for c in configs if c.get("error")]
    if failed:
        items = "".join(
            f"<li><b>{html.escape(c['label'])}</b>: {html.escape(c['error'])} "
            f"(log {html.escape(c['log'])})</li>"
            for c in failed
        )
        parts.append(f'<div class="note"><b>Server configurations that failed</b><ul>{items}</ul></div>')
    return "".join(parts)


def _print_run(console: Console, run: RunResult) -> None:
    s, lat = run.summary, run.summary["latency_ms"]
    server = run.server or {}
    from .htmlreport import SIMULATED_BANNER, is_simulated

    if is_simulated([run]):
        console.print(f"[bold yellow]{SIMULATED_BANNER}[/bold yellow]")
    table = Table(show_header=True, box=None)
    for col in ("run", "achieved/s", "p50", "p95", "p99", "avg batch", "J/inf", "valid"):
        table.add_column(col, justify="right")
    table.add_row(
        run.label,
        _f(s["achieved_rate"]),
        _f(lat["p50"]),
        _f(lat["p95"]),
        _f(lat["p99"]),
        _f(server.get("avg_batch_size")),
        _f(server.get("energy_per_inference_j")),
        "yes" if s["valid"] else "NO: " + "; ".join(s["invalid_reasons"]),
    )
    console.print(table)


def _f(v: Any) -> str:
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")
