"""The simulated GPU's telemetry on a clock a test moves by hand: the real service, NVML
layer and sampler over ``SimulatedNvml``, every figure exact because nothing is timed."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry
from wattserve.telemetry import TelemetryConfig, TelemetryService
from wattserve.telemetry.simulated_gpu import PowerModel, SimulatedNvml


class ManualClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def simulated_service(
    model: PowerModel, clock: ManualClock, registry: CollectorRegistry, **config: Any
) -> TelemetryService:
    """A telemetry service (not started) over ``model`` on ``clock``; ``config``: more
    ``TelemetryConfig`` fields."""
    return TelemetryService(
        TelemetryConfig(simulated_gpu="default", **config),
        registry,
        nvml=SimulatedNvml(model, clock=clock),
        clock=clock,
        wall_clock=clock,
        sleep=clock.sleep,
        background=False,
    )
