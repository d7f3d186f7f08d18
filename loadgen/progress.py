"""A rich progress line per run: time through warm-up and window, sent, answered, errors, lag."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from .runner import LiveCounts


def make_console() -> Console:
    """A stderr console; 160 columns wide when output goes to a file or pipe (logs, CI)."""
    console = Console(stderr=True)
    return console if console.is_terminal else Console(stderr=True, width=160)


class RichProgress:
    """Implements runner.ProgressSink. Refreshes twice a second from rich's own thread."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def start(self, label: str, total_s: float) -> None:
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed:>5.1f}/{task.total:.0f}s"),
            TextColumn("{task.fields[counts]}"),
            TimeRemainingColumn(),
            console=self.console,
            refresh_per_second=2,
            transient=False,
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
