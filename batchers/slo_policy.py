"""What the latency-objective policies (adaptive, aimd) share: the objective, the count of
requests that met or missed it, and one Prometheus collector publishing both beside the
policy's own gauges."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import Metric
from wattserve.batchers.base import BatcherConfig, RequestBatcher, common_config
from wattserve.batchers.config import BatchingSpec
from wattserve.batchers.slo_metrics import SloCollector, SloCounts
from wattserve.batchers.types import ItemState, WorkItem


@dataclass
class SloConfig(BatcherConfig):
    slo_s: float = 0.1  # the objective: request arrival to answer, seconds
    percentile: float = 99.0  # ... for this percentile of requests


def slo_config(spec: BatchingSpec) -> dict[str, Any]:
    """The ``SloConfig`` fields from a model's batching spec (common fields included)."""
    return {
        **common_config(spec),
        "slo_s": spec.slo_ms / 1000.0,
        "percentile": spec.slo_percentile,
    }


class SloBatcher(RequestBatcher):
    """Base of the policies that plan for a latency objective."""

    config: SloConfig

    def __init__(self, engines: Sequence[Any], config: SloConfig, **kwargs: Any) -> None:
        super().__init__(engines, config, **kwargs)
        self.slo = SloCounts()

    def count_slo(self, items: Iterable[WorkItem], now: float) -> None:
        """Count each computed request not answered yet (deadline, client gone) as met or
        missed: arrival to ``now`` against the objective."""
        slo = self.config.slo_s
        for item in items:
            if item.state is ItemState.RUNNING:
                if now - item.arrival <= slo:
                    self.slo.met += 1
                else:
                    self.slo.missed += 1

    def collector(self, model: str) -> SloCollector:
        return SloCollector(
            model, self.name, self.config.slo_s, self.config.percentile, self.slo, extra=self.collect_policy
        )

    def collect_policy(self, labels: tuple[str, str]) -> Iterable[Metric]:
        """The policy's own gauges at scrape time, labelled (model, batcher)."""
        return ()
