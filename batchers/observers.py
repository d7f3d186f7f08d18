"""What a batcher reports: one observer, called at fixed points of every batch.

A batcher calls exactly one ``BatchObserver``. The server composes its serving metrics,
the energy meter of the engine's device and telemetry's per-batch record into one
(``server/models/batch_observer.py``); tests pass their own; without one, ``NULL_OBSERVER``.

Where each call runs matters: ``on_dispatch`` runs wherever a batch is taken from the
queue (the event loop, or an engine thread when it chains the next batch), the
``on_batch_start``/``on_batch_end`` pair and ``on_step`` on the engine's worker thread
right around the model call(s), and ``on_batch`` on the event loop once per executed batch
(or iteration), before its requests are answered. None of them may block for long.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from wattserve.batchers.types import WorkItem


@dataclass(slots=True)  # not frozen: a frozen init sets each field through object.__setattr__
class BatchReport:
    """One executed batch (request-level) or one iteration (iteration-level)."""

    size: int  # rows (request-level) or states (iteration-level) in the model call
    started: float  # monotonic seconds, engine side
    finished: float
    energy: Any = None  # what on_batch_end returned for it
    padded: int = 0  # slots the engine added to reach one of its batch sizes
    # rows of ``size`` that were no request's: a stateful model's null requests in idle slots
    # (Triton counts them in the batch's size, not in its inferences)
    null_rows: int = 0
    # Iteration-level only: arrival -> result of each request this iteration finished (a
    # request-level batch's requests all finish with it: None).
    time_to_result: tuple[float, ...] | None = None
    input_s: float = 0.0  # gathering the batch's inputs (Triton's compute_input)
    output_s: float = 0.0  # slicing its outputs back to requests (Triton's compute_output)

    @property
    def compute_s(self) -> float:
        return self.finished - self.started


class BatchObserver(Protocol):
    """The one listener a batcher calls; see the module docstring for where each runs."""

    def on_dispatch(self, items: Sequence[WorkItem], now: float) -> None:
        """``items`` left the queue for a batch (or a running set) at ``now``."""

    def on_batch_start(self) -> Any:
        """Engine thread, right before the model call; returns a mark for ``on_batch_end``."""

    def on_batch_end(self, mark: Any) -> Any:
        """Engine thread, right after it (also when it failed); returns the batch's energy
        record (``measured_joules`` reads it), or None."""

    def on_batch(self, report: BatchReport) -> None:
        """Event loop, once per executed batch, before its requests are answered."""

    def on_step(self, states: int, seconds: float) -> None:
        """Engine thread, once per model call of an engine that reports its steps
        (``engines.base.ReportsSteps``), whichever policy formed the batch."""


class NullObserver:
    """Observes nothing: the default, for unit tests and bare batchers."""

    def on_dispatch(self, items: Sequence[WorkItem], now: float) -> None:
        return None

    def on_batch_start(self) -> Any:
        return None

    def on_batch_end(self, mark: Any) -> Any:
        return None

    def on_batch(self, report: BatchReport) -> None:
        return None

    def on_step(self, states: int, seconds: float) -> None:
        return None


NULL_OBSERVER = NullObserver()


def measured_joules(energy: Any) -> float | None:
    """The joules of one batch when its energy record has them already (a meter that
    measures per batch), else None: telemetry's window attribution makes the figure final
    only after the next counter step, so it goes to metrics, never to the response
    (docs/telemetry.md)."""
    return getattr(energy, "joules", None)
