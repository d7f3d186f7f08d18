"""NVML and RAPL energy telemetry: sampler, energy poller, window attribution, Prometheus metrics."""

from wattserve.telemetry.energy import EnergyMeter
from wattserve.telemetry.service import TelemetryConfig, TelemetryService
from wattserve.telemetry.windows import BatchSpan

__all__ = ["BatchSpan", "EnergyMeter", "TelemetryConfig", "TelemetryService"]
