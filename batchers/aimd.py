"""aimd: Clipper's adaptive batch size (Crankshaw et al., NSDI 2017, section 4.3), a baseline.

Whatever is queued goes the moment an instance is free, up to a batch-size limit. The
limit grows by ``step`` after every batch whose processing time stays within the latency
objective, and shrinks by 10% (multiplicatively) after one that exceeds it. As in Clipper,
the batch's own processing time is what is compared with the objective; queueing time is
not. It is here so the adaptive policy is measured against a published adaptive one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from time import monotonic

from prometheus_client.core import GaugeMetricFamily, Metric
from wattserve.batchers.base import BatcherConfig, BatchOutcome, RequestBatcher
from wattserve.batchers.slo_metrics import SloCollector, SloCounts
from wattserve.batchers.types import ItemState, WorkItem


@dataclass
class AimdConfig(BatcherConfig):
    slo_s: float = 0.1
    percentile: float = 99.0
    step: int = 1  # additive increase per batch within the objective
    backoff: float = 0.9  # multiplicative decrease after a batch past it
    model_name: str = ""


def next_limit(limit: int, batch_seconds: float, config: AimdConfig) -> int:
    """The AIMD rule on its own: the batch-size limit after one batch."""
    if batch_seconds > config.slo_s:
        return max(1, math.floor(limit * config.backoff))
    return min(config.max_batch_size, limit + config.step)


class AimdBatcher(RequestBatcher):
    name = "aimd"
    config: AimdConfig

    def __init__(self, engines, config: AimdConfig, **hooks) -> None:
        super().__init__(engines, config, **hooks)
        self.limit = 1
        self.slo = SloCounts()
        if self.metrics is not None:
            self.metrics.registry.register(
                SloCollector(
                    config.model_name,
                    self.name,
                    config.slo_s,
                    config.percentile,
                    self.slo,
                    extra=self._collect_limit,
                )
            )

    def ready_size(self, queued: int) -> int | None:
        """Engine thread, between batches: like continuous, up to the current limit."""
        return min(queued, self.limit) or None

    async def form_batch(self) -> list[WorkItem] | None:
        while True:
            if len(self.queue):
                return self.take(self.limit)
            if self.closing:
                return None
            await self.wait_for_change()

    def batch_finished(self, outcome: BatchOutcome) -> None:  # cannot raise
        self.limit = next_limit(self.limit, outcome.finished - outcome.started, self.config)
        now = monotonic()
        for item in outcome.items:
            if item.state is ItemState.RUNNING:
                if now - item.arrival <= self.config.slo_s:
                    self.slo.met += 1
                else:
                    self.slo.missed += 1

    def _collect_limit(self, labels: tuple[str, str]) -> Iterable[Metric]:
        g = GaugeMetricFamily(
            "wattserve_aimd_batch_size_limit", "AIMD's current batch-size limit.", labels=["model", "batcher"]
        )
        g.add_metric(list(labels), self.limit)
        yield g
