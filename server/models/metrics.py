"""Serving metrics, declared once in one registry object (base units, ``_total`` counters).

One ``ServingMetrics`` per app, on its own ``CollectorRegistry`` so tests can build many
apps in one process. Label children are bound once per model/batcher so the hot path is a
lock and an add, not a label lookup.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from wattserve.server.extensions.statistics import ModelStatistics
from wattserve.telemetry.buckets import BATCH_SIZE_BUCKETS, LATENCY_BUCKETS
from wattserve.telemetry.counter_add import counter_add
from wattserve.telemetry.families import families
from wattserve.telemetry.histogram import BisectHistogram

OUTCOMES = (
    "success",  # answered with a result
    "bad_request",  # 4xx before queueing
    "queue_full",  # 503, bounded queue full
    "queue_timeout",  # 503, waited max_queue_wait_s in the queue anyway; never computed
    "draining",  # 503, server is shutting down
    "timeout",  # 504, deadline passed (never computed if it passed while queued)
    "cancelled",  # client went away before the answer
    "error",  # 500, the engine failed this request's batch
)

PROTOCOLS = ("http", "grpc")

# The front end that carries the request being handled. A gRPC handler sets it in its own
# task; HTTP leaves the default. The one admission path and the runtime count requests
# without knowing the protocol, and the ``protocol`` label still says which one it was.
request_protocol: ContextVar[str] = ContextVar("wattserve_request_protocol", default="http")


class _Families:
    """The metric families of one registry, declared once however many models it serves
    (``telemetry.families``)."""

    def __init__(self, r: CollectorRegistry) -> None:
        labels = ("model", "batcher")
        self.requests = Counter(
            "wattserve_requests", "Inference requests by protocol and outcome.",
            (*labels, "protocol", "outcome"), registry=r,
        )  # fmt: skip
        self.request_latency = BisectHistogram(
            "wattserve_request_duration_seconds",
            "Time from request arrival to response, successful requests, by protocol.",
            (*labels, "protocol"), buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue_time = BisectHistogram(
            "wattserve_queue_duration_seconds",
            "Time a request waited in the queue before its batch started.",
            labels, buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.compute_time = BisectHistogram(
            "wattserve_batch_compute_duration_seconds",
            "Engine time of one batch (stacking, model, splitting).",
            labels, buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.batch_size = BisectHistogram(
            "wattserve_batch_size", "Requests per executed batch.",
            labels, buckets=BATCH_SIZE_BUCKETS, registry=r,
        )  # fmt: skip
        self.inferences = Counter(
            "wattserve_inferences", "Requests computed (Triton's inference count).", labels, registry=r
        )
        self.executions = Counter(
            "wattserve_batch_executions", "Batches executed (Triton's execution count).", labels, registry=r
        )
        self.padded = Counter(
            "wattserve_batch_padded_slots",
            "Slots added to batches to reach an engine batch size (wasted work).",
            labels,
            registry=r,
        )
        self.queue_depth = Gauge(
            "wattserve_queue_depth", "Requests waiting in the queue.", labels, registry=r
        )
        self.inflight = Gauge(
            "wattserve_inflight_requests", "Accepted requests not yet answered.", labels, registry=r
        )
        self.ready = Gauge("wattserve_model_ready", "1 when the model serves.", labels, registry=r)
        self.connections_refused = Counter(  # the server's, not a model's: no model label
            "wattserve_connections_refused",
            "Connections closed before a request reached the app (header timeout or size, cap).",
            ("reason",),
            registry=r,
        )


def server_metrics(registry: CollectorRegistry) -> dict[str, Any]:
    """The server-wide (not per-model) metrics of a registry."""
    return {"connections_refused": families(registry, _Families).connections_refused}


class ServingMetrics:
    """Every serving metric of one model served by one batcher.

    Many models share one registry (one ``/metrics``): the families are declared once per
    registry and each model binds its own label children.
    """

    def __init__(self, model: str, batcher: str, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        f = families(self.registry, _Families)
        self._requests = f.requests
        self.connections_refused = f.connections_refused
        self.statistics = ModelStatistics()
        lv = (model, batcher)
        self.queue_depth = f.queue_depth.labels(*lv)
        self.inflight = f.inflight.labels(*lv)
        self.ready = f.ready.labels(*lv)
        self._latency = {p: f.request_latency.labels(*lv, p) for p in PROTOCOLS}
        self.queue_time = f.queue_time.labels(*lv)
        self.compute_time = f.compute_time.labels(*lv)
        self.batch_size = f.batch_size.labels(*lv)
        self.inferences = f.inferences.labels(*lv)
        self.executions = f.executions.labels(*lv)
        self.padded_slots = f.padded.labels(*lv)
        self._outcomes = {p: {o: self._requests.labels(*lv, p, o) for o in OUTCOMES} for p in PROTOCOLS}
        for children in self._outcomes.values():  # so rate() queries have a series from the start
            for child in children.values():
                child.inc(0)
        # the adds the hot path makes once per batch or loop turn (telemetry.counter_add)
        self._add_inferences = counter_add(self.inferences)
        self._add_executions = counter_add(self.executions)
        self.success_add = {p: counter_add(children["success"]) for p, children in self._outcomes.items()}

    @property
    def outcome(self) -> dict[str, Any]:
        """Request counters by outcome, for the protocol of the request being handled."""
        return self.outcomes(request_protocol.get())

    @property
    def request_latency(self) -> Any:
        """The latency histogram of the protocol of the request being handled."""
        return self.latency(request_protocol.get())

    def outcomes(self, protocol: str) -> dict[str, Any]:
        """Request counters by outcome for ``protocol`` (a caller outside the request's context)."""
        return self._outcomes[protocol]

    def latency(self, protocol: str) -> Any:
        """The latency histogram for ``protocol``."""
        return self._latency[protocol]

    def count(self, outcome: str) -> int:
        """Requests with ``outcome`` over every protocol (Triton's statistics count them all)."""
        return int(sum(children[outcome]._value.get() for children in self._outcomes.values()))

    def watch(self, batcher: Any) -> None:
        """Queue depth and in-flight count are read from the batcher at scrape time, so the
        hot path pays nothing for them."""
        self.queue_depth.set_function(lambda: batcher.queue_depth)
        self.inflight.set_function(lambda: batcher.inflight)

    def unwatch(self) -> None:
        """The batcher stopped: read zero, and let go of it (``ServingObserver.unwatch``)."""
        self.queue_depth.set_function(lambda: 0)
        self.inflight.set_function(lambda: 0)

    def observe_batch(
        self,
        size: int,
        compute_s: float,
        padded: int = 0,
        input_s: float = 0.0,
        output_s: float = 0.0,
        null_rows: int = 0,
    ) -> None:
        """Called once per executed batch (``size`` rows, ``null_rows`` of them no request's)."""
        self.batch_size.observe(size)
        self.compute_time.observe(compute_s)
        self.statistics.record_batch(size, compute_s, size - null_rows, input_s=input_s, output_s=output_s)
        self._add_inferences(size - null_rows)
        self._add_executions(1)
        if padded:
            self.padded_slots.inc(padded)
