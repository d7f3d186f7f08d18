"""Python models' custom metrics (Triton's ``pb_utils.MetricFamily``), published on /metrics.

Triton keeps one registry of custom families per server: two instances (or two models) that
create a family of the same name and kind share it, and two ``Metric`` handles with the same
labels share one series (a counter both increment, a gauge either sets). ``CustomMetrics``
is that registry for one wattserve app: the families' state (values under one lock), and a
prometheus_client ``Collector`` that the app registers on its registry, so the series appear
on the same /metrics scrape as the server's own, read at scrape time.

Lifetime follows Triton's reference counting: a series lives while a ``Metric`` handle for
it does, a family while a ``MetricFamily`` handle or one of its series does. Every handle a
model creates is also owned by its engine instance (``Owner``), and ``Owner.release`` at
unload drops them all: the stub process's exit does that under Triton, and here a
reference cycle in the model must not keep its series on /metrics after it is gone.

Exposition differs from Triton's in one way the library forces (as for the ``nv_*``
counters, server/extensions/triton_metrics.py): a counter is exposed ``untyped`` under the exact name
the model gave, because prometheus_client names every counter ``*_total``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import threading
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import Metric as PromMetric
from prometheus_client.registry import Collector

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2
KIND_NAMES = {COUNTER: "COUNTER", GAUGE: "GAUGE", HISTOGRAM: "HISTOGRAM"}
_EXPOSED_TYPE = {COUNTER: "unknown", GAUGE: "gauge", HISTOGRAM: "histogram"}
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
RESERVED_PREFIXES = ("nv_", "wattserve_")  # the server's own families: a model may not shadow them


class MetricError(Exception):
    """A misuse of the custom metrics API, with Triton's message; pb_utils raises it as a
    ``TritonModelException``."""


@dataclass(eq=False)
class Series:
    """One labelled series of a family: a counter's or gauge's value, or a histogram's
    bucket counts, count and sum."""

    labels: dict[str, str]
    kind: int
    buckets: tuple[float, ...] = ()
    value: float = 0.0
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative
    count: int = 0
    total: float = 0.0
    refs: int = 0


@dataclass(eq=False)
class Family:
    name: str
    description: str
    kind: int
    refs: int = 0  # live MetricFamily handles
    series: dict[tuple[tuple[str, str], ...], Series] = field(default_factory=dict)


class CustomMetrics(Collector):
    """One server's custom metric families (``registry.register(CustomMetrics())``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, Family] = {}

    # ------------------------------------------------------------------ families and series
    def acquire_family(self, name: Any, description: Any, kind: Any) -> Family:
        """The family ``name`` (created, or the existing one: its first description is kept);
        MetricError for a bad name or kind, or a name taken by a family of another kind."""
        if not isinstance(name, str) or not _METRIC_NAME.match(name):
            raise MetricError(f"Error when creating MetricFamily: invalid metric name {name!r}")
        if name.startswith(RESERVED_PREFIXES):
            raise MetricError(f"Error when creating MetricFamily: {name!r}: names starting with "
                              f"{' or '.join(RESERVED_PREFIXES)} are the server's own")  # fmt: skip
        if not isinstance(description, str):
            raise MetricError("Error when creating MetricFamily: the description must be a str")
        kind = _kind(kind)
        with self._lock:
            family = self._families.get(name)
            if family is None:
                family = self._families[name] = Family(name, description, kind)
            elif family.kind != kind:
                have, want = KIND_NAMES[family.kind], KIND_NAMES[kind]
                raise MetricError(f"Error when creating MetricFamily: a family named {name!r} already "
                                  f"exists with kind {have}, not {want}")  # fmt: skip
            family.refs += 1
            return family

    def acquire_series(self, family: Family, labels: Any, buckets: Any) -> Series:
        """The series of ``family`` with ``labels`` (Triton's checks on labels and buckets);
        the same labels give the same series."""
        if labels is not None and not isinstance(labels, dict):
            raise MetricError("Failed to create metric. Labels must be a dictionary.")
        label_map = dict(labels or {})
        for key, value in label_map.items():
            if not isinstance(key, str) or not _LABEL_NAME.match(key) or key.startswith("__"):
                raise MetricError(f"Error when creating Metric: invalid label name {key!r}")
            if not isinstance(value, str):
                raise MetricError(f"Error when creating Metric: label {key!r} must have a str value")
        if family.kind == HISTOGRAM and "le" in label_map:
            raise MetricError("Error when creating Metric: 'le' is a histogram's own label")
        bounds = _buckets(family.kind, buckets)
        key = tuple(sorted(label_map.items()))
        with self._lock:
            series = family.series.get(key)
            if series is None:
                series = family.series[key] = Series(
                    label_map, family.kind, bounds, counts=[0] * (len(bounds) + 1)
                )
            series.refs += 1
            return series

    def release_series(self, family: Family, series: Series) -> None:
        with self._lock:
            series.refs -= 1
            if series.refs <= 0:
                family.series = {k: s for k, s in family.series.items() if s is not series}
            self._drop_if_unused(family)

    def release_family(self, family: Family) -> None:
        with self._lock:
            family.refs -= 1
            self._drop_if_unused(family)

    def _drop_if_unused(self, family: Family) -> None:
        if family.refs <= 0 and not family.series and self._families.get(family.name) is family:
            del self._families[family.name]

    # ------------------------------------------------------------------ operations (Triton's rules)
    def increment(self, series: Series, value: float) -> None:
        if series.kind == HISTOGRAM:
            raise MetricError("Failed to increment metric value: a HISTOGRAM does not support increment")
        if series.kind == COUNTER and value < 0:
            raise MetricError("Failed to increment metric value: a COUNTER can only be incremented "
                              "monotonically by non-negative values")  # fmt: skip
        with self._lock:
            series.value += value

    def set(self, series: Series, value: float) -> None:
        if series.kind != GAUGE:
            raise MetricError(f"Failed to set metric value: a {KIND_NAMES[series.kind]} does not support set")
        with self._lock:
            series.value = value

    def observe(self, series: Series, value: float) -> None:
        if series.kind != HISTOGRAM:
            raise MetricError(
                f"Failed to observe metric value: a {KIND_NAMES[series.kind]} does not support observe"
            )
        with self._lock:
            series.counts[bisect.bisect_left(series.buckets, value)] += 1
            series.count += 1
            series.total += value

    def value(self, series: Series) -> float:
        if series.kind == HISTOGRAM:
            raise MetricError("Failed to get metric value: a HISTOGRAM does not support value")
        with self._lock:
            return series.value

    # ------------------------------------------------------------------ scrape
    def describe(self) -> Iterable[PromMetric]:
        return []  # names come and go with the models: no registry-time collision checks

    def collect(self) -> Iterator[PromMetric]:
        with self._lock:
            families = [(f, [_snapshot(s) for s in f.series.values()]) for f in self._families.values()]
        for family, series in families:
            metric = PromMetric(family.name, family.description, _EXPOSED_TYPE[family.kind])
            for labels, kind, bounds, value, counts, count, total in series:
                if kind != HISTOGRAM:
                    metric.add_sample(family.name, labels, value)
                    continue
                cumulative = 0
                for bound, n in zip((*bounds, math.inf), counts, strict=True):
                    cumulative += n
                    metric.add_sample(f"{family.name}_bucket", {**labels, "le": _le(bound)}, cumulative)
                metric.add_sample(f"{family.name}_count", labels, count)
                metric.add_sample(f"{family.name}_sum", labels, total)
            yield metric


