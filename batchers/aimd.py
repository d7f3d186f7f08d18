"""aimd: Clipper's adaptive batch size (Crankshaw et al., NSDI 2017, section 4.3), a baseline.

Whatever is queued goes the moment an instance is free, up to a batch-size limit. The
limit grows by ``step`` after every batch whose processing time stays within the latency
objective, and shrinks by 10% (multiplicatively) after one that exceeds it. As in Clipper,
the batch's own processing time is what is compared with the objective; queueing time is
not. It is here so the adaptive policy is measured against a published adaptive one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from wattserve.batchers.base import BatchOutcome
from wattserve.batchers.config import BatchingSpec
from wattserve.batchers.policy import Decision, Dispatch, QueueView
from wattserve.batchers.slo_policy import SloBatcher, SloConfig, slo_config
from wattserve.engines.base import Engine


@dataclass
class AimdConfig(SloConfig):
    step: int = 1  # additive increase per batch within the objective
    backoff: float = 0.9  # multiplicative decrease after a batch past it


def next_limit(limit: int, batch_seconds: float, config: AimdConfig) -> int:
    """The AIMD rule on its own: the batch-size limit after one batch."""
    if batch_seconds > config.slo_s:
        return max(1, math.floor(limit * config.backoff))
    return min(config.max_batch_size, limit + config.step)


class AimdBatcher(SloBatcher):
    name = "aimd"
    summary = "Clipper's AIMD on the batch-size limit, a baseline"
    config: AimdConfig

    def __init__(self, engines: Sequence[Engine], config: AimdConfig, **kwargs: Any) -> None:
        super().__init__(engines, config, **kwargs)
        self.limit = 1

    @classmethod
    def config_from(cls, spec: BatchingSpec, engine: Engine) -> AimdConfig:
        return AimdConfig(**slo_config(spec))

    def decide(self, view: QueueView, now: float) -> Decision:
        """Like continuous (whatever is queued, at once), up to the current limit."""
        return Dispatch(self.limit)

    def batch_finished(self, outcome: BatchOutcome) -> None:  # cannot raise
        self.limit = next_limit(self.limit, outcome.finished - outcome.started, self.config)
        self.count_slo(outcome.items, self._now())

    def collect_policy(self, labels: tuple[str, str]) -> Iterable[Metric]:
        g = GaugeMetricFamily(
            "wattserve_aimd_batch_size_limit", "AIMD's current batch-size limit.", labels=["model", "batcher"]
        )
        g.add_metric(list(labels), self.limit)
        yield g
