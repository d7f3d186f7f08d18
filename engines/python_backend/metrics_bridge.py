"""Custom metrics (``pb_utils.MetricFamily``) of a model that runs in its own process.

The families live in the server's one ``CustomMetrics`` store, so every instance's series
appear on the same /metrics scrape and share by name as Triton's do. In the worker,
``RemoteStore`` stands in for that store: ``pb_utils`` calls it exactly as it calls the real
one, and each call crosses the channel (synchronously: a misuse raises in the model, with
Triton's message, as in thread mode). In the server, ``MetricsHost`` runs the calls on the
real store and keeps every handle the worker holds, so a worker that dies releases its
series as Triton's exiting stub does.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from wattserve.engines.python_backend.channel import Calls
from wattserve.engines.python_backend.custom_metrics import CustomMetrics, Family, Series


class RemoteStore:
    """The worker's view of the server's store: handles are ids the server hands out."""

    def __init__(self, calls: Calls) -> None:
        self._calls = calls

    def _op(self, op: str, *args: Any) -> Any:
        return self._calls.call("metric", op, args)

    def acquire_family(self, name: Any, description: Any, kind: Any) -> int:
        return int(self._op("family", name, description, getattr(kind, "value", kind)))

    def acquire_series(self, family: int, labels: Any, buckets: Any) -> int:
        return int(self._op("series", family, labels, buckets))

    def release_series(self, family: int, series: int) -> None:
        self._op("release_series", series)

    def release_family(self, family: int) -> None:
        self._op("release_family", family)

    def increment(self, series: int, value: float) -> None:
        self._op("increment", series, value)

    def set(self, series: int, value: float) -> None:
        self._op("set", series, value)

    def observe(self, series: int, value: float) -> None:
        self._op("observe", series, value)

    def value(self, series: int) -> float:
        return float(self._op("value", series))


class MetricsHost:
    """One worker's handles on the server's store (ids -> families and series)."""

    def __init__(self, store: CustomMetrics) -> None:
        self.store = store
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._families: dict[int, Family] = {}
        self._series: dict[int, tuple[Family, Series]] = {}

    def handle(self, op: str, args: tuple[Any, ...]) -> Any:
        """Run one of ``RemoteStore``'s calls; a misuse raises ``MetricError``."""
        if op == "family":
            return self._keep(self._families, self.store.acquire_family(*args))
        if op == "series":
            family_id, labels, buckets = args
            family = self._families[family_id]
            return self._keep(self._series, (family, self.store.acquire_series(family, labels, buckets)))
        if op == "release_series":
            with self._lock:
                entry = self._series.pop(args[0], None)
            if entry is not None:
                self.store.release_series(*entry)
            return None
        if op == "release_family":
            with self._lock:
                dropped = self._families.pop(args[0], None)
            if dropped is not None:
                self.store.release_family(dropped)
            return None
        series = self._series[args[0]][1]
        if op == "value":
            return self.store.value(series)
        getattr(self.store, op)(series, float(args[1]))  # increment, set, observe
        return None

    def release_all(self) -> None:
        """The worker is gone: drop what it held (series before their families)."""
        with self._lock:
            series, self._series = list(self._series.values()), {}
            families, self._families = list(self._families.values()), {}
        for family, one in reversed(series):
            self.store.release_series(family, one)
        for family in reversed(families):
            self.store.release_family(family)

    def _keep(self, table: dict[int, Any], value: Any) -> int:
        with self._lock:
            handle = next(self._ids)
            table[handle] = value
            return handle