def _snapshot(s: Series) -> tuple[dict[str, str], int, tuple[float, ...], float, list[int], int, float]:
    return s.labels, s.kind, s.buckets, s.value, list(s.counts), s.count, s.total


def _kind(kind: Any) -> int:
    value = getattr(kind, "value", kind)
    if isinstance(value, bool) or value not in KIND_NAMES:
        raise MetricError(f"Error when creating MetricFamily: unknown kind {kind!r} (MetricFamily.COUNTER, "
                          "GAUGE or HISTOGRAM)")  # fmt: skip
    return int(value)


def _buckets(kind: int, buckets: Any) -> tuple[float, ...]:
    """Triton's rules: a histogram needs a list of strictly increasing bounds (an empty list
    is allowed: one +Inf bucket); a counter or gauge takes none."""
    if buckets is None:
        if kind == HISTOGRAM:
            raise MetricError("Failed to create metric. Missing required buckets.")
        return ()
    if not isinstance(buckets, list):
        raise MetricError("Failed to create metric. Buckets must be a list.")
    if kind != HISTOGRAM:
        raise MetricError("Failed to create metric. Unexpected buckets found.")
    try:
        bounds = tuple(float(b) for b in buckets)
    except (TypeError, ValueError):
        raise MetricError("Failed to create metric. Buckets must be numbers.") from None
    if any(b >= c for b, c in itertools.pairwise(bounds)) or any(math.isnan(b) for b in bounds):
        raise MetricError("Error when creating Metric: bucket boundaries must be strictly sorted")
    return bounds


def _le(bound: float) -> str:
    """A bucket bound as Triton (prometheus-cpp) writes it: ``1``, ``2.5``, ``+Inf``."""
    if bound == math.inf:
        return "+Inf"
    return f"{bound:g}" if float(f"{bound:g}") == bound else repr(bound)


# ---------------------------------------------------------------------------- ownership


class Owner:
    """The handles one engine instance created, released together when it is closed. Held
    weakly: a handle the model drops is released at once, as Triton's are."""

    def __init__(self, store: CustomMetrics) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._handles: list[weakref.ref[Any]] = []

    def adopt(self, handle: Any) -> None:
        with self._lock:
            self._handles = [h for h in self._handles if h() is not None]
            self._handles.append(weakref.ref(handle))

    def release(self) -> None:
        with self._lock:
            handles, self._handles = self._handles, []
        for ref in reversed(handles):  # series before their families
            handle = ref()
            if handle is not None:
                handle._release()


_bound = threading.local()
_fallback: list[Owner | None] = [None]
_default_store = CustomMetrics()  # an engine built outside a server (tests, tools): counted, unpublished


def bind(owner: Owner | None, *, thread_only: bool = False) -> None:
    """The owner this thread's ``MetricFamily`` calls use (the engine binds its own around
    initialize, execute and finalize; threads a model starts fall back to the last bound)."""
    _bound.owner = owner
    if owner is not None and not thread_only:
        _fallback[0] = owner


def current_owner() -> Owner:
    owner = getattr(_bound, "owner", None) or _fallback[0]
    if owner is None:
        owner = _fallback[0] = Owner(_default_store)
    return owner


def bound_store() -> CustomMetrics:
    """The store an engine being built on this thread publishes to (``publishing_to``)."""
    return getattr(_bound, "store", None) or _default_store


def publishing_to(store: CustomMetrics, factory: Any) -> Any:
    """An engine factory whose Python models publish their custom metrics to ``store``: it
    runs the build (on the instance's engine thread) with ``store`` bound to that thread."""

    def build(config: Any) -> Any:
        previous = getattr(_bound, "store", None)
        _bound.store = store
        try:
            return factory(config)
        finally:
            _bound.store = previous

    return build
