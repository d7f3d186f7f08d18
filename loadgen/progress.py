"""What a person watching sees: a live rich bar per run on a terminal, and one plain line per
finished run or search step everywhere (a log file, a pipe, CI), printed as it finishes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from .runner import LiveCounts

if TYPE_CHECKING:
    from .runner import RunResult
    from .search import Objective


def make_console() -> Console:
    """A stderr console; 160 columns wide when output goes to a file or pipe (logs, CI)."""
    console = Console(stderr=True)
    return console if console.is_terminal else Console(stderr=True, width=160)


def _ms(v: Any) -> str:
    return "-" if v is None else f"{v:.3g}"


def step_line(
    index: int,
    total: int,
    run: RunResult,
    objective: Objective | None = None,
    verdict: dict[str, Any] | None = None,
) -> str:
    """One line for a finished run (``run 2/3``) or SLO-search step (``step 2/12``)."""
    s, lat = run.summary, run.summary["latency_ms"]
    lag = (s.get("lag_ms") or {}).get("p99")
    parts = [
        f"{'step' if objective else 'run'} {index + 1}/{total}",
        run.label,
        f"achieved {s['achieved_rate']:.4g}/s",
        f"p50 {_ms(lat['p50'])} p99 {_ms(lat['p99'])} ms",
    ]
    if objective is not None and verdict is not None:
        key = f"p{objective.percentile:g}"
        parts.append(f"{key} (errors=miss) {_ms(verdict['percentile_ms'])} ms vs {objective.slo_ms:g}")
    if lag is not None:
        parts.append(f"lag p99 {lag:.2g} ms")
    parts.append("valid" if s["valid"] else "INVALID: " + "; ".join(s["invalid_reasons"]))
    if verdict is not None:
        parts.append("-> PASS" if verdict["passed"] else "-> fail")
    return escape("  ".join(parts))


class RichProgress:
    """Implements runner.ProgressSink. On a terminal: a live bar, refreshed twice a second from
    rich's own thread. Elsewhere (a pipe, a log file) no bar, which would only appear at its
    end: a plain line when each run starts; the caller prints one when it finishes."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def start(self, label: str, total_s: float) -> None:
        if not self.console.is_terminal:
            self.console.print(escape(f"{label}: running, {total_s:.3g} s of warm-up and window ..."))
            return
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed:>5.1f}/{task.total:.0f}s"),
            TextColumn("{task.fields[counts]}"),
            TimeRemainingColumn(),
            console=self.console,
            refresh_per_second=2,
            transient=True,  # the finished run's line replaces it
        )
        self._progress.start()
        self._task = self._progress.add_task(label, total=total_s, counts="")

    def update(self, elapsed_s: float, live: LiveCounts) -> None:
        if self._progress is None or self._task is None:
            return
        counts = (
            f"sent {live.sent} done {live.done} err {live.errors} "
            f"in-flight {live.in_flight} max-lag {live.max_lag_ms:.1f}ms"
        )
        self._progress.update(self._task, completed=elapsed_s, counts=counts)

    def stop(self) -> None:
        if self._progress is not None:
            if self._task is not None:
                self._progress.update(self._task, completed=self._progress.tasks[0].total)
            self._progress.stop()
        self._progress, self._task = None, None
