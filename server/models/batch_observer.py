"""The server's one observer of a model's batcher: serving metrics, the iteration metrics
of a step model, the energy meter of the engine's device, and telemetry's batch record.

The batcher knows only ``batchers.observers.BatchObserver``; this class is where the
server decides what each batch updates, so no batcher reaches into server/ or telemetry/.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

from wattserve.batchers.base import Batcher
from wattserve.batchers.iteration_metrics import IterationMetrics
from wattserve.batchers.lm_metrics import LMMetrics
from wattserve.batchers.observers import BatchReport
from wattserve.batchers.types import WorkItem
from wattserve.server.models.metrics import ServingMetrics

REQUESTS = attrgetter("requests")  # the client requests a work item answers


class ServingObserver:
    """``BatchObserver`` of one served model version."""

    def __init__(
        self,
        metrics: ServingMetrics,
        *,
        iteration: IterationMetrics | None = None,  # step models only
        lm: LMMetrics | None = None,  # language models only
        meter: Any = None,  # telemetry's EnergyMeter for the engine's device (begin/end), or None
        record_batch: Callable[[int, Any], None] | None = None,  # (batch size, energy) -> None
    ) -> None:
        self.metrics = metrics
        self.iteration = iteration
        self.lm = lm
        self.meter = meter
        self.record_batch = record_batch

    def watch(self, batcher: Batcher) -> None:
        """Gauges read from the batcher at scrape time: the hot path pays nothing for them."""
        self.metrics.watch(batcher)
        if self.iteration is not None:
            self.iteration.running.set_function(lambda: batcher.running_count)
        if self.lm is not None:
            self.lm.watch([inst.engine for inst in batcher.instances])

    def unwatch(self) -> None:
        """The batcher stopped: every gauge reads zero and lets go of it (the gauges outlive
        an unload, and a closure over the batcher kept the unloaded engine alive)."""
        self.metrics.unwatch()
        if self.iteration is not None:
            self.iteration.running.set_function(lambda: 0)
        if self.lm is not None:
            self.lm.unwatch()

    def on_dispatch(self, items: Sequence[WorkItem], now: float) -> None:
        if max(map(REQUESTS, items), default=1) > 1:  # a front end's groups: each member counted
            self.metrics.queue_time.observe_counted([(now - item.arrival, item.requests) for item in items])
        else:
            self.metrics.queue_time.observe_many([now - item.arrival for item in items])

    def on_batch_start(self) -> Any:
        return self.meter.begin() if self.meter is not None else None

    def on_batch_end(self, mark: Any) -> Any:
        return self.meter.end(mark) if self.meter is not None else None

    def on_batch(self, report: BatchReport) -> None:
        m = self.metrics
        if report.time_to_result is None:  # a request-level batch: its requests end with it
            m.observe_batch(report.size, report.compute_s, report.padded, report.input_s, report.output_s,
                            report.null_rows)  # fmt: skip
        else:  # one iteration: a model call; requests are counted as they finish
            m.batch_size.observe(report.size)
            m.compute_time.observe(report.compute_s)
            m.executions.inc()
            m.statistics.record_batch(report.size, report.compute_s, inferences=len(report.time_to_result))
            if report.time_to_result:
                m.inferences.inc(len(report.time_to_result))
            if self.iteration is not None:
                for seconds in report.time_to_result:
                    self.iteration.time_to_result.observe(seconds)
        if self.record_batch is not None:
            self.record_batch(report.size, report.energy)

    def on_step(self, states: int, seconds: float) -> None:
        if self.iteration is not None:
            self.iteration.observe_iteration(states, seconds)
