"""Prometheus view of an SLO-driven policy: its objective, its misses, and what it learned.

Read at scrape time (a custom collector), so the batching hot path pays only for plain
integer counters on the policy object.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


@dataclass
class SloCounts:
    """Requests answered within / past the objective, and rejected early (503)."""

    met: int = 0
    missed: int = 0
    rejected: int = 0


@dataclass(eq=False)  # a registry keys collectors by identity
class SloCollector:
    model: str
    batcher: str
    slo_s: float
    percentile: float
    counts: SloCounts
    extra: Callable[[tuple[str, str]], Iterable[Metric]] = field(default=lambda labels: ())

    def collect(self) -> Iterable[Metric]:
        labels = (self.model, self.batcher)
        objective = GaugeMetricFamily(
            "wattserve_slo_objective_seconds",
            "The latency objective the policy plans for.",
            labels=["model", "batcher", "percentile"],
        )
        objective.add_metric([*labels, f"{self.percentile:g}"], self.slo_s)
        yield objective
        results = CounterMetricFamily(
            "wattserve_slo_requests",
            "Requests by whether their batcher-side latency (arrival to answer) met the "
            "objective: met, missed (served late) or rejected (503 early, if turned on).",
            labels=["model", "batcher", "result"],
        )
        counts = self.counts
        for result, count in (("met", counts.met), ("missed", counts.missed), ("rejected", counts.rejected)):
            results.add_metric([*labels, result], count)
        yield results
        yield from self.extra(labels)

    def describe(self) -> Iterable[Metric]:
        return ()  # no fixed list: the registry then skips its duplicate-name check for it
