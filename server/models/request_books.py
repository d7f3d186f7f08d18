"""A model's successful requests, counted once per event-loop turn instead of once each.

A batch's requests are answered together, in one turn of the loop; counting each as it
is answered takes three locked adds (the outcome counter, the latency histogram's sum and
bucket) and Triton's statistics' sums per request, the largest piece of per-request
bookkeeping left on the engine core's loop. Here an answer appends its figures to a list,
and at the end of the turn the list is counted in one go: one add for the counter, one
per distinct latency bucket, one pass over the statistics. The figures are the same;
they show on ``/metrics`` and ``/v2/models/{m}/stats`` one turn later, before any request
read after the answers left (a scrape is read in a later turn).
"""

from __future__ import annotations

import asyncio
from typing import Any

from wattserve.batchers.types import Result


class SuccessBooks:
    """Pending successes of one model, by protocol; counted at the end of the loop turn."""

    __slots__ = ("_groups", "_pending", "_scheduled", "metrics")

    def __init__(self, metrics: Any) -> None:  # ServingMetrics
        self.metrics = metrics
        self._pending: dict[str, list[tuple[float, Result]]] = {}
        # a front end's groups: one entry each, with the count of requests it answered
        self._groups: dict[str, list[tuple[float, Result, int]]] = {}
        self._scheduled = False

    def add(self, protocol: str, elapsed_s: float, result: Result, requests: int = 1) -> None:
        """``requests``: the client requests this answer stands for (a front end's group:
        booked once, with its count)."""
        if requests == 1:
            entries = self._pending.get(protocol)
            if entries is None:
                entries = self._pending[protocol] = []
            entries.append((elapsed_s, result))
        else:
            groups = self._groups.get(protocol)
            if groups is None:
                groups = self._groups[protocol] = []
            groups.append((elapsed_s, result, requests))
        if not self._scheduled:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop in this thread: count now
                self.flush()
                return
            self._scheduled = True
            loop.call_soon(self.flush)

    def flush(self) -> None:
        """Count everything pending (also what a reader that cannot wait a turn calls)."""
        self._scheduled = False
        pending, self._pending = self._pending, {}
        metrics = self.metrics
        for protocol, entries in pending.items():
            metrics.success_add[protocol](len(entries))
            metrics.latency(protocol).observe_many([elapsed for elapsed, _ in entries])
            metrics.statistics.record_successes(entries)
        if self._groups:
            groups, self._groups = self._groups, {}
            for protocol, counted in groups.items():
                metrics.success_add[protocol](sum(count for _, _, count in counted))
                metrics.latency(protocol).observe_counted([(elapsed, count) for elapsed, _, count in counted])
                metrics.statistics.record_counted_successes(counted)
