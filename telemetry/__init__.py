"""NVML and RAPL energy telemetry: sampler, energy poller, window attribution, Prometheus metrics."""

from telemetry.energy import EnergyMeter
from telemetry.service import TelemetryService
from telemetry.windows import BatchSpan

__all__ = ["BatchSpan", "EnergyMeter", "TelemetryService"]
