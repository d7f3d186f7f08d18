"""Serving metrics, declared once in one registry object (base units, ``_total`` counters).

One ``ServingMetrics`` per app, on its own ``CollectorRegistry`` so tests can build many
apps in one process. Label children are bound once per model/batcher so the hot path is a
lock and an add, not a label lookup.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024)

OUTCOMES = (
    "success",  # answered with a result
    "bad_request",  # 4xx before queueing
    "queue_full",  # 503, bounded queue full
    "draining",  # 503, server is shutting down
    "timeout",  # 504, deadline passed (never computed if it passed while queued)
    "cancelled",  # client went away before the answer
    "error",  # 500, the engine failed this request's batch
)


class ServingMetrics:
    """Every serving metric of one model served by one batcher."""

    def __init__(self, model: str, batcher: str, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        labels = ("model", "batcher")
        r = self.registry
        self._requests = Counter(
            "wattserve_requests", "Inference requests by outcome.", (*labels, "outcome"), registry=r
        )
        self._request_latency = Histogram(
            "wattserve_request_duration_seconds",
            "Time from request arrival to response, successful requests.",
            labels, buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self._queue_time = Histogram(
            "wattserve_queue_duration_seconds",
            "Time a request waited in the queue before its batch started.",
            labels, buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self._compute_time = Histogram(
            "wattserve_batch_compute_duration_seconds",
            "Engine time of one batch (stacking, model, splitting).",
            labels, buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self._batch_size = Histogram(
            "wattserve_batch_size", "Requests per executed batch.",
            labels, buckets=BATCH_SIZE_BUCKETS, registry=r,
        )  # fmt: skip
        self._inferences = Counter(
            "wattserve_inferences",
            "Requests computed (Triton's inference count).",
            labels,
            registry=r,
        )
        self._executions = Counter(
            "wattserve_batch_executions",
            "Batches executed (Triton's execution count).",
            labels,
            registry=r,
        )
        self._padded = Counter(
            "wattserve_batch_padded_slots",
            "Slots added to batches to reach an engine batch size (wasted work).",
            labels,
            registry=r,
        )
        self._queue_depth = Gauge(
            "wattserve_queue_depth", "Requests waiting in the queue.", labels, registry=r
        )
        self._inflight = Gauge(
            "wattserve_inflight_requests", "Accepted requests not yet answered.", labels, registry=r
        )
        self._ready = Gauge("wattserve_model_ready", "1 when the model serves.", labels, registry=r)
        self.connections_refused = Counter(
            "wattserve_connections_refused",
            "Connections closed before a request reached the app (header timeout or size, cap).",
            ("reason",),
            registry=r,
        )

        lv = (model, batcher)
        self.queue_depth = self._queue_depth.labels(*lv)
        self.inflight = self._inflight.labels(*lv)
        self.ready = self._ready.labels(*lv)
        self.request_latency = self._request_latency.labels(*lv)
        self.queue_time = self._queue_time.labels(*lv)
        self.compute_time = self._compute_time.labels(*lv)
        self.batch_size = self._batch_size.labels(*lv)
        self.inferences = self._inferences.labels(*lv)
        self.executions = self._executions.labels(*lv)
        self.padded_slots = self._padded.labels(*lv)
        self.outcome = {o: self._requests.labels(*lv, o) for o in OUTCOMES}
        for child in self.outcome.values():  # so rate() queries have a series from the start
            child.inc(0)

    def watch(self, batcher: Any) -> None:
        """Queue depth and in-flight count are read from the batcher at scrape time, so the
        hot path pays nothing for them."""
        self.queue_depth.set_function(lambda: batcher.queue_depth)
        self.inflight.set_function(lambda: batcher.inflight)

    def observe_batch(self, size: int, compute_s: float, padded: int = 0) -> None:
        """Called once per executed batch."""
        self.batch_size.observe(size)
        self.compute_time.observe(compute_s)
        self.inferences.inc(size)
        self.executions.inc()
        if padded:
            self.padded_slots.inc(padded)
