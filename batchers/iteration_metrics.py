"""Metrics of iterative (step) models, on the same registry as ServingMetrics.

- ``wattserve_iteration_batch_size``: states advanced by one model call (the per-iteration
  occupancy), for every batcher: the engine reports each UNet call it makes, so a
  request-level batch shows its occupancy falling as short requests finish.
- ``wattserve_iterations_total`` / ``wattserve_iteration_state_steps_total``: model calls and
  state-steps; ``rate()`` of them is UNet calls per second and denoising steps per second.
- ``wattserve_iteration_duration_seconds``: one model call plus its scheduler update.
- ``wattserve_time_to_result_seconds``: arrival to result of each request served by the
  iteration-level batcher (the request-level batchers' equivalent is
  ``wattserve_request_duration_seconds``).
- ``wattserve_running_states``: requests in the iteration-level running set now (read from
  the batcher at scrape time).

The server makes one ``IterationMetrics`` per served step model and hands it to that
model's one batch observer (``server/models/batch_observer.py``), its only writer: the engine's
step reports arrive through the observer's ``on_step``, time to result through its
``on_batch``. The families are declared once per registry (many models share one;
``telemetry.families``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge
from wattserve.telemetry.buckets import BATCH_SIZE_BUCKETS, LATENCY_BUCKETS
from wattserve.telemetry.families import families
from wattserve.telemetry.histogram import BisectHistogram


class _Families:
    """The iteration metric families of one registry, declared once however many step
    models (or reloads of one) the registry serves (``telemetry.families``)."""

    def __init__(self, r: CollectorRegistry) -> None:
        labels = ("model", "batcher")
        self._occupancy = BisectHistogram(
            "wattserve_iteration_batch_size",
            "States advanced by one model call of an iterative model (per-iteration occupancy).",
            labels, buckets=BATCH_SIZE_BUCKETS, registry=r,
        )  # fmt: skip
        self._duration = BisectHistogram(
            "wattserve_iteration_duration_seconds",
            "One model call of an iterative model, scheduler update included.",
            labels, buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self._iterations = Counter(
            "wattserve_iterations", "Model calls of an iterative model.", labels, registry=r
        )
        self._state_steps = Counter(
            "wattserve_iteration_state_steps",
            "Denoising steps done, summed over states (rate() = steps per second).",
            labels,
            registry=r,
        )
        self._time_to_result = BisectHistogram(
            "wattserve_time_to_result_seconds",
            "Arrival to result of a request served by the iteration-level batcher.",
            labels, buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self._running = Gauge(
            "wattserve_running_states",
            "Requests in the iteration-level batcher's running set.",
            labels,
            registry=r,
        )


class IterationMetrics:
    """Per-iteration occupancy, step rate and time to result of one model and batcher."""

    def __init__(self, model: str, batcher: str, registry: CollectorRegistry) -> None:
        f = families(registry, _Families)
        lv = (model, batcher)
        self.occupancy = f._occupancy.labels(*lv)
        self.duration = f._duration.labels(*lv)
        self.iterations = f._iterations.labels(*lv)
        self.state_steps = f._state_steps.labels(*lv)
        self.time_to_result = f._time_to_result.labels(*lv)
        self.running = f._running.labels(*lv)

    def observe_iteration(self, states: int, seconds: float) -> None:
        """One model call over ``states`` states; thread-safe (called on engine threads)."""
        self.occupancy.observe(states)
        self.duration.observe(seconds)
        self.iterations.inc()
        self.state_steps.inc(states)
